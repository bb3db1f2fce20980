"""The grouped GEMM's Triton launch (ignis_kernels.moe picks it for CUDA tensors)."""

from __future__ import annotations

import torch
import triton

from ignis_kernels.backend import interpreting
from ignis_kernels.moe_kernel import grouped_gemm_kernel


def grouped_gemm_triton(
    x: torch.Tensor,
    w: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """The Triton grouped GEMM with grouped_gemm_ref's contract. Tiles default to guesses
    aimed at Hopper; tests pass small ones."""
    M, K = x.shape
    E, N, Kw = w.shape
    if Kw != K:
        raise ValueError(f"w {tuple(w.shape)} does not take x {tuple(x.shape)}")
    out, offsets, b = launch_args(x, E, N, expert_offsets, bias, out)
    if M == 0:
        return out
    grid = (M // block_m + E, triton.cdiv(N, block_n))
    grouped_gemm_kernel[grid](
        x, w, b, out, offsets,
        E, N, K,
        *x.stride(), *w.stride(),
        *(bias.stride() if bias is not None else (0, 0)),
        *out.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting(),
        FP32_DOT=x.dtype == torch.float32,
        num_warps=num_warps,
    )
    return out


def launch_args(
    x: torch.Tensor, E: int, N: int, expert_offsets: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, int32 offsets, the bias pointer) of a grouped GEMM over E experts' [N, K] weights,
    after checking the offsets' and bias's shapes (this one's and the MXFP4 one's launch)."""
    if expert_offsets.shape != (E + 1,):
        raise ValueError(f"expert_offsets must be [{E + 1}], got {tuple(expert_offsets.shape)}")
    if bias is not None and bias.shape != (E, N):
        raise ValueError(f"bias must be [{E}, {N}], got {tuple(bias.shape)}")
    if out is None:
        out = torch.empty(x.shape[0], N, dtype=x.dtype, device=x.device)
    # without a bias, an unused placeholder pointer
    return out, expert_offsets.to(torch.int32).contiguous(), bias if bias is not None else out
