"""Never a 500 for a client's mistake: valid requests with one field replaced by an
arbitrary JSON value, against both generation routes."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import json_values
from tests.server.server_harness import http

JSON = json_values(max_leaves=12, text=20, keys=10, width=4, huge=False)
RESPONSES = {"model": "tiny", "input": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9,
             "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
             "tool_choice": "auto", "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}},
             "include": [], "metadata": {}, "stream": False, "instructions": "be brief", "truncation": "disabled"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "auto", "stream": False, "stop": ["x"], "seed": 1, "logprobs": False, "n": 1}


def _check(srv, path, body):
    r = http(srv, "POST", path, content=json.dumps(body, allow_nan=False), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(RESPONSES) + ["bogus", "seed", "stop", "top_k"]), value=JSON)
def test_responses_never_500(srv, key, value):
    _check(srv, "/v1/responses", dict(RESPONSES, **{key: value}, max_output_tokens=2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(CHAT) + ["bogus", "max_completion_tokens", "reasoning_effort"]), value=JSON)
def test_chat_never_500(srv, key, value):
    _check(srv, "/v1/chat/completions", dict(CHAT, **{key: value}, max_tokens=2))
