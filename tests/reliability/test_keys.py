"""API keys: every route the app has (read from its router, so a route added later is
covered too) and the WebSocket upgrade, without a key, with a wrong one and with the
right one; the key never in the logs (every logger, DEBUG), in error messages, in the
handshake answer, in /metrics or /admin/config; and the comparison constant-time
(`hmac.compare_digest` over digests of equal length; the timings of a nearly right and a
wholly wrong guess are printed, not asserted)."""

from __future__ import annotations

import json
import logging
import re
import statistics
import time

import pytest
from websockets.exceptions import InvalidStatus

from tests.reliability.reliability_harness import check_envelope, recv_json, ws_connect
from tests.server.server_harness import KEY, http

# Authorization headers that must not get in (None: no header).
WRONG = [None, "Bearer sk-wrong", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", f"Bearer {KEY.upper()}", "Bearer",
         f"Basic {KEY}", f"Token {KEY}", f"Bearer x{KEY}"]
BODIES = {
    ("POST", "/v1/responses"): {"model": "tiny", "input": "hi", "max_output_tokens": 1},
    ("POST", "/v1/chat/completions"): {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 1},
    ("POST", "/v1/responses/compact"): {"model": "tiny", "input": "hi"},
    ("PATCH", "/admin/config"): {"socket_idle_close": 300},
}


def _routes(srv):
    """(method, concrete path, websocket?) for every route of the app."""
    out = []
    for route in srv.app.router.routes:
        path = "/" + route.path
        path = re.sub(r"<model_id:path>", "tiny", path)
        path = re.sub(r"<__file_uri__:path>", "index.html", path)
        assert "<" not in path, f"a route this test does not know how to call: {path}"
        for method in sorted(route.methods):
            out.append((method, path, bool(route.extra.websocket)))
    return out


def _protected(path):
    return path.startswith("/v1") or path.startswith("/admin")


def test_every_route_with_without_and_with_a_wrong_key(srv):
    counts = {"refused": 0, "open": 0, "allowed": 0}
    routes = _routes(srv)
    for method, path, websocket in routes:
        if websocket:
            continue
        kw = {"json": BODIES[(method, path)]} if (method, path) in BODIES else {}
        if not _protected(path):
            r = http(srv, method, path, key=None, **kw)
            assert r.status_code == 200, (method, path, r.status_code)
            counts["open"] += 1
            continue
        for value in WRONG:
            headers = {"Authorization": value} if value is not None else {}
            r = http(srv, method, path, key=None, headers=headers, **kw)
            assert r.status_code == 401, (method, path, value, r.status_code)
            err = check_envelope(r.json(), 401)
            assert err["code"] == "invalid_api_key"
            assert KEY.lower() not in r.text.lower() and "sk-wrong" not in r.text, r.text
            counts["refused"] += 1
        for scheme in ("Bearer", "bearer"):
            r = http(srv, method, path, key=None, headers={"Authorization": f"{scheme} {KEY}"}, **kw)
            assert r.status_code == 200, (method, path, r.status_code, r.text[:200])
            assert KEY not in r.text
            counts["allowed"] += 1
    # The upgrade: header form, subprotocol form (browsers), and neither.
    url_kw = [
        ({}, False), ({"additional_headers": {"Authorization": "Bearer sk-wrong"}}, False),
        ({"subprotocols": ["openai-insecure-api-key.sk-wrong"]}, False),
        ({"subprotocols": ["realtime"]}, False),
        ({"additional_headers": {"Authorization": f"Bearer {KEY}"}}, True),
        ({"subprotocols": [f"openai-insecure-api-key.{KEY}"]}, True),
        ({"subprotocols": [f"openai-insecure-api-key.{KEY}", "realtime"]}, True),
        ({"additional_headers": {"Authorization": "Bearer stale"}, "subprotocols": [f"openai-insecure-api-key.{KEY}"]},
         True),
    ]
    for kw, ok in url_kw:
        if ok:
            with ws_connect(srv, key=None, **kw) as ws:
                head = str(ws.response.headers) + (ws.response.reason_phrase or "")
                assert KEY not in head and "openai-insecure-api-key" not in head
                ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hi", "max_output_tokens": 1}))
                while recv_json(ws)["type"] != "response.incomplete":
                    pass
            counts["allowed"] += 1
        else:
            with pytest.raises(InvalidStatus) as info:
                with ws_connect(srv, key=None, **kw):
                    pass
            resp = info.value.response
            assert resp.status_code == 401
            body = bytes(resp.body).decode()
            assert check_envelope(json.loads(body), 401)["code"] == "invalid_api_key"
            assert KEY not in body and KEY not in str(resp.headers)
            counts["refused"] += 1
    print(f"\n[keys] {len(routes)} routes (from the router) + the upgrade: {counts['refused']} refused with 401, "
          f"{counts['allowed']} allowed with the key, {counts['open']} open routes (health, metrics, playground)")


def test_the_key_never_leaks(srv, caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("sanic.root", "sanic.error", "sanic.access", "sanic.websockets", "sanic.server", "ignis"):
        caplog.set_level(logging.DEBUG, logger=name)
    texts = []
    for method, path, websocket in _routes(srv):
        if websocket:
            continue
        kw = {"json": BODIES[(method, path)]} if (method, path) in BODIES else {}
        for key in (KEY, KEY + "x", None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            texts.append(http(srv, method, path, key=None, headers=headers, **kw).text)
    with ws_connect(srv, key=None, subprotocols=[f"openai-insecure-api-key.{KEY}", "x"]) as ws:
        texts.append(str(ws.response.headers))
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hi", "max_output_tokens": 1}))
        while (ev := recv_json(ws))["type"] != "response.incomplete":
            texts.append(json.dumps(ev))
    with pytest.raises(InvalidStatus) as info:
        with ws_connect(srv, key=None, subprotocols=[f"openai-insecure-api-key.{KEY}x"]):
            pass
    texts.append(bytes(info.value.response.body).decode() + str(info.value.response.headers))
    metrics = http(srv, "GET", "/metrics", key=None).text
    admin = http(srv, "GET", "/admin/config").text
    client_side = ("websockets.client", "httpcore", "httpx", "openai", "hpack")
    records = [r for r in caplog.records if not r.name.startswith(client_side)]
    assert records and any(r.name == "ignis.access" for r in records)
    for r in records:
        text = r.getMessage() + repr(r.args) + str(r.exc_text or "")
        assert KEY not in text, (r.name, text[:300])
    leaks = [t for t in texts if KEY in t]
    assert not leaks, leaks[:2]
    assert KEY not in metrics and KEY not in admin
    print(f"\n[keys] {len(records)} server log records at DEBUG, {len(texts)} answers and handshakes, /metrics "
          f"({len(metrics)} B) and /admin/config: the key in none of them")


def test_constant_time_comparison(srv, monkeypatch):
    from ignis.server import auth

    seen = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    for key in ("x", KEY[:-1], KEY + "x", "y" * 1000, KEY):
        http(srv, "GET", "/v1/models", key=key)
    assert len(seen) == 5 and all(a == b == 32 for a, b in seen), seen  # one check each; digests: no length shows
    monkeypatch.undo()

    # Timing: guesses of the key's length, right up to the last character or wrong from the
    # first, compared interleaved (drift cancels out); medians of many short batches.
    near, far = KEY[:-1] + "#", "#" * len(KEY)
    batches = {near: [], far: []}
    for _ in range(60):
        for guess in (near, far):
            t0 = time.perf_counter()
            for _ in range(300):
                auth._same(guess, KEY)
            batches[guess].append(time.perf_counter() - t0)
    m_near, m_far = statistics.median(batches[near]), statistics.median(batches[far])
    ratio = m_near / m_far  # quoted, not asserted: these machines are shared and noisy
    print(f"\n[keys] every check through hmac.compare_digest over 32-byte digests ({len(seen)} checks); "
          f"median per check: almost right {m_near / 300 * 1e9:.0f} ns, wrong from the first character "
          f"{m_far / 300 * 1e9:.0f} ns (ratio {ratio:.2f})")
