"""A web page as the attacker: what a local server with no key must still refuse.

- A WebSocket upgrade with a foreign `Origin` (or `Origin: null`) gets 403 before any
  work; the server's own origin, a listed `server.cors_origins` entry and no Origin at
  all (Codex, the SDKs) get through.
- Bound to loopback, a request naming another `Host` (DNS rebinding) gets 403 on every
  route, the admin one included; loopback names and `server.allowed_hosts` get through.
- `/v1` POST bodies that are not `application/json` (a "simple" cross-site request
  needs no preflight) get 415 in OpenAI's error shape and start nothing.
- The key's subprotocol is recognised in any casing and never selected or echoed.
- A path with a NUL byte is a 404, not a 500.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.reliability.reliability_harness import check_envelope, raw_head, recv_json, wait_idle, ws_connect
from tests.server.server_harness import KEY, http

HI = {"model": "tiny", "input": "hi", "max_output_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def open_srv(start_server):
    """No key (the `make serve` default), one extra CORS origin and one extra host name."""
    return start_server(api_key="", cors_origins=["http://app.example"], allowed_hosts=["ignis.lan"])


def _upgrade(srv, headers: dict[str, str], path: str = "/v1/responses") -> tuple[int, dict[str, str], bytes]:
    """A raw upgrade request: (status, lower-cased headers, body) of the answer."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {headers.pop('Host', f'127.0.0.1:{srv.port}')}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((srv.host, srv.port), timeout=30) as s:
        data = raw_head(s, lines)
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *rest = head.decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in rest)}
        status = int(status_line.split()[1])
        if status != 101:
            want = int(hdrs.get("content-length", "0"))
            while len(body) < want:
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
        return status, hdrs, body


def test_websocket_origin(open_srv):
    own = f"http://127.0.0.1:{open_srv.port}"
    refused = ["http://evil.example", "null", f"http://127.0.0.1:{open_srv.port + 1}", "https://app.example.evil",
               "file://", f"http://localhost:{open_srv.port}"]  # another name is another origin
    for origin in refused:
        status, _, body = _upgrade(open_srv, {"Origin": origin})
        assert status == 403, (origin, status, body)
        assert check_envelope(json.loads(body), 403)["code"] == "forbidden_origin"
    for origin in (own, own.upper().replace("HTTP", "http"), "http://app.example", None):
        status, _, _ = _upgrade(open_srv, {"Origin": origin} if origin else {})
        assert status == 101, (origin, status)
    # The allowed socket works end to end; the refused ones started nothing.
    with ws_connect(open_srv, key=None, origin=own) as ws:
        ws.send(json.dumps({"type": "response.create", **HI}))
        while recv_json(ws)["type"] != "response.incomplete":
            pass
    wait_idle(open_srv)


def test_host_allow_list_on_loopback(open_srv):
    for host in ("evil.example", f"evil.example:{open_srv.port}", "127.0.0.1.evil.example", "[::2]", "x:y:z"):
        for method, path, kw in (("PATCH", "/admin/config", {"json": {"socket_idle_close": 300}}),
                                 ("GET", "/health", {}), ("GET", "/", {}), ("GET", "/v1/models", {}),
                                 ("POST", "/v1/responses", {"json": HI})):
            r = http(open_srv, method, path, key=None, headers={"Host": host}, **kw)
            assert r.status_code == 403, (host, method, path, r.status_code)
            assert check_envelope(r.json(), 403)["code"] == "host_not_allowed"
        status, _, _ = _upgrade(open_srv, {"Host": host})
        assert status == 403, host
    for host in (f"localhost:{open_srv.port}", "localhost", f"127.0.0.1:{open_srv.port}", f"[::1]:{open_srv.port}",
                 "LOCALHOST", f"ignis.lan:{open_srv.port}", "IGNIS.LAN"):
        r = http(open_srv, "GET", "/health", key=None, headers={"Host": host})
        assert r.status_code == 200, (host, r.status_code)
    r = http(open_srv, "PATCH", "/admin/config", key=None, headers={"Host": f"localhost:{open_srv.port}"},
             json={"socket_idle_close": 300})
    assert r.status_code == 200, r.text


def test_other_binds_keep_any_host():
    from ignis.server.guard import is_loopback_bind

    assert is_loopback_bind("127.0.0.1") and is_loopback_bind("::1") and is_loopback_bind("localhost")
    assert is_loopback_bind("127.0.0.2") and is_loopback_bind("[::1]")
    assert not is_loopback_bind("0.0.0.0") and not is_loopback_bind("::") and not is_loopback_bind("10.0.0.5")


def test_post_bodies_must_be_json(open_srv):
    body = json.dumps(HI)
    before = open_srv.ctx.engine.stats
    for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data",
                  None, "application/jsonx", "application/json-patch+json"):
        headers = {"Content-Type": ctype} if ctype else {}
        for path in ("/v1/responses", "/v1/chat/completions"):
            r = http(open_srv, "POST", path, key=None, headers=headers, content=body)
            assert r.status_code == 415, (ctype, path, r.status_code)
            assert check_envelope(r.json(), 415)["code"] == "unsupported_media_type"
        r = http(open_srv, "PATCH", "/admin/config", key=None, headers=headers, content='{"socket_idle_close": 1}')
        assert r.status_code == 415, (ctype, r.status_code)
    assert open_srv.ctx.live.socket_idle_close == 300
    after = open_srv.ctx.engine.stats
    assert after.num_in_flight == before.num_in_flight == 0
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        r = http(open_srv, "POST", "/v1/responses", key=None, headers={"Content-Type": ctype}, content=body)
        assert r.status_code == 200, (ctype, r.text)


def test_key_subprotocol_in_any_casing(srv):
    for prefix in ("openai-insecure-api-key.", "OpenAI-Insecure-API-Key.", "OPENAI-INSECURE-API-KEY."):
        # Beside a Bearer header (the key entry is then not needed), and alone.
        for headers in ({"Authorization": f"Bearer {KEY}"}, {}):
            status, hdrs, _ = _upgrade(srv, dict(headers, **{"Sec-WebSocket-Protocol": f"{prefix}{KEY}"}))
            assert status == 101, (prefix, headers, status)
            assert "sec-websocket-protocol" not in hdrs, hdrs
            status, hdrs, _ = _upgrade(srv, dict(headers, **{"Sec-WebSocket-Protocol": f"{prefix}{KEY}, realtime"}))
            assert status == 101 and hdrs.get("sec-websocket-protocol") == "realtime", hdrs
        # The key itself stays case-sensitive.
        status, _, body = _upgrade(srv, {"Sec-WebSocket-Protocol": f"{prefix}{KEY.upper()}"})
        assert status == 401 and KEY.upper() not in body.decode()


def test_nul_in_a_path(open_srv):
    for path in ("/playground/%00", "/playground/index.html%00.js", "/playground/%00/x", "/%00"):
        r = http(open_srv, "GET", path, key=None)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
        assert check_envelope(r.json(), 404)["code"] == "unknown_url"
    assert http(open_srv, "GET", "/playground/index.html", key=None).status_code == 200
