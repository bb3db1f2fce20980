"""What one forward over a flat ragged batch needs to know about the paged KV cache.

The engine builds this once per step (on the host, then one copy to the device); the
forward only passes it through to `ignis_kernels.write_kv` / `ignis_kernels.paged_attention`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: block * block_size + offset per new token; -1 = skip
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with -1
    query_start_loc: torch.Tensor  # [S + 1] int32: sequence i owns rows qsl[i]:qsl[i+1]
    seq_lens: torch.Tensor  # [S] int32: context length including the new tokens
    # Host-side sizes so kernels can size their grids without reading device tensors.
    max_query_len: int
    max_seq_len: int
    # A stand-in for ignis_kernels.paged_attention (same signature) chosen per step by the
    # engine's runner, e.g. its batched CPU path; None = ignis_kernels.paged_attention.
    attention_op: Callable[..., torch.Tensor] | None = None
    # A stand-in for ignis_kernels.write_kv (same signature), e.g. the runner's CPU writer that
    # prepares its index once per step rather than once per layer; None = ignis_kernels.write_kv.
    write_kv_op: Callable[..., None] | None = None

    @classmethod
    def build(
        cls,
        *,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> tuple[AttentionMetadata, torch.Tensor]:
        """Metadata plus positions [T] for sequences whose new tokens are their last
        query_lens[i] positions. A host-side helper for tests and experiments; the
        engine's runner builds the same tensors its own way."""
        positions: list[int] = []
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            for pos in range(s_len - q_len, s_len):
                positions.append(pos)
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0)
        padded = [list(t) + [-1] * (width - len(t)) for t in block_tables]
        qsl = [0]
        for q_len in query_lens:
            qsl.append(qsl[-1] + q_len)
        meta = cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
        )
        return meta, torch.tensor(positions, dtype=torch.int64, device=device)
