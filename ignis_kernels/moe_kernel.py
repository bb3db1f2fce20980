"""The grouped (per-expert) GEMM Triton kernel: one program per (row tile, column tile).

Rows arrive grouped by expert (ignis_kernels.moe_ref's layout). Expert e's row tiles are
numbered from offsets[e] // BLOCK_M + e, which leaves room for its cdiv(count, BLOCK_M)
tiles, so a grid of M // BLOCK_M + E row tiles covers any grouping and is sized without
reading the offsets back to the host (the paged-attention kernel numbers its query tiles
the same way). A program finds its expert by binary search over the offsets; tiles past
an expert's rows return at once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_expert(offsets_ptr, num_experts, tile, BLOCK_M: tl.constexpr):
    """The last e with offsets[e] // BLOCK_M + e <= tile (0 <= e < num_experts)."""
    lo = 0
    hi = num_experts
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(offsets_ptr + mid) // BLOCK_M + mid
        if first <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _expert_rows(offsets_ptr, num_experts, tile, BLOCK_M: tl.constexpr):
    """Row tile `tile`'s expert, its first row and its expert's end (first >= end: a tile
    past the expert's rows, nothing to do)."""
    e = _find_expert(offsets_ptr, num_experts, tile, BLOCK_M)
    start = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    return e, start + (tile - (start // BLOCK_M + e)) * BLOCK_M, end


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, FP32_DOT: tl.constexpr):
    # The interpreter computes bf16 dots wrongly: it gets fp32 operands instead.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif FP32_DOT:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def grouped_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, offsets_ptr,
    num_experts, N, K,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_be, stride_bn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    tile = tl.program_id(0)
    col_tile = tl.program_id(1)
    e, row0, end = _expert_rows(offsets_ptr, num_experts, tile, BLOCK_M)
    if row0 >= end:
        return
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    rows64 = rows.to(tl.int64)
    w_e = w_ptr + e.to(tl.int64) * stride_we

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_ok = k < K
        a = tl.load(x_ptr + rows64[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        # W^T tile: [BLOCK_K, BLOCK_N].
        b = tl.load(w_e + cols[None, :] * stride_wn + k[:, None] * stride_wk,
                    mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = _dot(a, b, acc, UPCAST, FP32_DOT)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + e.to(tl.int64) * stride_be + cols * stride_bn, mask=col_ok, other=0.0)
        acc = acc + bias.to(tl.float32)[None, :]
    tl.store(out_ptr + rows64[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
