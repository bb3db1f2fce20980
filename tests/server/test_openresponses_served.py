"""The server side of what Open Responses' suite and Codex ask for, on the tiny model:
compressed request bodies (zstd, gzip) and their bounds, the client's request id in the
access line, Codex's catalog on GET /v1/models, tool outputs that answer no call (HTTP
and the socket, where the failed turn evicts its parent), POST /v1/responses/compact and
its output as the input of a new chain, and a prewarm answered before its prefill ends."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
import zstandard

from tests import openresponses
from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import KEY, Frames, client, http

BODY = {"model": "tiny", "input": "Say hi.", "max_output_tokens": 3, "temperature": 0}
CALL = {"type": "function_call", "call_id": "call_real", "name": "f", "arguments": "{}"}


@pytest.fixture(scope="module")
def capped(start_server):
    """A server whose answers stop at 8 tokens (the compaction summary is one)."""
    return start_server(max_output_tokens=8, max_request_bytes=64 * 1024)


def post(srv, body: bytes, encoding: str | None, key: str | None = KEY, path: str = "/v1/responses"):
    headers = {"Content-Type": "application/json"}
    if encoding:
        headers["Content-Encoding"] = encoding
    return http(srv, "POST", path, key=key, content=body, headers=headers)


@pytest.mark.parametrize("encoding, pack", [("zstd", zstandard.ZstdCompressor().compress), ("gzip", gzip.compress),
                                            ("gzip, zstd", lambda b: zstandard.ZstdCompressor().compress(gzip.compress(b)))])
def test_compressed_bodies_are_accepted(capped, encoding, pack):
    r = post(capped, pack(json.dumps(BODY).encode()), encoding)
    assert r.status_code == 200, r.text
    validate_response(r.json())
    sse = post(capped, pack(json.dumps({**BODY, "stream": True}).encode()), encoding)
    assert sse.status_code == 200 and "event: response.incomplete" in sse.text  # at its 3 tokens


def test_compressed_bodies_are_bounded_and_checked(capped):
    raw = json.dumps({**BODY, "input": "x" * (200 * 1024)}).encode()  # 200 KiB inflated, limit 64 KiB
    for encoding, packed in (("zstd", zstandard.ZstdCompressor(level=19).compress(raw)), ("gzip", gzip.compress(raw))):
        assert len(packed) < 4096
        r = post(capped, packed, encoding)
        assert (r.status_code, r.json()["error"]["code"]) == (413, "request_too_large"), r.text
    r = post(capped, gzip.compress(json.dumps(BODY).encode())[:-6], "gzip")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_content_encoding")
    r = post(capped, b"not zstd at all", "zstd")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_content_encoding")
    r = post(capped, json.dumps(BODY).encode(), "br")
    assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_content_encoding")
    assert post(capped, json.dumps(BODY).encode(), "identity").status_code == 200
    # No key: refused before anything is inflated.
    assert post(capped, zstandard.ZstdCompressor().compress(raw), "zstd", key="sk-wrong").status_code == 401


def test_codex_headers_are_accepted_and_the_request_id_logged(capped, caplog):
    caplog.set_level(logging.INFO, logger="ignis.access")
    headers = {"OpenAI-Beta": "responses_websockets=2026-02-06", "session_id": "0198-abc",
               "x-client-request-id": "req-7f3a.1"}
    assert http(capped, "POST", "/v1/responses", json=BODY, headers=headers).status_code == 200
    odd = {"x-client-request-id": "evil id=injected"}  # not a plain id: left out
    assert http(capped, "POST", "/v1/responses", json=BODY, headers=odd).status_code == 200
    with client(capped, default_headers={"x-client-request-id": "sock-42"}).responses.connect() as conn:
        f = Frames(conn)
        conn.response.create(**BODY)
        f.terminal()
    lines = [r.getMessage() for r in caplog.records if r.name == "ignis.access"]
    assert any("POST /v1/responses" in m and m.endswith("req=req-7f3a.1") for m in lines), lines
    assert any("socket open" in m and "req=sock-42" in m for m in lines), lines
    assert not any("evil" in m or "injected" in m for m in lines)


def test_models_carry_codex_catalog(capped):
    listed = client(capped).models.list()
    assert [m.id for m in listed.data] == ["tiny", "fake-model"]
    body = http(capped, "GET", "/v1/models?client_version=0.171.0").json()
    entries = {e["slug"]: e for e in body["models"]}
    assert set(entries) == {"tiny", "fake-model"}
    tiny = entries["tiny"]
    assert tiny["context_window"] == capped.app.ctx.ignis.max_model_len
    assert tiny["input_modalities"] == ["text"] and tiny["apply_patch_tool_type"] == "freeform"
    assert tiny["model_messages"]["instructions_template"]
    assert http(capped, "GET", "/v1/models", key=None).status_code == 401


def test_an_output_without_its_call_is_refused_over_http(srv):
    orphan = {"type": "function_call_output", "call_id": "call_openresponses_missing", "output": "x"}
    r = http(srv, "POST", "/v1/responses", json={**BODY, "input": [{"role": "user", "content": "hi"}, orphan]})
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("input[1].call_id", "invalid_value")
    ok = http(srv, "POST", "/v1/responses", json={**BODY, "input": [CALL, {**orphan, "call_id": "call_real"}]})
    assert ok.status_code == 200, ok.text


def test_a_failed_continuation_evicts_its_parent(srv):
    orphan = {"type": "function_call_output", "call_id": "call_openresponses_missing", "output": "x"}
    with client(srv).responses.connect() as conn:
        f = Frames(conn)
        conn.response.create(**BODY, store=False)
        first = f.terminal()[-1]["response"]
        conn.response.create(**{**BODY, "input": [orphan]}, previous_response_id=first["id"])
        [err] = f.terminal()
        assert err["type"] == "error" and err["error"]["param"] == "input[0].call_id"
        conn.response.create(**BODY, previous_response_id=first["id"])
        [gone] = f.terminal()
        assert gone["error"]["code"] == "previous_response_not_found"
        # An answer to a call of the history is fine.
        conn.response.create(**{**BODY, "input": [CALL]})
        second = f.terminal()[-1]["response"]
        conn.response.create(**{**BODY, "input": [{**orphan, "call_id": "call_real"}]}, previous_response_id=second["id"])
        assert f.terminal()[-1]["response"]["status"] == "incomplete"  # answered, to its 3 tokens


def test_compaction_then_a_new_chain_on_the_socket(capped):
    c = client(capped)
    conversation = [{"type": "message", "role": "user", "content": "Remember the code word: slate."},
                    {"type": "message", "role": "assistant", "content": "OK."},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Compress."}]}]
    compacted = c.responses.compact(model="tiny", input=conversation)  # the SDK's own method and type
    body = compacted.model_dump(mode="json", exclude_unset=True)
    openresponses.check_compaction(body)
    assert body["object"] == "response.compaction" and body["output"][-1]["type"] == "compaction"
    assert [m["content"][0]["text"] for m in body["output"][:-1]] == ["Remember the code word: slate.", "Compress."]
    assert 0 < body["usage"]["output_tokens"] <= 8
    follow = [*body["output"], {"type": "message", "role": "user", "content": "Continue."}]
    with c.responses.connect() as conn:
        f = Frames(conn)
        conn.response.create(model="tiny", input=follow, store=False, tools=[], max_output_tokens=3)
        events = f.terminal()
        assert check_grammar(events)["status"] == "incomplete"  # answered, to its 3 tokens
    over_http = http(capped, "POST", "/v1/responses", json={**BODY, "input": follow})
    assert over_http.status_code == 200
    # The summary is in the prompt: longer than the kept user messages alone.
    bare = http(capped, "POST", "/v1/responses", json={**BODY, "input": [*body["output"][:-1], follow[-1]]})
    assert over_http.json()["usage"]["input_tokens"] > bare.json()["usage"]["input_tokens"]
    missing = http(capped, "POST", "/v1/responses/compact", json={"input": conversation})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "model")


def test_a_prewarm_is_answered_then_prefills(srv, caplog):
    caplog.set_level(logging.INFO, logger="ignis.access")
    with client(srv).responses.connect() as conn:
        f = Frames(conn)
        conn.response.create(model="tiny", input=[{"role": "developer", "content": "Be brief. " * 200}],
                             generate=False)
        warm = f.terminal()[-1]["response"]
        assert warm["status"] == "completed" and warm["output"] == [] and warm["usage"]["input_tokens"] > 400
        conn.send({"type": "response.cancel", "response_id": warm["id"]})  # a finished response: nothing to do
        conn.response.create(**{**BODY, "input": "Go."}, previous_response_id=warm["id"])
        turn = f.terminal()[-1]["response"]
        assert turn["usage"]["input_tokens_details"]["cached_tokens"] >= warm["usage"]["input_tokens"] - 16
    line = next(r.getMessage() for r in caplog.records if warm["id"] in r.getMessage())
    assert "prewarm answered completed at" in line and "prefill completed" in line
