"""Helpers shared by the reliability tests: error-envelope checks, raw socket clients,
event-stream parsing, and the server's own state (engine idle, loop tasks, threads)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import httpx2 as httpx
from websockets.sync.client import connect

from tests.server.server_harness import KEY

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
ENVELOPE = {"message", "type", "param", "code"}
# Refusals with no single offending value: the body or frame as a whole is at fault.
PARAMLESS = {"invalid_json", "invalid_frame", "request_too_large", "invalid_api_key", "engine_overloaded",
             "engine_unavailable", "server_shutting_down", "unknown_url", "method_not_allowed", "forbidden_origin",
             "host_not_allowed", "unsupported_media_type", "request_timeout", "too_many_connections",
             "socket_buffer_full", "invalid_frame", "invalid_host_header"}


def check_envelope(body: Any, status: int) -> dict[str, Any]:
    """OpenAI's error envelope, a client error, and a param unless the whole body is at fault."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == ENVELOPE, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error"), (status, err)
    if err["param"] is None:
        assert err["code"] in PARAMLESS, ("a refusal without a param", status, err)
    else:
        assert isinstance(err["param"], str) and err["param"], err
    return err


def check_error_frame(ev: dict[str, Any]) -> dict[str, Any]:
    assert ev["type"] == "error" and isinstance(ev.get("status"), int), ev
    assert 400 <= ev["status"] < 500, ev
    return check_envelope({"error": ev["error"]}, ev["status"])


def ws_connect(srv: Any, key: str | None = KEY, **kw: Any) -> Any:
    headers = dict(kw.pop("additional_headers", {}) or {})
    if key is not None:
        headers.setdefault("Authorization", f"Bearer {key}")
    kw.setdefault("max_size", None)
    kw.setdefault("open_timeout", 30)
    return connect(srv.ws_url + "/v1/responses", additional_headers=headers, **kw)


def recv_json(ws: Any, timeout: float = 30.0) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Responses SSE (`event:` + `data:` blocks) -> events."""
    events = []
    for block in filter(None, text.split("\n\n")):
        lines = block.split("\n")
        data = next(ln for ln in lines if ln.startswith("data: "))
        ev = json.loads(data[6:])
        events.append(ev)
    return events


def wait_idle(srv: Any, timeout: float = 20.0) -> Any:
    """Until the engine holds no request (running, waiting or in flight)."""
    end = time.monotonic() + timeout
    while True:
        s = srv.ctx.engine.stats
        if s.num_in_flight == 0 and s.num_running == 0 and s.num_waiting == 0 and s.num_room_waiters == 0:
            return s
        if time.monotonic() > end:
            raise AssertionError(f"engine still busy: {s}")
        time.sleep(0.05)


def wait_for(pred: Any, timeout: float = 10.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def loop_tasks(srv: Any) -> list[str]:
    """Names of the coroutines of the tasks alive on the server's event loop (this one aside)."""
    def names() -> list[str]:
        me = asyncio.current_task()
        return sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not me and not t.done())

    return srv.call(names)


def thread_names() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def wait_healthy(proc: Any, port: int, timeout: float = 120.0) -> None:
    """Until a server subprocess on `port` answers /health with 200 (fails if it exits)."""
    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "the server exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < end, "the server did not come up"
        time.sleep(0.3)


def raw_head(sock: socket.socket, lines: list[str]) -> bytes:
    """Send `lines` as one request head on `sock` and read until the answer's head has
    arrived (or the peer closed): the bytes read, head and any body begun."""
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data

