"""Random paged batches for the attention tests, experiments/bench_kernels.py and
experiments/gpu/attention_check.py: the tests import it as tests.kernels.paged_batch, the
two experiments put this folder on sys.path and import it as paged_batch.

A batch is laid out exactly as `paged_attention_ref` documents. Cache rows that no
sequence owns (the tail of each last block, spare blocks, and a guard block that a -1
table entry would address) hold NaN, so a kernel that reads them shows NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignis_kernels.attention_ref import gather_kv


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim] (maybe a view)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, -1 padded
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_lens: list[int]
    seq_lens_list: list[int]

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list, default=0)

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.query_start_loc, self.seq_lens)

    def dense_kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence i's keys and values gathered densely: [seq_len, kv_heads, dim] each."""
        n = self.seq_lens_list[i]
        return gather_kv(self.k_cache, self.block_tables[i], n), gather_kv(self.v_cache, self.block_tables[i], n)


def make_paged_batch(
    seq_lens: list[int],
    query_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
    spare_blocks: int = 2,
    fused_kv: bool = False,
    poison: bool = True,
) -> PagedBatch:
    """A random batch: sequence i has seq_lens[i] cached positions, the last query_lens[i] new.

    Physical blocks are handed out in a shuffled order; tables get one extra -1 column.
    fused_kv: K and V are the views kv[:, 0] / kv[:, 1] of one [blocks, 2, ...] tensor.
    """
    assert len(seq_lens) == len(query_lens) and all(0 <= q <= s for q, s in zip(query_lens, seq_lens))
    device = torch.device(device)
    gen = generator
    rng_device = gen.device if gen is not None else device

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=rng_device).to(device=device, dtype=dtype)

    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    # Block -1 of the cache is row 0 of the storage, so a -1 table entry reads poison.
    if fused_kv:
        storage = randn(1 + num_blocks, 2, block_size, num_kv_heads, head_dim)
        k_cache, v_cache = storage[1:, 0], storage[1:, 1]
    else:
        storage = randn(2, 1 + num_blocks, block_size, num_kv_heads, head_dim)
        k_cache, v_cache = storage[0, 1:], storage[1, 1:]

    perm = torch.randperm(num_blocks, generator=gen, device=rng_device).to(torch.int32).cpu()
    max_blocks = max(blocks_per_seq, default=0) + 1
    tables = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    nxt = 0
    for i, (n, s) in enumerate(zip(blocks_per_seq, seq_lens)):
        ids = perm[nxt : nxt + n]
        nxt += n
        tables[i, :n] = ids
        pos = torch.arange(s)
        used[ids[pos // block_size].long(), pos % block_size] = True
    if poison:
        unused = ~used.to(device)
        for cache in (k_cache, v_cache):
            cache[unused] = float("nan")
        if fused_kv:
            storage[0] = float("nan")
        else:
            storage[:, 0] = float("nan")

    num_tokens = sum(query_lens)
    q = randn(num_tokens, num_q_heads, head_dim)
    qsl = torch.tensor([0] + torch.tensor(query_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    return PagedBatch(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
    )
