"""Mixture-of-experts ops: the grouped GEMM (Triton or reference) and the MoE block over it.

    weights, ids = route(router_logits, top_k, renormalize=True)
    y = moe(x, weights, ids, w_gate_up, w_down, activation="silu",     # [T, H]
            gate_up_bias=None, down_bias=None)                          # gpt-oss: biases, swiglu_oai
    y = grouped_gemm(x, w, expert_offsets, bias=None)                  # rows grouped by expert

MXFP4 experts (gpt-oss's, kept packed on the GPU): ignis_kernels.moe_mxfp4's grouped_gemm_mxfp4, moe_mxfp4.
Layouts are ignis_kernels.moe_ref's. `moe` runs the same composition on either backend; only
the grouped GEMM differs. Nothing here reads a value back to the host on the Triton path.
"""

from __future__ import annotations

import torch
import triton

from ignis_kernels.backend import Backend, interpreting, use_triton
from ignis_kernels.moe_kernel import grouped_gemm_kernel
from ignis_kernels.moe_ref import glu, group_by_expert, grouped_gemm_ref, moe_ref, route

__all__ = ["glu", "group_by_expert", "grouped_gemm", "grouped_gemm_triton", "moe", "route"]


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
    if expert_offsets.shape != (E + 1,):
        raise ValueError(f"expert_offsets must be [{E + 1}], got {tuple(expert_offsets.shape)}")
    if bias is not None and bias.shape != (E, N):
        raise ValueError(f"bias must be [{E}, {N}], got {tuple(bias.shape)}")
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    offsets = expert_offsets.to(torch.int32).contiguous()
    b = bias if bias is not None else out  # an unused placeholder pointer
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


def grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Rows offsets[e]:offsets[e+1] of x times expert e's weight (see ignis_kernels.moe_ref)."""
    if use_triton(x, backend):
        return grouped_gemm_triton(x, w, expert_offsets, bias, out)
    return grouped_gemm_ref(x, w, expert_offsets, bias, out)


def moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: str = "silu",
    backend: Backend | None = None,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """The routed experts' gated MLPs, weighted and summed per token (ignis_kernels.moe_ref.moe_ref)."""
    extra = dict(gate_up_bias=gate_up_bias, down_bias=down_bias, alpha=alpha, limit=limit)
    gemm = grouped_gemm_triton if use_triton(x, backend) else grouped_gemm_ref
    return moe_ref(x, weights, ids, w_gate_up, w_down, activation, grouped_gemm=gemm, **extra)
