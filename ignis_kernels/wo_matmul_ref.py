"""PyTorch reference of the weight-only quantized matmul: the oracle of the Triton kernel
(ignis_kernels/wo_matmul.py) and its CPU path.

Layout (shared with the kernel), y = x W^T with W [N, K] held as:
  bits 8: qweight int8  [N, K];      W[n, k] = q[n, k] * scales[n, k // G]  (+ zeros[n, k // G])
  bits 4: qweight uint8 [N, K // 2]; byte j of row n holds k = 2j (low nibble) and
          k = 2j + 1 (high nibble), q in [0, 16); W[n, k] = (q - 8) * scales[n, k // G]
          + zeros[n, k // G]
  scales, zeros [N, K // G] in x's dtype (zeros None = 0). G = group_size divides K.
This holds llama.cpp's blocks exactly: Q8_0 (8 bits, G 32, no zeros), Q4_0 (zeros 0),
Q4_1 (zeros m + 8d) and Q4_K's 32-wide sub-blocks (see ignis/model/gguf_quant.py).
"""

from __future__ import annotations

import torch


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values in [0, 16) -> [N, K // 2] uint8, two per byte (even k in the low nibble)."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: [N, K // 2] uint8 -> [N, K] uint8."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def dequantize_weight(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, group_size: int
) -> torch.Tensor:
    """W [N, K] in fp32."""
    if bits == 4:
        q = unpack_int4(qweight).float() - 8
    elif bits == 8:
        q = qweight.float()
    else:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    s = scales.float().repeat_interleave(group_size, dim=1)
    w = q * s
    if zeros is not None:
        w = w + zeros.float().repeat_interleave(group_size, dim=1)
    return w


def wo_matmul_ref(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None = None,
    *,
    bits: int,
    group_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ W^T in x's dtype, accumulated in fp32."""
    w = dequantize_weight(qweight, scales, zeros, bits, group_size)
    y = (x.float() @ w.t()).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
