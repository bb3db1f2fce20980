"""MXFP4 (OCP microscaling, 4-bit e2m1 values sharing a power-of-two scale per 32): the
form gpt-oss's checkpoints ship their experts in.

HF checkpoints store a weight W [..., N, K] as `<name>_blocks` [..., N, K/32, 16] uint8
(two values a byte, the low nibble first: elements 2i and 2i+1) and `<name>_scales`
[..., N, K/32] uint8 (e8m0: the scale is 2^(byte - 127)). GGUF's MXFP4 blocks hold the
same values in ggml's order (ignis/model/gguf_quant.py decode_mxfp4).
"""

from __future__ import annotations

import torch

# e2m1's 16 values by nibble (sign bit 3): every product with a power of two is exact in fp32/bf16.
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequantize_hf(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [..., N, K] from an HF checkpoint's `_blocks` [..., N, G, 16] and `_scales` [..., N, G]."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales "
                         f"{tuple(scales.shape)} {scales.dtype} do not pair")
    lut = E2M1.to(dtype)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1)  # [..., G, 16, 2]
    values = values.reshape(*scales.shape, 32)
    out = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None].to(dtype))
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 32)
