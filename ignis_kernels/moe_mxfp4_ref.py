"""PyTorch reference of the mixture-of-experts ops over MXFP4 expert weights: the CPU path
and the oracle of ignis_kernels.moe_mxfp4_kernel.

MXFP4 (OCP microscaling: 4-bit e2m1 values sharing a power-of-two scale per 32 along K),
laid out as gpt-oss's HF checkpoints store a weight W [E, N, K] (y = x W^T, per expert):
  blocks  [E, N, K/32, 16] uint8   two e2m1 values a byte: the low nibble is element 2i of
                                   the 32-element group, the high nibble element 2i + 1
  scales  [E, N, K/32]     uint8   e8m0: the group's scale is 2^(byte - 127)
Everything else (x, expert_offsets, bias) is ignis_kernels.moe_ref's layout. This module stands
alone (ignis_kernels imports nothing of ignis; ignis.model.mxfp4 decodes the same layout).
"""

from __future__ import annotations

import torch

from ignis_kernels.moe_ref import GroupedGemm, moe_compose

# e2m1 by nibble (bit 3 the sign): each times a power of two is exact in fp32 and bf16.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def check_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[int, int, int]:
    """(E, N, K) of a pair of MXFP4 tensors, or ValueError when they do not pair."""
    if (blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() != 4
            or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales "
                         f"{tuple(scales.shape)} {scales.dtype} do not pair as [E, N, K/32, 16] and [E, N, K/32] uint8")
    E, N, G = scales.shape
    return E, N, G * 32


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [..., N, K] from blocks [..., N, K/32, 16] and scales [..., N, K/32] (exact in fp32)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    low, high = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    values = torch.stack((low, high), dim=-1).reshape(*scales.shape, 32)  # element 2i, then 2i + 1
    # ldexp keeps the e8m0 extremes exact: byte 0 is 2^-127 (an fp32 subnormal).
    w = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None].float())
    return w.reshape(*scales.shape[:-1], scales.shape[-1] * 32).to(dtype)


def grouped_gemm_mxfp4_ref(
    x: torch.Tensor,
    blocks: torch.Tensor,
    scales: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[offsets[e]:offsets[e+1]] = x[...] @ W[e]^T (+ bias[e]) for every expert e with rows,
    W[e] dequantized in fp32 one expert at a time (never the whole stack widened) and the
    product accumulated in fp32, as the kernel does."""
    E, N, K = check_mxfp4(blocks, scales)
    if x.shape[-1] != K:
        raise ValueError(f"MXFP4 weight [{E}, {N}, {K}] does not take x {tuple(x.shape)}")
    if out is None:
        out = torch.empty(x.shape[0], N, dtype=x.dtype, device=x.device)
    bounds = expert_offsets.tolist()
    for e in range(E):
        a, b = bounds[e], bounds[e + 1]
        if b > a:
            y = x[a:b].float() @ dequantize_mxfp4(blocks[e], scales[e]).T
            if bias is not None:
                y = y + bias[e].float()
            out[a:b] = y.to(out.dtype)
    return out


def moe_mxfp4_ref(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up_blocks: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down_blocks: torch.Tensor,
    down_scales: torch.Tensor,
    activation: str = "silu",
    grouped_gemm: GroupedGemm = grouped_gemm_mxfp4_ref,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """ignis_kernels.moe_ref.moe_ref's composition over MXFP4 experts: gate_up [E, 2I, H] (gate rows
    first: gpt-oss's checkpoints interleave gate and up rows, so the loader de-interleaves
    them) and down [E, H, I], each as blocks + scales; x [T, H] -> [T, H]."""
    return moe_compose(
        x, weights, ids, gate_up_blocks.shape[0], down_blocks.shape[1],
        lambda rows, offsets: grouped_gemm(rows, gate_up_blocks, gate_up_scales, offsets, gate_up_bias),
        lambda h, offsets: grouped_gemm(h, down_blocks, down_scales, offsets, down_bias),
        activation, alpha, limit,
    )
