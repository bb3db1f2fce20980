"""The paged-attention Triton kernel: one program per (query tile, kv head, kv split).

A query tile is BLOCK_M rows = BLOCK_Q tokens of one sequence x GROUP_PAD query heads
of one kv group, so every query head sharing a kv head is served by one program and
the K/V of that group is read once (GQA; decode is BLOCK_Q = 1 in effect). The keys are
walked in tiles of BLOCK_N positions, each spanning BLOCK_N / block_size cache blocks
looked up in the block table; online softmax in base 2 with fp32 statistics.

With NUM_SPLITS > 1 (split-KV / flash-decoding) each program covers 1/NUM_SPLITS of its
tile's key range and writes unnormalised partials (max, sum, acc) that
`attention_split.combine_splits` reduces.

HAS_SINKS (gpt-oss): a learned logit per query head joins each row's softmax denominator
once, where the row's statistics are final (here with one split, else in the combine).

Layout and masking semantics are those of `attention_ref.paged_attention_ref`. Every
load is masked on the key range, so block-table entries past a sequence's length
(-1 padding) are never dereferenced (the interpreter would not catch it). Rows of q
outside qsl[0]:qsl[num_seqs] belong to no sequence (padding before or after the batch):
no program writes them, in this kernel or in the split combine, and no index below 0
of qsl is ever read.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _find_sequence(qsl_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The sequence owning query tile `tile`: the last i with qsl[i] // BLOCK_Q + i <= tile,
    or -1 when there is none (tiles below sequence 0's first: qsl[0] > 0, rows before the
    batch, which no sequence owns). The caller must return on -1, never read qsl[-1].

    Sequence i's tiles are numbered from qsl[i] // BLOCK_Q + i, which leaves room for its
    cdiv(q_len, BLOCK_Q) tiles and so sizes the grid from num_tokens without a sync.
    """
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, FP32_DOT: tl.constexpr):
    # The interpreter computes bf16 dots wrongly: it gets fp32 operands instead.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif FP32_DOT:
        # fp32 inputs: three tf32 passes keep ~fp32 accuracy on tensor cores (plain tf32
        # rounds to 10 mantissa bits; "ieee" falls back to FMAs and spills registers).
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        return tl.dot(a, b)


@triton.jit
def paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, qsl_ptr, seq_lens_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr,
    sinks_ptr,  # fp32 [num_q_heads], natural log; read only under HAS_SINKS
    qk_scale,  # softmax scale * log2(e) (the plain scale with SOFTCAP)
    window,
    softcap,
    num_seqs, num_q_heads, group, head_dim,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    stride_bts, stride_btb,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,  # head_dim rounded up to a power of two
    PAD_D: tl.constexpr,  # HEAD_DIM != head_dim
    GROUP_PAD: tl.constexpr,  # query heads per kv head, rounded up to a power of two
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DECODE: tl.constexpr,  # every sequence has at most one new token: tile == sequence
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,  # scores -> softcap * tanh(scores / softcap), then base 2
    HAS_SINKS: tl.constexpr,
    UPCAST: tl.constexpr,
    FP32_DOT: tl.constexpr,  # fp32 inputs: tf32x3 dots on the GPU
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    if DECODE:
        seq = tile
        q_start = tl.load(qsl_ptr + seq)
        tile_start = q_start
    else:
        # Last tiles first: under causality a sequence's later tiles see more keys, and
        # launching the longest programs first shortens the tail of the grid.
        tile = tl.num_programs(0) - 1 - tile
        seq = _find_sequence(qsl_ptr, num_seqs, tile, BLOCK_Q)
        if seq < 0:  # a tile of the rows before qsl[0]: nobody's, left untouched
            return
        q_start = tl.load(qsl_ptr + seq)
        tile_start = q_start + (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    q_end = tl.load(qsl_ptr + seq + 1)
    if tile_start >= q_end:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - (q_end - q_start)  # position of the first new token

    # Rows: token-major, head-minor, so one kv group's heads sit side by side.
    rows = tl.arange(0, BLOCK_M)
    tok = tile_start + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    head = kv_head * group + head_in_group
    row_ok = (tok < q_end) & (head_in_group < group)
    pos = context + (tok - q_start)
    d = tl.arange(0, HEAD_DIM)
    if PAD_D:
        d_ok = d < head_dim
    else:
        # A constant mask keeps the K/V loads vectorised (and pipelined as async copies).
        d_ok = tl.full([HEAD_DIM], 1, tl.int1)
    tok64 = tok.to(tl.int64)

    q = tl.load(
        q_ptr + tok64[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )

    # Keys this tile can see: [kv_lo, kv_hi), from causality and the window.
    last_tok = tl.minimum(tile_start + BLOCK_Q, q_end) - 1
    kv_hi = context + (last_tok - q_start) + 1
    kv_lo = 0
    if USE_WINDOW:
        # Blocks wholly behind the window may be freed (-1 in the table): never load them.
        kv_lo = tl.maximum(context + (tile_start - q_start) - window + 1, 0)
    first_kv_tile = kv_lo // BLOCK_N
    end_kv_tile = tl.cdiv(kv_hi, BLOCK_N)
    if NUM_SPLITS > 1:
        per_split = tl.cdiv(end_kv_tile - first_kv_tile, NUM_SPLITS)
        first_kv_tile = first_kv_tile + split * per_split
        end_kv_tile = tl.minimum(first_kv_tile + per_split, end_kv_tile)

    # A finite floor for the running max: fully masked rows stay NaN-free.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    table = block_tables_ptr + seq.to(tl.int64) * stride_bts
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    # The block-table entries of the first tile; each iteration loads the next tile's
    # (one table entry per key; repeated entries of a block hit in cache). Carried one
    # iteration ahead, a tile's K/V addresses never wait on a load of the same iteration,
    # so the pipeliner can keep num_stages - 1 tiles of K and V in flight (a separate
    # shared buffer each) instead of one tile waiting on its table lookup.
    j = first_kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    block = tl.load(table + (j // BLOCK_SIZE) * stride_btb, mask=(j < kv_hi) & (j >= kv_lo), other=0)
    for kv_tile in range(first_kv_tile, end_kv_tile):
        j = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        j_ok = (j < kv_hi) & (j >= kv_lo)
        block64 = block.to(tl.int64)
        j_next = j + BLOCK_N
        # Masked past kv_hi: a -1 entry beyond the sequence is never read (nor dereferenced).
        block = tl.load(table + (j_next // BLOCK_SIZE) * stride_btb, mask=j_next < kv_hi, other=0)
        slot = j % BLOCK_SIZE

        # K transposed: [HEAD_DIM, BLOCK_N].
        k = tl.load(
            k_head + block64[None, :] * stride_kb + slot[None, :] * stride_ks + d[:, None] * stride_kd,
            mask=j_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        s = _dot(q, k, UPCAST, FP32_DOT) * qk_scale
        if SOFTCAP:
            # tanh(t) = 1 - 2 / (e^2t + 1): exp only (no libdevice under the interpreter);
            # e^2t overflowing to inf still gives 1.
            t = s / softcap
            s = (1.0 - 2.0 / (tl.exp(2.0 * t) + 1.0)) * (softcap * 1.4426950408889634)
        allowed = (j[None, :] <= pos[:, None]) & j_ok[None, :]
        if USE_WINDOW:
            allowed = allowed & ((pos[:, None] - j[None, :]) < window)
        s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(
            v_head + block64[:, None] * stride_vb + slot[:, None] * stride_vs + d[None, :] * stride_vd,
            mask=j_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, FP32_DOT)
        m_i = m_new

    if NUM_SPLITS == 1:
        if HAS_SINKS:
            # The scores are in base 2 here (with or without SOFTCAP): so is the sink.
            sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * 1.4426950408889634
            m_new = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_new)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + tok64[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        # Partials laid out [num_tokens, num_q_heads, NUM_SPLITS, (HEAD_DIM)].
        part = (tok64 * num_q_heads + head) * NUM_SPLITS + split
        tl.store(part_m_ptr + part, m_i, mask=row_ok)
        tl.store(part_l_ptr + part, l_i, mask=row_ok)
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :],
            acc,
            mask=row_ok[:, None] & d_ok[None, :],
        )
