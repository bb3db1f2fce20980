"""Mixture-of-experts ops over MXFP4 expert weights (gpt-oss): the grouped GEMM (Triton or
reference) and the MoE block over it, ignis_kernels.moe's ops with each weight given as
(blocks, scales) in the layout of gpt-oss's HF checkpoints (ignis_kernels.moe_mxfp4_ref).

    y = grouped_gemm_mxfp4(x, blocks, scales, expert_offsets, bias=None)   # rows grouped by expert
    y = moe_mxfp4(x, weights, ids, gate_up_blocks, gate_up_scales,         # [T, H]
                  down_blocks, down_scales, activation="swiglu_oai",
                  gate_up_bias=None, down_bias=None)

gate_up's rows are gate rows first (ignis_kernels.moe_ref's layout); gpt-oss's checkpoints
interleave them (even rows gate, odd rows up), so the loader permutes the rows of blocks
and scales at load. The Triton launch is ignis_kernels.moe_mxfp4_triton, imported only when it
runs. Nothing here reads a value back to the host on the Triton path.
"""

from __future__ import annotations

import torch

from ignis_kernels.backend import Backend, use_triton
from ignis_kernels.moe_mxfp4_ref import dequantize_mxfp4, grouped_gemm_mxfp4_ref, moe_mxfp4_ref

__all__ = ["dequantize_mxfp4", "grouped_gemm_mxfp4", "moe_mxfp4"]


def grouped_gemm_mxfp4(
    x: torch.Tensor,
    blocks: torch.Tensor,
    scales: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Rows offsets[e]:offsets[e+1] of x times expert e's MXFP4 weight (ignis_kernels.moe_mxfp4_ref)."""
    if use_triton(x, backend):
        from ignis_kernels.moe_mxfp4_triton import grouped_gemm_mxfp4_triton

        return grouped_gemm_mxfp4_triton(x, blocks, scales, expert_offsets, bias, out)
    return grouped_gemm_mxfp4_ref(x, blocks, scales, expert_offsets, bias, out)


def moe_mxfp4(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    activation: str = "silu",
    backend: Backend | None = None,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """The routed experts' gated MLPs over MXFP4 weights (ignis_kernels.moe_mxfp4_ref.moe_mxfp4_ref)."""
    extra = dict(gate_up_bias=gate_up_bias, down_bias=down_bias, alpha=alpha, limit=limit)
    gemm = grouped_gemm_mxfp4_ref
    if use_triton(x, backend):
        from ignis_kernels.moe_mxfp4_triton import grouped_gemm_mxfp4_triton as gemm
    return moe_mxfp4_ref(x, weights, ids, gate_up_blocks, gate_up_scales, down_blocks, down_scales, activation,
                         grouped_gemm=gemm, **extra)
