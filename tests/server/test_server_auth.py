"""Authentication on every /v1 route, the WebSocket upgrade (header and subprotocol
forms) and /admin; the key never appears in logs or in the handshake answer."""

from __future__ import annotations

import json
import logging

import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.server.server_harness import KEY, Frames, client, http

ROUTES = [
    ("POST", "/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 1}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny", None),
    ("GET", "/admin/config", None),
    ("PATCH", "/admin/config", {"socket_idle_close": 300}),
]


def _url(srv):
    return srv.ws_url + "/v1/responses"


@pytest.mark.parametrize("method, path, body", ROUTES)
def test_every_route_needs_the_key(srv, method, path, body):
    kw = {"json": body} if body is not None else {}
    for key, missing in ((None, True), ("sk-wrong", False)):
        r = http(srv, method, path, key=key, **kw)
        assert r.status_code == 401, (key, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert ("didn't provide" in err["message"]) is missing
    r = http(srv, method, path, **kw)
    assert r.status_code == 200, r.text


def test_open_routes(srv):
    assert http(srv, "GET", "/health", key=None).status_code == 200
    assert http(srv, "GET", "/metrics", key=None).status_code == 200


def test_sdk_with_a_wrong_key(srv):
    c = client(srv, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        c.responses.create(model="tiny", input="hi")
    with pytest.raises(Exception) as info:
        with c.responses.connect() as conn:
            conn.response.create(model="tiny", input="hi")
    assert "401" in str(info.value)


def _roundtrip(ws):
    ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hi", "max_output_tokens": 1,
                        "temperature": 0}))
    while True:
        ev = json.loads(ws.recv(timeout=30))
        if ev["type"] in ("response.incomplete", "response.completed", "error"):
            return ev


def test_upgrade_header_form(srv):
    with client(srv).responses.connect() as conn:
        headers = conn._connection.response.headers
        assert "Sec-WebSocket-Protocol" not in headers and KEY not in str(headers)
        conn.response.create(model="tiny", input="hi", max_output_tokens=1, temperature=0)
        assert Frames(conn).terminal()[-1]["type"] == "response.incomplete"


def test_upgrade_subprotocol_form(srv):
    entry = f"openai-insecure-api-key.{KEY}"
    with connect(_url(srv), subprotocols=[entry]) as ws:  # the key alone: no protocol selected
        assert ws.subprotocol is None
        assert "Sec-WebSocket-Protocol" not in ws.response.headers and KEY not in str(ws.response.headers)
        assert _roundtrip(ws)["type"] == "response.incomplete"
    with connect(_url(srv), subprotocols=[entry, "realtime"]) as ws:  # a browser's plain name is selected
        assert ws.subprotocol == "realtime" and ws.response.headers["Sec-WebSocket-Protocol"] == "realtime"
        assert KEY not in str(ws.response.headers)
        assert _roundtrip(ws)["type"] == "response.incomplete"


@pytest.mark.parametrize("kw", [
    {},
    {"subprotocols": ["openai-insecure-api-key.sk-wrong"]},
    {"additional_headers": {"Authorization": "Bearer sk-wrong"}},
    {"subprotocols": ["realtime"]},
])
def test_upgrade_refused_with_401(srv, kw):
    with pytest.raises(InvalidStatus) as info:
        with connect(_url(srv), **kw):
            pass
    assert info.value.response.status_code == 401
    assert json.loads(bytes(info.value.response.body))["error"]["code"] == "invalid_api_key"


def test_the_key_and_prompts_never_reach_the_logs(srv, caplog):
    marker = "PROMPT-TEXT-7a1f"
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sanic.websockets")  # Sanic sets WARNING: open it up
    c = client(srv)
    c.responses.create(model="tiny", input=marker, max_output_tokens=2)
    list(c.responses.create(model="tiny", input=marker, max_output_tokens=2, stream=True))
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": marker}], max_tokens=2)
    http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": marker, "bogus": 1})
    with client(srv).responses.connect() as conn:
        conn.response.create(model="tiny", input=marker, max_output_tokens=2)
        Frames(conn).terminal()
    with connect(_url(srv), subprotocols=[f"openai-insecure-api-key.{KEY}", "x"]) as ws:
        _roundtrip(ws)
    for kw in ({"subprotocols": [f"openai-insecure-api-key.{KEY}x"]}, {"additional_headers": {"Authorization": f"Bearer {KEY}x"}}):
        with pytest.raises(InvalidStatus):
            with connect(_url(srv), **kw):
                pass
    http(srv, "GET", "/v1/models", key=KEY + "x")
    # The server's records only (the test's own clients log their request headers at DEBUG).
    client_side = ("websockets.client", "httpcore", "httpx", "openai")
    records = [r for r in caplog.records if not r.name.startswith(client_side)]
    assert any(r.name == "ignis.access" for r in records)
    assert any(r.name.startswith("sanic") for r in records)
    for r in records:
        text = r.getMessage() + str(getattr(r, "__dict__", ""))
        assert KEY not in text, (r.name, r.getMessage())
        if r.levelno >= logging.INFO:
            assert marker not in text, (r.name, r.getMessage())
