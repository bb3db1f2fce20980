"""Grammar-constrained decoding in the engine (ignis/engine/grammar.py) with the tiny random
model: outputs match their schema (greedy and sampled, beside unconstrained rows),
preemption keeps the matcher right, abort frees it, a row that cannot go on fails alone,
and what a grammar refuses at submit."""

from __future__ import annotations

import json

import pytest
import torch

from ignis.config import EngineConfig
from ignis.engine import EngineFinish, LLMEngine, SamplingParams
from ignis.engine.grammar import Grammar, GrammarError, GrammarState, is_grammar_failure, ll_tokenizer
from ignis.model import LoadedModel

jsonschema = pytest.importorskip("jsonschema")

CFG = EngineConfig(num_kv_blocks=128, block_size=4, cpu_pack_weights=False)
# Every value bounded, so a random model's output ends well within max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog", "hello world"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["kind", "ok", "tags"],
    "additionalProperties": False,
}


def _prompt(tiny: LoadedModel, text: str = "hello world") -> list[int]:
    return tiny.tokenizer.encode(text)


def test_constrained_output_matches_schema_beside_free_rows(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, CFG)
    g = Grammar.json_schema(SCHEMA)
    params = [SamplingParams.greedy(80, grammar=g), SamplingParams.greedy(12),
              SamplingParams(max_tokens=80, temperature=1.0, seed=5, grammar=g),
              SamplingParams(max_tokens=80, temperature=1.3, top_k=20, seed=9, grammar=Grammar.json_object())]
    free_alone = LLMEngine(tiny, CFG).generate([_prompt(tiny)], SamplingParams.greedy(12))[0]
    outs = engine.generate([_prompt(tiny)] * 4, params)
    for k in (0, 2):
        assert outs[k].finish_reason is EngineFinish.STOP, outs[k]
        jsonschema.validate(json.loads(outs[k].text), SCHEMA)
    assert outs[3].finish_reason in (EngineFinish.STOP, EngineFinish.LENGTH)
    if outs[3].finish_reason is EngineFinish.STOP:
        assert isinstance(json.loads(outs[3].text), dict)
    # The unconstrained row is what it is alone: the masks touch only their rows.
    assert outs[1].token_ids == free_alone.token_ids


def test_length_cut_leaves_a_prefix_and_says_length(tiny: LoadedModel) -> None:
    out = LLMEngine(tiny, CFG).generate([_prompt(tiny)], SamplingParams.greedy(3, grammar=Grammar.json_schema(SCHEMA)))[0]
    assert out.finish_reason is EngineFinish.LENGTH
    assert out.text.startswith("{") and len(out.token_ids) == 3


def test_regex_and_lark(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, CFG)
    outs = engine.generate(
        [_prompt(tiny)] * 2,
        [SamplingParams.greedy(40, grammar=Grammar.regex(r"(yes|no)-[0-9]{2}")),
         SamplingParams(max_tokens=40, temperature=1.0, seed=3,
                        grammar=Grammar.lark('start: "<" WORD ">"\nWORD: /[a-z]{1,5}/'))],
    )
    import re

    assert re.fullmatch(r"(yes|no)-[0-9]{2}", outs[0].text), outs[0]
    assert re.fullmatch(r"<[a-z]{1,5}>", outs[1].text), outs[1]
    assert outs[0].finish_reason is outs[1].finish_reason is EngineFinish.STOP


def test_preemption_keeps_the_matcher(tiny: LoadedModel) -> None:
    """Few KV blocks: sequences are preempted and recomputed mid-output; the constrained
    greedy outputs equal those of a roomy engine."""
    g = Grammar.json_schema(SCHEMA)
    prompts = [_prompt(tiny, f"hello world {i}") for i in range(4)]
    params = [SamplingParams.greedy(60, grammar=g)] * 4
    roomy = LLMEngine(tiny, CFG).generate(prompts, params)
    tight = LLMEngine(tiny, EngineConfig(num_kv_blocks=12, block_size=4, cpu_pack_weights=False,
                                         enable_prefix_caching=False))
    outs = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    assert all(o.finish_reason is EngineFinish.STOP for o in outs)


def test_abort_frees_the_matcher(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, CFG)
    engine.add_request("a", _prompt(tiny), SamplingParams.greedy(60, grammar=Grammar.json_schema(SCHEMA)))
    engine.add_request("b", _prompt(tiny), SamplingParams.greedy(5))
    engine.step()
    seq = engine.seqs["a"]
    assert seq.grammar is not None and seq.grammar.num_tokens == 1
    assert engine.abort_request("a")
    assert seq.grammar is None and "a" not in engine.seqs
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert finals["a"].finish_reason is EngineFinish.ABORT and finals["b"].finish_reason is EngineFinish.LENGTH


def test_empty_mask_fails_that_row_only(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is allowed (a mask with no bit set): that request fails with a message,
    the other of the batch goes on."""
    import ignis.engine.grammar_masks as masks_module

    real = masks_module.fill_masks

    def empty(states, out):
        real(states, out)
        out[:] = 0

    monkeypatch.setattr(masks_module, "fill_masks", empty)
    engine = LLMEngine(tiny, CFG)
    bad = SamplingParams.greedy(10, grammar=Grammar.regex("abc"))
    outs = engine.generate([_prompt(tiny)] * 2, [bad, SamplingParams.greedy(4)])
    assert outs[0].finish_reason is EngineFinish.ERROR and "grammar allows no token" in (outs[0].error or "")
    assert outs[1].finish_reason is EngineFinish.LENGTH and len(outs[1].token_ids) == 4


def test_rejected_token_fails_the_request(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token the matcher rejects (a sampler fault) ends the request with an error."""
    engine = LLMEngine(tiny, CFG)
    real = engine.runner.execute

    def wrong(batch):  # the sampler "draws" a token outside the mask
        result = real(batch)
        result.tokens = [tiny.tokenizer.encode("zz")[0] if t is not None else None for t in result.tokens]
        return result

    monkeypatch.setattr(engine.runner, "execute", wrong)
    out = engine.generate([_prompt(tiny)], SamplingParams.greedy(10, grammar=Grammar.regex("[0-9]+")))[0]
    assert out.finish_reason is EngineFinish.ERROR and "does not match the output grammar" in (out.error or "")
    assert is_grammar_failure(out.error)  # the server answers it as the request's fault


def test_only_grammar_errors_count_as_the_requests_grammar() -> None:
    assert is_grammar_failure("the output grammar allows no token here: parser error: Too many items")
    assert not is_grammar_failure("output processing failed: RuntimeError('x')")
    assert not is_grammar_failure(None)


def test_refused_at_submit(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, CFG)
    g = Grammar.json_object()
    with pytest.raises(ValueError, match="stop strings"):
        engine.add_request("s", _prompt(tiny), SamplingParams(stop=["}"], grammar=g))
    with pytest.raises(ValueError, match="min_tokens"):
        engine.add_request("m", _prompt(tiny), SamplingParams(min_tokens=2, grammar=g))
    with pytest.raises(GrammarError, match="unknown name"):
        GrammarState(Grammar.lark("start: foo"), ll_tokenizer(tiny.tokenizer, tiny.config.vocab_size))
    with pytest.raises(GrammarError):
        Grammar.lark("start: /a[b/").check()
    assert not engine.seqs


def test_a_prepared_grammar_starts_each_sequence_from_a_copy(tiny: LoadedModel) -> None:
    """`Grammar.prepared` builds the matcher in the caller's thread; every sequence starts
    from a copy of it, so the prototype is never advanced and outputs are the same."""
    lt = ll_tokenizer(tiny.tokenizer, tiny.config.vocab_size)
    plain = Grammar.json_schema(SCHEMA)
    prepared = plain.prepared(lt)
    assert prepared == plain and prepared.prototype is not None
    want = LLMEngine(tiny, CFG).generate([_prompt(tiny)], SamplingParams.greedy(80, grammar=plain))[0]
    outs = LLMEngine(tiny, CFG).generate([_prompt(tiny)] * 2, SamplingParams.greedy(80, grammar=prepared))
    assert [o.token_ids for o in outs] == [want.token_ids] * 2
    jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    # The prototype is where every copy starts: nothing consumed.
    assert prepared.prototype[1].deep_copy().consume_tokens(want.token_ids)


def test_masks_are_filled_while_the_model_runs(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner starts each step's bitmasks before the forward, on the mask threads; the
    sampler uses them. A prefetch for other rows than those sampled is left alone: the
    masks of the rows at hand are filled for them."""
    import threading

    import ignis.engine.grammar_masks as masks_module

    real = masks_module.fill_masks
    threads: list[str] = []

    def spy(states, out):
        threads.append(threading.current_thread().name)
        real(states, out)

    monkeypatch.setattr(masks_module, "fill_masks", spy)
    engine = LLMEngine(tiny, CFG)
    out = engine.generate([_prompt(tiny)], SamplingParams.greedy(80, grammar=Grammar.json_schema(SCHEMA)))[0]
    jsonschema.validate(json.loads(tiny.tokenizer.decode(out.token_ids)), SCHEMA)
    assert threads and all(name.startswith("ignis-masks") for name in threads)

    # A prefetch for other rows: not used for these.
    engine.add_request("a", _prompt(tiny), SamplingParams.greedy(4, grammar=Grammar.regex("[0-9]+")))
    engine.add_request("b", _prompt(tiny, "cat"), SamplingParams.greedy(4, grammar=Grammar.regex("[a-c]+")))
    a, b = engine.seqs["a"], engine.seqs["b"]
    sampler = engine.runner.sampler
    sampler.prefetch_masks([a])
    logits = torch.zeros(1, tiny.config.vocab_size)
    got = sampler.sample(logits, [b])
    assert not got.errors and not got.deferred and tiny.tokenizer.decode([got.tokens[0]]).strip("abc") == ""
