"""Mixture-of-experts ops: the grouped GEMM (Triton or reference) and the MoE block over it.

    weights, ids = route(router_logits, top_k, renormalize=True)
    y = moe(x, weights, ids, w_gate_up, w_down, activation="silu",     # [T, H]
            gate_up_bias=None, down_bias=None)                          # gpt-oss: biases, swiglu_oai
    y = grouped_gemm(x, w, expert_offsets, bias=None)                  # rows grouped by expert

MXFP4 experts (gpt-oss's, kept packed on the GPU): ignis_kernels.moe_mxfp4's grouped_gemm_mxfp4, moe_mxfp4.
Layouts are ignis_kernels.moe_ref's. `moe` runs the same composition on either backend; only
the grouped GEMM differs (the Triton one: ignis_kernels.moe_triton, imported only when it runs,
as Triton's import alone is ~70 MB of a CPU server's memory). Nothing here reads a value back
to the host on the Triton path.
"""

from __future__ import annotations

import torch

from ignis_kernels.backend import Backend, use_triton
from ignis_kernels.moe_ref import glu, group_by_expert, grouped_gemm_ref, moe_ref, route

__all__ = ["glu", "group_by_expert", "grouped_gemm", "moe", "route"]


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
        from ignis_kernels.moe_triton import grouped_gemm_triton

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
    gemm = grouped_gemm_ref
    if use_triton(x, backend):
        from ignis_kernels.moe_triton import grouped_gemm_triton as gemm
    return moe_ref(x, weights, ids, w_gate_up, w_down, activation, grouped_gemm=gemm, **extra)
