"""Forced starts (ignis/engine/constraint.py): the allowed sets on handmade vocabularies,
then through the engine with the tiny model: the answer begins with a choice (greedy and
sampled), other rows of the batch are untouched, reasoning first, a token running past a
choice's end, and free sampling after it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.constraint import (
    ConstraintState,
    OutputConstraint,
    TokenIndex,
    _successor,
    token_index,
)
from ignis.engine.sequence import Sequence
from ignis.model import LoadedModel

CFG = EngineConfig(num_kv_blocks=64, block_size=4, cpu_pack_weights=False)


# -- the index and the state on handmade vocabularies ---------------------------------

VOCAB = [b"", b"a", b"ab", b"abc", b"abcd", b"b", b"abx", b"get_", b"g", b"get_a", b"get_b", b"x", b"ge", b"\xff",
         b"a\xff", b"a\xff\xff", b"b\x00"]
IDS = {b: i for i, b in enumerate(VOCAB)}


def allowed_bytes(state: ConstraintState) -> set[bytes]:
    allowed = state.allowed()
    assert allowed is not None
    return {VOCAB[i] for i in allowed.id_set(state.index)}


def test_prefix_tokens_equal_and_overshooting_ones() -> None:
    state = ConstraintState(OutputConstraint((b"abc",)), TokenIndex(VOCAB))
    # Proper prefixes, the text itself, and tokens that run past it; never the empty token.
    assert allowed_bytes(state) == {b"a", b"ab", b"abc", b"abcd"}
    state.advance(IDS[b"a"])
    assert allowed_bytes(state) == {b"b"}
    state.advance(IDS[b"b"])
    # "c" is no token here: nothing fits, so the constraint gives up rather than stall the row.
    assert state.allowed() is None and state.done and not state.satisfied


def test_overshoot_completes_the_choice() -> None:
    state = ConstraintState(OutputConstraint((b"abc",)), TokenIndex(VOCAB))
    state.advance(IDS[b"abcd"])  # runs one byte past the choice's end
    assert state.done and state.satisfied and state.allowed() is None


def test_several_choices_narrow_as_tokens_come() -> None:
    state = ConstraintState(OutputConstraint((b"get_a", b"get_b")), TokenIndex(VOCAB))
    assert allowed_bytes(state) == {b"g", b"ge", b"get_", b"get_a", b"get_b"}
    state.advance(IDS[b"get_"])
    assert state.forcing and state.alive == (b"get_a", b"get_b")
    # "a" or "b" completes one; so does any token starting with them, running past the end.
    assert allowed_bytes(state) == {b"a", b"ab", b"abc", b"abcd", b"abx", b"a\xff", b"a\xff\xff", b"b", b"b\x00"}
    state.advance(IDS[b"b"])
    assert state.done and state.satisfied


def test_narrowing_drops_choices_that_no_longer_fit() -> None:
    state = ConstraintState(OutputConstraint((b"abx", b"abcd", b"get_a")), TokenIndex(VOCAB))
    assert allowed_bytes(state) == {b"a", b"ab", b"abc", b"abcd", b"abx", b"g", b"ge", b"get_", b"get_a"}
    state.advance(IDS[b"ab"])
    assert state.alive == (b"abx", b"abcd")
    assert allowed_bytes(state) == {b"x"}  # "c" and "cd" are no tokens; "x" completes abx
    state.advance(IDS[b"x"])
    assert state.done and state.satisfied


def test_ranges_reach_bytes_up_to_0xff() -> None:
    assert _successor(b"a") == b"b" and _successor(b"a\xff") == b"b" and _successor(b"\xff\xff") is None
    state = ConstraintState(OutputConstraint((b"a\xff",)), TokenIndex(VOCAB))
    assert allowed_bytes(state) == {b"a", b"a\xff", b"a\xff\xff"}
    state = ConstraintState(OutputConstraint((b"\xff",)), TokenIndex(VOCAB))
    assert allowed_bytes(state) == {b"\xff"}


def test_reasoning_phases() -> None:
    index = TokenIndex(VOCAB)
    think, end = IDS[b"x"], IDS[b"b"]  # stand-ins for <think> and </think>
    # The first token may open a think block: free until its end, then forced.
    state = ConstraintState(OutputConstraint((b"get_a",), think_start_id=think, think_end_id=end), index)
    assert allowed_bytes(state) == {b"g", b"ge", b"get_", b"get_a", b"x"}
    state.advance(think)
    assert not state.forcing and state.allowed() is None
    state.advance(IDS[b"abc"])
    state.advance(end)
    assert state.forcing and allowed_bytes(state) == {b"g", b"ge", b"get_", b"get_a"}  # no second think block
    # A first token that is not the think tag starts forcing at once.
    state = ConstraintState(OutputConstraint((b"get_a",), think_start_id=think, think_end_id=end), index)
    state.advance(IDS[b"get_"])
    assert allowed_bytes(state) == {b"a", b"ab", b"abc", b"abcd", b"abx", b"a\xff", b"a\xff\xff"}  # no <think>
    # The prompt ends inside the block: free until its end.
    state = ConstraintState(OutputConstraint((b"get_a",), think_start_id=think, think_end_id=end,
                                             starts_in_reasoning=True), index)
    assert state.allowed() is None
    state.advance(think)
    assert state.allowed() is None
    state.advance(end)
    assert allowed_bytes(state) == {b"g", b"ge", b"get_", b"get_a"}
    # Without both think ids there is no reasoning phase.
    state = ConstraintState(OutputConstraint((b"get_a",), think_start_id=think), index)
    assert b"x" not in allowed_bytes(state)


def test_thinking_budget_phases() -> None:
    index = TokenIndex(VOCAB)
    think, end, a = IDS[b"x"], IDS[b"b"], IDS[b"a"]
    # In a block the prompt opened: free for `budget` tokens, then only the closing tag.
    state = ConstraintState(OutputConstraint(think_end_id=end, starts_in_reasoning=True, think_budget=2), index)
    for _ in range(2):
        assert state.allowed() is None
        state.advance(a)
    assert state.forcing and state.allowed().id_set(index) == {end}
    state.advance(end)
    assert state.done and state.allowed() is None
    # The model closes the block itself within the budget: nothing is forced.
    state = ConstraintState(OutputConstraint(think_end_id=end, starts_in_reasoning=True, think_budget=2), index)
    state.advance(a)
    state.advance(end)
    assert state.done
    # The first token may open the block (not counted); any other first token ends it all.
    state = ConstraintState(OutputConstraint(think_start_id=think, think_end_id=end, think_budget=1), index)
    assert state.allowed() is None
    state.advance(a)
    assert state.done and state.allowed() is None
    state = ConstraintState(OutputConstraint(think_start_id=think, think_end_id=end, think_budget=1), index)
    state.advance(think)
    assert state.allowed() is None
    state.advance(a)
    assert state.allowed().id_set(index) == {end}
    # Budget 0 closes at once; with choices, the forced start follows the forced close.
    state = ConstraintState(OutputConstraint((b"get_a",), think_start_id=think, think_end_id=end,
                                             starts_in_reasoning=True, think_budget=0), index)
    assert state.allowed().id_set(index) == {end}
    state.advance(end)
    assert allowed_bytes(state) == {b"g", b"ge", b"get_", b"get_a"}


def test_validation() -> None:
    for bad in [OutputConstraint(()), OutputConstraint((b"",)), OutputConstraint(("text",)),  # type: ignore[arg-type]
                OutputConstraint((b"a",), think_end_id=-1), OutputConstraint(think_budget=3),
                OutputConstraint(think_end_id=1, think_budget=-1), OutputConstraint(think_end_id=1, think_budget=True)]:
        with pytest.raises(ValueError):
            SamplingParams(constraint=bad).validate()


def test_index_of_a_real_tokenizer_counts_added_tokens(tiny: LoadedModel) -> None:
    tok = tiny.tokenizer
    index = token_index(tok, tiny.config.vocab_size)
    assert token_index(tok, tiny.config.vocab_size) is index  # built once
    call = tok.added_tokens["<tool_call>"]
    assert index.bytes_of(call) == b"<tool_call>"
    state = ConstraintState(OutputConstraint((b"<tool_call>\n{",)), index)
    allowed = state.allowed()
    assert allowed is not None and call in allowed.id_set(index)
    assert not any(tok.decode([i]) == "" for i in allowed.id_set(index))
    # Rows past the tokenizer (the model's spare embedding rows) have no bytes: never allowed.
    assert len(index.token_bytes) == min(tok.vocab_size, tiny.config.vocab_size)


# -- through the engine ---------------------------------------------------------------

CALL = b'<tool_call>\n{"name": "get_weather", "arguments": '
PROMPT = [298, 330, 326, 293, 323]  # "The cap ital of Fr" in the tiny vocabulary


def biased(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, bias: Callable[[Sequence], dict[int, float]]) -> None:
    """Make the random model 'want' tokens: add bias(seq) to its logits before sampling."""
    real = engine.runner.sampler._sample_rows

    def sample_rows(logits: torch.Tensor, rows: list[Sequence]) -> object:
        logits = logits.clone()
        for k, seq in enumerate(rows):
            for t, v in bias(seq).items():
                logits[k, t] += v
        return real(logits, rows)

    monkeypatch.setattr(engine.runner.sampler, "_sample_rows", sample_rows)


def output_bytes(tiny: LoadedModel, ids: list[int]) -> bytes:
    return b"".join(tiny.tokenizer.token_bytes(i) for i in ids)


@pytest.mark.parametrize("sampled", [False, True])
def test_forced_row_in_a_batch_leaves_the_others_alone(tiny: LoadedModel, sampled: bool) -> None:
    c = OutputConstraint((CALL, b'<tool_call>\n{"name": "get_time", "arguments": '))
    prompts = [[5, 6, 7, 8], list(range(10, 31)), PROMPT, [9, 3]]
    seeds = range(4) if sampled else [None]
    for seed in seeds:
        mixed = [
            SamplingParams(max_tokens=48, ignore_eos=True, constraint=c if i % 2 == 0 else None,
                           temperature=1.0 if sampled else 0.0, seed=None if seed is None else 100 * seed + i)
            for i in range(len(prompts))
        ]
        batch = LLMEngine(tiny, CFG).generate(prompts, mixed)
        for i, out in enumerate(batch):
            alone = LLMEngine(tiny, CFG).generate([prompts[i]], mixed[i])[0]
            assert out.token_ids == alone.token_ids
            text = output_bytes(tiny, out.token_ids)
            if i % 2 == 0:
                assert text.startswith(c.choices), text
                assert out.text.encode().startswith(b'<tool_call>\n{"name": "get_')  # detokenized as is
            else:  # unconstrained: not forced
                assert not text.startswith(b"<tool_call>")


def test_eos_is_held_back_while_forcing_then_free(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LLMEngine(tiny, CFG)
    eos = tiny.tokenizer.added_tokens["<|im_end|>"]
    biased(engine, monkeypatch, lambda seq: {eos: 1e4})  # the model wants to stop at once
    out = engine.generate([PROMPT], SamplingParams.greedy(40, constraint=OutputConstraint((CALL,))))[0]
    # Forced to the end of the choice (the last forced token may run past it), then the
    # first free step stops.
    assert out.token_ids[-1] == eos and out.finish_reason.value == "stop"
    forced = output_bytes(tiny, out.token_ids[:-1])
    assert forced.startswith(CALL) and CALL.startswith(output_bytes(tiny, out.token_ids[:-2]))
    assert out.text.encode() == forced


def test_a_token_may_run_past_the_choice(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny.tokenizer
    france, paris = tok.token_to_id("ĠFrance"), tok.token_to_id("Paris")
    assert tok.token_bytes(france) == b" France"
    engine = LLMEngine(tiny, CFG)
    # The model wants " France" (allowed only once the rest is " Fr" or shorter), then "Paris".
    biased(engine, monkeypatch, lambda seq: {france: 1e4, paris: 5e3})
    choice = b"The capital of Fr"
    out = engine.generate([[5, 6]], SamplingParams.greedy(30, ignore_eos=True, constraint=OutputConstraint((choice,))))[0]
    assert output_bytes(tiny, out.token_ids).startswith(b"The capital of France")
    cut = out.token_ids.index(france)  # the first " France" runs past the choice's end ...
    assert output_bytes(tiny, out.token_ids[:cut]) == b"The capital of"
    after = out.token_ids[cut + 1 :]
    assert after and set(after) == {france}  # ... and sampling is free again: the biased token every step


def test_reasoning_first_then_forced(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny.tokenizer
    think, end = tok.added_tokens["<think>"], tok.added_tokens["</think>"]
    paris = tok.token_to_id("Paris")
    c = OutputConstraint((CALL,), think_start_id=think, think_end_id=end)

    def wants(seq: Sequence) -> dict[int, float]:
        n = seq.num_output_tokens  # <think> Paris Paris </think>, then Paris forever
        return {think: 1e4} if n == 0 else {end: 1e4} if n == 3 else {paris: 1e4}

    engine = LLMEngine(tiny, CFG)
    biased(engine, monkeypatch, wants)
    out = engine.generate([PROMPT], SamplingParams(max_tokens=30, temperature=1.0, seed=7, ignore_eos=True,
                                                   constraint=c))[0]
    assert out.token_ids[:4] == [think, paris, paris, end]  # free inside the block
    rest = output_bytes(tiny, out.token_ids[4:])
    assert rest.startswith(CALL)  # forced right after it
    assert out.token_ids[-1] == paris  # and free after the choice

    # Without reasoning in the constraint, the same model is forced from the first token.
    engine = LLMEngine(tiny, CFG)
    biased(engine, monkeypatch, wants)
    out = engine.generate([PROMPT], SamplingParams.greedy(30, ignore_eos=True, constraint=OutputConstraint((CALL,))))[0]
    assert output_bytes(tiny, out.token_ids).startswith(CALL) and think not in out.token_ids[:1]

    # The prompt ends inside the block: free until </think>.
    c = OutputConstraint((CALL,), think_start_id=think, think_end_id=end, starts_in_reasoning=True)
    engine = LLMEngine(tiny, CFG)
    biased(engine, monkeypatch, lambda seq: {end: 1e4} if seq.num_output_tokens == 2 else {paris: 1e4})
    out = engine.generate([PROMPT], SamplingParams.greedy(30, ignore_eos=True, constraint=c))[0]
    assert out.token_ids[:3] == [paris, paris, end]
    assert output_bytes(tiny, out.token_ids[3:]).startswith(CALL)


def test_thinking_budget_closes_the_block(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny.tokenizer
    think, end = tok.added_tokens["<think>"], tok.added_tokens["</think>"]
    paris = tok.token_to_id("Paris")
    # A model that opens a think block and never closes it.
    wants = lambda seq: {think: 1e4} if seq.num_output_tokens == 0 else {paris: 1e4}  # noqa: E731
    for budget, opened_by in [(3, "model"), (0, "model"), (2, "prompt")]:
        engine = LLMEngine(tiny, CFG)
        biased(engine, monkeypatch, wants if opened_by == "model" else (lambda seq: {paris: 1e4}))
        c = OutputConstraint(think_start_id=think, think_end_id=end, think_budget=budget,
                             starts_in_reasoning=opened_by == "prompt")
        out = engine.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True,
                                                       constraint=c))[0]
        head = [think] if opened_by == "model" else []
        assert out.token_ids[: len(head) + budget + 1] == head + [paris] * budget + [end]
        assert out.token_ids[len(head) + budget + 1 :] == [paris] * (12 - len(head) - budget - 1)  # free after


def test_preemption_keeps_the_state(tiny: LoadedModel) -> None:
    """A sequence preempted mid-forcing (its KV recomputed) still ends with the choice."""
    cfg = EngineConfig(num_kv_blocks=10, block_size=4, cpu_pack_weights=False, max_num_seqs=4)
    choice = b'<tool_call>\n{"name": "f"'
    prompts = [list(range(10, 18)), list(range(20, 28)), list(range(30, 38))]
    params = [SamplingParams.greedy(20, ignore_eos=True, constraint=OutputConstraint((choice,)))] * 3
    engine = LLMEngine(tiny, cfg)
    outs = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for out in outs:
        assert output_bytes(tiny, out.token_ids).startswith(choice)


def test_logprobs_of_forced_tokens_come_from_the_masked_distribution(tiny: LoadedModel) -> None:
    out = LLMEngine(tiny, CFG).generate(
        [PROMPT], SamplingParams.greedy(20, ignore_eos=True, top_logprobs=5, constraint=OutputConstraint((CALL,))))[0]
    assert all(lp <= 0.0 and lp > float("-inf") for lp in out.logprobs)
    # The first token is forced to "<tool_call>" or "<" (only they fit): the alternatives are
    # those allowed ones, never an impossible (-inf) token.
    first = out.top_logprobs[0]
    assert 1 <= len(first) <= 5 and all(lp > float("-inf") for _, lp in first)
    allowed = {tiny.tokenizer.added_tokens["<tool_call>"], tiny.tokenizer.token_to_id("<")}
    assert {t for t, _ in first} <= allowed
    assert abs(sum(torch.tensor([lp for _, lp in first]).exp().tolist()) - 1.0) < 1e-4


def test_requires_a_byte_level_vocabulary(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LLMEngine(tiny, CFG)
    monkeypatch.setattr(type(engine.tokenizer), "is_byte_level", property(lambda self: False))
    with pytest.raises(ValueError, match="byte-level"):
        engine.add_request("x", PROMPT, SamplingParams(constraint=OutputConstraint((CALL,))))
    assert not engine.seqs


def test_row_by_row_retry_masks_the_original_logits(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed batched sampler call is retried row by row on the same logits: the forced
    row is masked afresh (its mask went on a copy), the free row is untouched."""
    from ignis.engine import sampler

    real = sampler.sample
    failed = []

    def flaky(logits: torch.Tensor, params: object, **kw: object) -> object:
        if logits.shape[0] > 1:
            failed.append(True)
            raise RuntimeError("batched call failed")
        return real(logits, params, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler, "sample", flaky)
    params = [SamplingParams(max_tokens=48, temperature=1.0, seed=3, ignore_eos=True, constraint=OutputConstraint((CALL,))),
              SamplingParams(max_tokens=48, temperature=1.0, seed=4, ignore_eos=True)]
    done = LLMEngine(tiny, CFG).generate([PROMPT, [5, 6, 7]], params)
    assert failed
    assert output_bytes(tiny, done[0].token_ids).startswith(CALL)
    monkeypatch.setattr(sampler, "sample", real)
    assert done[1].token_ids == LLMEngine(tiny, CFG).generate([[5, 6, 7]], params[1])[0].token_ids


def test_sampler_kernel_draws_only_allowed_tokens_of_masked_rows() -> None:
    """Masked rows are mostly -inf: the Triton kernel (interpreted here) draws what the
    reference draws, always an allowed token, with the same logprobs."""
    from kernels.sampling import SamplingTensors, sample

    B, V = 6, 96
    g = torch.Generator().manual_seed(0)
    allowed = torch.zeros(B, V, dtype=torch.bool)
    for b, n in enumerate([1, 2, 3, 5, 40, 96]):
        allowed[b, torch.randperm(V, generator=g)[:n]] = True
    x = torch.where(allowed, torch.randn(B, V, generator=g) * 3, float("-inf"))
    params = SamplingTensors.from_lists(
        [0.0, 1.0, 0.7, 1.3, 1.0, 0.5], top_k=[0, 5, 2, 0, 3, 0], top_p=[1.0, 0.9, 1.0, 0.5, 1.0, 0.8],
        min_p=[0.0, 0.0, 0.1, 0.0, 0.05, 0.0], presence_penalty=[0.0, 0.5, 0.0, 0.0, 0.0, 0.0],
        seed=list(range(B)), step=[3] * B, output_tokens=torch.tensor([[1, 2, -1]] * B, dtype=torch.int32),
        prompt_tokens=torch.full((B, 1), -1, dtype=torch.int32))
    ref, ref_lp = sample(x, params, return_logprobs=True, backend="torch")
    got, got_lp = sample(x, params, return_logprobs=True, backend="triton")
    assert got.tolist() == ref.tolist() and bool(allowed.gather(1, got[:, None]).all())
    assert torch.allclose(got_lp, ref_lp, atol=1e-5) and bool(torch.isfinite(got_lp).all())
