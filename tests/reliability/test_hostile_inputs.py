"""Inputs that reached a 500, a `failed` response or seconds of CPU:

- `top_k` at or past 2**31 (and anything >= the vocabulary) is clipped to "off", as vLLM
  clips it: the request completes on chat, Responses and the socket, and neither it nor its
  batch-mates fall back to row-by-row sampling.
- A prompt far longer than the context is refused on its character count before the
  tokenizer sees it (`context_length_exceeded`), also inside `truncation: "auto"`, which
  then drops it without tokenizing it.
- An unknown `model` is echoed back as a short prefix only.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from tests.reliability.reliability_harness import TERMINAL, check_envelope, check_error_frame, recv_json, wait_idle, ws_connect
from tests.server.server_harness import http

CONTEXT = 256
HUGE_K = [2**31 - 1 + 1, 2**40, 2**64 - 1, 4096 + 16, 10**30]


@pytest.fixture(scope="module")
def small(start_server):
    return start_server(engine={"max_model_len": CONTEXT})


def _fallbacks(caplog):
    return [r for r in caplog.records if "batched sampling failed" in r.getMessage()]


def test_huge_top_k_is_clipped(small, caplog):
    caplog.set_level(logging.WARNING)
    for k in HUGE_K:
        r = http(small, "POST", "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_k": k, "max_tokens": 3, "seed": 1})
        assert r.status_code == 200, (k, r.text[:300])
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
        r = http(small, "POST", "/v1/responses", json={"model": "tiny", "input": "hi", "top_k": k,
                                                        "max_output_tokens": 3})
        assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), (k, r.text[:300])
    with ws_connect(small) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "hi", "top_k": 2**31,
                            "max_output_tokens": 3}))
        while (ev := recv_json(ws))["type"] not in TERMINAL:
            assert ev["type"] != "error", ev
        assert ev["response"]["status"] == "incomplete", ev
    assert not _fallbacks(caplog)


def test_a_huge_top_k_does_not_slow_its_batch_mates(small, caplog):
    """Eight sampled requests in one batch, one of them with top_k = 2**31: no step of theirs
    takes the row-by-row fallback (which a value past int32 forced on the whole batch)."""
    caplog.set_level(logging.WARNING)
    results: dict[int, int] = {}

    def one(i: int) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 24,
                "temperature": 1, "top_p": 0.9, "seed": i}
        if i == 0:
            body["top_k"] = 2**31
        results[i] = http(small, "POST", "/v1/chat/completions", json=body).status_code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {i: 200 for i in range(8)}, results
    assert not _fallbacks(caplog), [r.getMessage() for r in _fallbacks(caplog)]


@pytest.fixture
def tokenized(small):
    """The lengths of every text the server's tokenizer is asked to encode during the test."""
    tok = small.ctx.renderer.tokenizer
    seen: list[int] = []
    originals = {name: getattr(tok, name) for name in ("encode", "encode_batch")}

    def encode(text, *a, **kw):
        seen.append(len(text))
        return originals["encode"](text, *a, **kw)

    def encode_batch(texts, *a, **kw):
        seen.extend(len(t) for t in texts)
        return originals["encode_batch"](texts, *a, **kw)

    tok.encode, tok.encode_batch = encode, encode_batch
    yield seen
    tok.encode, tok.encode_batch = originals["encode"], originals["encode_batch"]


def test_an_over_long_prompt_is_refused_before_tokenizing(small, tokenized):
    longest = small.ctx.renderer.tokenizer.max_token_bytes
    assert longest and longest < 200, longest
    text = "lorem ipsum " * 200_000  # 2.4 M characters against a 256-token context
    bound = CONTEXT * longest
    cases = [
        ("/v1/responses", {"model": "tiny", "input": text}, "input"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": text}]}, "messages"),
        ("/v1/responses", {"model": "tiny", "input": [{"role": "user", "content": "x"},
                                                      {"role": "user", "content": text}],
                           "truncation": "auto"}, "input"),
    ]
    for path, body, param in cases:
        r = http(small, "POST", path, json=body)
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        err = check_envelope(r.json(), 400)
        assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    with ws_connect(small) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": text}))
        err = check_error_frame(recv_json(ws, timeout=60))
        assert err["code"] == "context_length_exceeded", err
    # (the token cache cuts a long text into pieces: count them all)
    assert sum(tokenized) < bound, (sum(tokenized), bound)
    # truncation "auto" drops the over-long old turn, also without tokenizing it.
    r = http(small, "POST", "/v1/responses", json={
        "model": "tiny", "truncation": "auto", "max_output_tokens": 2,
        "input": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"},
                  {"role": "user", "content": "and now?"}]})
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text[:300]
    assert sum(tokenized) < bound, (sum(tokenized), bound)
    wait_idle(small)


def test_unknown_model_is_echoed_short(small):
    name = "m" * 100_000
    for method, path, body in (("POST", "/v1/responses", {"model": name, "input": "hi"}),
                               ("POST", "/v1/chat/completions", {"model": name,
                                                                 "messages": [{"role": "user", "content": "hi"}]}),
                               ("GET", f"/v1/models/{name[:3000]}", None)):
        r = http(small, method, path, **({"json": body} if body else {}))
        assert r.status_code == 404, (path, r.status_code)
        err = check_envelope(r.json(), 404)
        assert err["code"] == "model_not_found" and len(err["message"]) < 400, len(err["message"])
    with ws_connect(small) as ws:
        ws.send(json.dumps({"type": "response.create", "model": name, "input": "hi"}))
        err = check_error_frame(recv_json(ws))
        assert err["code"] == "model_not_found" and len(err["message"]) < 400
