"""Paged KV-cache allocation: per layer, K and V shaped [num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import numpy as np
import torch

from ignis.model.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V
KVCaches = list[KVCache]


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V: what the engine divides free memory by."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize


def allocate_kv_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> KVCaches:
    """One allocation for the whole cache, handed out as contiguous per-layer (K, V) views.

    On the CPU the zeros come from calloc (through numpy), so the OS hands out zero pages
    as they are first written: resident memory grows with the blocks in use, not with
    the cache's size (torch.zeros writes every page up front)."""
    shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16}.get(dtype)
    if torch.device(device).type == "cpu" and np_dtype is not None:
        storage = torch.from_numpy(np.zeros(shape, dtype=np_dtype))
    else:
        storage = torch.zeros(shape, dtype=dtype, device=device)
    return [(storage[layer, 0], storage[layer, 1]) for layer in range(config.num_layers)]
