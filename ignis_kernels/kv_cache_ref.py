"""PyTorch reference of the KV-cache write: the CPU path and the oracle of the kernel."""

from __future__ import annotations

import torch


def write_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value rows [num_tokens, kv_heads, dim] into the paged caches.

    slot_mapping[t] = block * block_size + offset for token t; -1 skips the token
    (padding). The caches may be strided views (e.g. of one [blocks, 2, ...] tensor).
    """
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = value[valid].to(v_cache.dtype)
