"""GPU check of the sort-free sampling kernel at full size (256 rows x 151,936 vocab).

`run(copy_bw_gbs)` (called by check_kernels.py) checks the Triton kernel against the
PyTorch reference (token mismatches and kept-set mismatches per row, logprob error)
and times it, the reference and the usual torch.sort-based top-k/top-p sampler with
CUDA events. gbs counts ONE read of the logits per call, so frac_bw near 1/passes
means the kernel runs at copy bandwidth. Imports cleanly on a CPU machine.
"""

from __future__ import annotations

import random
from typing import Callable

import torch

from kernels.sampling_params import SamplingTensors

ROWS, VOCAB = 256, 151_936


def sort_sampler(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The usual sort-based sampler (as vLLM's apply_top_k_top_p): sort, mask the top-k
    tail, softmax, cumsum, mask the top-p tail, scatter back, softmax, multinomial."""
    x = logits.float() / temperature.clamp(min=1e-5)[:, None]
    vals, idx = x.sort(dim=-1)  # ascending
    V = x.shape[1]
    kth = vals.gather(1, (V - top_k.long()).clamp(0, V - 1)[:, None])
    vals = vals.masked_fill(vals < kth, float("-inf"))
    cum = vals.softmax(-1).cumsum(-1)
    drop = cum <= 1 - top_p[:, None]
    drop[:, -1] = False
    vals = vals.masked_fill(drop, float("-inf"))
    probs = torch.empty_like(x).scatter_(1, idx, vals).softmax(-1)
    return torch.multinomial(probs, 1)[:, 0]


def make_logits(rows: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """LLM-like rows: a wide Gaussian bulk plus a peaked head at random positions."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device=device) * 2.5
    head = torch.randint(0, vocab, (rows, 64), generator=g, device=device)
    boost = torch.linspace(10, 3, 64, device=device).expand(rows, -1)
    return x.scatter_add_(1, head, boost).to(dtype)


def make_params(rows: int, kind: str, device: str, vocab: int = VOCAB, seed: int = 0) -> SamplingTensors:
    """kind: greedy | temperature | topk_topp | min_p | mixed | penalties."""
    rng = random.Random(seed)
    temps, ks, ps, mps = [1.0] * rows, [0] * rows, [1.0] * rows, [0.0] * rows
    kw: dict = {}
    for i in range(rows):
        k = kind if kind != "mixed" else rng.choice(["greedy", "temperature", "topk_topp", "topk_topp", "min_p", "top_p"])
        if k == "greedy":
            temps[i] = 0.0
        elif k == "topk_topp":
            temps[i], ks[i], ps[i] = rng.choice([0.6, 0.8, 1.0]), rng.choice([20, 50, 100]), rng.choice([0.8, 0.9, 0.95])
        elif k == "top_p":
            temps[i], ps[i] = rng.choice([0.7, 1.0]), rng.choice([0.9, 0.95])
        elif k == "min_p":
            mps[i] = rng.choice([0.02, 0.05, 0.1])
    if kind == "penalties":
        ks, ps = [50] * rows, [0.9] * rows
        kw = dict(
            repetition_penalty=[1.1] * rows, presence_penalty=[0.5] * rows, frequency_penalty=[0.3] * rows,
            prompt_tokens=[[rng.randrange(vocab) for _ in range(2048)] for _ in range(rows)],
            output_tokens=[[rng.randrange(vocab) for _ in range(256)] for _ in range(rows)],
        )
    return SamplingTensors.from_lists(temps, top_k=ks, top_p=ps, min_p=mps, seed=[rng.getrandbits(63) for _ in range(rows)],
                                      step=[rng.randrange(1000) for _ in range(rows)], device=device, **kw)


def _compare(x: torch.Tensor, params: SamplingTensors) -> tuple[float, float, float]:
    """(token mismatch fraction, kept-set mismatch fraction, max logprob error)."""
    from kernels.sampling_penalties import apply_penalties_dense
    from kernels.sampling_ref import keep_mask, sample_ref
    from kernels.sampling_triton import sample_triton, sample_triton_debug

    tokens, lp = sample_triton(x, params, return_logprobs=True)
    want, want_lp = sample_ref(x, params, return_logprobs=True)
    _, tau, _ = sample_triton_debug(x, params)
    xp = apply_penalties_dense(x.float(), params)
    sampled = params.temperature >= 1e-5
    keep_diff = ((keep_mask(xp, params) != (xp >= tau[:, None])).any(1) & sampled).float().mean().item()
    return (tokens != want).float().mean().item(), keep_diff, (lp - want_lp).abs().max().item()


def run(copy_bw_gbs: float) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    from experiments.gpu.common import cuda_time, gbs
    from kernels.sampling_ref import sample_ref
    from kernels.sampling_triton import TritonSamplerConfig, sample_triton

    rows: list[dict] = []
    dev = "cuda"

    def row(op: str, shape: str, ms: float, nbytes: int, vs: str, err: float | None, ok: bool) -> dict:
        bw = gbs(nbytes, ms)
        return {"op": op, "shape": shape, "ms": ms, "gbs": bw, "frac_bw": bw / copy_bw_gbs,
                "vs": vs, "max_err": err, "ok": ok}

    def timed(fn: Callable[[], object], iters: int = 30) -> float:
        return cuda_time(fn, iters=iters, warmup=3)

    for dtype in (torch.bfloat16, torch.float32):
        x = make_logits(ROWS, VOCAB, dtype, dev)
        shape = f"{ROWS}x{VOCAB} {str(dtype).removeprefix('torch.')}"
        nbytes = x.numel() * x.element_size()
        base = make_params(ROWS, "topk_topp", dev)
        sort_ms = timed(lambda: sort_sampler(x, base.temperature, base.top_k, base.top_p))
        rows.append(row("sort sampler (top-k/p)", shape, sort_ms, nbytes, "baseline", None, True))
        for kind in ("topk_topp", "mixed", "greedy", "temperature", "min_p", "penalties"):
            params = base if kind == "topk_topp" else make_params(ROWS, kind, dev)
            mism, keep_diff, lp_err = _compare(x, params)
            ms = timed(lambda: sample_triton(x, params))
            ok = mism <= 0.01 and keep_diff <= 0.01 and lp_err <= 1e-3
            vs = f"torch.sort {sort_ms:.2f} ms -> {sort_ms / ms:.1f}x; kept-set diff {keep_diff:.3f}; lp err {lp_err:.1e}"
            rows.append(row(f"sample triton ({kind})", shape, ms, nbytes, vs, mism, ok))
        ref_ms = timed(lambda: sample_ref(x, base), iters=5)
        rows.append(row("sample_ref (top-k/p)", shape, ref_ms, nbytes, f"vs sort {sort_ms / ref_ms:.2f}x", None, True))
        # The default config was chosen by compiling for sm_90 only: time a few neighbours.
        if dtype == torch.bfloat16:
            for cfg in (TritonSamplerConfig(block=4096, block_p=512, num_warps=16),
                        TritonSamplerConfig(block=2048, block_p=256, num_warps=4),
                        TritonSamplerConfig(block=2048, block_p=512, num_pivots=4),
                        TritonSamplerConfig(block=4096, block_p=1024, num_pivots=16, num_warps=16)):
                ms = timed(lambda: sample_triton(x, base, config=cfg))
                label = f"b{cfg.block}/p{cfg.block_p}/np{cfg.num_pivots}/w{cfg.num_warps}"
                rows.append(row(f"sample config {label}", shape, ms, nbytes, f"torch.sort -> {sort_ms / ms:.1f}x", None, True))
        del x
        torch.cuda.empty_cache()
    # Small batches: one program per row leaves most SMs idle.
    for B in (1, 32):
        x = make_logits(B, VOCAB, torch.bfloat16, dev)
        params = make_params(B, "topk_topp", dev)
        sort_ms = timed(lambda: sort_sampler(x, params.temperature, params.top_k, params.top_p))
        ms = timed(lambda: sample_triton(x, params))
        rows.append(row("sample triton (topk_topp)", f"{B}x{VOCAB} bfloat16", ms, x.numel() * 2,
                        f"torch.sort {sort_ms:.3f} ms -> {sort_ms / ms:.1f}x", None, True))
    return rows
