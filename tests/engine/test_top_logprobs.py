"""top_logprobs: each step's most likely tokens for the rows that ask, from the distribution
the sampled token's logprob is read from (log_softmax of the penalised logits over T, T = 1
for greedy rows, before top-k/top-p/min-p), sorted descending, in the batched sampler call."""

from __future__ import annotations

import pytest
import torch

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams, sampler
from ignis.engine.outputs import RequestOutput
from ignis.model import LoadedModel

CFG = EngineConfig(num_kv_blocks=64, block_size=4, cpu_pack_weights=False)


def test_params_validate_top_logprobs() -> None:
    assert SamplingParams(top_logprobs=3).logprobs  # asking for alternatives asks for logprobs
    assert not SamplingParams().logprobs and SamplingParams().top_logprobs == 0
    SamplingParams(top_logprobs=20).validate()
    for bad in (-1, 21, 2.5, True, "3"):
        with pytest.raises(ValueError, match="top_logprobs"):
            SamplingParams(top_logprobs=bad).validate()  # type: ignore[arg-type]


def reference(logits: torch.Tensor, params: SamplingParams, output_ids: list[int]) -> torch.Tensor:
    """The test's own distribution for one row: presence penalty on the output tokens, then
    log_softmax over temperature (1 when greedy)."""
    x = logits.double().clone()
    if params.presence_penalty:
        x[sorted(set(output_ids))] -= params.presence_penalty
    t = 1.0 if params.is_greedy else params.temperature
    return torch.log_softmax(x / t, 0)


def run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", prompt, p)
        outs[f"r{i}"] = []
    while engine.seqs:
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def test_top_logprobs_in_a_mixed_batch(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LLMEngine(tiny, CFG)
    runner_sampler = engine.runner.sampler
    calls: list[tuple[torch.Tensor, list[tuple[SamplingParams, list[int]]], sampler.Sampled]] = []
    real_rows = runner_sampler._sample_rows

    def recording(logits, rows, *rest):
        ctx = [(s.params, list(s.token_ids[s.num_prompt_tokens :])) for s in rows]
        got = real_rows(logits, rows, *rest)
        calls.append((logits.clone(), ctx, got))
        return got

    dist_rows: list[int] = []
    real_dist = sampler.logprob_distribution

    def counting(logits, params):
        dist_rows.append(logits.shape[0])
        return real_dist(logits, params)

    monkeypatch.setattr(runner_sampler, "_sample_rows", recording)
    monkeypatch.setattr(sampler, "logprob_distribution", counting)

    params = [
        SamplingParams.greedy(6, ignore_eos=True, top_logprobs=5),
        SamplingParams(max_tokens=6, temperature=0.7, seed=1, ignore_eos=True, top_logprobs=3),
        SamplingParams(max_tokens=6, temperature=1.0, seed=2, ignore_eos=True, logprobs=True),  # no alternatives
        SamplingParams.greedy(6, ignore_eos=True),  # nothing asked
        SamplingParams(max_tokens=6, temperature=1.3, seed=3, top_k=5, presence_penalty=0.8, ignore_eos=True,
                       top_logprobs=4),
    ]
    prompts = [[5, 6, 7, 8], list(range(10, 31)), [9, 3], [40, 41, 42], [7, 7, 8]]
    outs = run(engine, prompts, params)

    # Only the rows that ask go through the distribution.
    asking = {0, 1, 4}
    assert dist_rows and all(1 <= n <= len(asking) for n in dist_rows)
    checked = 0
    for logits, ctx, got in calls:
        for k, (p, output_ids) in enumerate(ctx):
            if not p.top_logprobs:
                assert got.top_logprobs is None or got.top_logprobs[k] is None
                continue
            top = got.top_logprobs[k]
            ids = [t for t, _ in top]
            lps = [lp for _, lp in top]
            assert len(top) == p.top_logprobs and len(set(ids)) == len(ids)
            assert lps == sorted(lps, reverse=True)
            ref = reference(logits[k], p, output_ids)
            want_lps, want_ids = ref.topk(p.top_logprobs)
            assert ids == want_ids.tolist()
            torch.testing.assert_close(torch.tensor(lps, dtype=torch.float64), want_lps, rtol=0, atol=1e-5)
            chosen, chosen_lp = got.tokens[k], got.logprobs[k]
            assert chosen_lp == pytest.approx(ref[chosen].item(), abs=1e-5)
            if chosen in ids:
                assert chosen_lp == lps[ids.index(chosen)]  # the same number, exactly
            if p.is_greedy:
                assert ids[0] == chosen
            checked += 1
    assert checked >= 3 * 6

    # Carried to the outputs: one entry per token, for the rows that asked only.
    for i, p in enumerate(params):
        stream = outs[f"r{i}"]
        assert sum(len(o.token_ids) for o in stream) == 6
        for o in stream:
            if p.top_logprobs:
                assert o.top_logprobs is not None and len(o.top_logprobs) == len(o.token_ids)
                assert all(len(alts) == p.top_logprobs for alts in o.top_logprobs)
            else:
                assert o.top_logprobs is None
            assert (o.logprobs is not None) == p.logprobs


def test_nobody_asks_no_distribution(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("computed top logprobs nobody asked for")

    monkeypatch.setattr(sampler, "logprob_distribution", boom)
    engine = LLMEngine(tiny, CFG)
    done = engine.generate(
        [[5, 6, 7], [8, 9]],
        [SamplingParams.greedy(4, ignore_eos=True, logprobs=True), SamplingParams(max_tokens=4, seed=4, ignore_eos=True)],
    )
    assert all(c.top_logprobs is None and len(c.token_ids) == 4 for c in done)


def test_row_by_row_fallback_keeps_top_logprobs(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed batched sampler call is retried row by row; alternatives survive it."""
    engine = LLMEngine(tiny, CFG)
    real = engine.runner.sampler._sample_rows

    def one_at_a_time(logits, rows, *rest):
        if len(rows) > 1:
            raise RuntimeError("batched call failed")
        return real(logits, rows, *rest)

    monkeypatch.setattr(engine.runner.sampler, "_sample_rows", one_at_a_time)
    params = [SamplingParams.greedy(3, ignore_eos=True, top_logprobs=2), SamplingParams.greedy(3, ignore_eos=True)]
    done = engine.generate([[5, 6, 7], [8, 9]], params)
    assert done[0].top_logprobs is not None and [len(a) for a in done[0].top_logprobs] == [2, 2, 2]
    assert [a[0][0] for a in done[0].top_logprobs] == done[0].token_ids  # greedy: the top one
    assert done[1].top_logprobs is None and done[1].logprobs is None
