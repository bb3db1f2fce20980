"""HTTP routes against a real server with the OpenAI SDK: /v1/responses (JSON and SSE),
/v1/chat/completions (JSON and SSE), models, health, metrics, client errors, deadlines,
and the shared conversation path (same tokens, prefix cache across endpoints)."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter

from tests.protocol.responses_sdk import check_grammar, validate_event, validate_response
from tests.server.server_harness import KEY, LONG, client, http, metric

CHAT = TypeAdapter(ChatCompletion)
CHUNK = TypeAdapter(ChatCompletionChunk)


def test_responses_create_json(srv):
    c = client(srv)
    r = c.responses.create(model="tiny", input="Hello there", max_output_tokens=12, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 12 and r.usage.input_tokens > 0
    assert r.output and r.output[0].type == "message"
    raw = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hello there", "max_output_tokens": 5})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("application/json")
    validate_response(raw.json())


def test_responses_create_stream(srv):
    c = client(srv)
    events = [ev.model_dump(mode="json", exclude_unset=True) for ev in
              c.responses.create(model="tiny", input="Hello there", max_output_tokens=10, stream=True,
                                                 temperature=0)]
    final = check_grammar(events)
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 10
    # The wire: `event:` + `data:` lines, one event each.
    with httpx.stream("POST", srv.base_url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "input": "hi", "max_output_tokens": 3, "stream": True,
                            "temperature": 0}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    blocks = [b for b in text.split("\n\n") if b]
    for block in blocks:
        ev_line, data_line = block.split("\n")
        assert ev_line.startswith("event: ") and data_line.startswith("data: ")
        ev = json.loads(data_line[6:])
        assert ev["type"] == ev_line[7:]
        validate_event(ev)
    assert json.loads(blocks[-1].split("\n")[1][6:])["type"] == "response.incomplete"


def test_chat_completions_json_and_stream(srv):
    c = client(srv)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    CHAT.validate_python(r.model_dump(mode="json"))
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    for ch in chunks:
        CHUNK.validate_python(ch.model_dump(mode="json"))
    assert chunks[-1].usage.completion_tokens == 6
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "messages": msgs, "max_tokens": 3, "stream": True}) as resp:
        lines = [ln for ln in resp.read().decode().split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_same_conversation_same_tokens_and_cache_across_endpoints(srv):
    c = client(srv)
    system = "You are a careful assistant. " * 8
    question = "What is the capital of France? Answer in one word, please."
    r = c.responses.create(model="tiny", instructions=system, input=question, max_output_tokens=4, temperature=0)
    cc = c.chat.completions.create(model="tiny", max_tokens=4, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}])
    assert cc.usage.prompt_tokens == r.usage.input_tokens
    assert cc.usage.prompt_tokens_details.cached_tokens >= (r.usage.input_tokens // 16 - 1) * 16 > 0
    # A follow-up through the other endpoint reuses the first turn's blocks.
    answer = r.output_text
    follow = c.responses.create(model="tiny", instructions=system, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": question}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "And of Italy?"}])
    assert follow.usage.input_tokens_details.cached_tokens >= (r.usage.input_tokens // 16 - 1) * 16


def test_models_health_metrics(srv):
    c = client(srv)
    assert [m.id for m in c.models.list()] == ["tiny", "fake-model"]
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as info:
        c.models.retrieve("gpt-9")
    assert info.value.body["code"] == "model_not_found"
    h = http(srv, "GET", "/health", key=None)
    assert h.status_code == 200 and h.json()["status"] == "ok"
    text = http(srv, "GET", "/metrics", key=None).text
    for name in ("ignis_responses_sockets", "ignis_responses_queued_requests", "ignis_engine_running_requests",
                 "ignis_engine_waiting_requests", "ignis_engine_free_blocks", "ignis_engine_prefix_cache_hit_tokens_total",
                 "ignis_requests_total", "ignis_time_to_first_token_seconds_bucket",
                 "ignis_e2e_request_latency_seconds_bucket"):
        assert name in text, name
    assert metric(srv, "ignis_engine_blocks") == 2048


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        (b"{not json", 400, None, "invalid_json"),
        (b"[1, 2]", 400, None, "invalid_json"),
        ({"model": "tiny", "input": "x", "bogus": 1}, 400, "bogus", "unknown_parameter"),
        ({"model": "tiny", "input": 5}, 400, "input", "invalid_type"),
        ({"model": "tiny", "input": "x", "temperature": 9}, 400, "temperature", None),
        ({"model": "tiny", "input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id",
         "previous_response_not_found"),
        ({"model": "tiny", "input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "unsupported_value"),
        ({"model": "gpt-9", "input": "x"}, 404, "model", "model_not_found"),
        ({"model": "tiny", "input": "word " * 40000}, 400, "input", "context_length_exceeded"),
    ],
)
def test_responses_client_errors(srv, body, status, param, code):
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
        else {"json": body}
    r = http(srv, "POST", "/v1/responses", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "tiny"}, "messages"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "word " * 40000}]}, "messages"),
    ],
)
def test_chat_client_errors(srv, body, param):
    r = http(srv, "POST", "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_unknown_routes_and_methods(srv):
    r = http(srv, "POST", "/v1/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = http(srv, "DELETE", "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = http(srv, "GET", "/v1/responses")  # no upgrade: a client error, not a 500
    assert 400 <= r.status_code < 500 and "error" in r.json()


def test_body_too_large_is_413(start_server):
    small = start_server(max_request_bytes=4096)
    r = http(small, "POST", "/v1/responses", json={"model": "tiny", "input": "x" * 10000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_logprobs(srv):
    c = client(srv)
    r = c.responses.create(model="tiny", input="hi", max_output_tokens=5, temperature=0,
                           include=["message.output_text.logprobs"])
    lps = r.output[0].content[0].logprobs
    assert lps and all(lp.logprob <= 0 for lp in lps)
    cc = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                   logprobs=True, temperature=0)
    assert cc.choices[0].logprobs.content


def _check_alternatives(entries: list[dict], n: int, *, greedy: bool, with_bytes: bool) -> None:
    """Each token: n alternatives, logprob descending; greedy: the first is the token itself."""
    assert entries
    for e in entries:
        alts = e["top_logprobs"]
        assert len(alts) == n, e
        lps = [a["logprob"] for a in alts]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        assert all(("bytes" in a) == with_bytes for a in alts)
        if with_bytes:  # each token's own bytes (part of a character reads U+FFFD as text)
            assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
            assert all(bytes(a["bytes"]).decode("utf-8", "replace") == a["token"] for a in alts)
        if greedy:
            assert alts[0]["token"] == e["token"] and alts[0]["logprob"] == e["logprob"]
        elif e["token"] in [a["token"] for a in alts]:
            assert e["logprob"] in lps


def test_responses_top_logprobs_json_and_stream(srv):
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 6, "temperature": 0, "top_logprobs": 3,
            "include": ["message.output_text.logprobs"]}
    raw = http(srv, "POST", "/v1/responses", json=body)
    assert raw.status_code == 200
    resp = raw.json()
    validate_response(resp)
    assert resp["top_logprobs"] == 3
    [part] = [p for item in resp["output"] if item["type"] == "message" for p in item["content"]]
    _check_alternatives(part["logprobs"], 3, greedy=True, with_bytes=True)

    with httpx.stream("POST", srv.base_url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                      json={**body, "stream": True}) as sse:
        events = [json.loads(b.split("\n")[1][6:]) for b in sse.read().decode().split("\n\n") if b]
    for ev in events:
        validate_event(ev)
    final = check_grammar(events)
    deltas = [lp for ev in events if ev["type"] == "response.output_text.delta" for lp in ev["logprobs"]]
    _check_alternatives(deltas, 3, greedy=True, with_bytes=True)  # Open Responses requires bytes in deltas too
    [done] = [ev for ev in events if ev["type"] == "response.output_text.done"]
    assert done["logprobs"] == deltas
    [part] = [p for item in final["output"] if item["type"] == "message" for p in item["content"]]
    _check_alternatives(part["logprobs"], 3, greedy=True, with_bytes=True)
    assert [e["token"] for e in part["logprobs"]] == [e["token"] for e in deltas]

    # Sampled (temperature 1, seeded) through the SDK: alternatives of the same distribution.
    r = client(srv).responses.create(model="tiny", input="hi", max_output_tokens=6, temperature=1.0, top_logprobs=2,
                                     include=["message.output_text.logprobs"], extra_body={"seed": 7})
    lps = [lp.model_dump(mode="json") for lp in r.output[0].content[0].logprobs]
    _check_alternatives(lps, 2, greedy=False, with_bytes=True)


def test_chat_top_logprobs_json_and_stream(srv):
    c = client(srv)
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=2)
    CHAT.validate_python(r.model_dump(mode="json"))
    content = [t.model_dump(mode="json") for t in r.choices[0].logprobs.content]
    _check_alternatives(content, 2, greedy=True, with_bytes=True)
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                            top_logprobs=2, stream=True))
    for ch in chunks:
        CHUNK.validate_python(ch.model_dump(mode="json"))
    streamed = [t.model_dump(mode="json") for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content or ()]
    _check_alternatives(streamed, 2, greedy=True, with_bytes=True)
    assert streamed == content
    # logprobs without top_logprobs: no alternatives.
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, temperature=0, logprobs=True)
    assert all(t.top_logprobs == [] for t in plain.choices[0].logprobs.content)


def test_deadlines_end_with_one_terminal_event(srv):
    c = client(srv)
    admin = dict(headers={"Authorization": f"Bearer {KEY}"})
    try:
        assert http(srv, "PATCH", "/admin/config", json={"request_timeout": 1e-6, "stream_timeout": 1e-6},
                    **admin).status_code == 200
        r = c.responses.create(model="tiny", input="hi", **LONG)
        assert r.status == "failed" and r.error.message.startswith("Timed out")
        validate_response(r.model_dump(mode="json", exclude_unset=True))
        events = [e.model_dump(mode="json", exclude_unset=True) for e in
                  c.responses.create(model="tiny", input="hi", stream=True, **LONG)]
        final = check_grammar(events)
        assert final["status"] == "failed" and "stream_timeout" in final["error"]["message"]
        with pytest.raises(openai.APIStatusError) as info:
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20000,
                                      temperature=0)
        assert info.value.status_code == 504 and info.value.body["code"] == "timeout"
        chunks = httpx.post(srv.base_url + "/v1/chat/completions", headers=admin["headers"], timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 20000,
            "temperature": 0}).text.split("\n\n")
        assert json.loads(chunks[-3][6:])["error"]["code"] == "timeout" and chunks[-2] == "data: [DONE]"
    finally:
        http(srv, "PATCH", "/admin/config", json={"request_timeout": 600, "stream_timeout": 1800}, **admin)


def test_admin_config(srv):
    r = http(srv, "GET", "/admin/config")
    assert r.status_code == 200 and r.json()["live"]["socket_idle_close"] == 300
    assert KEY not in r.text
    r = http(srv, "PATCH", "/admin/config", json={"port": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "port"
    r = http(srv, "PATCH", "/admin/config", json={"socket_idle_close": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "socket_idle_close"


def test_client_gone_mid_stream_frees_the_engine(srv):
    with httpx.stream("POST", srv.base_url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "input": "hi", "stream": True, **LONG}) as resp:
        for line in resp.iter_lines():
            if "output_text.delta" in line:
                break
    import time

    for _ in range(100):
        if srv.ctx.engine.stats.num_in_flight == 0:
            break
        time.sleep(0.05)
    assert srv.ctx.engine.stats.num_in_flight == 0


def test_an_engine_failure_fails_that_response_only(start_server):
    srv = start_server()
    runner = srv.ctx.engine.engine.runner
    real = runner.execute
    calls = {"n": 0}

    def failing(batch):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return real(batch)

    runner.execute = failing
    try:
        c = client(srv)
        events = [e.model_dump(mode="json", exclude_unset=True) for e in
                  c.responses.create(model="tiny", input="hi", max_output_tokens=3, stream=True, temperature=0)]
        final = check_grammar(events)
        assert final["status"] == "failed" and final["error"]["code"] == "server_error"
        assert "injected failure" in final["error"]["message"]
        r = c.responses.create(model="tiny", input="hi", max_output_tokens=3, temperature=0)
        assert r.status == "incomplete"
        assert http(srv, "GET", "/health", key=None).status_code == 200
    finally:
        runner.execute = real


def test_encrypted_reasoning_is_restored(srv):
    from protocol.encrypted import seal_reasoning

    thought = "The user greets me; I should greet back briefly and warmly."
    c = client(srv)

    def tokens(reasoning):
        items = [{"role": "user", "content": "hi"}]
        if reasoning is not None:
            items.append(reasoning)
        items += [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}]
        return c.responses.create(model="tiny", input=items, max_output_tokens=1).usage.input_tokens

    plain = tokens({"type": "reasoning", "id": "rs_1", "summary": [],
                    "content": [{"type": "reasoning_text", "text": thought}]})
    sealed = tokens({"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
                     "encrypted_content": seal_reasoning(thought, srv.ctx.reasoning_key)})
    foreign = tokens({"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
                      "encrypted_content": seal_reasoning(thought, b"another server's key")})
    assert sealed == plain > foreign == tokens(None)


def test_truncation_auto_drops_the_oldest_items(srv):
    c = client(srv)
    items = [{"role": "user", "content": "word " * 40000}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="tiny", input=items, max_output_tokens=1)
    r = c.responses.create(model="tiny", input=items, max_output_tokens=1, truncation="auto")
    assert r.usage.input_tokens < 100 and r.truncation == "auto"


def test_cors(start_server):
    srv = start_server(cors_origins=["https://app.example"])
    pre = http(srv, "OPTIONS", "/v1/responses", key=None, headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://app.example"
    r = http(srv, "GET", "/v1/models", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    r = http(srv, "GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_dead_engine_answers_503_not_500(start_server):
    """Once the engine thread is gone, /health and every generation route say 503."""
    dead = start_server()
    dead.engine.shutdown()
    assert http(dead, "GET", "/health", key=None).status_code == 503
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    for path, payload in (("/v1/responses", body),
                          ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})):
        r = http(dead, "POST", path, json=payload)
        assert r.status_code == 503, (path, r.status_code, r.text)
        assert r.json()["error"]["code"] == "engine_unavailable", r.text


def test_server_output_limit_caps_requests_without_one_and_larger_ones(start_server):
    srv = start_server(max_output_tokens=6)
    c = client(srv)
    for asked in (None, 50, 4):
        kw = {} if asked is None else {"max_output_tokens": asked}
        r = c.responses.create(model="tiny", input="Hello there", temperature=0, **kw)
        assert r.status == "incomplete" and r.usage.output_tokens == min(asked or 6, 6)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6
    srv.stop()
    with pytest.raises(RuntimeError, match="failed to start") as failed:
        start_server(max_output_tokens=0)
    assert "server.max_output_tokens must be null or at least 1" in str(failed.value.__cause__)
