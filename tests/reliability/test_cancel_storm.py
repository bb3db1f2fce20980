"""Cancellation storm: 200 random cancels under load against a small engine
(max_num_seqs 8, so socket requests queue and HTTP gets 503s): `response.cancel` by id
and by lane, sockets closed mid-stream (cleanly and by dropping the TCP connection), and
HTTP clients going away mid-stream (SSE) or before the answer (JSON).

Afterwards: every response ended with exactly one terminal event, unless its client had
closed the transport; the free KV blocks are back to the starting count;
`ignis_responses_sockets` and `ignis_responses_queued_requests` are back to 0; the
engine holds nothing; and no task on the server's loop nor thread in this process was
left behind."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter

import httpx2 as httpx

from tests.reliability.reliability_harness import TERMINAL, loop_tasks, recv_json, thread_names, wait_for, wait_idle, ws_connect
from tests.server.server_harness import KEY, metric

CANCELS = 200
SOCKET_WORKERS = 6
HTTP_WORKERS = 3
LANES = ["a", "b", "c", "d"]


class Storm:
    def __init__(self, srv):
        self.srv = srv
        self.lock = threading.Lock()
        self.cancels = Counter()
        self.outcomes = Counter()
        self.errors: list[str] = []

    def more(self) -> bool:
        with self.lock:
            return sum(self.cancels.values()) < CANCELS and not self.errors

    def cancelled(self, kind: str) -> None:
        with self.lock:
            self.cancels[kind] += 1

    def ended(self, kind: str) -> None:
        with self.lock:
            self.outcomes[kind] += 1

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)


def _socket_worker(storm: Storm, seed: int) -> None:
    rng = random.Random(seed)
    while storm.more():
        try:
            _socket_episode(storm, rng)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            storm.fail(f"socket worker {seed}: {exc!r}")


def _socket_episode(storm: Storm, rng: random.Random) -> None:
    ws = ws_connect(storm.srv)
    lanes = rng.sample(LANES, rng.randint(1, len(LANES)))
    for lane in lanes:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": f"storm {lane}", "temperature": 0,
                            "stream_id": lane, "max_output_tokens": rng.choice([8, 60, 300, 1000])}))
    live: dict[str, str] = {}  # response id -> lane, created and not ended
    terminals: Counter[str] = Counter()

    def read(n: int, timeout: float = 30) -> None:
        for _ in range(n):
            ev = recv_json(ws, timeout)
            if ev["type"] == "error":
                raise AssertionError(f"unexpected error event {ev}")
            if ev["type"] == "response.created":
                live[ev["response"]["id"]] = ev["stream_id"]
            elif ev["type"] in TERMINAL:
                rid = ev["response"]["id"]
                terminals[rid] += 1
                if terminals[rid] > 1:
                    raise AssertionError(f"two terminal events for {rid}")
                live.pop(rid, None)
                storm.ended(f"socket {ev['response']['status']}")

    want, until = rng.randint(1, 25), time.monotonic() + rng.uniform(0.05, 1.0)
    while want > 0 and time.monotonic() < until and sum(terminals.values()) < len(lanes):
        try:
            read(1, timeout=0.1)
            want -= 1
        except TimeoutError:
            pass  # queued behind others: nothing to read yet
    action = rng.choice(["cancel_id", "cancel_lane", "close", "drop", "finish"])
    if action in ("close", "drop"):
        storm.cancelled(f"socket {action}")
        if action == "drop":  # no close handshake: the TCP connection just goes
            ws.socket.shutdown(socket.SHUT_RDWR)
        ws.close()
        return
    if action == "cancel_id" and live:
        ws.send(json.dumps({"type": "response.cancel", "response_id": rng.choice(list(live))}))
        storm.cancelled("socket cancel by id")
    elif action == "cancel_lane":
        ws.send(json.dumps({"type": "response.cancel", "stream_id": rng.choice(lanes)}))
        storm.cancelled("socket cancel by lane")
    # Then every response of the episode must end, with exactly one terminal event; the
    # ones still running after a while are cancelled too (by id).
    hurry, deadline = time.monotonic() + 1.0, time.monotonic() + 60
    while sum(terminals.values()) < len(lanes):
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"responses never ended: {live}")
        if now > hurry:
            for rid in list(live):
                ws.send(json.dumps({"type": "response.cancel", "response_id": rid}))
                storm.cancelled("socket cancel by id")
            hurry = deadline
        try:
            read(1, timeout=0.5)
        except TimeoutError:
            pass
    ws.close()


def _http_worker(storm: Storm, seed: int) -> None:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {KEY}"}
    while storm.more():
        body = {"model": "tiny", "input": "storm http", "temperature": 0,
                "max_output_tokens": rng.choice([8, 60, 3000])}
        try:
            if rng.random() < 0.6:
                with httpx.stream("POST", storm.srv.base_url + "/v1/responses", json=dict(body, stream=True),
                                  headers=headers, timeout=30) as r:
                    if r.status_code == 503:
                        storm.ended("http 503")
                        time.sleep(0.05)
                        continue
                    stop_after, seen, terminal = rng.randint(1, 20), 0, 0
                    for line in r.iter_lines():
                        if line.startswith("event: "):
                            seen += 1
                            terminal += line[7:] in TERMINAL
                            if seen >= stop_after and not terminal:
                                break  # the client goes away mid-stream
                    if terminal:
                        storm.ended("http sse finished")
                    else:
                        storm.cancelled("http sse disconnect")
            else:
                try:
                    r = httpx.post(storm.srv.base_url + "/v1/responses", json=body, headers=headers,
                                   timeout=rng.choice([0.05, 0.2, 30]))
                    storm.ended(f"http {r.status_code}")
                    if r.status_code == 503:
                        time.sleep(0.05)
                except httpx.TimeoutException:
                    storm.cancelled("http json disconnect")
        except Exception as exc:  # noqa: BLE001
            storm.fail(f"http worker {seed}: {exc!r}")


def test_cancellation_storm(start_server):
    srv = start_server(engine={"max_num_seqs": 8})
    base_blocks = wait_idle(srv).num_free_blocks
    base_tasks = loop_tasks(srv)
    base_threads = thread_names()
    storm = Storm(srv)
    t0 = time.monotonic()
    workers = [threading.Thread(target=_socket_worker, args=(storm, i), name=f"storm-socket-{i}")
               for i in range(SOCKET_WORKERS)]
    workers += [threading.Thread(target=_http_worker, args=(storm, 100 + i), name=f"storm-http-{i}")
                for i in range(HTTP_WORKERS)]
    peak = {"in_flight": 0, "queued": 0}

    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        s = srv.ctx.engine.stats
        peak["in_flight"] = max(peak["in_flight"], s.num_in_flight)
        peak["queued"] = max(peak["queued"], srv.ctx.admission.queued)
        time.sleep(0.05)
    for w in workers:
        w.join()
    storm_s = time.monotonic() - t0
    assert not storm.errors, storm.errors[:3]
    assert sum(storm.cancels.values()) >= CANCELS

    stats = wait_idle(srv)
    wait_for(lambda: metric(srv, "ignis_responses_sockets") == 0, what="ignis_responses_sockets back to 0")
    assert metric(srv, "ignis_responses_queued_requests") == 0
    assert stats.num_free_blocks == base_blocks == stats.num_blocks
    engine = srv.ctx.engine
    assert not engine.engine.seqs and not engine._streams and engine._slots == 0 and not engine._waiters
    assert not srv.ctx.sockets and not srv.ctx.http_streams
    wait_for(lambda: loop_tasks(srv) == base_tasks, what=f"the loop's tasks back to {base_tasks}")
    leaked = [t for t in thread_names() if t not in base_threads and not t.startswith("asyncio_")]
    assert not leaked, leaked
    print(f"\n[storm] {sum(storm.cancels.values())} cancels in {storm_s:.1f} s ({dict(storm.cancels)}); "
          f"other endings {dict(storm.outcomes)}; peak in flight {peak['in_flight']}, queued {peak['queued']}; "
          f"after: free blocks {stats.num_free_blocks}/{stats.num_blocks}, sockets 0, queued 0, "
          f"loop tasks {len(base_tasks)} as before, no thread left")
