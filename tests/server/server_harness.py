"""Helpers for the server tests: configs, SDK clients, socket frame readers, checks."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx2 as httpx
import openai
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from ignis.config import EngineConfig, IgnisConfig, KernelBackend, ServerConfig
from tests import openresponses

KEY = "sk-ignis-test-4f9c2e7a1b"  # distinctive: tests grep logs for it
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
WS_EVENT = TypeAdapter(ResponsesServerEvent)
# Greedy decoding of the tiny model never emits EOS on ordinary prompts: long runs.
LONG = {"temperature": 0, "max_output_tokens": 20000}


def free_port() -> int:
    """A port free on 127.0.0.1 just now (for a server in a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(*, engine: dict | None = None, **server: Any) -> IgnisConfig:
    eng = dict(kernel_backend=KernelBackend.torch, num_kv_blocks=2048, cpu_threads=1, max_num_seqs=16)
    eng.update(engine or {})
    # shutdown_grace: a test server stopped with responses still running waits that long.
    srv = dict(host="127.0.0.1", port=0, api_key=KEY, model_aliases=["fake-model"], access_log=True, shutdown_grace=1)
    srv.update(server)
    return IgnisConfig(engine=EngineConfig(**eng), server=ServerConfig(**srv))


def client(srv: Any, key: str | None = KEY, **kw: Any) -> openai.OpenAI:
    kw.setdefault("timeout", 60)
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key or "none", max_retries=0, **kw)


def http(srv: Any, method: str, path: str, key: str | None = KEY, **kw: Any) -> httpx.Response:
    headers = dict(kw.pop("headers", {}) or {})
    if key is not None:
        headers.setdefault("Authorization", f"Bearer {key}")
    kw.setdefault("timeout", 60)
    return httpx.request(method, srv.base_url + path, headers=headers, **kw)


def validate_ws(ev: dict[str, Any]) -> Any:
    """Strict validation of one socket frame against the SDK's server-event union and the
    Open Responses schema."""
    wire = json.loads(json.dumps(ev))
    openresponses.check_event(wire, socket=True)
    model = WS_EVENT.validate_python(wire, strict=True)
    assert model.type == ev["type"]
    return model


class Frames:
    """Reads an SDK `ResponsesConnection` frame by frame (with a deadline), validating
    each frame strictly and parsing it with the SDK too."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.seen: list[dict[str, Any]] = []

    def next(self, timeout: float = 30.0) -> dict[str, Any]:
        raw = self.conn._connection.recv(timeout=timeout)
        self.conn.parse_event(raw)  # the SDK's own parsing must take it
        ev = json.loads(raw)
        validate_ws(ev)
        self.seen.append(ev)
        return ev

    def until(self, pred: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Frames up to and including the first for which pred(frame) holds."""
        out = []
        end = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.1, end - time.monotonic()))
            out.append(ev)
            if pred(ev):
                return out

    def terminal(self, timeout: float = 60.0, stream_id: str | None = "*") -> list[dict[str, Any]]:
        """Frames up to a terminal event (of `stream_id` when given) or an error."""
        def done(ev: dict[str, Any]) -> bool:
            if ev["type"] == "error":
                return stream_id == "*" or ev.get("stream_id") == stream_id
            return ev["type"] in TERMINAL and (stream_id == "*" or ev.get("stream_id") == stream_id)
        return self.until(done, timeout)


def of_stream(events: list[dict[str, Any]], stream_id: str | None) -> list[dict[str, Any]]:
    return [e for e in events if e.get("stream_id") == stream_id]


def metric(srv: Any, name: str, labels: str = "") -> float | None:
    text = http(srv, "GET", "/metrics").text
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return None


class ServedProcess:
    """`python -m ignis.serve OVERRIDES...` in a subprocess on a free 127.0.0.1 port, the
    key from IGNIS_API_KEY; a context manager that waits for /health and, on exit, stops
    it with SIGINT and keeps its whole output in `.output`."""

    def __init__(self, *overrides: str, key: str = KEY, start_timeout: float = 180) -> None:
        import os
        import sys
        from pathlib import Path

        port = free_port()
        env = dict(os.environ, IGNIS_API_KEY=key)
        env.pop("TRITON_INTERPRET", None)  # the product runs the torch references on a CPU anyway
        self.args = [sys.executable, "-m", "ignis.serve", *overrides, f"server.port={port}"]
        self.cwd, self.env = Path(__file__).resolve().parents[2], env
        self.base_url = f"http://127.0.0.1:{port}"
        self.start_timeout = start_timeout
        self.output = ""

    def __enter__(self) -> "ServedProcess":
        import subprocess

        self.proc = subprocess.Popen(self.args, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                assert self.proc.poll() is None, self.proc.stdout.read()
                try:
                    if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.3)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        import signal
        import subprocess

        self.proc.send_signal(signal.SIGINT)
        try:
            self.output, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output, _ = self.proc.communicate()
