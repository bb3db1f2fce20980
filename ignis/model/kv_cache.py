"""Paged KV-cache allocation: per layer, K and V shaped [num_blocks, block_size, kv_heads, head_dim]."""

from __future__ import annotations

import math
import mmap

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
    model's dtype otherwise (float32: the reference path stays exact). bf16 needs no bf16
    arithmetic here (widening it is a shift), and it measured at least as fast as fp32 on
    every tier (experiments/kv_dtype_speed.py, RESULTS.md "Every CPU": AVX2 1.13-1.21x,
    portable 1.01-1.05x, AVX-512 faster too), so the rule does not depend on the CPU."""
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


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros [shape] of `dtype` in an anonymous private mapping with 4 KiB pages, resident
    only where written (the tensor keeps the mapping alive)."""
    count = math.prod(shape)
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, count * torch.empty((), dtype=dtype).element_size(),
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def allocate_kv_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> KVCaches:
    """One allocation for the whole cache, handed out as contiguous per-layer (K, V) views.

    On the CPU the zeros are an anonymous mapping, so the OS hands out zero pages as they
    are first written: resident memory grows with the blocks in use, not with the cache's
    size (torch.zeros writes every page up front). Transparent huge pages are declined for
    it: each layer's K and V are written from their first block on, and at 2 MiB a page
    SmolLM2's 60 regions made a short request resident ~120 MiB of cache instead of ~1
    (numpy's calloc, used before, asks the kernel for huge pages; experiments/RESULTS.md)."""
    shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    if torch.device(device).type == "cpu":
        storage = _lazy_zeros(shape, dtype)
    else:
        storage = torch.zeros(shape, dtype=dtype, device=device)
    return [(storage[layer, 0], storage[layer, 1]) for layer in range(config.num_layers)]
