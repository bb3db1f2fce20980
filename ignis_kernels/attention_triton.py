"""Paged attention's Triton path: plans and launches the kernel (the public op that picks it:
ignis_kernels.attention).

One launch serves any batch (prefill over a cached prefix, decode, or both mixed): the
grid is sized from num_tokens and num_seqs, so no host sync is needed when the caller
passes `max_query_len` (and `max_seq_len`, for the split-KV decision). A batch whose
sequences all have at most one new token uses the decode tiling (one tile per sequence,
no tile search); split-KV adds a second, small launch that merges the partials.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ignis_kernels.attention_kernel import paged_attention_kernel
from ignis_kernels.attention_split import choose_num_splits, combine_splits_kernel, sm_count, worth_splitting
from ignis_kernels.backend import interpreting

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per program: tokens x padded group heads
    block_n: int  # keys per loop iteration (block_n / block_size cache blocks)
    num_warps: int
    num_stages: int


def tile_config(head_dim_pad: int, group_pad: int, max_query_len: int, dtype: torch.dtype) -> TileConfig:
    """Tile shapes by regime. Untuned guesses aimed at Hopper, sized from the bytes of one
    K/V row so tiles and pipeline stages fit shared memory (checked offline by
    tests/kernels/sm90_compile.py). tl.dot needs >= 16 along every side."""
    row_bytes = head_dim_pad * dtype.itemsize
    block_n = 64 if row_bytes <= 256 else 32 if row_bytes <= 512 else 16
    num_stages = 3 if row_bytes <= 256 else 2
    if max_query_len <= 1:
        # Decode is bandwidth bound: a small query tile, a pipelined K/V stream. Three
        # stages give K and V two shared buffers each (the kernel loads the block table
        # one tile ahead, which is what lets the pipeliner do so: RESULTS.md, 2026-12-01):
        # at most 2 x 2 x 16 KB, so three programs fit an SM.
        return TileConfig(max(16, group_pad), block_n, num_warps=4, num_stages=3)
    max_rows = 128 if row_bytes <= 256 else 64 if row_bytes <= 512 else 32
    rows = triton.next_power_of_2(max_query_len) * group_pad
    block_m = max(16, group_pad, min(rows, max_rows))
    num_warps = 8 if block_m * row_bytes >= 128 * 256 else 4
    return TileConfig(block_m, block_n, num_warps=num_warps, num_stages=num_stages)


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    config: TileConfig | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton paged attention with the contract of `paged_attention_ref`.

    max_query_len / max_seq_len: upper bounds of the batch's new tokens per sequence and
    of seq_lens; computed with a host sync when absent (max_seq_len only if the split
    heuristic needs it). num_splits: None picks by heuristic, 1 disables split-KV, n > 1
    forces n splits. config overrides the tile shapes (tests use it to reach edge cases).
    Rows of q outside query_start_loc[0]:query_start_loc[-1] belong to no sequence and are
    left as they are in `out` (query_start_loc[0] may be > 0).
    """
    _check_args(q, k_cache, v_cache, sliding_window, softcap, sinks)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out

    query_start_loc = query_start_loc.contiguous()
    seq_lens = seq_lens.contiguous()
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())  # host sync
    group = num_q_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    cfg = config or tile_config(head_dim_pad, group_pad, max_query_len, q.dtype)
    decode = max_query_len <= 1
    block_q = cfg.block_m // group_pad
    if block_q < 1:
        raise ValueError(f"block_m {cfg.block_m} is smaller than the padded group {group_pad}")
    num_tiles = num_seqs if decode else num_tokens // block_q + num_seqs

    if num_splits is None:
        num_splits = _auto_splits(decode, num_tiles * num_kv_heads, max_seq_len, seq_lens, q.device)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    part_m, part_l, part_acc = _partials(out, num_splits, head_dim_pad)
    scale = head_dim**-0.5 if scale is None else scale
    if sinks is not None:
        sinks = sinks.to(device=q.device, dtype=torch.float32).contiguous()
    sinks_arg = out if sinks is None else sinks  # a placeholder pointer without sinks
    paged_attention_kernel[(num_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out,
        block_tables, query_start_loc, seq_lens,
        part_m, part_l, part_acc,
        sinks_arg,
        # With soft-capping the kernel caps the plain score, then goes to base 2 itself.
        scale if softcap is not None else scale * _LOG2E,
        sliding_window or 0,
        softcap or 1.0,
        num_seqs, num_q_heads, group, head_dim,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        *block_tables.stride(),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim_pad,
        PAD_D=head_dim_pad != head_dim,
        GROUP_PAD=group_pad,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        DECODE=decode,
        NUM_SPLITS=num_splits,
        USE_WINDOW=sliding_window is not None,
        SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        UPCAST=interpreting(),
        FP32_DOT=q.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        _combine(part_m, part_l, part_acc, out, query_start_loc, num_seqs, head_dim_pad, sinks)
    return out


def _combine(
    part_m: torch.Tensor, part_l: torch.Tensor, part_acc: torch.Tensor, out: torch.Tensor,
    query_start_loc: torch.Tensor, num_seqs: int, head_dim_pad: int, sinks: torch.Tensor | None = None,
) -> None:
    """Merge the split-KV partials [tokens, heads, splits, ...] into `out` (a second launch);
    sinks (fp32, contiguous) join each row's denominator here."""
    num_tokens, num_q_heads, num_splits = part_m.shape
    combine_splits_kernel[(num_tokens, num_q_heads)](
        part_m, part_l, part_acc, out, query_start_loc,
        part_m if sinks is None else sinks,
        num_seqs, num_q_heads, out.shape[2],
        *out.stride(),
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim_pad,
        HAS_SINKS=sinks is not None,
        num_warps=4 if head_dim_pad >= 128 else 2,
    )


def _partials(out: torch.Tensor, num_splits: int, head_dim_pad: int) -> tuple[torch.Tensor, ...]:
    """Split-KV's per-split running max, sum and accumulator (fp32); `out` three times as
    unused placeholders when there is one split."""
    if num_splits == 1:
        return out, out, out
    num_tokens, num_q_heads = out.shape[0], out.shape[1]
    part_m = torch.empty(num_tokens, num_q_heads, num_splits, device=out.device, dtype=torch.float32)
    part_acc = torch.empty(num_tokens, num_q_heads, num_splits, head_dim_pad, device=out.device, dtype=torch.float32)
    return part_m, torch.empty_like(part_m), part_acc


def _check_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sliding_window: int | None,
                softcap: float | None = None, sinks: torch.Tensor | None = None) -> None:
    num_q_heads, head_dim, num_kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != head_dim:
        raise ValueError(f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not fit q {tuple(q.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, got {softcap}")
    if sinks is not None and tuple(sinks.shape) != (num_q_heads,):
        raise ValueError(f"sinks must have shape [num_q_heads] = [{num_q_heads}], got {tuple(sinks.shape)}")


def _auto_splits(
    decode: bool, num_programs: int, max_seq_len: int | None, seq_lens: torch.Tensor, device: torch.device
) -> int:
    """The split-KV heuristic: decode batches only (a prefill split would need partials
    for every token); the occupancy test is cheap and comes before the sync that
    max_seq_len may need."""
    if not decode or not worth_splitting(num_programs, sm_count(device)):
        return 1
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())  # host sync
    return choose_num_splits(num_programs, max_seq_len, sm_count(device))


__all__ = ["TileConfig", "paged_attention_triton", "tile_config"]
