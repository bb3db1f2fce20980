"""Paged KV-cache allocation: per layer, K and V shaped [num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import numpy as np
import torch

from ignis.model.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V
KVCaches = list[KVCache]

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")
# The weight forms (Transformer.weight_form) whose CPU cache `auto` makes bf16: their GEMMs
# already round activations to bf16, and at long contexts the cache is most of their memory.
HALF_KV_FORMS = ("quantized", "mixed", "bfloat16")


def resolve_kv_cache_dtype(choice: str, *, model_dtype: torch.dtype, weight_form: str, triton: bool) -> torch.dtype:
    """engine.kv_cache_dtype -> the cache's dtype.

    Where the Triton kernels run (`triton`: CUDA, or the triton backend on the CPU) q and
    the cache must share one dtype: the model's; an explicit choice that differs is refused.
    On the CPU the attention ops read either dtype and compute in fp32: `auto` is bf16 for
    the packed weight forms (half the memory: SmolLM2 23 instead of 46 KB a token) and the
    model's dtype otherwise (float32: the reference path stays exact)."""
    if choice not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV cache dtype {choice!r}; expected one of {KV_CACHE_DTYPES}")
    if triton:
        if choice != "auto" and getattr(torch, choice) != model_dtype:
            raise ValueError(
                f"engine.kv_cache_dtype={choice} needs the model in that dtype where the Triton kernels run "
                f"(the model is {str(model_dtype).removeprefix('torch.')}): use auto, or model.dtype={choice}"
            )
        return model_dtype
    if choice == "auto":
        return torch.bfloat16 if weight_form in HALF_KV_FORMS else model_dtype
    return getattr(torch, choice)


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
    the cache's size (torch.zeros writes every page up front). numpy has no bf16: its
    zeros are allocated as uint16 (the same bits) and viewed as bf16."""
    shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}.get(dtype)
    if torch.device(device).type == "cpu" and np_dtype is not None:
        storage = torch.from_numpy(np.zeros(shape, dtype=np_dtype)).view(dtype)
    else:
        storage = torch.zeros(shape, dtype=dtype, device=device)
    return [(storage[layer, 0], storage[layer, 1]) for layer in range(config.num_layers)]
