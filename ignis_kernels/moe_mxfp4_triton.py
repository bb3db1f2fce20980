"""The MXFP4 grouped GEMM's Triton launch (ignis_kernels.moe_mxfp4 picks it for CUDA tensors)."""

from __future__ import annotations

import torch
import triton

from ignis_kernels.backend import interpreting
from ignis_kernels.moe_mxfp4_kernel import grouped_gemm_mxfp4_kernel
from ignis_kernels.moe_mxfp4_ref import check_mxfp4
from ignis_kernels.moe_triton import launch_args


def tile_m(num_rows: int, num_experts: int) -> int:
    """The row tile for a grouping of num_rows rows over num_experts experts, from shapes
    only (no host sync): decode steps give most experts a row or two, and a 64-row tile
    there would multiply zeros; 16 is tl.dot's least."""
    per_expert = triton.cdiv(max(num_rows, 1), num_experts)
    return 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64


def grouped_gemm_mxfp4_triton(
    x: torch.Tensor,
    blocks: torch.Tensor,
    scales: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """The Triton grouped GEMM with grouped_gemm_mxfp4_ref's contract. block_k is a multiple
    of 32 (whole groups a tile; 64 divides gpt-oss's 2880, so no tile is ragged there);
    block_m defaults to tile_m(M, E). Tiles are guesses aimed at Hopper; tests pass small ones."""
    M, Kx = x.shape
    E, N, K = check_mxfp4(blocks, scales)
    if Kx != K:
        raise ValueError(f"MXFP4 weight [{E}, {N}, {K}] does not take x {tuple(x.shape)}")
    if blocks.stride(-1) != 1 or blocks.stride(-2) != 16:
        raise ValueError("MXFP4 blocks must be contiguous within a row ([..., K/32, 16] with strides (16, 1))")
    if block_k % 32 or block_k < 32:
        raise ValueError(f"block_k must be a multiple of 32, got {block_k}")
    out, offsets, b = launch_args(x, E, N, expert_offsets, bias, out)
    if M == 0:
        return out
    block_m = block_m or tile_m(M, E)
    grid = (M // block_m + E, triton.cdiv(N, block_n))
    grouped_gemm_mxfp4_kernel[grid](
        x, blocks, scales, b, out, offsets,
        E, N, K,
        *x.stride(), blocks.stride(0), blocks.stride(1),
        *scales.stride(),
        *(bias.stride() if bias is not None else (0, 0)),
        *out.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        HAS_BIAS=bias is not None,
        UPCAST=interpreting(),
        FP32_DOT=x.dtype == torch.float32,
        EVEN_K=K % block_k == 0,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
