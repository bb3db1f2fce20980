"""KV-cache write's Triton kernel: scatter the new K/V rows of a step into the paged caches
(the public op that picks it: ignis_kernels.kv_cache).

One program per (token, chunk of kv heads). The slot is read on the device, so the
launch needs no host synchronisation; slot -1 (padding) makes the program return
before touching the caches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements of one (token, head-chunk) tile; bounds registers for wide models.
_MAX_TILE = 2048


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    num_heads, head_dim,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAD_D: tl.constexpr,  # BLOCK_D != head_dim
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    if PAD_D:
        mask = (h < num_heads)[:, None] & (d < head_dim)[None, :]
    else:
        # No mask along the row: the copies stay vectorised.
        mask = (h < num_heads)[:, None] & tl.full([1, BLOCK_D], 1, tl.int1)
    t64 = token.to(tl.int64)

    k = tl.load(key_ptr + t64 * stride_kt + h[:, None] * stride_kh + d[None, :] * stride_kd, mask=mask)
    v = tl.load(value_ptr + t64 * stride_vt + h[:, None] * stride_vh + d[None, :] * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs
    tl.store(k_dst + h[:, None] * stride_kch + d[None, :] * stride_kcd, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst + h[:, None] * stride_vch + d[None, :] * stride_vcd, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton version of `write_kv_ref` (same contract); every stride is honoured."""
    num_tokens, num_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not fit rows {tuple(key.shape)}")
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError("slot_mapping is shorter than the number of tokens")
    if num_tokens == 0:
        return
    block_d = max(triton.next_power_of_2(head_dim), 1)
    block_h = min(triton.next_power_of_2(num_heads), max(1, _MAX_TILE // block_d))
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _write_kv_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping,
        num_heads, head_dim,
        *key.stride(), *value.stride(),
        *k_cache.stride(), *v_cache.stride(),
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        PAD_D=block_d != head_dim,
        num_warps=4 if block_h * block_d >= 512 else 1,
    )
