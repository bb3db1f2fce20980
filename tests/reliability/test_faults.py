"""Faults inside the engine, injected in this test process (the server runs in it):

- an exception in the forward for one request (its marker: temperature 0.123) fails
  that request alone with `response.failed`, while the requests batched with it go on
  to their normal end (the engine re-runs a failed step's requests one by one);
- the engine thread dying: every open response ends (`response.failed`, queued ones
  too), /health turns 503, new requests get 503 `engine_unavailable` over HTTP and an
  error event on the socket, quickly and without hanging.
"""

from __future__ import annotations

import json
import threading
import time

import httpx2 as httpx

from tests.reliability.reliability_harness import (
    TERMINAL,
    check_envelope,
    check_error_frame,
    parse_sse,
    recv_json,
    wait_for,
    wait_idle,
    ws_connect,
)
from tests.server.server_harness import KEY, http, metric

POISON = 0.123


def _sse(srv, body, out, key):
    with httpx.stream("POST", srv.base_url + "/v1/responses", json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        out[key] = parse_sse(r.read().decode())


def _socket_turns(srv, bodies, out, key, started=None):
    """Send every body (one per lane) on one socket, read until each has ended;
    out[key] = events by stream_id."""
    by: dict[str, list] = {}
    with ws_connect(srv) as ws:
        for body in bodies:
            ws.send(json.dumps({"type": "response.create", "model": "tiny", **body}))
        ended = 0
        while ended < len(bodies):
            ev = recv_json(ws, 60)
            if ev["type"] == "error":
                by.setdefault(f"error-{ended}", []).append(ev)
                ended += 1
                continue
            by.setdefault(ev.get("stream_id"), []).append(ev)
            if started is not None and ev["type"] == "response.output_text.delta":
                started.set()
            if ev["type"] in TERMINAL:
                ended += 1
    out[key] = by


def test_a_fault_for_one_request_fails_it_alone(start_server):
    srv = start_server(engine={"max_num_seqs": 8})
    runner = srv.ctx.engine.engine.runner
    real = runner.execute
    faults = {"steps": 0, "raised": 0}

    def execute(batch):
        faults["steps"] += 1
        if any(seq.params.temperature == POISON for seq in batch.seqs):
            faults["raised"] += 1
            raise RuntimeError("injected fault")
        return real(batch)

    runner.execute = execute
    try:
        out: dict = {}
        started = threading.Event()
        healthy = {"model": "tiny", "input": "count slowly", "temperature": 0, "max_output_tokens": 120}
        threads = [
            threading.Thread(target=_sse, args=(srv, healthy, out, "sse")),
            threading.Thread(target=_socket_turns, args=(srv, [dict(healthy, stream_id=s) for s in "ab"], out,
                                                         "socket", started)),
        ]
        for t in threads:
            t.start()
        assert started.wait(30)
        poisoned = {"model": "tiny", "input": "poison", "temperature": POISON, "max_output_tokens": 50}
        threads.append(threading.Thread(target=_sse, args=(srv, poisoned, out, "poisoned-sse")))
        threads.append(threading.Thread(target=_socket_turns, args=(srv, [dict(poisoned, stream_id="p")], out,
                                                                    "poisoned-socket")))
        for t in threads[2:]:
            t.start()
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    finally:
        runner.execute = real
    failed = [out["poisoned-sse"][-1]] + [evs[-1] for evs in out["poisoned-socket"].values()]
    for ev in failed:
        assert ev["type"] == "response.failed", ev
        err = ev["response"]["error"]
        assert err["code"] == "server_error" and "injected fault" in err["message"], err
    fine = [out["sse"][-1]] + [evs[-1] for evs in out["socket"].values()]
    for ev in fine:
        assert ev["type"] == "response.incomplete", ev["type"]
        assert ev["response"]["usage"]["output_tokens"] == 120
    assert faults["raised"] >= 2  # the poisoned ones, batched with the others then alone
    assert http(srv, "GET", "/health", key=None).status_code == 200
    r = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "after", "max_output_tokens": 2})
    assert r.status_code == 200 and r.json()["status"] == "incomplete"
    wait_idle(srv)
    print(f"\n[faults] one poisoned request (SSE and socket): {len(failed)} failed alone with response.failed, "
          f"{len(fine)} batched with them finished all 120 tokens; {faults['raised']} forwards raised "
          f"out of {faults['steps']}")


class _Die(BaseException):
    """Not an Exception: nothing in the engine catches it, the core thread dies."""


def test_the_engine_thread_dying(start_server):
    srv = start_server(engine={"max_num_seqs": 3})
    engine = srv.ctx.engine
    out: dict = {}
    started = threading.Event()
    long = {"model": "tiny", "input": "go on", "temperature": 0, "max_output_tokens": 20000}
    threads = [threading.Thread(target=_sse, args=(srv, long, out, "sse"))]
    threads[0].start()
    wait_for(lambda: engine.stats.num_in_flight == 1, what="the SSE response running")
    # Four lanes: two run beside the SSE response, two wait in the server's queue.
    threads.append(threading.Thread(target=_socket_turns, args=(srv, [dict(long, stream_id=s) for s in "abcd"], out,
                                                                "socket", started)))
    threads[1].start()
    assert started.wait(30)
    wait_for(lambda: engine.stats.num_room_waiters == 2, what="two queued socket requests")
    real_step = engine.engine.step

    def dying_step():
        raise _Die("injected: the engine thread dies")

    t_kill = time.monotonic()
    engine.engine.step = dying_step
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a response hung after the engine died"
    t_all_ended = time.monotonic() - t_kill
    engine.engine.step = real_step
    assert not engine.healthy
    endings = [evs[-1] for evs in out["socket"].values()] + [out["sse"][-1]]
    assert len(endings) == 5
    queued = [evs for evs in out["socket"].values() if any(e["type"] == "response.queued" for e in evs)]
    assert len(queued) == 2
    for ev in endings:
        if ev["type"] == "error":  # a socket request that had not been announced yet
            assert ev["status"] == 503 and ev["error"]["code"] == "engine_unavailable", ev
        else:
            assert ev["type"] == "response.failed", ev
            assert ev["response"]["error"]["code"] == "server_error", ev["response"]["error"]
    # Afterwards: /health says so, and new requests get 503 at once.
    h = http(srv, "GET", "/health", key=None)
    assert h.status_code == 503 and h.json()["status"] == "engine_down"
    assert metric(srv, "ignis_engine_healthy") == 0
    t0 = time.monotonic()
    for path, body in (("/v1/responses", {"model": "tiny", "input": "hi"}),
                       ("/v1/responses", {"model": "tiny", "input": "hi", "stream": True}),
                       ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})):
        r = httpx.post(srv.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=10)  # an answer, not a hang
        assert r.status_code == 503, (path, r.text)
        assert check_envelope(r.json(), 503)["code"] == "engine_unavailable"
    with ws_connect(srv) as ws:
        for generate in (True, False):
            ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hi", "generate": generate}))
            ev = recv_json(ws, 10)
            assert ev["type"] == "error" and ev["status"] == 503, ev
            assert ev["error"]["code"] == "engine_unavailable"
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": 5}))
        check_error_frame(recv_json(ws, 10))  # client errors still say what is wrong
    refusals = time.monotonic() - t0
    kinds = sorted(ev["type"] for ev in endings)
    print(f"\n[faults] engine thread killed: all {len(endings)} open responses ended within {t_all_ended:.2f} s "
          f"({kinds}); /health 503; 3 HTTP requests + 2 socket creates refused with 503 in {refusals:.2f} s")
