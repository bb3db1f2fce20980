"""A tensor-parallel server (TP=2 over gloo, one spawned worker): the same greedy
conversation as TP=1 over HTTP and the socket; a worker killed mid-stream fails that
response and turns the server unhealthy; SIGTERM stops every rank, and no worker
outlives its server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from ignis.server.background import BackgroundServer
from tests.distributed.tp_models import torch_threads
from tests.server.server_harness import LONG, KEY, Frames, client, free_port, http, make_config

TURNS = ["Write a haiku about rivers.", "Now one about the sea."]


@pytest.fixture
def tp_server(tiny_server_model: Any) -> Iterator[BackgroundServer]:
    with torch_threads():
        srv = BackgroundServer(make_config(engine={"tensor_parallel_size": 2}), tiny_server_model).start()
        try:
            yield srv
        finally:
            srv.stop()
    assert not [p for p in srv.engine.engine.runner.workers if p.is_alive()]


def _http_conversation(srv: Any) -> list[str]:
    c, history, texts = client(srv), [], []
    for turn in TURNS:
        history.append({"type": "message", "role": "user", "content": turn})
        r = c.responses.create(model="tiny", input=history, max_output_tokens=12, temperature=0)
        assert r.status == "incomplete"  # greedy: the tiny model runs to the limit
        texts.append(r.output_text)
        history.extend(item.model_dump(exclude_none=True) for item in r.output)
    return texts


def _socket_conversation(srv: Any) -> list[str]:
    texts, previous = [], None
    with client(srv).responses.connect() as conn:
        f = Frames(conn)
        for turn in TURNS:
            conn.response.create(model="tiny", input=turn, max_output_tokens=12, temperature=0,
                                 **({"previous_response_id": previous} if previous else {}))
            final = f.terminal()[-1]["response"]
            previous = final["id"]
            texts.append("".join(c["text"] for item in final["output"] if item["type"] == "message"
                                 for c in item["content"]))
    return texts


def test_a_greedy_conversation_is_the_same_at_tp1_and_tp2(srv, tp_server):
    http_1, socket_1 = _http_conversation(srv), _socket_conversation(srv)
    assert all(http_1) and all(socket_1)
    assert _http_conversation(tp_server) == http_1
    assert _socket_conversation(tp_server) == socket_1


def test_a_worker_killed_mid_stream_fails_the_response_and_the_server_turns_unhealthy(tp_server):
    assert http(tp_server, "GET", "/health").status_code == 200
    worker = tp_server.engine.engine.runner.workers[0]
    stream = client(tp_server).responses.create(model="tiny", input="Count to a thousand.", stream=True, **LONG)
    types = []
    for event in stream:
        types.append(event.type)
        if event.type == "response.output_text.delta" and types.count(event.type) == 3:
            os.kill(worker.pid, signal.SIGKILL)
    assert types[-1] == "response.failed", types[-5:]
    assert event.response.error.code == "server_error"
    health = http(tp_server, "GET", "/health")
    assert health.status_code == 503 and health.json()["status"] == "engine_down"
    refused = http(tp_server, "POST", "/v1/responses", json={"model": "tiny", "input": "hi"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"


def test_a_worker_dying_while_idle_turns_the_server_unhealthy(tp_server):
    worker = tp_server.engine.engine.runner.workers[0]
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while http(tp_server, "GET", "/health").status_code == 200:
        assert time.monotonic() < deadline, "a dead worker went unnoticed"
        time.sleep(0.05)
    refused = http(tp_server, "POST", "/v1/responses", json={"model": "tiny", "input": "hi"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _all_gone(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while left := [pid for pid in pids if _alive(pid)]:
        assert time.monotonic() < deadline, f"outlived the server: {[_cmdline(pid) for pid in left]}"
        time.sleep(0.1)


def _serve(model_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, IGNIS_API_KEY=KEY)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ignis.serve", "+model=hf", f"model.path={model_dir}", "engine.tensor_parallel_size=2",
         "engine.num_kv_blocks=256", "engine.kernel_backend=torch", f"server.port={port}", "server.shutdown_grace=1"],
        cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.3)


@pytest.mark.slow
def test_sigterm_stops_every_rank_and_a_killed_server_leaves_no_worker(tmp_path):
    from tests.model.tiny_models import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", "qwen3", seed=2)
    procs: list[subprocess.Popen] = []
    workers: list[int] = []
    try:
        proc, url = _serve(model_dir)
        procs.append(proc)
        workers = _children(proc.pid)  # the worker, and multiprocessing's resource tracker
        assert any("spawn_main" in _cmdline(pid) for pid in workers), [_cmdline(pid) for pid in workers]
        body = {"model": model_dir.name, "input": "Hello there", "max_output_tokens": 8, "temperature": 0}
        r = httpx.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "rank 1 stopping" in out  # the worker was told to stop, not killed
        _all_gone(workers)

        # A server killed outright: its worker notices and exits on its own.
        proc, url = _serve(model_dir)
        procs.append(proc)
        workers = _children(proc.pid)
        proc.kill()
        proc.communicate(timeout=30)
        _all_gone(workers)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
