"""Paged attention, the public op: the Triton kernel on CUDA (ignis_kernels.attention_triton,
imported only when it runs: Triton's import alone is ~70 MB of a CPU server's memory), the
PyTorch reference elsewhere.
"""

from __future__ import annotations

import torch

from ignis_kernels.attention_ref import paged_attention_ref
from ignis_kernels.backend import Backend, use_triton


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    backend: Backend | None = None,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q over the paged caches (see paged_attention_ref for the layout;
    softcap: Gemma 2's score soft-capping; sinks: gpt-oss's per-head sink logits).

    The keyword-only hints are used by the Triton path only: pass max_query_len and
    max_seq_len as Python ints to avoid host syncs; num_splits forces (n > 1) or
    disables (1) split-KV, None lets a heuristic decide.
    """
    if use_triton(q, backend):
        from ignis_kernels.attention_triton import paged_attention_triton

        return paged_attention_triton(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, sliding_window, out,
            max_query_len=max_query_len, max_seq_len=max_seq_len, num_splits=num_splits, softcap=softcap,
            sinks=sinks,
        )
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, sliding_window, out,
                               softcap, sinks)
