"""GPU check of the grammar bitmask kernel (ignis_kernels.token_mask) at full size.

`run(copy_bw_gbs)` (same interface as the other checks, for check_kernels.py) applies
packed masks to 1, 64 and 256 rows of a 151,936-token vocabulary, bf16 and fp32:
the Triton kernel against the PyTorch reference (exact equality), and its time
against the reference and llguidance's own unpack-and-masked_fill formula (run
eagerly). gbs counts one read and one write of the masked rows plus the mask.
Imports cleanly on a CPU machine. Standalone: python experiments/gpu/token_mask_check.py
"""

from __future__ import annotations

import torch

VOCAB = 151_936


def _masks(rows: int, vocab: int, device: str, seed: int = 0) -> torch.Tensor:
    """Grammar-like masks: long runs allowed (a JSON string) or a few tokens (structure)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    words = (vocab + 31) // 32
    out = torch.zeros(rows, words, dtype=torch.int32)
    for r in range(rows):
        if r % 2:
            out[r] = -1  # all allowed...
            out[r, torch.randint(0, words, (words // 50,), generator=g)] = 0x7FFF7FFF  # ...but a few
        else:
            out[r, torch.randint(0, words, (8,), generator=g)] = 1 << 5
    return out.to(device)


def _unpack_fill(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """The usual formula (llguidance.torch's kernel, eager): repeat, shift, masked_fill."""
    bits = (torch.repeat_interleave(mask, 32, dim=1) >> torch.arange(32, device=mask.device, dtype=torch.int32)
            .repeat(mask.shape[1])) & 1
    logits.masked_fill_(bits[:, : logits.shape[1]] == 0, float("-inf"))


def run(copy_bw_gbs: float) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    from experiments.gpu.common import cuda_time, gbs
    from ignis_kernels.token_mask_triton import apply_token_bitmask_triton_
    from ignis_kernels.token_mask_ref import apply_token_bitmask_ref_

    out: list[dict] = []
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 64, 256):
            g = torch.Generator(device="cuda").manual_seed(rows)
            logits = torch.randn(rows, VOCAB, device="cuda", generator=g).to(dtype)
            mask = _masks(rows, VOCAB, "cuda", seed=rows)
            idx = torch.arange(rows, device="cuda")
            want, got = logits.clone(), logits.clone()
            apply_token_bitmask_ref_(want, mask, idx)
            apply_token_bitmask_triton_(got, mask, idx)
            ok = torch.equal(want, got)
            work = logits.clone()
            ms = cuda_time(lambda: apply_token_bitmask_triton_(work, mask, idx), iters=50, warmup=5)
            ref_ms = cuda_time(lambda: apply_token_bitmask_ref_(work, mask, idx), iters=20, warmup=3)
            fill_ms = cuda_time(lambda: _unpack_fill(work, mask), iters=20, warmup=3)
            nbytes = 2 * logits.numel() * logits.element_size() + mask.numel() * 4
            bw = gbs(nbytes, ms)
            out.append({
                "op": "token bitmask", "shape": f"{rows}x{VOCAB} {str(dtype).removeprefix('torch.')}",
                "ms": ms, "gbs": bw, "frac_bw": bw / copy_bw_gbs,
                "vs": f"reference {ref_ms:.3f} ms -> {ref_ms / ms:.1f}x; unpack+fill {fill_ms:.3f} ms -> {fill_ms / ms:.1f}x",
                "max_err": 0.0 if ok else float("nan"), "ok": ok,
            })
    return out


if __name__ == "__main__":
    from experiments.gpu.common import measure_copy_bandwidth

    bw = measure_copy_bandwidth()
    for r in run(bw):
        print(f"{r['op']:<16} {r['shape']:<24} {r['ms']:.4f} ms {r['gbs']:.0f} GB/s ok={r['ok']}  {r['vs']}")


def cases(ctx: "object") -> list:
    """check_kernels.py's interface: one case producing every row of `run`."""
    from experiments.gpu.common import Case

    return [Case("token mask (grammar bitmask)", f"1/64/256 x {VOCAB}", lambda c: run(c.copy_gbs), "events, median",
                 "reference, unpack + masked_fill")]
