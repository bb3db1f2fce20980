"""`protocol.sampling`: the shared sampling/thinking fields (also used by chat)."""

from __future__ import annotations

import pytest

from protocol.errors import Refusal
from protocol.sampling import CHAT_NAMES, EFFORT_THINKING, EFFORTS, SamplingFields, extract_sampling, thinking_for_effort


def test_empty():
    assert extract_sampling({}) == SamplingFields()
    assert extract_sampling({"temperature": None, "stop": []}) == SamplingFields()


def test_all_fields():
    s = extract_sampling({
        "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.2,
        "presence_penalty": -2, "frequency_penalty": 2, "seed": -5, "stop": "###",
        "max_output_tokens": 1, "top_logprobs": 0, "thinking": False,
    })
    assert s == SamplingFields(0.0, 1.0, 0, 0.1, 1.2, -2.0, 2.0, -5, ("###",), 1, 0, False, None)
    assert isinstance(s.temperature, float)
    assert s.to_dict()["stop"] == ["###"]


@pytest.mark.parametrize("effort", EFFORTS)
def test_effort_table(effort):
    s = extract_sampling({"reasoning": {"effort": effort}})
    assert (s.thinking, s.thinking_budget) == EFFORT_THINKING[effort] == thinking_for_effort(effort)


def test_effort_budgets_increase():
    budgets = [EFFORT_THINKING[e][1] for e in ("minimal", "low", "medium", "high")]
    assert budgets == sorted(budgets) and EFFORT_THINKING["xhigh"] == (True, None) and EFFORT_THINKING["none"] == (False, None)
    assert thinking_for_effort(None) == (None, None)


def test_thinking_forms():
    assert extract_sampling({"thinking": True}).thinking is True
    s = extract_sampling({"thinking": {"type": "enabled", "budget_tokens": 9}})
    assert (s.thinking, s.thinking_budget) == (True, 9)
    s = extract_sampling({"thinking": {"type": "disabled"}, "reasoning": {"effort": "high"}})
    assert (s.thinking, s.thinking_budget) == (False, None)


def test_bad_effort_refused_even_when_thinking_wins():
    with pytest.raises(Refusal) as info:
        extract_sampling({"thinking": True, "reasoning": {"effort": "lots"}})
    assert info.value.param == "reasoning.effort"


def test_chat_names():
    s = extract_sampling({"max_tokens": 5, "reasoning_effort": "low"}, names=CHAT_NAMES, effort_param="reasoning_effort")
    assert s.max_output_tokens == 5 and s.thinking_budget == 1024
    s = extract_sampling({"max_tokens": 5, "max_completion_tokens": 5}, names=CHAT_NAMES, effort_param="reasoning_effort")
    assert s.max_output_tokens == 5
    with pytest.raises(Refusal) as info:
        extract_sampling({"max_tokens": 5, "max_completion_tokens": 6}, names=CHAT_NAMES)
    assert info.value.param == "max_completion_tokens"


def test_prefix():
    with pytest.raises(Refusal) as info:
        extract_sampling({"temperature": 9}, prefix="body")
    assert info.value.param == "body.temperature"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": -0.01}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"temperature": 10**400}, "temperature"),
        ({"presence_penalty": -(10**400)}, "presence_penalty"),
        ({"repetition_penalty": 10**400}, "repetition_penalty"),
        ({"seed": 1.0}, "seed"),
        ({"stop": {"a": 1}}, "stop"),
        ({"thinking": {"type": "enabled", "extra": 1}}, "thinking.extra"),
        ({"thinking": {}}, "thinking.type"),
        ({"thinking": "on"}, "thinking"),
        ({"reasoning": {"effort": ["low"]}}, "reasoning.effort"),
    ],
)
def test_refusals(body, param):
    with pytest.raises(Refusal) as info:
        extract_sampling(body)
    assert info.value.param == param and info.value.status == 400


@pytest.mark.parametrize("names", [None, CHAT_NAMES])
def test_vllm_benchmark_extensions(names):
    kw = {} if names is None else {"names": names}
    limit = "max_output_tokens" if names is None else "max_tokens"
    s = extract_sampling({"ignore_eos": True, "min_tokens": 8, limit: 8}, **kw)
    assert (s.ignore_eos, s.min_tokens, s.max_output_tokens) == (True, 8, 8)
    with pytest.raises(Refusal) as e:
        extract_sampling({"ignore_eos": 1}, **kw)
    assert e.value.param == "ignore_eos"
    with pytest.raises(Refusal) as e:
        extract_sampling({"min_tokens": -1}, **kw)
    assert e.value.param == "min_tokens"
    with pytest.raises(Refusal) as e:  # more than the output limit, as vLLM refuses it
        extract_sampling({"min_tokens": 9, limit: 8}, **kw)
    assert e.value.param == "min_tokens" and "9" in e.value.message
