"""Packed token bitmasks on logits, in place: the Triton kernel (the public op that picks it:
ignis_kernels.token_mask).

Contract: ignis_kernels.token_mask_ref. The kernel reads the mask words on the device, so the
launch needs no host synchronisation: one program per (row, block of tokens), each token's
word loaded (neighbours share it, so the loads hit the cache) and its bit tested.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignis_kernels.token_mask_ref import DEFAULT_FLOOR, check_args

BLOCK_V = 2048  # tokens per program: 64 words of mask, 8 KiB of fp32 logits


@triton.jit
def _token_bitmask_kernel(
    logits_ptr, mask_ptr, rows_ptr,
    vocab, num_words, floor,
    stride_lb, stride_lv, stride_mr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < vocab
    word_idx = offs // 32
    words = tl.load(mask_ptr + r.to(tl.int64) * stride_mr + word_idx, mask=inside & (word_idx < num_words), other=0)
    allowed = ((words >> (offs % 32)) & 1) != 0
    ptrs = logits_ptr + row * stride_lb + offs.to(tl.int64) * stride_lv
    x = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
    y = tl.where(allowed, tl.maximum(x, floor), float("-inf"))
    tl.store(ptrs, y.to(logits_ptr.dtype.element_ty), mask=inside)


def apply_token_bitmask_triton_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, floor: float = DEFAULT_FLOOR
) -> None:
    check_args(logits, bitmask, rows)
    R, V = rows.shape[0], logits.shape[1]
    if R == 0 or V == 0:
        return
    if bitmask.stride(1) != 1:
        bitmask = bitmask.contiguous()
    # A floor below the dtype's range would round to -inf in half precision.
    floor = max(floor, torch.finfo(logits.dtype).min)
    grid = (R, triton.cdiv(V, BLOCK_V))
    _token_bitmask_kernel[grid](
        logits, bitmask, rows,
        V, bitmask.shape[1], floor,
        logits.stride(0), logits.stride(1), bitmask.stride(0),
        BLOCK=BLOCK_V,
        num_warps=4,
    )
