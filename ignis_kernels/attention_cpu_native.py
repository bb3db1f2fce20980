"""ignis_kernels.attention_cpu_prefill.CpuAttention with its decode rows through the native paged decode attention
(torch.ops.ignis_cpu.paged_decode_attention, ignis_kernels/cpu/decode.cpp; load it first with
ignis_kernels.cpu_native.load()).

The eager batched path gathers every decode row's blocks into one padded [d, ctx] copy
per layer and runs SDPA over it with a mask: at 64 rows the gather and SDPA were a third
of a decode step (experiments/RESULTS.md). The native op reads each row's keys in place
from its blocks, exactly its length (or window), split over keys across threads. Prefill
rows are CpuAttention's as before (as is everything when q is not fp32, or the cache
neither fp32 nor bf16).
Soft-capped scores (Gemma 2) take the eager path too; attention sinks (gpt-oss) go to the op.
Same constructor and call.
"""

from __future__ import annotations

import torch

from ignis_kernels.attention_cpu_prefill import CpuAttention, prefill_rows


class NativeCpuAttention:
    def __init__(
        self, block_tables: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, *,
        num_decodes: int, decode_max_seq_len: int, block_size: int,
    ) -> None:
        self.block_tables, self.query_start_loc, self.seq_lens = block_tables, query_start_loc, seq_lens
        self.num_decodes = num_decodes
        # The eager path (its gather index and masks), built only if a call needs it.
        self._eager_sizes = {"num_decodes": num_decodes, "decode_max_seq_len": decode_max_seq_len,
                             "block_size": block_size}
        self._eager: CpuAttention | None = None

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float | None = None,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
        backend: object = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        **hints: object,
    ) -> torch.Tensor:
        d = self.num_decodes
        if softcap is not None or not d or q.dtype != torch.float32 or k_cache.dtype not in (torch.float32, torch.bfloat16):
            if self._eager is None:
                self._eager = CpuAttention(self.block_tables, self.query_start_loc, self.seq_lens, **self._eager_sizes)
            return self._eager(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                               sliding_window, out, softcap=softcap, sinks=sinks)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        sink_arg = None if sinks is None else sinks.float().contiguous()
        o = torch.ops.ignis_cpu.paged_decode_attention(
            q[:d].contiguous(), k_cache, v_cache, self.block_tables[:d].contiguous(), self.seq_lens[:d].contiguous(),
            scale, sliding_window or 0, sink_arg,
        )
        if q.shape[0] == d and out is None:
            return o
        if out is None:
            out = torch.empty_like(q)
        out[:d] = o
        if q.shape[0] > d:
            prefill_rows(q, k_cache, v_cache, self.block_tables, self.query_start_loc, self.seq_lens, d, scale,
                         sliding_window, out, sinks)
        return out
