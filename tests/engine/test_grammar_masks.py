"""Grammar masks that take long never hold other requests up (ignis/engine/grammar_masks.py):
a row whose mask misses its step is deferred (the others get their token every step) and
still ends with the output the grammar allows; a mask past the timeout fails its request
alone; a grammar that can go nowhere (a matcher in error) is never reported complete."""

from __future__ import annotations

import re
import threading
import time

import pytest

import ignis.engine.grammar_masks as masks_module
from ignis.config import EngineConfig
from ignis.engine import EngineFinish, LLMEngine, SamplingParams
from ignis.engine.grammar import Grammar
from ignis.model import LoadedModel

CFG = EngineConfig(num_kv_blocks=128, block_size=4, cpu_pack_weights=False)
SLOW = r"(yes|no)-[0-9]{2}"  # the grammar whose fills are made slow below


def _slow_fills(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[str]:
    """Fills of the SLOW grammar's rows sleep `seconds` first (a grammar llguidance works
    long on); returns the names of the threads fills ran on."""
    real = masks_module.fill_masks
    threads: list[str] = []

    def fill(states, out):
        threads.append(threading.current_thread().name)
        if any(s.grammar.source == SLOW for s in states):
            time.sleep(seconds)
        real(states, out)

    monkeypatch.setattr(masks_module, "fill_masks", fill)
    return threads


def test_a_slow_mask_defers_its_row_only(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _slow_fills(monkeypatch, 0.4)
    engine = LLMEngine(tiny, CFG)
    prompt = tiny.tokenizer.encode("hello world")
    engine.add_request("plain", prompt, SamplingParams.greedy(6))
    engine.add_request("slow", prompt, SamplingParams.greedy(20, grammar=Grammar.regex(SLOW)))
    engine.add_request("quick", prompt, SamplingParams.greedy(20, grammar=Grammar.regex("[a-c]{3}")))
    plain_tokens, steps, finals, late, text = 0, 0, {}, False, {"slow": "", "quick": "", "plain": ""}
    while engine.has_unfinished_requests():
        outs = engine.step()
        if "plain" not in finals:
            steps += 1
        slow = engine.seqs.get("slow")
        late = late or (slow is not None and slow.grammar is not None and slow.grammar.late)
        for out in outs:
            text[out.request_id] += out.text
            if out.request_id == "plain":
                plain_tokens += len(out.token_ids)
            if out.finished:
                finals[out.request_id] = out
        if engine.stalled:
            engine.masks.wait_any([s.grammar for s in engine.seqs.values() if s.grammar is not None], 0.05)
    # One token a step for the plain request (prefill, then 5 decodes), slow mask or not.
    assert plain_tokens == 6 and steps == 6
    assert late and "ignis-masks-alone-0" in threads
    assert finals["slow"].finish_reason is EngineFinish.STOP and re.fullmatch(SLOW, text["slow"]), text
    assert finals["quick"].finish_reason is EngineFinish.STOP and re.fullmatch("[a-c]{3}", text["quick"]), text


def test_generate_waits_for_slow_masks(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_fills(monkeypatch, 0.1)
    out = LLMEngine(tiny, CFG).generate([tiny.tokenizer.encode("hi")], SamplingParams.greedy(20, grammar=Grammar.regex(SLOW)))[0]
    assert out.finish_reason is EngineFinish.STOP and re.fullmatch(SLOW, out.text)


def test_a_mask_past_the_timeout_fails_its_request(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_fills(monkeypatch, 0.6)
    monkeypatch.setattr(masks_module, "MASK_TIMEOUT_S", 0.2)
    monkeypatch.setattr("ignis.engine.engine.MASK_TIMEOUT_S", 0.2)
    engine = LLMEngine(tiny, CFG)
    prompt = tiny.tokenizer.encode("hello world")
    outs = engine.generate([prompt, prompt], [SamplingParams.greedy(20, grammar=Grammar.regex(SLOW)),
                                              SamplingParams.greedy(4)])
    assert outs[0].finish_reason is EngineFinish.ERROR and "to compute the next token's mask" in outs[0].error
    assert outs[1].finish_reason is EngineFinish.LENGTH and len(outs[1].token_ids) == 4


def test_a_grammar_with_no_way_out_is_never_complete(tiny: LoadedModel) -> None:
    """A $ref cycle: llguidance's matcher errs where the value must start (and would let
    EOS through); the request fails instead of ending as complete."""
    schema = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "object",
              "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"], "additionalProperties": False}
    out = LLMEngine(tiny, CFG).generate([tiny.tokenizer.encode("hi")],
                                        SamplingParams.greedy(40, grammar=Grammar.json_schema(schema)))[0]
    assert out.finish_reason is EngineFinish.ERROR, out
    assert len(out.error or "") < 500
