"""Split-KV (flash-decoding): when to split, and the kernel that merges the splits.

A decode step with few sequences launches only num_seqs x kv_heads programs, too few to
keep a GPU's memory system busy over long contexts. Splitting each key range into
NUM_SPLITS chunks multiplies the programs; each writes (max, sum, acc) partials and
`combine_splits` merges them exactly (log-sum-exp rescaling, base 2); attention sinks join the merged denominator.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Programs per SM the attention launch should reach before splitting stops paying: about
# what fits resident (the bf16 decode tile at head_dim 128 with its K/V double-buffered
# takes ~72 KB of shared memory: 3 per SM; smaller heads fit more).
PROGRAMS_PER_SM = 4
# Keys each split should at least cover, so the merge (one fp32 partial per head and
# split) stays cheap next to the K/V it reads, and each program still streams a few tiles.
MIN_KEYS_PER_SPLIT = 128
MAX_SPLITS = 64


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # an H100/H200's count: keeps the heuristic's CPU behaviour meaningful
    return torch.cuda.get_device_properties(device).multi_processor_count


def worth_splitting(num_programs: int, num_sms: int) -> bool:
    """Whether a launch of num_programs is small enough that splitting could double it
    (cheap: the caller asks before the host sync that max_seq_len may cost)."""
    return 2 * num_programs <= PROGRAMS_PER_SM * num_sms


def choose_num_splits(num_programs: int, max_seq_len: int, num_sms: int) -> int:
    """Splits for a launch of `num_programs` (query tiles x kv heads) over <= max_seq_len keys.

    As many as bring the launch to PROGRAMS_PER_SM programs per SM without passing it
    (rounded down, so a launch that nearly fills the card is not doubled), and no more
    than leave each split MIN_KEYS_PER_SPLIT keys. Batch 1 with 8 kv heads at 4k keys on
    132 SMs: 32 splits, 256 programs (a split of 512 keys gave 64 programs).
    """
    target = PROGRAMS_PER_SM * num_sms
    by_occupancy = target // max(num_programs, 1)
    by_length = max_seq_len // MIN_KEYS_PER_SPLIT
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


@triton.jit
def combine_splits_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, qsl_ptr,
    sinks_ptr,  # fp32 [num_q_heads], natural log; read only under HAS_SINKS
    num_seqs, num_q_heads, head_dim,
    stride_ot, stride_oh, stride_od,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    # Rows outside the batch's query range qsl[0]:qsl[num_seqs] (padding before or after
    # it) have no partials and stay untouched: the same contract as the attention kernel.
    if tok < tl.load(qsl_ptr):
        return
    if tok >= tl.load(qsl_ptr + num_seqs):
        return
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM)
    d_ok = d < head_dim
    base = (tok.to(tl.int64) * num_q_heads + head) * NUM_SPLITS

    m = tl.load(part_m_ptr + base + s, mask=s_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + base + s, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    if HAS_SINKS:  # once per row, not per split; base 2 as the partials are
        sink = tl.load(sinks_ptr + head) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    w = tl.exp2(m - m_max)  # empty splits carry m = -1e30: weight 0
    total = tl.sum(w * l, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_max)
    acc = tl.load(
        part_acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + tok.to(tl.int64) * stride_ot + head * stride_oh + d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=d_ok,
    )
