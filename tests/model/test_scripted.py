"""The scripted model: script parsing and refusal of bad scripts, and replies through the
real engine, sampled at any temperature, in batches, over prefix-cache hits and after
preemption (it reads each sequence back from the paged KV cache)."""

from __future__ import annotations

import json

import pytest

from ignis.config import EngineConfig, KernelBackend
from ignis.engine import LLMEngine
from ignis.engine.sampling_params import SamplingParams
from ignis.model import load_model
from ignis.model.chat_template import encode_chat
from ignis.model.scripted import Script, ScriptError

SCRIPT = {
    "rules": [
        {"contains": "<tool_response>", "reply": "Done."},
        {"regex": r"(?i)\bweather\b", "role": "user", "reply": "<think>Look it up.</think>Sunny."},
        {"role": "system", "reply": "A system message came last."},
        {"contains": "count", "reply": " ".join(str(i) for i in range(100))},
    ],
    "default": "No idea.",
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    path = tmp_path_factory.mktemp("scripted") / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return load_model(kind="scripted", script=str(path), device="cpu")


def _prompt(loaded, *messages):
    msgs = [{"role": r, "content": c} for r, c in messages]
    return encode_chat(loaded.tokenizer, loaded.chat_template, msgs, add_generation_prompt=True)


def _engine(loaded, **kw):
    cfg = dict(kernel_backend=KernelBackend.torch, num_kv_blocks=256, max_num_seqs=8, cpu_threads=1)
    cfg.update(kw)
    return LLMEngine(loaded, EngineConfig(**cfg))


@pytest.mark.parametrize("bad, message", [
    ({"rules": [{"contains": "x"}]}, "needs a string 'reply'"),
    ({"rules": [{"reply": "x"}]}, "needs 'contains', 'regex' or 'role'"),
    ({"rules": [{"reply": "x", "regex": "("}]}, "bad regex"),
    ({"rules": [{"reply": "x", "contains": "y", "when": 1}]}, "unknown keys"),
    ({"rule": []}, "unknown keys"),
    ([], "expected a mapping"),
])
def test_bad_scripts_are_refused(bad, message):
    with pytest.raises(ScriptError, match=message):
        Script.from_dict(bad)


def test_a_script_is_required():
    with pytest.raises(ScriptError, match="model.script"):
        load_model(kind="scripted", script=None, device="cpu")


def test_replies_follow_the_latest_message_at_any_temperature(scripted):
    engine = _engine(scripted)
    prompts = [
        _prompt(scripted, ("user", "What is the weather today?")),
        _prompt(scripted, ("user", "hi"), ("assistant", "Hello."), ("user", "<tool_response>\nok\n</tool_response>")),
        _prompt(scripted, ("user", "hi")),
        _prompt(scripted, ("system", "be brief")),
    ]
    params = [SamplingParams(temperature=t, seed=3, repetition_penalty=1.3) for t in (0.0, 1.0, 2.0, 0.7)]
    out = engine.generate(prompts, params)
    assert [c.text for c in out] == ["<think>Look it up.</think>Sunny.", "Done.", "No idea.",
                                     "A system message came last."]
    assert all(c.finish_reason.value == "stop" for c in out)


def test_prefix_cache_hits_and_preemption_keep_the_script(scripted):
    long_system = ("You are a careful assistant. " * 40).strip()
    first = _prompt(scripted, ("system", long_system), ("user", "weather?"))
    again = _prompt(scripted, ("system", long_system), ("user", "weather?"), ("assistant", "Sunny."),
                    ("user", "thanks"))
    engine = _engine(scripted)
    [a] = engine.generate([first], SamplingParams.greedy())
    [b] = engine.generate([again], SamplingParams.greedy())
    assert a.text == "<think>Look it up.</think>Sunny." and b.text == "No idea."
    assert b.usage.cached_tokens >= len(first) - 16 > 0  # read back from blocks another sequence wrote
    # Admitted together, the eight outgrow a 40-block pool: some are preempted and recomputed.
    small = _engine(scripted, num_kv_blocks=40, enable_prefix_caching=False)
    outs = small.generate([_prompt(scripted, ("user", "count"))] * 8, SamplingParams.greedy())
    assert [c.text for c in outs] == [" ".join(str(i) for i in range(100))] * 8
    assert small.stats().num_preemptions > 0
