"""vLLM's ``min_tokens`` and ``ignore_eos`` in the engine, on the tiny random Llama
(greedy): the stop ids cannot be drawn before ``min_tokens`` output tokens, and with
``ignore_eos`` the model's EOS ids do not end the output."""

from __future__ import annotations

import pytest

from ignis.config import EngineConfig
from ignis.engine import EngineFinish, LLMEngine, SamplingParams

PROMPT = [5, 9, 13, 21, 34]


@pytest.fixture
def engine(tiny):
    return LLMEngine(tiny, EngineConfig(num_kv_blocks=64, max_num_seqs=4, cpu_threads=1))


def _run(engine, params):
    [c] = engine.generate([PROMPT], params)
    return c


def test_min_tokens_holds_back_the_stop_ids(engine):
    free = _run(engine, SamplingParams.greedy(6))
    first = free.token_ids[0]
    stopped = _run(engine, SamplingParams.greedy(6, stop_token_ids=[first]))
    assert stopped.token_ids == [first] and stopped.finish_reason is EngineFinish.STOP
    held = _run(engine, SamplingParams.greedy(6, stop_token_ids=[first], min_tokens=4))
    assert first not in held.token_ids[:4] and len(held.token_ids) >= 4
    assert held.token_ids[0] != first  # the next most likely token instead


def test_ignore_eos(engine):
    first = _run(engine, SamplingParams.greedy(6)).token_ids[0]
    engine.eos_token_ids = frozenset({first})  # pretend the model's first token is its EOS
    assert _run(engine, SamplingParams.greedy(6)).token_ids == [first]
    kept = _run(engine, SamplingParams.greedy(6, ignore_eos=True))
    assert len(kept.token_ids) == 6 and kept.token_ids[0] == first and kept.finish_reason is EngineFinish.LENGTH


def test_min_tokens_is_validated():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=-1).validate()
