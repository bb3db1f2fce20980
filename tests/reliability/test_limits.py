"""Limits, each at its edge: request size (413 over HTTP, an error event on the socket,
which stays open), the model's context (400 naming `input` / `messages`),
`max_output_tokens` clipped to the context (ending `incomplete`), 32 stream_ids per
socket (`websocket_stream_limit_reached`), 16 active lanes per socket (the rest wait),
and malformed stream_ids (`invalid_stream_id`)."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed

from tests.reliability.reliability_harness import TERMINAL, check_envelope, check_error_frame, parse_sse, recv_json, wait_idle, ws_connect
from tests.server.server_harness import client, http

LIMIT = 64 * 1024
CONTEXT = 256


@pytest.fixture(scope="module")
def small(start_server):
    """A server with a 64 KiB request limit and a 256-token context."""
    return start_server(max_request_bytes=LIMIT, engine={"max_model_len": CONTEXT})


def _until_terminal(ws, timeout=60.0):
    events = []
    while True:
        ev = recv_json(ws, timeout)
        events.append(ev)
        if ev["type"] in TERMINAL or ev["type"] == "error":
            return events


def _create(ws, **body):
    body.setdefault("model", "tiny")
    body.setdefault("temperature", 0)
    ws.send(json.dumps({"type": "response.create", **body}))


def test_request_size(small):
    over = "x" * (LIMIT + 1000)
    figures = {}
    for path, body in (("/v1/responses", {"model": "tiny", "input": over}),
                       ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": over}]})):
        r = http(small, "POST", path, json=body)
        assert r.status_code == 413, r.text
        assert check_envelope(r.json(), 413)["code"] == "request_too_large"
        figures[path] = r.status_code
    with ws_connect(small) as ws:
        # Over the limit: an error event, and the socket goes on.
        _create(ws, input=over, max_output_tokens=1)
        err = recv_json(ws)
        assert err["status"] == 413 and check_error_frame(err)["code"] == "request_too_large"
        _create(ws, input="still here?", max_output_tokens=2)
        assert _until_terminal(ws)[-1]["type"] == "response.incomplete"
        # Just under it: accepted (and refused for the context, with a param, not for its size).
        _create(ws, input="y " * ((LIMIT - 200) // 2), max_output_tokens=1)
        err = recv_json(ws)
        assert check_error_frame(err)["code"] == "context_length_exceeded"
        # Compressed, even past twice the limit: inflated no further than the limit, refused
        # with the same event, and the socket goes on.
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "z" * (2 * LIMIT + 10)}))
        assert check_error_frame(recv_json(ws))["code"] == "request_too_large"
    # Uncompressed past twice the limit, the transport refuses to read the frame at all: close 1009.
    with ws_connect(small, compression=None) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "z" * (2 * LIMIT + 10)}))
        with pytest.raises(ConnectionClosed) as info:
            recv_json(ws)
        code = info.value.rcvd.code if info.value.rcvd else None
        assert code == 1009, info.value
    assert http(small, "GET", "/health", key=None).status_code == 200
    print(f"\n[limits] size: HTTP over {LIMIT} B -> {figures}; socket over -> error 413 and open; "
          f"over {2 * LIMIT} B -> close {code}")


def test_input_over_the_context(small):
    long_text = "word " * 400  # ~400 tokens > 256
    r = http(small, "POST", "/v1/responses", json={"model": "tiny", "input": long_text})
    assert r.status_code == 400 and check_envelope(r.json(), 400)["param"] == "input"
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = http(small, "POST", "/v1/chat/completions", json={"model": "tiny",
                                                          "messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and check_envelope(r.json(), 400)["param"] == "messages"
    with ws_connect(small) as ws:
        for generate in (True, False):  # a prewarm must fit too
            _create(ws, input=long_text, generate=generate)
            err = recv_json(ws)
            assert check_error_frame(err)["param"] == "input" and err["error"]["code"] == "context_length_exceeded"
        _create(ws, input="short", max_output_tokens=1)
        assert _until_terminal(ws)[-1]["type"] == "response.incomplete"
    print(f"\n[limits] context {CONTEXT}: ~400-token input -> 400 context_length_exceeded (input / messages), "
          "socket error events (generate and prewarm), socket open")


def test_max_output_tokens_clipped_to_the_context(small):
    t0 = time.monotonic()
    c = client(small)
    ends = []
    for extra in ({"max_output_tokens": 100000}, {}):
        r = c.responses.create(model="tiny", input="Tell me a long story.", temperature=0, **extra)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r.status
        assert r.usage.input_tokens + r.usage.output_tokens == CONTEXT
        ends.append(r.usage.output_tokens)
    r = http(small, "POST", "/v1/responses", json={"model": "tiny", "input": "Again.", "temperature": 0,
                                                    "stream": True, "max_output_tokens": 10**9})
    final = parse_sse(r.text)[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"]["reason"] == "max_output_tokens"
    assert final["usage"]["total_tokens"] == CONTEXT
    cc = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Go on."}], temperature=0,
                                   max_tokens=100000)
    assert cc.choices[0].finish_reason == "length" and cc.usage.total_tokens == CONTEXT
    with ws_connect(small) as ws:
        _create(ws, input="And over the socket.", max_output_tokens=100000)
        final = _until_terminal(ws)[-1]
        assert final["type"] == "response.incomplete" and final["response"]["usage"]["total_tokens"] == CONTEXT
    wait_idle(small)
    print(f"\n[limits] max_output_tokens clipped to the {CONTEXT}-token context: outputs {ends} (+ SSE, chat, "
          f"socket), all incomplete / length, {time.monotonic() - t0:.1f} s")


def test_stream_id_limits(srv):
    with ws_connect(srv) as ws:
        for i in range(34):
            _create(ws, input="x", stream_id=f"s{i}", generate=False)
        _create(ws, input="x", generate=False)  # the default lane does not count
        done, errors = 0, []
        while done + len(errors) < 35:
            ev = recv_json(ws)
            if ev["type"] == "error":
                errors.append(ev)
            elif ev["type"] in TERMINAL:
                assert ev["response"]["status"] == "completed"
                done += 1
        assert done == 33 and sorted(e["stream_id"] for e in errors) == ["s32", "s33"]
        for e in errors:
            err = check_error_frame(e)
            assert err["code"] == "websocket_stream_limit_reached" and err["param"] == "stream_id"
        _create(ws, input="an old lane still works", stream_id="s0", max_output_tokens=1)
        assert _until_terminal(ws)[-1]["type"] == "response.incomplete"
        bad = ["", "has space", "x" * 257, 7, True, ["a"], {"a": 1}, "é"]
        for sid in bad:
            _create(ws, input="x", stream_id=sid, max_output_tokens=1)
            err = recv_json(ws)
            assert check_error_frame(err)["code"] == "invalid_stream_id" and err["error"]["param"] == "stream_id", err
            assert "stream_id" not in err
        ws.send(json.dumps({"type": "response.cancel", "stream_id": "bad id"}))
        assert recv_json(ws)["error"]["code"] == "invalid_stream_id"
    with ws_connect(srv) as ws:
        _create(ws, input="x" * 3, stream_id="x" * 256, max_output_tokens=1)  # 256 characters is fine
        assert _until_terminal(ws)[-1]["type"] == "response.incomplete"
    print(f"\n[limits] stream_id: 32 named lanes + the default one served; 2 more -> websocket_stream_limit_reached; "
          f"{len(bad) + 1} malformed ids -> invalid_stream_id")


def test_sixteen_active_lanes_then_the_rest_wait(start_server):
    srv = start_server(engine={"max_num_seqs": 32})
    n = 20
    with ws_connect(srv) as ws:
        for i in range(n):
            _create(ws, input=f"lane {i}", stream_id=f"l{i}", max_output_tokens=150)
        started, ended, most, order = set(), set(), 0, []
        while len(ended) < n:
            ev = recv_json(ws)
            assert ev["type"] != "error", ev
            if ev["type"] == "response.created":
                started.add(ev["stream_id"])
                order.append(("start", ev["stream_id"]))
            elif ev["type"] in TERMINAL:
                ended.add(ev["stream_id"])
                order.append(("end", ev["stream_id"]))
            most = max(most, len(started) - len(ended))
    first_end = next(i for i, (what, _) in enumerate(order) if what == "end")
    assert sum(what == "start" for what, _ in order[:first_end]) == 16
    assert most == 16
    wait_idle(srv)
    print(f"\n[limits] {n} lanes on one socket: {most} active at most, the other {n - 16} started as lanes ended; "
          f"all {len(ended)} finished")
