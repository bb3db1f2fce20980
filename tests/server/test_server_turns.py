"""How a turn ends, with the scripted model (tests/clients/script.yaml):

- ``parallel_tool_calls: false``: one call per response (the model's second is never
  emitted), on /v1/responses (JSON, SSE, the socket) and /v1/chat/completions;
- an engine fault in the middle of a stream (the script's ``fail_after``): exactly one
  ``response.failed`` over SSE and the socket, after the text made so far, and the next
  request is served;
- a client that goes away mid-stream: a 499 in the access log and in
  ``ignis_requests_total``, its tokens counted.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx2 as httpx
import pytest

from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import KEY, Frames, client, http, metric

TWO_CALLS = "What is the weather in Oslo and in Rome?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


def _sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(b.split("\n")[1][6:]) for b in text.split("\n\n") if b]


def _calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_over_responses(scripted_server, parallel):
    body = {"model": "scripted", "input": TWO_CALLS, "tools": TOOLS, "parallel_tool_calls": parallel}
    r = http(scripted_server, "POST", "/v1/responses", json=body)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    cities = [json.loads(c["arguments"])["city"] for c in _calls(resp)]
    assert cities == (["Oslo", "Rome"] if parallel else ["Oslo"])
    assert resp["status"] == "completed" and resp["parallel_tool_calls"] is parallel

    r = http(scripted_server, "POST", "/v1/responses", json={**body, "stream": True})
    final = check_grammar(_sse_events(r.text))
    assert final["status"] == "completed" and len(_calls(final)) == len(cities)

    with client(scripted_server).responses.connect() as conn:
        frames = Frames(conn)
        conn.response.create(**body)
        final = frames.terminal()[-1]["response"]
    assert final["status"] == "completed" and len(_calls(final)) == len(cities)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_over_chat(scripted_server, stream):
    body = {"model": "scripted", "messages": [{"role": "user", "content": TWO_CALLS}], "tools": CHAT_TOOLS,
            "parallel_tool_calls": False, "stream": stream}
    r = http(scripted_server, "POST", "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(b[6:]) for b in r.text.split("\n\n") if b and b != "data: [DONE]"]
        indexes = {tc["index"] for ch in chunks for c in ch["choices"] for tc in c["delta"].get("tool_calls") or ()}
        assert indexes == {0}
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    else:
        choice = r.json()["choices"][0]
        assert [json.loads(tc["function"]["arguments"])["city"] for tc in choice["message"]["tool_calls"]] == ["Oslo"]
        assert choice["finish_reason"] == "tool_calls"


def test_an_engine_fault_mid_stream_fails_that_response_once(scripted_server):
    body = {"model": "scripted", "input": "Fail midway, please."}
    r = http(scripted_server, "POST", "/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200
    events = _sse_events(r.text)
    final = check_grammar(events)
    assert [e["type"] for e in events].count("response.failed") == 1 and events[-1]["type"] == "response.failed"
    assert final["error"]["code"] == "server_error" and "scripted fault" in final["error"]["message"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text.startswith("one two")  # what came before the fault is kept

    with client(scripted_server).responses.connect() as conn:
        frames = Frames(conn)
        conn.response.create(**body, stream_id="bad")
        got = frames.terminal()
        assert [e["type"] for e in got].count("response.failed") == 1 and got[-1]["type"] == "response.failed"
        assert "scripted fault" in got[-1]["response"]["error"]["message"]
        conn.response.create(model="scripted", input="Say hi", stream_id="bad")  # the same socket goes on
        assert frames.terminal()[-1]["response"]["status"] == "completed"
    r = http(scripted_server, "POST", "/v1/responses", json={"model": "scripted", "input": "Say hi"})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert r.json()["output"][0]["content"][0]["text"] == "Hi!"


def _wait_idle(srv: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while (s := srv.ctx.engine.stats).num_in_flight or s.num_running or s.num_waiting:
        assert time.monotonic() < end, f"engine still busy: {s}"
        time.sleep(0.05)


def _wait_metric(srv: Any, name: str, labels: str, want: float, timeout: float = 20.0) -> float | None:
    end = time.monotonic() + timeout
    while True:
        got = metric(srv, name, labels)
        if got == want or time.monotonic() > end:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize("transport", ["http", "sse", "socket"])
def test_a_client_gone_mid_stream_is_a_499_with_its_tokens(srv, caplog, transport):
    closed = f'endpoint="responses",status="client_closed",transport="{transport}"'
    _wait_idle(srv)
    before = metric(srv, "ignis_requests_total", closed) or 0.0
    out_before = metric(srv, "ignis_output_tokens_total") or 0.0
    gen_before = metric(srv, "ignis_engine_generated_tokens_total") or 0.0
    body = {"model": "tiny", "input": "count for ever", "temperature": 0, "max_output_tokens": 5000}
    caplog.set_level(logging.INFO, logger="ignis.access")
    if transport == "http":  # a JSON request whose client gives up waiting
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.base_url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=httpx.Timeout(60, read=1.5))
    elif transport == "sse":
        with httpx.stream("POST", srv.base_url + "/v1/responses", json={**body, "stream": True}, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"}) as r:
            for line in r.iter_lines():
                if "output_text.delta" in line:
                    break  # leave mid-stream: the connection closes
    else:
        with client(srv).responses.connect() as conn:
            frames = Frames(conn)
            conn.response.create(**body)
            frames.until(lambda e: e["type"] == "response.output_text.delta")
    assert _wait_metric(srv, "ignis_requests_total", closed, before + 1) == before + 1
    _wait_idle(srv)
    out = metric(srv, "ignis_output_tokens_total") - out_before
    gen = metric(srv, "ignis_engine_generated_tokens_total") - gen_before
    assert out >= 1 and out == gen  # every token the engine made for it is counted
    lines = [r.getMessage() for r in caplog.records if r.name == "ignis.access"]
    if transport != "socket":
        assert any(" POST /v1/responses HTTP/1.1 499 (client closed request)" in ln for ln in lines), lines
    else:
        assert any("499 client closed" in ln for ln in lines), lines
    assert not any(" 500 " in ln for ln in lines), lines


def test_speculation_is_reported_in_usage_and_metrics(srv):
    """Draft tokens kept and dropped: chat's completion_tokens_details (OpenAI's names),
    a response's output_tokens_details, and the engine's counters on /metrics agree."""
    _wait_idle(srv)
    drafted0 = metric(srv, "ignis_engine_draft_tokens_total") or 0.0
    kept0 = metric(srv, "ignis_engine_accepted_draft_tokens_total") or 0.0
    text = "one two three four five six seven eight " * 6
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 40}
    details = http(srv, "POST", "/v1/chat/completions", json=body).json()["usage"]["completion_tokens_details"]
    resp = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": text, "temperature": 0,
                                                    "max_output_tokens": 40}).json()
    out = resp["usage"]["output_tokens_details"]
    validate_response(resp)
    _wait_idle(srv)
    kept = details["accepted_prediction_tokens"] + out["accepted_prediction_tokens"]
    dropped = details["rejected_prediction_tokens"] + out["rejected_prediction_tokens"]
    assert metric(srv, "ignis_engine_accepted_draft_tokens_total") - kept0 == kept
    assert metric(srv, "ignis_engine_draft_tokens_total") - drafted0 == kept + dropped > 0  # (it drafted)
    rate = metric(srv, "ignis_engine_draft_acceptance_rate")
    assert rate is not None and 0.0 <= rate <= 1.0
