"""GPU check of the paged-attention and KV-write kernels: correctness at full size, and time.

    cases(ctx) -> list[Case]   (driven by experiments/gpu/check_kernels.py)
    dry_run(ctx)               host-side preparation at toy sizes (no kernel launched)

Each case checks the Triton kernel against its PyTorch reference on the same inputs
(outputs poisoned with NaN, caches NaN outside the owned rows, as in the tests) and
times it (common.bench: graph replay under ~0.2 ms, else CUDA events), next to torch
SDPA on the same K/V laid out densely and contiguously. Bandwidth-bound ops report GB/s
(bytes the op must move / median time) and the fraction of the measured copy bandwidth;
prefill reports TFLOP/s in `vs` instead.

Targets (H200): decode at 64 seqs x 4k context, 32/8 heads, dim 128, bf16 reaches
>= 80% of copy bandwidth and is no slower than SDPA on dense KV (`target_met`).
The sweep (BLOCK_N x num_stages x num_warps at that shape) and the split comparison
(batch 1 at 4k: splits chosen vs none vs half vs double) answer the tuning questions
in the same call.

Run alone: python experiments/gpu/attention_check.py [--small]
(--small: tiny shapes, also under TRITON_INTERPRET=1 on a CPU, to smoke-test the script).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# The random paged batches of the attention tests (tests/kernels/paged_batch.py).
sys.path.append(str(Path(__file__).resolve().parents[2] / "tests" / "kernels"))

from paged_batch import PagedBatch, make_paged_batch  # noqa: E402

from experiments.gpu.common import Case, Context, bench, gbs, row  # noqa: E402
from ignis_kernels.attention_triton import TileConfig, paged_attention_triton, tile_config  # noqa: E402
from ignis_kernels.attention_ref import paged_attention_ref  # noqa: E402
from ignis_kernels.attention_split import choose_num_splits, sm_count  # noqa: E402
from ignis_kernels.kv_cache_triton import write_kv_triton  # noqa: E402
from ignis_kernels.kv_cache_ref import write_kv_ref  # noqa: E402

TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
DECODE_TARGET_FRAC = 0.8
SMEM_BUDGET = 200 * 1024  # the sweep skips tiles whose K/V stages alone would not fit


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.float() - ref.float()).abs()
    return float("nan") if diff.isnan().any() else float(diff.max())


def _batch(seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, dim: int, block_size: int,
           dtype: torch.dtype, device: torch.device, seed: int = 0) -> PagedBatch:
    gen = torch.Generator(device=device).manual_seed(1234 + seed)
    return make_paged_batch(seq_lens, q_lens, hq, hkv, dim, block_size, dtype=dtype, device=device, generator=gen)


def _dense(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Equal-length batch as SDPA's [B, heads, len, dim] tensors, contiguous."""
    n, q_len = len(batch.seq_lens_list), batch.query_lens[0]
    ks, vs = zip(*(batch.dense_kv(i) for i in range(n)))
    k = torch.stack(ks).transpose(1, 2).contiguous()
    v = torch.stack(vs).transpose(1, 2).contiguous()
    q = batch.q.view(n, q_len, *batch.q.shape[1:]).transpose(1, 2).contiguous()
    return q, k, v


def _sdpa_fn(batch: PagedBatch) -> Callable[[], torch.Tensor]:
    """SDPA over the same K/V gathered contiguously: what paging costs against no paging."""
    q, k, v = _dense(batch)
    q_len, ctx = batch.query_lens[0], batch.seq_lens_list[0]
    if q_len == 1:
        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if q_len == ctx:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
    mask = torch.arange(ctx, device=q.device)[None, :] <= pos
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _attention_bytes(batch: PagedBatch) -> int:
    """K/V each sequence must read once, plus q in and out."""
    kv_heads, dim = batch.k_cache.shape[2], batch.k_cache.shape[3]
    elem = batch.q.element_size()
    return (2 * sum(batch.seq_lens_list) * kv_heads * dim + 2 * batch.q.numel()) * elem


def _attention_flops(batch: PagedBatch) -> float:
    """Q K^T and P V over the visible (causal) keys only."""
    heads, dim = batch.q.shape[1], batch.q.shape[2]
    pairs = sum(q * (s - q) + q * (q + 1) / 2 for q, s in zip(batch.query_lens, batch.seq_lens_list))
    return 4.0 * heads * dim * pairs


def _shape(seqs: int, ctx_len: int, q_len: int, hq: int, hkv: int, dim: int, block_size: int,
           dtype: torch.dtype, extra: str = "") -> str:
    return f"{seqs}x{ctx_len} q{q_len} h{hq}/{hkv} d{dim} b{block_size} {str(dtype).removeprefix('torch.')}{extra}"


def _attention_case(op: str, batch: PagedBatch, ctx: Context, shape: str, *, iters: int,
                    sliding_window: int | None = None, num_splits: int | None = None,
                    sdpa: bool = True, bandwidth: bool = True, compare_splits: bool = False,
                    target: bool = False, rotate: list[PagedBatch] = ()) -> dict:
    """One row: the kernel on `batch` checked against the reference, then timed; with
    `rotate`, timed over those batches in turn too (same shapes, other memory), so that a
    launch whose K/V would fit the L2 does not find them there (a 1 x 4k decode reads 16 MB)."""
    args = batch.args()
    hints = dict(max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len, num_splits=num_splits)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention_triton(*args, sliding_window=sliding_window, out=out, **hints)
    ref = paged_attention_ref(*args, sliding_window=sliding_window)
    err = _err(out, ref)
    ok = err <= TOL[batch.q.dtype]
    del ref

    every = [b.args() for b in (batch, *rotate)]

    def calls(**over: object) -> list[Callable[[], object]]:
        kw = {**hints, **over}
        return [lambda a=a: paged_attention_triton(*a, sliding_window=sliding_window, out=out, **kw) for a in every]

    t = bench(calls(), iters=iters)
    notes = [t.label() + (f", rotating {len(every)} batches" if rotate else "")]
    sdpa_ms = None
    if sdpa and sliding_window is None:
        fns = [_sdpa_fn(b) for b in (batch, *rotate)]  # rotated alike: neither side reads from L2
        sdpa_ms = bench(fns, iters=iters).ms
        notes.append(f"SDPA dense {sdpa_ms:.3f} ms (x{sdpa_ms / t.ms:.2f})")
        del fns
    if compare_splits:
        chosen = choose_num_splits(len(batch.seq_lens_list) * batch.k_cache.shape[2], batch.max_seq_len,
                                   sm_count(batch.q.device))
        for n in sorted({1, max(1, chosen // 2), 2 * chosen} - {chosen}):
            ms = bench(calls(num_splits=n), iters=iters).ms
            notes.append(f"{n} splits {ms:.3f} ms")
        notes.insert(1, f"auto = {chosen} splits")
    if not bandwidth:
        notes.append(f"{_attention_flops(batch) / (t.ms * 1e-3) / 1e12:.0f} TFLOP/s")
    extra: dict = {"method": t.method}
    nbytes = _attention_bytes(batch) if bandwidth else None
    if target:
        frac = gbs(nbytes, t.ms) / ctx.copy_gbs if ctx.copy_gbs else 0.0
        met = frac >= DECODE_TARGET_FRAC and (sdpa_ms is None or t.ms <= sdpa_ms)
        extra |= {"target": f">= {DECODE_TARGET_FRAC:.0%} copy bw and <= SDPA", "target_met": met}
        notes.append("target met" if met else "TARGET MISSED")
    return row(op, shape, t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs, ok=ok, max_err=err, vs="; ".join(notes),
               **extra)


def sweep_configs(head_dim: int, dtype: torch.dtype) -> list[TileConfig]:
    """Decode tiles to try: BLOCK_N x num_stages x num_warps whose K/V stages fit SMEM_BUDGET."""
    row_bytes = head_dim * dtype.itemsize
    out = []
    for block_n in (16, 32, 64, 128):
        for stages in (2, 3, 4):
            for warps in (4, 8):
                if stages * 2 * block_n * row_bytes <= SMEM_BUDGET:
                    out.append(TileConfig(16, block_n, num_warps=warps, num_stages=stages))
    return out


def _sweep(batch: PagedBatch, ctx: Context, shape: str, iters: int) -> list[dict]:
    """The decode target shape under each sweep config: time, bandwidth, and correctness."""
    args = batch.args()
    hints = dict(max_query_len=1, max_seq_len=batch.max_seq_len, num_splits=1)
    ref = paged_attention_ref(*args)
    default = tile_config(batch.q.shape[2], 4, 1, batch.q.dtype)
    rows = []
    for cfg in sweep_configs(batch.q.shape[2], batch.q.dtype):
        label = f"n{cfg.block_n} s{cfg.num_stages} w{cfg.num_warps}"
        try:
            out = torch.full_like(batch.q, float("nan"))
            paged_attention_triton(*args, out=out, config=cfg, **hints)
            err = _err(out, ref)
            t = bench(lambda: paged_attention_triton(*args, out=out, config=cfg, **hints), iters=iters)
            vs = t.label() + ("; the default" if cfg == default else "")
            rows.append(row(f"decode sweep {label}", shape, t.ms, nbytes=_attention_bytes(batch),
                            copy_gbs=ctx.copy_gbs, ok=err <= TOL[batch.q.dtype], max_err=err, vs=vs,
                            config=cfg.__dict__))
        except Exception as exc:  # e.g. out of shared memory: a row, not the end of the sweep
            rows.append(row(f"decode sweep {label}", shape, None, ok=False,
                            vs=f"failed: {type(exc).__name__}: {exc}"[:160]))
    return rows


def _write_kv_case(num_tokens: int, heads: int, dim: int, block_size: int, dtype: torch.dtype,
                   ctx: Context, iters: int) -> dict:
    device = ctx.device
    gen = torch.Generator(device=device).manual_seed(99)
    num_blocks = 4 * math.ceil(num_tokens / block_size)
    kv = torch.full((num_blocks, 2, block_size, heads, dim), float("nan"), dtype=dtype, device=device)
    kv_ref = kv.clone()
    key = torch.randn(num_tokens, heads, dim, generator=gen, device=device).to(dtype)
    value = torch.randn(num_tokens, heads, dim, generator=gen, device=device).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:num_tokens]
    slots[::7] = -1
    write_kv_triton(key, value, kv[:, 0], kv[:, 1], slots)
    write_kv_ref(key, value, kv_ref[:, 0], kv_ref[:, 1], slots)
    same = torch.equal(kv.isnan(), kv_ref.isnan())
    err = _err(torch.nan_to_num(kv, nan=0.0), torch.nan_to_num(kv_ref, nan=0.0))
    ok = same and err == 0.0
    # Large writes rotate over other source rows (16 MB of K/V at 4096 tokens would sit in L2).
    sources = [(key, value)] + [(torch.randn_like(key), torch.randn_like(value)) for _ in range(
        0 if num_tokens <= 256 or ctx.small else 5)]
    t = bench([lambda k=k, v=v: write_kv_triton(k, v, kv[:, 0], kv[:, 1], slots) for k, v in sources], iters=iters)
    ref_ms = bench([lambda k=k, v=v: write_kv_ref(k, v, kv_ref[:, 0], kv_ref[:, 1], slots) for k, v in sources],
                   iters=iters).ms
    nbytes = 4 * key.numel() * key.element_size()  # read K and V, write them
    shape = f"{num_tokens} tok h{heads} d{dim} b{block_size} {str(dtype).removeprefix('torch.')}"
    vs = f"{t.label()}; torch index_put {ref_ms:.4f} ms (x{ref_ms / t.ms:.2f})"
    return row("write_kv", shape, t.ms, nbytes=nbytes, copy_gbs=ctx.copy_gbs, ok=ok, max_err=err, vs=vs,
               method=t.method)


def _sizes(small: bool) -> dict:
    if small:  # a smoke run of this script (interpreter on CPU, the dry run, or a quick GPU look)
        return dict(S=3, CTX=80, LONG=300, PRE=48, H=4, KV=2, D=64, IT=3, FEW=1, TOK=(8, 40))
    return dict(S=64, CTX=4096, LONG=32768, PRE=4096, H=32, KV=8, D=128, IT=50, FEW=4, TOK=(64, 4096))


def cases(ctx: Context) -> list[Case]:
    """The checks, in the order they run (the target first, the sweep after the rest)."""
    z = _sizes(ctx.small)
    S, CTX, LONG, PRE, H, KV, D, IT, FEW = (z[k] for k in ("S", "CTX", "LONG", "PRE", "H", "KV", "D", "IT", "FEW"))
    bf16, f16 = torch.bfloat16, torch.float16
    dev = ctx.device

    def batch(seq_lens: list[int], q_lens: list[int], bs: int = 16, dtype: torch.dtype = bf16) -> PagedBatch:
        return _batch(seq_lens, q_lens, H, KV, D, bs, dtype, dev)

    def decode(seqs: int = S, bs: int = 16, dtype: torch.dtype = bf16, ctx_len: int = CTX, target: bool = False,
               compare_splits: bool = False) -> Case:
        shape = _shape(seqs, ctx_len, 1, H, KV, D, bs, dtype)
        op = "attention decode" + (" split-KV" if compare_splits else "")
        kv_bytes = 2 * seqs * ctx_len * KV * D * dtype.itemsize
        # K/V under ~3 L2s (60 MB): rotate over enough batches to read ~200 MB per cycle.
        extra = 0 if ctx.small else min(7, max(0, -(-200_000_000 // kv_bytes) - 1))

        def run(c: Context) -> dict:
            seq_lens = [ctx_len] * seqs
            rotate = [_batch(seq_lens, [1] * seqs, H, KV, D, bs, dtype, dev, seed=i + 1) for i in range(extra)]
            return _attention_case(op, batch(seq_lens, [1] * seqs, bs, dtype), c, shape, iters=IT,
                                   target=target and not c.small, compare_splits=compare_splits, rotate=rotate)

        method = "graph/events" + (f", rotating {extra + 1} batches" if extra else "")
        return Case(op, shape, run, method, "SDPA on dense KV" + ("; 1, n/2, 2n splits" * compare_splits))

    def split_forced() -> Case:
        shape = _shape(FEW, CTX, 1, H, KV, D, 32, f16, " 7 splits")
        return Case("attention split-KV forced", shape, lambda c: _attention_case(
            "attention split-KV forced", batch([CTX] * FEW, [1] * FEW, 32, f16), c, shape, iters=IT, num_splits=7),
            "graph/events", "SDPA on dense KV")

    def prefill(seqs: int, q_len: int) -> Case:
        shape = _shape(seqs, PRE, q_len, H, KV, D, 16, bf16)
        return Case("attention prefill", shape, lambda c: _attention_case(
            "attention prefill", batch([PRE] * seqs, [q_len] * seqs), c, shape, iters=max(3, IT // 3),
            bandwidth=False), "events", "SDPA causal on dense KV; TFLOP/s")

    def mixed() -> Case:  # decodes and prefix prefills in one launch
        n_dec = max(1, S // 2)
        shape = f"{n_dec} decodes x{CTX // 2} + 2 prefills h{H}/{KV} d{D} bf16"
        return Case("attention mixed", shape, lambda c: _attention_case(
            "attention mixed", batch([CTX // 2] * n_dec + [PRE // 2, PRE], [1] * n_dec + [PRE // 4, PRE // 2]),
            c, shape, iters=IT, sdpa=False, bandwidth=False), "events", "")

    def window() -> Case:
        shape = _shape(2 * FEW, PRE, PRE // 4, H, KV, D, 16, bf16, f" w{PRE // 4}")
        return Case("attention sliding window", shape, lambda c: _attention_case(
            "attention sliding window", batch([PRE] * FEW + [CTX] * FEW, [PRE // 4] * FEW + [1] * FEW), c, shape,
            iters=IT, sliding_window=PRE // 4, sdpa=False, bandwidth=False), "events", "")

    def write(n: int) -> Case:
        shape = f"{n} tok h{KV} d{D} b16 bfloat16"
        return Case("write_kv", shape, lambda c: _write_kv_case(n, KV, D, 16, bf16, c, IT),
                    "graph replay" if n <= 256 else "graph/events", "torch index_put (the reference)")

    def sweep() -> Case:
        shape = _shape(S, CTX, 1, H, KV, D, 16, bf16)
        n = len(sweep_configs(D, bf16))
        return Case(f"decode sweep ({n} configs)", shape, lambda c: _sweep(
            batch([CTX] * S, [1] * S), c, shape, IT), "graph/events", "each config vs the reference")

    return [
        decode(target=True),
        decode(bs=32),
        decode(seqs=max(1, S // 8), dtype=f16),
        decode(seqs=1, compare_splits=True),  # batch 1, 8 kv heads: splits or idles the card
        decode(seqs=FEW, ctx_len=LONG, compare_splits=True),
        split_forced(),
        prefill(1, PRE),
        prefill(FEW, PRE // 4),
        mixed(),
        window(),
        write(z["TOK"][0]),
        write(z["TOK"][1]),
        sweep(),
    ]


def dry_run(ctx: Context) -> None:
    """Everything host-side the cases do, at toy sizes on the CPU: batches, the dense
    SDPA inputs (and SDPA itself, a torch op), the reference, the split choice, the sweep."""
    z = _sizes(True)
    b = _batch([z["CTX"]] * 2, [1] * 2, z["H"], z["KV"], z["D"], 16, torch.float32, torch.device("cpu"))
    _sdpa_fn(b)()
    paged_attention_ref(*b.args())
    choose_num_splits(2 * z["KV"], z["CTX"], sm_count(torch.device("cpu")))
    assert sweep_configs(128, torch.bfloat16), "no sweep config fits"
    _attention_bytes(b), _attention_flops(b)


def run(copy_bw_gbs: float | None, small: bool = False) -> list[dict]:
    """Every case in order (for running this module alone)."""
    from experiments.gpu.common import Deadline

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = Context(device=device, copy_gbs=copy_bw_gbs, deadline=Deadline(1e9), small=small)
    rows: list[dict] = []
    for case in cases(ctx):
        result = case.run(ctx)
        rows += result if isinstance(result, list) else [result]
    return rows


if __name__ == "__main__":
    from experiments.gpu.common import measure_copy_bandwidth

    small = "--small" in sys.argv
    bw = measure_copy_bandwidth() if torch.cuda.is_available() else None
    for r in run(bw, small=small):
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
