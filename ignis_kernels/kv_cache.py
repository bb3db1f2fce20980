"""KV-cache write: scatter the new K/V rows of a step into the paged caches.

    write_kv(key, value, k_cache, v_cache, slot_mapping, backend=None)

The Triton kernel (ignis_kernels.kv_cache_triton) is imported only when it runs: Triton's
import alone is ~70 MB of a CPU server's memory.
"""

from __future__ import annotations

import torch

from ignis_kernels.backend import Backend, use_triton
from ignis_kernels.kv_cache_ref import write_kv_ref


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: Backend | None = None,
) -> None:
    """Scatter key/value [num_tokens, kv_heads, dim] into the paged caches (see write_kv_ref)."""
    if use_triton(key, backend):
        from ignis_kernels.kv_cache_triton import write_kv_triton

        write_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        write_kv_ref(key, value, k_cache, v_cache, slot_mapping)
