"""Weight-only quantized matmul on the GPU (W8A16 / W4A16 with group scales): the weight
streams from memory in its compact form and is dequantized in registers, tile by tile.

Decode is bandwidth bound: at one row a bf16 weight costs 2 bytes per parameter, int8
one, int4 half (plus a scale and zero per group), so the kernel's whole job is to read
the packed weight once at full bandwidth. One program owns a BLOCK_M x BLOCK_N tile of
the output and walks K in BLOCK_K steps: load x's tile, load the packed weight tile
(for 4 bits each byte is read for its two nibbles), load the group scales/zeros of
those columns, dequantize to x's dtype, and accumulate with tl.dot in fp32. Layout
and semantics: ignis_kernels/wo_matmul_ref.py (the oracle, same signature).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ignis_kernels.backend import Backend, interpreting, use_triton
from ignis_kernels.wo_matmul_ref import wo_matmul_ref


@triton.jit
def wo_matmul_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_qn, stride_qk,
    stride_sn, stride_sg,
    stride_om, stride_on,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,  # the interpreter's bf16 tl.dot is wrong: dot in fp32 there
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        # The weight tile transposed: [BLOCK_K, BLOCK_N], k along rows, so tl.dot(x, w).
        wmask = k_ok[:, None] & n_ok[None, :]
        if BITS == 4:
            byte = tl.load(q_ptr + rn[None, :] * stride_qn + (k[:, None] // 2) * stride_qk, mask=wmask, other=0)
            q = ((byte.to(tl.int32) >> ((k[:, None] % 2) * 4)) & 0xF).to(tl.float32) - 8.0
        else:
            q = tl.load(q_ptr + rn[None, :] * stride_qn + k[:, None] * stride_qk, mask=wmask, other=0).to(tl.float32)
        g = k // GROUP
        s = tl.load(s_ptr + rn[None, :] * stride_sn + g[:, None] * stride_sg, mask=wmask, other=0.0).to(tl.float32)
        w = q * s
        if HAS_ZEROS:
            z = tl.load(z_ptr + rn[None, :] * stride_sn + g[:, None] * stride_sg, mask=wmask, other=0.0)
            w += z.to(tl.float32)
        if UPCAST:
            acc += tl.dot(x.to(tl.float32), w)
        else:
            acc += tl.dot(x, w.to(x.dtype))
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class WoTileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def wo_tile_config(M: int, bits: int) -> WoTileConfig:
    """Untuned guesses aimed at Hopper (tl.dot needs >= 16 per side): decode rows (M <= 16)
    take a 16-row tile and wide N tiles so many programs stream the weight; larger M a
    square-ish tile. Checked to fit sm_90's shared memory by tests/kernels/test_wo_matmul.py."""
    if M <= 16:  # 4-bit: a longer K step per load (registers allow it at 16 rows only)
        return WoTileConfig(16, 64, 128 if bits == 4 else 64, num_warps=4, num_stages=4)
    if M <= 64:
        return WoTileConfig(64, 64, 64, num_warps=4, num_stages=3)
    return WoTileConfig(128, 128, 64, num_warps=8, num_stages=3)


def wo_matmul_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None = None,
    *,
    bits: int,
    group_size: int,
    out: torch.Tensor | None = None,
    config: WoTileConfig | None = None,
) -> torch.Tensor:
    """The Triton kernel with the contract of wo_matmul_ref; config overrides the tiles."""
    M, K = x.shape
    N = qweight.shape[0]
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if qweight.shape[1] * (2 if bits == 4 else 1) != K or K % group_size:
        raise ValueError(f"qweight {tuple(qweight.shape)} / group {group_size} do not fit K = {K}")
    if scales.shape != (N, K // group_size) or (zeros is not None and zeros.shape != scales.shape):
        raise ValueError(f"scales {tuple(scales.shape)} do not fit [{N}, {K // group_size}]")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    cfg = config or wo_tile_config(M, bits)
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n))
    wo_matmul_kernel[grid](
        x, qweight, scales, zeros if zeros is not None else scales, out,
        M, N, K,
        *x.stride(), *qweight.stride(), *scales.stride(), *out.stride(),
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        UPCAST=interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def wo_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None = None,
    *,
    bits: int,
    group_size: int,
    out: torch.Tensor | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """y = x W^T with W weight-only quantized (see ignis_kernels/wo_matmul_ref.py for the layout)."""
    if use_triton(x, backend):
        return wo_matmul_triton(x, qweight, scales, zeros, bits=bits, group_size=group_size, out=out)
    return wo_matmul_ref(x, qweight, scales, zeros, bits=bits, group_size=group_size, out=out)


__all__ = ["WoTileConfig", "wo_matmul", "wo_matmul_triton", "wo_tile_config"]
