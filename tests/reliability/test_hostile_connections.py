"""Slow, idle and surplus connections.

- A client trickling its request head (or body) a byte group at a time, each well within
  Sanic's idle timer, is cut at `server.receive_timeout` from its first byte: 408, closed.
- Past `server.max_connections` open connections, one more gets a 503 in OpenAI's error
  shape and is closed; once one closes, the next is served.
- Clients that go away mid-head or mid-body (FIN or RST) leave no 500 access line, no
  error record; SIGTERM with such clients open prints no "connection_task uncaught"
  traceback.

No timed assertions: the deadlines here are a few seconds against clients that would
trickle for a minute.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.reliability_harness import check_envelope, wait_for, wait_healthy
from tests.server.server_harness import KEY, free_port, http

REPO = Path(__file__).resolve().parents[2]
RECEIVE = 2.0  # seconds
TRICKLE = 120  # pieces, one every 0.5 s: a minute, far past RECEIVE


@pytest.fixture(scope="module")
def strict(start_server):
    return start_server(receive_timeout=RECEIVE, max_connections=6)


def _read_answer(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError, socket.timeout):
        pass
    return data


def _trickle(srv, pieces: list[bytes]) -> tuple[bytes, int]:
    """Send the pieces 0.5 s apart until the server answers or closes; (answer, pieces sent)."""
    with socket.create_connection((srv.host, srv.port), timeout=30) as s:
        s.settimeout(0.5)
        sent = 0
        for piece in pieces:
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            try:
                data = s.recv(65536)
            except (TimeoutError, socket.timeout):
                continue
            except ConnectionResetError:
                return b"", sent
            s.settimeout(10)
            return data + _read_answer(s), sent
        return b"", sent


def test_a_trickled_head_is_cut(strict):
    pieces = [b"GET /health HTTP/1.1\r\n"] + [f"X-Slow-{i}: {'y' * 10}\r\n".encode() for i in range(TRICKLE)]
    answer, sent = _trickle(strict, pieces)
    assert answer.startswith(b"HTTP/1.1 408"), (answer[:200], sent)
    assert sent < TRICKLE, sent
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert check_envelope(body, 408)["code"] == "request_timeout"
    assert http(strict, "GET", "/health", key=None).status_code == 200


def test_a_trickled_body_is_cut(strict):
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{strict.port}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {10 * TRICKLE}\r\n\r\n").encode()
    answer, sent = _trickle(strict, [head] + [b" " * 10] * TRICKLE)
    assert answer.startswith(b"HTTP/1.1 408"), (answer[:200], sent)
    assert sent < TRICKLE, sent


def test_connection_cap(strict):
    wait_for(lambda: len(strict.ctx.sockets) == 0, what="no sockets")
    held = []
    try:
        # Idle keep-alive connections count too: fill every slot.
        for _ in range(12):
            s = socket.create_connection((strict.host, strict.port), timeout=10)
            held.append(s)
            s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{strict.port}\r\n\r\n".encode())
            head = s.recv(65536)
            if head.startswith(b"HTTP/1.1 503"):
                break
            assert head.startswith(b"HTTP/1.1 200"), head[:100]
        assert head.startswith(b"HTTP/1.1 503"), head[:200]
        s.settimeout(10)
        answer = head + _read_answer(s)
        assert b"retry-after" in answer.lower()
        err = check_envelope(json.loads(answer.partition(b"\r\n\r\n")[2]), 503)
        assert err["code"] == "too_many_connections", err
        assert len(held) == 7, len(held)  # six served, the seventh refused
        held.pop().close()
        held.pop().close()  # one slot free again once the server has seen it go
        time.sleep(0.2)
        wait_for(lambda: http(strict, "GET", "/health", key=None).status_code == 200, what="a free slot")
    finally:
        for s in held:
            s.close()


def _rst(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_disconnects_are_quiet(strict, caplog):
    caplog.set_level(logging.INFO)
    for how in ("fin", "rst"):
        for piece in (b"GET /health HTTP/1.1\r\nX-Half: ",
                      f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{strict.port}\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"model\": ".encode()):
            s = socket.create_connection((strict.host, strict.port), timeout=10)
            s.sendall(piece)
            time.sleep(0.3)
            if how == "fin":
                s.close()
            else:
                _rst(s)
    time.sleep(1.0)
    assert http(strict, "GET", "/health", key=None).status_code == 200
    server_side = [r for r in caplog.records if r.name.startswith(("ignis", "sanic"))]
    noisy = [r.getMessage() for r in server_side if r.levelno >= logging.ERROR or " 500" in r.getMessage()
             or "uncaught" in r.getMessage()]
    assert not noisy, noisy


def test_sigterm_with_slow_clients_is_quiet(tiny_server_model):
    port = free_port()
    env = dict(os.environ, IGNIS_API_KEY=KEY)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ignis.serve", "+model=hf", f"model.path={tiny_server_model.path}", "model.name=tiny",
         f"server.port={port}", "server.shutdown_grace=1", "engine.kernel_backend=torch", "engine.num_kv_blocks=256",
         "engine.cpu_threads=1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slow = []
    try:
        wait_healthy(proc, port)
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nX-Slow: " if i % 2 else
                      b"POST /v1/responses HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 99\r\n\r\n{")
            slow.append(s)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for s in slow:
            s.close()
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output and "uncaught" not in output, output[-3000:]
    assert " 500 " not in output, output[-3000:]


def test_the_cap_leaves_room_under_the_descriptor_limit(monkeypatch):
    """With `ulimit -n 256`, 512 connections would exhaust descriptors (accept() failing,
    /health with it): the cap is lowered to what the limit leaves."""
    from ignis.server import connections

    monkeypatch.setattr(connections.resource, "getrlimit", lambda _: (256, 4096))
    assert connections.connection_cap(512) == 256 - connections._FD_RESERVE
    assert connections.connection_cap(100) == 100
