"""GPU check of the paged-attention and KV-write kernels: correctness at full size, and time.

    run(copy_bw_gbs) -> list[dict]   (driven by experiments/gpu/check_kernels.py)

Each case checks the Triton kernel against its PyTorch reference on the same inputs
(caches poisoned with NaN outside the owned rows, as in the tests) and times it with
CUDA events (median after warmup), next to torch SDPA on the same K/V laid out densely.
Bandwidth-bound ops report GB/s (bytes the op must move / median time) and the fraction
of the measured copy bandwidth; prefill reports TFLOP/s in `vs` instead.

Targets (H200): decode at 64 seqs x 4k context, 32/8 heads, dim 128, bf16 reaches
>= 80% of copy bandwidth and is no slower than SDPA on dense KV (`target_met`).

Run alone: python experiments/gpu/attention_check.py [--small]
(--small: tiny shapes, also under TRITON_INTERPRET=1 on a CPU, to smoke-test the script).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.gpu.common import cuda_time, gbs, measure_copy_bandwidth  # noqa: E402
from kernels.attention import paged_attention_triton  # noqa: E402
from kernels.attention_ref import paged_attention_ref  # noqa: E402
from kernels.kv_cache import write_kv_triton  # noqa: E402
from kernels.kv_cache_ref import write_kv_ref  # noqa: E402
from kernels.testing import PagedBatch, make_paged_batch  # noqa: E402

TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
DECODE_TARGET_FRAC = 0.8


def _time(fn: Callable[[], object], iters: int) -> float:
    """Median ms: CUDA events on a GPU; wall clock elsewhere (smoke runs only)."""
    if torch.cuda.is_available():
        return cuda_time(fn, iters=iters, warmup=max(3, iters // 10))
    times = []
    for _ in range(min(iters, 3)):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _row(op: str, shape: str, ms: float | None, max_err: float, ok: bool, vs: str = "",
         nbytes: float | None = None, copy_bw: float | None = None, **extra) -> dict:
    rate = None if nbytes is None or not ms else gbs(nbytes, ms)
    frac = None if rate is None or not copy_bw else rate / copy_bw
    return {"op": op, "shape": shape, "ms": ms, "gbs": rate, "frac_bw": frac, "vs": vs,
            "max_err": max_err, "ok": ok, **extra}


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.float() - ref.float()).abs()
    return float("nan") if diff.isnan().any() else float(diff.max())


def _batch(seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, dim: int, block_size: int,
           dtype: torch.dtype, device: torch.device) -> PagedBatch:
    gen = torch.Generator(device=device).manual_seed(1234)
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


def _shape(batch: PagedBatch, block_size: int, extra: str = "") -> str:
    hq, dim = batch.q.shape[1], batch.q.shape[2]
    hkv = batch.k_cache.shape[2]
    n = len(batch.seq_lens_list)
    s = f"{n}x{max(batch.seq_lens_list)} q{batch.max_query_len} h{hq}/{hkv} d{dim} b{block_size}"
    return f"{s} {str(batch.q.dtype).removeprefix('torch.')}{extra}"


def _attention_case(op: str, batch: PagedBatch, block_size: int, copy_bw: float, *, iters: int,
                    sliding_window: int | None = None, num_splits: int | None = None,
                    sdpa: bool = True, bandwidth: bool = True, compare_splits: bool = False,
                    target: bool = False) -> dict:
    args = batch.args()
    hints = dict(max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len, num_splits=num_splits)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention_triton(*args, sliding_window=sliding_window, out=out, **hints)
    ref = paged_attention_ref(*args, sliding_window=sliding_window)
    err = _err(out, ref)
    ok = err <= TOL[batch.q.dtype]
    del ref

    ms = _time(lambda: paged_attention_triton(*args, sliding_window=sliding_window, out=out, **hints), iters)
    notes = []
    sdpa_ms = None
    if sdpa and sliding_window is None:
        fn = _sdpa_fn(batch)
        sdpa_ms = _time(fn, iters)
        notes.append(f"SDPA {sdpa_ms:.3f} ms (x{sdpa_ms / ms:.2f})")
        del fn
    if compare_splits:
        one = _time(lambda: paged_attention_triton(*args, out=out, **{**hints, "num_splits": 1}), iters)
        notes.append(f"no-split {one:.3f} ms")
    if not bandwidth:
        notes.append(f"{_attention_flops(batch) / (ms * 1e-3) / 1e12:.0f} TFLOP/s")
    extra = {}
    nbytes = _attention_bytes(batch) if bandwidth else None
    if target:
        frac = gbs(nbytes, ms) / copy_bw if copy_bw else 0.0
        met = frac >= DECODE_TARGET_FRAC and (sdpa_ms is None or ms <= sdpa_ms)
        extra = {"target": f">= {DECODE_TARGET_FRAC:.0%} copy bw and <= SDPA", "target_met": met}
        notes.append("target met" if met else "TARGET MISSED")
    return _row(op, _shape(batch, block_size, f" w{sliding_window}" if sliding_window else ""), ms, err, ok,
                "; ".join(notes), nbytes, copy_bw, **extra)


def _write_kv_case(num_tokens: int, heads: int, dim: int, block_size: int, dtype: torch.dtype,
                   device: torch.device, copy_bw: float, iters: int) -> dict:
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
    ms = _time(lambda: write_kv_triton(key, value, kv[:, 0], kv[:, 1], slots), iters)
    ref_ms = _time(lambda: write_kv_ref(key, value, kv_ref[:, 0], kv_ref[:, 1], slots), iters)
    nbytes = 4 * key.numel() * key.element_size()  # read K and V, write them
    shape = f"{num_tokens} tok h{heads} d{dim} b{block_size} {str(dtype).removeprefix('torch.')}"
    vs = f"torch index_put {ref_ms:.4f} ms" + ("; launch-bound" if num_tokens <= 256 else "")
    return _row("write_kv", shape, ms, err, ok, vs, nbytes, copy_bw)


def cases(small: bool, device: torch.device) -> list[Callable[[float], dict]]:
    """The checks, each a function of the copy bandwidth (GB/s) returning one row."""
    bf16, f16 = torch.bfloat16, torch.float16
    if small:  # a smoke run of this script (interpreter on CPU, or a quick GPU look)
        S, CTX, LONG, PRE, H, KV, D, IT, FEW = 3, 80, 300, 48, 4, 2, 64, 3, 1
    else:
        S, CTX, LONG, PRE, H, KV, D, IT, FEW = 64, 4096, 32768, 4096, 32, 8, 128, 50, 4

    def batch(seq_lens: list[int], q_lens: list[int], bs: int = 16, dtype: torch.dtype = bf16) -> PagedBatch:
        return _batch(seq_lens, q_lens, H, KV, D, bs, dtype, device)

    def decode(bw: float, bs: int = 16, dtype: torch.dtype = bf16, seqs: int = S, target: bool = False) -> dict:
        b = batch([CTX] * seqs, [1] * seqs, bs, dtype)
        return _attention_case("attention decode", b, bs, bw, iters=IT, target=target)

    def split_auto(bw: float) -> dict:  # few long sequences: the heuristic splits
        b = batch([LONG] * FEW, [1] * FEW)
        return _attention_case("attention decode split-KV", b, 16, bw, iters=IT, compare_splits=True)

    def split_forced(bw: float) -> dict:
        b = batch([CTX] * FEW, [1] * FEW, 32, f16)
        return _attention_case("attention split-KV forced", b, 32, bw, iters=IT, num_splits=7)

    def prefill(bw: float, seqs: int, q_len: int) -> dict:
        b = batch([PRE] * seqs, [q_len] * seqs)
        return _attention_case("attention prefill", b, 16, bw, iters=max(3, IT // 3), bandwidth=False)

    def mixed(bw: float) -> dict:  # decodes and prefix prefills in one launch
        n_dec = max(1, S // 2)
        b = batch([CTX // 2] * n_dec + [PRE // 2, PRE], [1] * n_dec + [PRE // 4, PRE // 2])
        return _attention_case("attention mixed", b, 16, bw, iters=IT, sdpa=False, bandwidth=False)

    def window(bw: float) -> dict:
        b = batch([PRE] * FEW + [CTX] * FEW, [PRE // 4] * FEW + [1] * FEW)
        return _attention_case("attention sliding window", b, 16, bw, iters=IT, sliding_window=PRE // 4,
                               sdpa=False, bandwidth=False)

    def write(bw: float, n: int) -> dict:
        return _write_kv_case(n, KV, D, 16, bf16, device, bw, IT)

    tokens = (8, 40) if small else (64, 4096)
    return [
        lambda bw: decode(bw, target=not small),
        lambda bw: decode(bw, bs=32),
        lambda bw: decode(bw, dtype=f16, seqs=max(1, S // 8)),
        split_auto,
        split_forced,
        lambda bw: prefill(bw, 1, PRE),
        lambda bw: prefill(bw, FEW, PRE // 4),
        mixed,
        window,
        lambda bw: write(bw, tokens[0]),
        lambda bw: write(bw, tokens[1]),
    ]


def run(copy_bw_gbs: float, small: bool = False) -> list[dict]:
    """Check and time every attention / KV kernel; one row per case (see module doc)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for case in cases(small, device):
        try:
            rows.append(case(copy_bw_gbs))
        except Exception as exc:  # one case failing must not hide the others
            traceback.print_exc()
            rows.append(_row("attention_check", "-", None, float("nan"), False,
                             f"crashed: {type(exc).__name__}: {exc}"[:160]))
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    small = "--small" in sys.argv
    bw = measure_copy_bandwidth() if torch.cuda.is_available() else 0.0
    for r in run(bw, small=small):
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
