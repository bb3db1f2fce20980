"""The grouped (per-expert) GEMM over MXFP4 weights, Triton: one program per (row tile, column
tile), the weights decoded in registers so the experts stay packed in memory (4.25 bits a
weight: gpt-oss-20b is ~13 GB so, 2-4x that widened).

Tiles are numbered as ignis_kernels.moe_kernel's (expert e's row tiles from offsets[e] // BLOCK_M
+ e: a grid of M // BLOCK_M + E row tiles, sized without a host sync; a binary search finds
a program's expert). Each K step loads BLOCK_K/2 bytes of each of BLOCK_N weight rows and
their BLOCK_K/32 scale bytes (BLOCK_K a multiple of 32: a tile holds whole groups), builds
the e2m1 values and the e8m0 scales from their bits (exact), scales them in the
activation's dtype and accumulates x W^T in fp32. EVEN_K (K a multiple of BLOCK_K, as
gpt-oss's 2880 is of 64) drops the K masks, which lets the weight rows load as 16-byte
async copies (8-byte with the masks, per sm_90 compiles). Layouts: ignis_kernels.moe_mxfp4_ref.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ignis_kernels.moe_kernel import _dot, _expert_rows


@triton.jit
def _e2m1_to_fp32(nibble):
    """The e2m1 value of each 4-bit code (bit 3 sign, bits 1-2 exponent, bit 0 mantissa), as
    fp32 bits: exponent 0 is 0 or 0.5 (the subnormal), else (1 + m/2) * 2^(exponent - 1)."""
    n = nibble.to(tl.uint32)
    ex = (n >> 1) & 3
    m = n & 1
    normal = ((ex + 126) << 23) | (m << 22)  # fp32 exponent field ex - 1 + 127
    magnitude = tl.where(ex == 0, m * 0x3F000000, normal)  # 0x3F000000: 0.5
    return (magnitude | ((n & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_to_fp32(scale):
    """2^(byte - 127) as fp32 bits: the byte is the exponent field, except 0 (2^-127, a
    subnormal). 255 gives inf, as ldexp does."""
    s = scale.to(tl.uint32)
    return tl.where(s == 0, 0x00400000, s << 23).to(tl.float32, bitcast=True)


@triton.jit
def grouped_gemm_mxfp4_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, offsets_ptr,
    num_experts, N, K,
    stride_xm, stride_xk,
    stride_we, stride_wn,
    stride_se, stride_sn, stride_sg,
    stride_be, stride_bn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    FP32_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # w_ptr: the blocks as [E, N, K/2] bytes (a row's groups contiguous, 16 bytes each).
    tile = tl.program_id(0)
    col_tile = tl.program_id(1)
    e, row0, end = _expert_rows(offsets_ptr, num_experts, tile, BLOCK_M)
    if row0 >= end:
        return
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    e64 = e.to(tl.int64)
    w_rows = w_ptr + e64 * stride_we + cols64[:, None] * stride_wn
    s_rows = s_ptr + e64 * stride_se + cols64[:, None] * stride_sn
    ks = tl.arange(0, BLOCK_K)
    kb = tl.arange(0, BLOCK_K // 2)
    kg = tl.arange(0, BLOCK_K // 32)
    # The weights are scaled in the activation's dtype, except under the interpreter, which
    # multiplies bf16 wrongly (as it dots them): fp32 there, the same values (all exact).
    if UPCAST:
        dtype = tl.float32
    else:
        dtype = x_ptr.dtype.element_ty

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        byte = k0 // 2 + kb
        group = k0 // 32 + kg
        if EVEN_K:  # no K masks: the weight rows load in 16-byte vectors
            a = tl.load(x_ptr + rows64[:, None] * stride_xm + k[None, :] * stride_xk, mask=row_ok[:, None], other=0.0)
            packed = tl.load(w_rows + byte[None, :], mask=col_ok[:, None], other=0)
            scale = tl.load(s_rows + group[None, :] * stride_sg, mask=col_ok[:, None], other=127)
        else:  # K is a multiple of 32, so the last tile's tail is whole groups
            a = tl.load(x_ptr + rows64[:, None] * stride_xm + k[None, :] * stride_xk,
                        mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
            packed = tl.load(w_rows + byte[None, :], mask=col_ok[:, None] & (byte < K // 2)[None, :], other=0)
            scale = tl.load(s_rows + group[None, :] * stride_sg,
                            mask=col_ok[:, None] & (group < K // 32)[None, :], other=127)
        # Byte j holds elements 2j (low nibble) and 2j + 1 (high): join puts them side by side.
        values = _e2m1_to_fp32(tl.join(packed & 0x0F, packed >> 4)).to(dtype)  # [BLOCK_N, BLOCK_K/2, 2]
        values = tl.reshape(values, [BLOCK_N, BLOCK_K // 32, 32])
        w = values * _e8m0_to_fp32(scale).to(dtype)[:, :, None]  # exact: powers of two times 2-bit mantissas
        w = tl.reshape(w, [BLOCK_N, BLOCK_K])
        acc = _dot(a, tl.trans(w), acc, UPCAST, FP32_DOT)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + e64 * stride_be + cols * stride_bn, mask=col_ok, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    tl.store(out_ptr + rows64[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
