"""Paged attention: the Triton kernel (through the interpreter) against the reference, and
the reference against torch SDPA on densely gathered data.

Every test draws a fresh seed (shown in each assert message; set IGNIS_TEST_SEED to
replay one). Outputs start as NaN so every element must be written; cache rows no
sequence owns, spare blocks and the guard block a -1 entry would address are NaN too
(see paged_batch.py), so any read of them shows up as NaN in the output.

Tolerances (absolute and relative, vs the fp32 reference): fp32 1e-4; fp16 5e-3;
bf16 2e-2 (the kernel rounds the softmax weights to the input dtype before P @ V,
as FlashAttention does, and the output to the input dtype).

Interpreter cost is ~ms per program-iteration, so shapes stay tiny: a few sequences,
contexts under ~150 positions, at most 16 query heads.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.nn.functional as F

from ignis_kernels import paged_attention, paged_attention_ref
from ignis_kernels.attention_triton import TileConfig, paged_attention_triton, tile_config
from ignis_kernels.attention_split import MIN_KEYS_PER_SPLIT, choose_num_splits, worth_splitting
from tests.kernels.dense_sinks import dense_sink_attention, random_sinks
from tests.kernels.paged_batch import PagedBatch, make_paged_batch

TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("IGNIS_TEST_SEED", random.randrange(2**31)))


def lengths(gen: torch.Generator, mode: str, num_seqs: int, block_size: int) -> tuple[list[int], list[int]]:
    """Ragged (seq_lens, query_lens) for a batch kind, with partial last blocks likely."""

    def rand(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    seq_lens, q_lens = [], []
    for i in range(num_seqs):
        kind = mode if mode != "mixed" else ("decode", "prefill", "prefix")[i % 3]
        if kind == "decode":
            s, q = rand(1, 4 * block_size + 3), 1
        elif kind == "prefill":  # nothing cached yet
            s = rand(2, 40)
            q = s
        else:  # prefill over a cached prefix
            s = rand(block_size + 1, 3 * block_size + 7)
            q = rand(2, min(24, s))
        seq_lens.append(s)
        q_lens.append(q)
    return seq_lens, q_lens


def check(
    batch: PagedBatch,
    seed: int,
    scale: float | None = None,
    sliding_window: int | None = None,
    table: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """Run the kernel on a NaN-poisoned output and compare every row with the reference.

    table: a block table for the kernel only (the reference keeps batch.block_tables).
    """
    q = batch.q
    out = torch.full_like(q, float("nan"))
    tables = batch.block_tables if table is None else table
    res = paged_attention_triton(
        q, batch.k_cache, batch.v_cache, tables, batch.query_start_loc, batch.seq_lens,
        scale, sliding_window, out, **kwargs,
    )
    assert res is out
    ref = paged_attention_ref(*batch.args(), scale=scale, sliding_window=sliding_window,
                              softcap=kwargs.get("softcap"), sinks=kwargs.get("sinks"))
    msg = f"seed={seed} seq_lens={batch.seq_lens_list} query_lens={batch.query_lens} kwargs={kwargs}"
    assert not out.isnan().any(), f"unwritten or poisoned rows: {out.isnan().any(-1).nonzero().tolist()[:8]} {msg}"
    torch.testing.assert_close(out.float(), ref.float(), **TOL[q.dtype], msg=lambda m: f"{m}\n{msg}")
    return out


def batch_for(seed: int, mode: str, group: int, head_dim: int, block_size: int, dtype=torch.float32,
              num_seqs: int = 3, num_kv_heads: int = 2, **kwargs) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens, q_lens = lengths(gen, mode, num_seqs, block_size)
    return make_paged_batch(seq_lens, q_lens, group * num_kv_heads, num_kv_heads, head_dim, block_size,
                            dtype=dtype, generator=gen, **kwargs)


# ---------------------------------------------------------------- reference vs SDPA


@pytest.mark.parametrize("group", [1, 3])
def test_reference_matches_dense_sdpa(seed, group):
    """Pure causal prefill (no prefix): the reference equals SDPA on dense K/V."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [int(x) for x in torch.randint(1, 50, (3,), generator=gen)]
    batch = make_paged_batch(seq_lens, seq_lens, 2 * group, 2, 32, 16, generator=gen)
    out = paged_attention_ref(*batch.args())
    for i, n in enumerate(seq_lens):
        k, v = batch.dense_kv(i)
        lo, hi = batch.query_start_loc[i].item(), batch.query_start_loc[i + 1].item()
        expect = F.scaled_dot_product_attention(
            batch.q[lo:hi].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        ).transpose(0, 1)
        torch.testing.assert_close(out[lo:hi], expect, atol=1e-5, rtol=1e-5, msg=lambda m: f"{m}\nseed={seed}")


# ---------------------------------------------------------------- kernel vs reference


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decode(seed, group, head_dim, block_size):
    check(batch_for(seed, "decode", group, head_dim, block_size, num_seqs=4), seed, num_splits=1)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4])
def test_prefill_with_cached_prefix(seed, group, head_dim, block_size):
    check(batch_for(seed, "prefix", group, head_dim, block_size), seed)


@pytest.mark.parametrize("group", [1, 3])
def test_prefill_no_prefix(seed, group):
    check(batch_for(seed, "prefill", group, 64, 16), seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["decode", "mixed"])
def test_dtypes(seed, mode, dtype):
    check(batch_for(seed, mode, 3, 64, 16, dtype=dtype, num_kv_heads=3), seed)


@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_mixed_batch(seed, group):
    """Decodes, fresh prefills and prefix prefills in one launch, plus an idle sequence."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens, q_lens = lengths(gen, "mixed", 5, 16)
    seq_lens.insert(2, 9)
    q_lens.insert(2, 0)  # a sequence with no new token this step
    batch = make_paged_batch(seq_lens, q_lens, 2 * group, 2, 64, 16, generator=gen)
    check(batch, seed)


@pytest.mark.parametrize(
    "config",
    [
        TileConfig(16, 16, 4, 1),  # many query tiles per sequence, one cache block per key tile
        TileConfig(32, 16, 4, 1),  # key tile smaller than a cache block (block_size 32)
        TileConfig(16, 64, 4, 1),  # four cache blocks per key tile
        TileConfig(64, 32, 4, 1),
    ],
    ids=lambda c: f"M{c.block_m}N{c.block_n}",
)
@pytest.mark.parametrize("block_size", [16, 32])
def test_tile_shapes(seed, config, block_size):
    check(batch_for(seed, "mixed", 4, 32, block_size, num_seqs=4, num_kv_heads=1), seed, config=config)


@pytest.mark.parametrize("head_dim", [16, 32, 80])
def test_other_head_dims(seed, head_dim):
    """Smaller powers of two, and a non power of two (padded, masked lanes)."""
    check(batch_for(seed, "mixed", 2, head_dim, 16), seed)


@pytest.mark.parametrize("window", [1, 5, 40])
@pytest.mark.parametrize("mode", ["decode", "mixed"])
def test_sliding_window(seed, mode, window):
    check(batch_for(seed, mode, 3, 64, 16, num_kv_heads=1), seed, sliding_window=window)


def test_sliding_window_freed_blocks(seed):
    """Blocks wholly behind every query's window may be freed (-1): they must not be read."""
    window, block_size = 20, 16
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [int(torch.randint(60, 120, (1,), generator=gen)) for _ in range(3)]
    q_lens = [1, 5, int(torch.randint(2, 20, (1,), generator=gen))]
    batch = make_paged_batch(seq_lens, q_lens, 4, 2, 32, block_size, generator=gen)
    table = batch.block_tables.clone()
    for i, (s, q) in enumerate(zip(seq_lens, q_lens)):
        first_visible = max(0, s - q - window + 1)
        table[i, : first_visible // block_size] = -1
    check(batch, seed, sliding_window=window, table=table, config=TileConfig(16, 16, 4, 1))
    check(batch, seed, sliding_window=window, table=table, num_splits=3)


def test_custom_scale(seed):
    gen = torch.Generator().manual_seed(seed)
    scale = float(torch.empty(()).uniform_(0.01, 0.5, generator=gen))
    check(batch_for(seed, "mixed", 4, 64, 16), seed, scale=scale)


def test_reference_softcap_matches_dense_scores(seed):
    """Soft-capped scores (Gemma 2): softmax(cap * tanh(scale q.k / cap)) v, by hand."""
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged_batch([9], [9], 2, 1, 16, 4, generator=gen)
    batch.q.mul_(4.0)  # scores large enough that the cap bends them
    out = paged_attention_ref(*batch.args(), scale=0.25, softcap=2.0)
    k, v = batch.dense_kv(0)
    s = torch.einsum("thd,sd->hts", batch.q, k[:, 0]) * 0.25
    s = (2.0 * torch.tanh(s / 2.0)).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    expect = torch.einsum("hts,sd->thd", s.softmax(-1), v[:, 0])
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, paged_attention_ref(*batch.args(), scale=0.25), atol=1e-3)


@pytest.mark.parametrize("mode", ["decode", "mixed"])
def test_softcap(seed, mode):
    batch = batch_for(seed, mode, 2, 32, 16)
    batch.q.mul_(6.0)
    check(batch, seed, scale=0.3, softcap=5.0, config=TileConfig(16, 16, 4, 1))
    check(batch, seed, scale=0.3, softcap=5.0, sliding_window=7, num_splits=2)


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("mode", ["decode", "mixed"])
def test_split_kv_forced(seed, mode, num_splits):
    """Split-KV partials + the combine kernel; 8 splits leaves some splits empty."""
    check(batch_for(seed, mode, 4, 64, 16), seed, num_splits=num_splits, config=TileConfig(16, 16, 4, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_split_kv_low_precision_window(seed, dtype):
    check(batch_for(seed, "decode", 3, 64, 32, dtype=dtype, num_kv_heads=1), seed, num_splits=4, sliding_window=33)


def test_split_kv_heuristic():
    # A launch near PROGRAMS_PER_SM programs per SM (528 on 132 SMs) does not split; few
    # sequences do, up to that many programs and no shorter than MIN_KEYS_PER_SPLIT keys.
    assert choose_num_splits(num_programs=512, max_seq_len=4096, num_sms=132) == 1
    assert not worth_splitting(512, 132) and worth_splitting(264, 132)
    assert choose_num_splits(num_programs=264, max_seq_len=4096, num_sms=132) == 2
    assert choose_num_splits(num_programs=8, max_seq_len=4096, num_sms=132) == 32  # batch 1, 8 kv heads
    assert choose_num_splits(num_programs=32, max_seq_len=32768, num_sms=132) == 16
    assert choose_num_splits(num_programs=32, max_seq_len=2 * MIN_KEYS_PER_SPLIT, num_sms=132) == 2
    assert choose_num_splits(num_programs=8, max_seq_len=100, num_sms=132) == 1
    assert choose_num_splits(num_programs=1, max_seq_len=10**6, num_sms=132) == 64


def test_split_kv_automatic(seed):
    """One sequence, one kv head, a context long enough for the heuristic to split."""
    gen = torch.Generator().manual_seed(seed)
    n = 2 * MIN_KEYS_PER_SPLIT + int(torch.randint(0, 100, (1,), generator=gen))
    batch = make_paged_batch([n], [1], 2, 1, 16, 32, generator=gen)
    assert choose_num_splits(1, n, 132) > 1
    check(batch, seed)  # hints absent: computed with a sync
    check(batch, seed, max_query_len=1, max_seq_len=n)


def test_length_hints(seed):
    batch = batch_for(seed, "mixed", 4, 64, 16)
    check(batch, seed, max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len)
    decode = batch_for(seed, "decode", 4, 64, 16)
    check(decode, seed, max_query_len=1, max_seq_len=decode.max_seq_len)


def test_strided_views(seed):
    """K/V as views of one [blocks, 2, ...] tensor, q a slice of a fused qkv, out a strided view."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens, q_lens = lengths(gen, "mixed", 3, 16)
    batch = make_paged_batch(seq_lens, q_lens, 8, 2, 64, 16, generator=gen, fused_kv=True)
    qkv = torch.randn(batch.q.shape[0], 12, 64, generator=gen)
    qkv[:, :8] = batch.q
    batch.q = qkv[:, :8]
    assert not batch.q.is_contiguous() and not batch.k_cache.is_contiguous()
    wide = torch.full((batch.q.shape[0], 8, 2 * 64), float("nan"))
    out = wide[:, :, ::2]
    paged_attention_triton(*batch.args(), out=out)
    ref = paged_attention_ref(*batch.args())
    torch.testing.assert_close(out, ref, **TOL[torch.float32], msg=lambda m: f"{m}\nseed={seed}")
    assert wide[:, :, 1::2].isnan().all(), "wrote outside the out view"


def test_padding_tokens_untouched(seed):
    """Rows past query_start_loc[-1] (e.g. graph padding) are left as they were."""
    batch = batch_for(seed, "mixed", 2, 32, 16)
    pad = torch.randn(3, *batch.q.shape[1:])
    batch.q = torch.cat([batch.q, pad])
    for splits in (1, 2):
        out = paged_attention_triton(*batch.args(), out=torch.full_like(batch.q, 7.0), num_splits=splits)
        assert (out[-3:] == 7.0).all()
        assert not out[:-3].isnan().any()


def _after(value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a view that has `value` in the memory just before it (index -1 of a
    kernel's pointer), so an out-of-bounds read there finds plausible data."""
    return torch.cat([value.reshape(1, *tensor.shape[1:]).to(tensor.dtype), tensor])[1:]


@pytest.mark.parametrize("mode", ["prefill", "mixed", "decode"])
def test_rows_before_the_batch_untouched(seed, mode):
    """query_start_loc[0] > 0: the rows before it belong to no sequence. Their prefill
    tiles must not look up sequence -1 (qsl[-1], whose memory here holds a plausible 0,
    as seq_lens[-1] and block_tables[-1] hold sequence 0's), and no program may write
    them; the batch's own rows are exact."""
    batch = batch_for(seed, mode, 3, 32, 16)
    lead = 9  # two tiles of 4 tokens (block_m 16 / 4 padded heads) before the batch
    q = torch.cat([torch.randn(lead, *batch.q.shape[1:]), batch.q])
    qsl = _after(torch.tensor(0), batch.query_start_loc + lead)
    seq_lens = _after(batch.seq_lens[0], batch.seq_lens)
    tables = _after(batch.block_tables[0], batch.block_tables)
    args = (q, batch.k_cache, batch.v_cache, tables, qsl, seq_lens)
    ref = paged_attention_ref(*args)
    config = TileConfig(16, 16, num_warps=4, num_stages=1)
    for splits in (1, 3) if mode == "decode" else (1,):
        out = paged_attention_triton(*args, out=torch.full_like(q, 7.0), num_splits=splits, config=config)
        assert (out[:lead] == 7.0).all(), f"seed={seed} splits={splits}: wrote rows before qsl[0]"
        torch.testing.assert_close(out[lead:], ref[lead:], **TOL[torch.float32], msg=lambda m: f"{m}\nseed={seed}")


def test_empty_batch():
    batch = make_paged_batch([], [], 4, 2, 32, 16)
    out = paged_attention_triton(*batch.args())
    assert out.shape == (0, 4, 32)


def test_dispatch(seed):
    batch = batch_for(seed, "mixed", 2, 32, 16)
    ref = paged_attention_ref(*batch.args())
    for backend in ("torch", "auto"):  # CPU tensors: both take the reference
        torch.testing.assert_close(paged_attention(*batch.args(), backend=backend), ref, atol=0, rtol=0)
    out = paged_attention(*batch.args(), backend="triton")
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_rejects_bad_inputs():
    batch = make_paged_batch([5], [1], 3, 2, 32, 16)
    with pytest.raises(ValueError, match="multiple"):
        paged_attention_triton(*batch.args())
    batch = make_paged_batch([5], [1], 4, 2, 32, 16)
    with pytest.raises(ValueError, match="dtypes"):
        paged_attention_triton(batch.q.half(), *batch.args()[1:])
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention_triton(*batch.args(), sliding_window=0)


def test_tile_config_fits_tl_dot():
    for dtype in (torch.float32, torch.bfloat16):
        for head_dim in (16, 64, 128, 256):
            for group in (1, 2, 4, 8, 16, 32):
                for max_q in (1, 3, 64, 4096):
                    cfg = tile_config(head_dim, group, max_q, dtype)
                    assert cfg.block_m >= max(16, group) and cfg.block_m % group == 0
                    assert cfg.block_n >= 16


@pytest.mark.parametrize("draw", range(6))
def test_random_configurations(seed, draw):
    """Everything drawn at once: catches interactions the grids above do not pair up."""
    rng = random.Random(seed)
    group, kv_heads = rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2])
    head_dim, block_size = rng.choice([16, 32, 64, 128]), rng.choice([16, 32])
    dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
    mode = rng.choice(["decode", "prefill", "prefix", "mixed"])
    window = rng.choice([None, None, rng.randint(1, 64)])
    splits = rng.choice([None, 1, rng.randint(2, 6)])
    batch = batch_for(seed, mode, group, head_dim, block_size, dtype=dtype, num_seqs=rng.randint(1, 4),
                      num_kv_heads=kv_heads, fused_kv=rng.random() < 0.5)
    check(batch, seed, scale=rng.choice([None, 0.3]), sliding_window=window, num_splits=splits)


# ---------------------------------------------------------------- attention sinks (gpt-oss)


def _sinks_for(batch: PagedBatch, seed: int) -> torch.Tensor:
    return random_sinks(batch.q.shape[1], torch.Generator().manual_seed(seed + 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [None, 6])
def test_reference_sinks_match_dense(seed, window, dtype):
    """The oracle against transformers' formula (concat, softmax, drop) in float64: a mixed
    batch of decodes, fresh prefills and prefills over a cached prefix, GQA."""
    batch = batch_for(seed, "mixed", 3, 32, 16, dtype=dtype, num_seqs=4)
    sinks = _sinks_for(batch, seed)
    out = paged_attention_ref(*batch.args(), scale=0.3, sliding_window=window, sinks=sinks)
    want = dense_sink_attention(*batch.args(), 0.3, window, sinks)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(out.double(), want, **tol, msg=lambda m: f"{m}\nseed={seed}")
    plain = paged_attention_ref(*batch.args(), scale=0.3, sliding_window=window)
    assert not torch.allclose(out.float(), plain.float(), atol=1e-2), "the sinks changed nothing"
    # The head whose sink dwarfs its scores: each row is the plain row times Z / (Z + e^sink),
    # so never larger, and small overall (an absolute bound failed on seed 384756417).
    sunk, free = out[:, -1].float().abs(), plain[:, -1].float().abs()
    assert (sunk <= free * 1.02 + 1e-3).all()
    assert sunk.sum() < 0.25 * free.sum()
    # A sink far below every score is no sink: the same output as sinks=None (the old path).
    # fp32: the two paths round differently (SDPA vs scores by hand): seed 97949332 differed
    # by 1.9e-6, so the oracle's 1e-5, not 1e-6; bf16: an output ulp.
    off = paged_attention_ref(*batch.args(), scale=0.3, sliding_window=window, sinks=torch.full_like(sinks, -1e4))
    torch.testing.assert_close(off.float(), plain.float(), **tol, msg=lambda m: f"{m}\nseed={seed}")


@pytest.mark.parametrize("mode", ["decode", "mixed"])
def test_sinks(seed, mode):
    """Triton: one split (the sink folded at the end of the program) over decodes, fresh
    prefills and cached prefixes, GQA 3; against the reference and the dense formula."""
    batch = batch_for(seed, mode, 3, 32, 16, num_kv_heads=1)
    sinks = _sinks_for(batch, seed)
    out = check(batch, seed, scale=0.3, sinks=sinks, num_splits=1, config=TileConfig(16, 16, 4, 1))
    want = dense_sink_attention(*batch.args(), 0.3, None, sinks)
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{m}\nseed={seed}")


@pytest.mark.parametrize("num_splits", [3, 8])
def test_sinks_split_kv_window(seed, num_splits):
    """Split-KV forced: the sink enters the combine once per row (8 splits leaves some
    empty), under a sliding window."""
    batch = batch_for(seed, "decode", 2, 32, 16)
    sinks = _sinks_for(batch, seed)
    out = check(batch, seed, sinks=sinks, sliding_window=30, num_splits=num_splits, config=TileConfig(16, 16, 4, 1))
    want = dense_sink_attention(*batch.args(), None, 30, sinks)
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{m}\nseed={seed}")


def test_sinks_bf16_softcap_window(seed):
    """bf16 q and cache, soft-capped scores (the kernel's other base-2 route) and a window."""
    batch = batch_for(seed, "mixed", 2, 32, 16, dtype=torch.bfloat16)
    batch.q.mul_(4.0)
    sinks = _sinks_for(batch, seed)
    check(batch, seed, scale=0.3, softcap=5.0, sliding_window=9, sinks=sinks, config=TileConfig(16, 16, 4, 1))


def test_sinks_off_equals_no_sinks(seed):
    """sinks far below the scores: the no-sink kernel's output, with and without splits."""
    batch = batch_for(seed, "decode", 2, 32, 16, num_seqs=2)
    off = torch.full((batch.q.shape[1],), -1e4)
    for splits in (1, 2):
        plain = paged_attention_triton(*batch.args(), num_splits=splits)
        with_off = paged_attention_triton(*batch.args(), num_splits=splits, sinks=off)
        torch.testing.assert_close(with_off, plain, atol=1e-6, rtol=1e-6)


def test_sinks_dispatch_and_checks(seed):
    batch = batch_for(seed, "mixed", 2, 32, 16)
    sinks = _sinks_for(batch, seed)
    ref = paged_attention_ref(*batch.args(), sinks=sinks)
    torch.testing.assert_close(paged_attention(*batch.args(), backend="torch", sinks=sinks), ref, atol=0, rtol=0)
    with pytest.raises(ValueError, match="sinks"):
        paged_attention_triton(*batch.args(), sinks=sinks[:-1])
