"""The CPU prefill attention (two flash calls merged by log-sum-exp, no mask) against the
reference, over paged caches with interleaved block tables, GQA and cached prefixes."""

from __future__ import annotations

import pytest
import torch

from ignis_kernels.attention_cpu import BatchedCpuAttention
from ignis_kernels.attention_cpu_prefill import CpuAttention, prefill_attention_cpu
from ignis_kernels.attention_ref import paged_attention_ref
from tests.kernels.dense_sinks import dense_sink_attention, random_sinks


def _case(q_lens: list[int], seq_lens: list[int], heads: int, kv_heads: int, dtype: torch.dtype, bs: int = 4):
    g = torch.Generator().manual_seed(sum(seq_lens))
    counts = [-(-s // bs) for s in seq_lens]
    # interleaved blocks: sequence i owns blocks i, i + S, i + 2S, ...
    S = len(seq_lens)
    width = max(counts)
    tables = torch.full((S, width), -1, dtype=torch.int32)
    for i, c in enumerate(counts):
        tables[i, :c] = torch.arange(c, dtype=torch.int32) * S + i
    num_blocks = S * width
    k = torch.randn(num_blocks, bs, kv_heads, 16, generator=g).to(dtype)
    v = torch.randn(num_blocks, bs, kv_heads, 16, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), heads, 16, generator=g).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, tables, qsl, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize(
    "q_lens, seq_lens, heads, kv_heads",
    [
        ([7], [7], 4, 4),  # a whole prompt, no prefix
        ([5, 9], [13, 9], 6, 2),  # a chunk over a cached prefix beside a fresh prompt, GQA
        ([3, 1, 8], [3, 30, 20], 3, 1),  # a one-token "prefill" row and a long prefix, MQA
    ],
)
def test_matches_reference(q_lens, seq_lens, heads, kv_heads, dtype, tol) -> None:
    q, k, v, tables, qsl, lens = _case(q_lens, seq_lens, heads, kv_heads, dtype)
    want = paged_attention_ref(q, k, v, tables, qsl, lens, 0.3)
    got = prefill_attention_cpu(q, k, v, tables, qsl, lens, 0.3)
    assert got.dtype == dtype
    assert (got.float() - want.float()).abs().max().item() < tol


def test_sliding_window_goes_to_the_reference() -> None:
    q, k, v, tables, qsl, lens = _case([6], [10], 2, 1, torch.float32)
    want = paged_attention_ref(q, k, v, tables, qsl, lens, None, 3)
    assert torch.equal(prefill_attention_cpu(q, k, v, tables, qsl, lens, None, 3), want)


def test_cpu_attention_mixes_decode_and_prefill_rows() -> None:
    # decode rows first (as the runner orders them), then two prefill chunks
    q, k, v, tables, qsl, lens = _case([1, 1, 6, 4], [9, 5, 6, 12], 4, 2, torch.float32)
    op = CpuAttention(tables, qsl, lens, num_decodes=2, decode_max_seq_len=9, block_size=4)
    want = paged_attention_ref(q, k, v, tables, qsl, lens, 0.25)
    got = op(q, k, v, tables, qsl, lens, 0.25)
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "q_lens, seq_lens, heads, kv_heads",
    [([7], [7], 4, 4), ([5, 9], [13, 9], 6, 2), ([1, 1, 6, 4], [9, 5, 6, 12], 4, 2)],
)
def test_bf16_cache_under_fp32_queries(q_lens, seq_lens, heads, kv_heads) -> None:
    """engine.kv_cache_dtype=bfloat16 under an fp32 model: the same attention as the
    reference over the same bf16 values (computed in fp32: to 1e-5), and within 2e-2 of the
    attention over the unrounded fp32 cache. That tolerance, documented: rounding K/V to
    bf16 moves each by at most 2^-9 relative, which moves these outputs (randn data, scale
    0.3, |out| up to ~3) by at most 8e-3 (measured); a bf16 SDPA would be off by more
    against the reference, and a misread cache by far more."""
    q, k, v, tables, qsl, lens = _case(q_lens, seq_lens, heads, kv_heads, torch.float32)
    k16, v16 = k.to(torch.bfloat16), v.to(torch.bfloat16)
    num_decodes = sum(1 for n in q_lens if n == 1)
    op = CpuAttention(tables, qsl, lens, num_decodes=num_decodes,
                      decode_max_seq_len=max(seq_lens[:num_decodes], default=0), block_size=4)
    got = op(q, k16, v16, tables, qsl, lens, 0.3)
    assert got.dtype == torch.float32
    exact = paged_attention_ref(q, k16, v16, tables, qsl, lens, 0.3)
    assert (got - exact).abs().max().item() < 1e-5
    unrounded = paged_attention_ref(q, k, v, tables, qsl, lens, 0.3)
    assert (got - unrounded).abs().max().item() < 2e-2


# -- attention sinks (gpt-oss): the flash kernels' log-sum-exp, against the dense formula


def _sinks(heads: int) -> torch.Tensor:
    return random_sinks(heads, torch.Generator().manual_seed(heads))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize(
    "q_lens, seq_lens, heads, kv_heads",
    [([7], [7], 4, 4), ([5, 9], [13, 9], 6, 2), ([3, 1, 8], [3, 30, 20], 3, 1)],
)
def test_prefill_sinks_match_dense(q_lens, seq_lens, heads, kv_heads, dtype, tol) -> None:
    """No prefix (one flash call, out * sigmoid(lse - sink)) and cached prefixes (the sink a
    third term of the merge), GQA and MQA."""
    q, k, v, tables, qsl, lens = _case(q_lens, seq_lens, heads, kv_heads, dtype)
    sinks = _sinks(heads)
    got = prefill_attention_cpu(q, k, v, tables, qsl, lens, 0.3, sinks=sinks)
    assert got.dtype == dtype
    want = dense_sink_attention(q, k, v, tables, qsl, lens, 0.3, None, sinks)
    assert (got.double() - want).abs().max().item() < tol
    off = prefill_attention_cpu(q, k, v, tables, qsl, lens, 0.3, sinks=torch.full_like(sinks, -1e4))
    plain = prefill_attention_cpu(q, k, v, tables, qsl, lens, 0.3)
    assert (off.float() - plain.float()).abs().max().item() < (1e-6 if dtype == torch.float32 else tol)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("num_decodes", [1, 2, 3])
@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_attention_sinks(num_decodes, window, cache) -> None:
    """CpuAttention and BatchedCpuAttention with sinks: the lone decode row (its own flash
    call), the batched decode rows (a masked flash call), prefill rows after them (windowed:
    the reference), a bf16 cache under fp32 queries; with and without an out buffer."""
    q_lens = [1] * num_decodes + [6, 4]
    seq_lens = [9, 5, 17][:num_decodes] + [6, 12]
    q, k, v, tables, qsl, lens = _case(q_lens, seq_lens, 6, 2, torch.float32)
    k, v = k.to(cache), v.to(cache)
    sinks = _sinks(6)
    want = dense_sink_attention(q, k, v, tables, qsl, lens, 0.25, window, sinks)
    for cls in (CpuAttention, BatchedCpuAttention):
        op = cls(tables, qsl, lens, num_decodes=num_decodes, decode_max_seq_len=max(seq_lens[:num_decodes]),
                 block_size=4)
        got = op(q, k, v, tables, qsl, lens, 0.25, window, sinks=sinks)
        assert (got.double() - want).abs().max().item() < 1e-5, cls.__name__
        out = torch.full_like(q, float("nan"))
        op(q, k, v, tables, qsl, lens, 0.25, window, out, sinks=sinks)
        assert (out.double() - want).abs().max().item() < 1e-5, cls.__name__
        # Decode rows alone, as the engine's one-user step calls it (no out buffer).
        d = num_decodes
        lone = cls(tables[:d], qsl[: d + 1], lens[:d], num_decodes=d, decode_max_seq_len=max(seq_lens[:d]),
                   block_size=4)
        got = lone(q[:d], k, v, tables[:d], qsl[: d + 1], lens[:d], 0.25, window, sinks=sinks)
        assert (got.double() - want[:d]).abs().max().item() < 1e-5, cls.__name__
        plain = op(q, k, v, tables, qsl, lens, 0.25, window)
        off = op(q, k, v, tables, qsl, lens, 0.25, window, sinks=torch.full_like(sinks, -1e4))
        assert (off - plain).abs().max().item() < 1e-6, cls.__name__
