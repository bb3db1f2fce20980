"""The CPU runner's fast paths against the plain ones: batched attention vs kernels'
reference, oneDNN-packed GEMMs vs F.linear."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis_kernels import BatchedCpuAttention
from ignis.model import LoadedModel
from ignis_kernels import paged_attention_ref


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("lone", [False, True])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_batched_attention_matches_reference(window: int | None, consecutive: bool, lone: bool,
                                             cache_dtype: torch.dtype) -> None:
    """Several decode rows (one masked SDPA), or one (`lone`: sliced to its keys, unmasked),
    with prefill chunks after them unless lone. fp32 queries over an fp32 or a bf16 cache
    (engine.kv_cache_dtype): both compute in fp32 over the cache's values, as the reference."""
    g = torch.Generator().manual_seed(0)
    bs, kv_heads, heads, dim, num_blocks = 4, 2, 6, 16, 40
    k_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=g).to(cache_dtype)
    v_cache = torch.randn(num_blocks, bs, kv_heads, dim, generator=g).to(cache_dtype)
    # Three decode rows (one new token), then two prefill chunks over cached prefixes.
    seq_lens = [9, 3, 14, 11, 6]
    q_lens = [1, 1, 1, 5, 6]
    if consecutive:  # one decode row whose blocks are 0..3: read in place, no gather
        seq_lens, q_lens = [14, 11], [1, 4]
    if lone:  # one user's decode step: a single row, nothing else
        seq_lens, q_lens = seq_lens[:1], q_lens[:1]
    perm = torch.arange(num_blocks) if consecutive else torch.randperm(num_blocks, generator=g)
    tables, nxt = [], 0
    for n in seq_lens:
        count = -(-n // bs)
        tables.append(perm[nxt : nxt + count].tolist() + [-1] * (4 - count))
        nxt += count
    block_tables = torch.tensor(tables, dtype=torch.int32)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), heads, dim, generator=g)
    num_decodes = sum(1 for n in q_lens if n == 1)
    op = BatchedCpuAttention(
        block_tables, qsl, lens, num_decodes=num_decodes,
        decode_max_seq_len=max(seq_lens[:num_decodes]), block_size=bs,
    )
    assert (op.span is not None) == consecutive
    got = op(q, k_cache, v_cache, block_tables, qsl, lens, scale=0.3, sliding_window=window)
    want = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, lens, 0.3, window)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_weights_give_the_same_tokens(tiny: LoadedModel) -> None:
    prompts = [[5, 6, 7, 8, 9], list(range(20, 47)), [3]]
    params = SamplingParams.greedy(12, ignore_eos=True)
    cfg = {"num_kv_blocks": 64, "block_size": 4}
    plain = LLMEngine(tiny, EngineConfig(**cfg, cpu_pack_weights=False))
    assert plain.runner.head_op is None
    want = [c.token_ids for c in plain.generate(prompts, params)]
    packed = LLMEngine(tiny, EngineConfig(**cfg, cpu_pack_weights=True))
    assert packed.runner.head_op is not None
    got = [c.token_ids for c in packed.generate(prompts, params)]
    assert got == want


def test_engine_matches_the_simple_generator_with_sliding_windows(tmp_path) -> None:
    """A Qwen2 checkpoint with sliding-window layers through the engine (batched CPU
    attention, chunked prefill beside decodes) and through reference_generate.py (the
    kernels' reference, one prefill): the same greedy tokens."""
    from tests.model.reference_generate import generate
    from tests.model.tiny_models import build_tiny_model

    from ignis.model import load_model

    path = build_tiny_model(
        tmp_path / "qwen2-sw", "qwen2", num_layers=3, use_sliding_window=True, sliding_window=5, max_window_layers=1,
    )
    loaded = load_model(str(path), progress=False)
    assert [layer.self_attn.sliding_window for layer in loaded.model.layers] == [None, 5, 5]
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 41)), [3, 4]]
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=9,
                                            cpu_pack_weights=False))
    got = [c.token_ids for c in engine.generate(prompts, SamplingParams.greedy(10, ignore_eos=True))]
    want = generate(loaded.model, prompts, max_new_tokens=10, block_size=4).token_ids
    assert got == want


def test_penalty_token_buffers_follow_the_sequences(tiny: LoadedModel) -> None:
    """The runner's per-sequence penalty arrays (copied once, appended to) give the padded
    lists of the whole prompt and output, step after step; rows without penalties are empty."""
    from ignis_kernels.sampling_tensors import _pad

    engine = LLMEngine(tiny, EngineConfig(num_kv_blocks=64, block_size=4))
    pen = SamplingParams(max_tokens=40, temperature=1.0, seed=3, repetition_penalty=1.3, frequency_penalty=0.4,
                         ignore_eos=True)
    engine.add_request("a", list(range(5, 30)), pen)
    engine.add_request("b", [7, 8, 9], SamplingParams(max_tokens=40, temperature=1.0, seed=4, ignore_eos=True))
    engine.add_request("c", [3, 4], SamplingParams(max_tokens=90, temperature=0.5, seed=5, presence_penalty=1.0,
                                                   ignore_eos=True))
    for step in range(70):  # past the buffers' first capacity (64 tokens)
        engine.step()
        rows = [s for s in engine.seqs.values() if s.num_output_tokens]
        if not rows or step % 7:
            continue
        got = engine.runner.sampler._penalty_tokens(rows)
        uses = [s.params.uses_penalties for s in rows]
        want_p = _pad([s.token_ids[: s.num_prompt_tokens] if u else [] for s, u in zip(rows, uses)], "cpu")
        want_o = _pad([s.token_ids[s.num_prompt_tokens :] if u else [] for s, u in zip(rows, uses)], "cpu")
        assert torch.equal(got["prompt_tokens"], want_p) and torch.equal(got["output_tokens"], want_o)


def test_penalised_seeded_request_is_batch_invariant(tiny: LoadedModel) -> None:
    cfg = EngineConfig(num_kv_blocks=64, block_size=4)
    pen = SamplingParams(max_tokens=16, temperature=1.0, seed=11, repetition_penalty=1.4, presence_penalty=0.5,
                         ignore_eos=True)
    alone = LLMEngine(tiny, cfg).generate([[5, 6, 7, 8]], pen)[0].token_ids
    others = SamplingParams(max_tokens=16, temperature=0.8, seed=2, frequency_penalty=0.7, ignore_eos=True)
    batch = LLMEngine(tiny, cfg).generate([list(range(10, 40)), [5, 6, 7, 8], [9]], [others, pen, others])
    assert batch[1].token_ids == alone


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_release_thread_pool_frees_this_threads_openmp_team() -> None:
    """AsyncEngine frees the OpenMP team of the thread that built it (ignis/engine/openmp.py):
    its idle worker threads exit, and the next parallel region builds a team again."""
    import time

    from ignis.engine.openmp import release_thread_pool

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(512, 512)
        (x @ x).sum()
        threads = len(list(Path("/proc/self/task").iterdir()))
        if not release_thread_pool():
            pytest.skip("torch's OpenMP runtime offers no omp_pause_resource_all")
        deadline = time.monotonic() + 10
        while len(list(Path("/proc/self/task").iterdir())) >= threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list(Path("/proc/self/task").iterdir())) < threads
        torch.testing.assert_close(x @ x, x.double().matmul(x.double()).float(), rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(before)
