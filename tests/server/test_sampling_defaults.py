"""The served model's sampling defaults: `model.sampling`, then the checkpoint's own
(generation_config.json, GGUF ``general.sampling.*``), then OpenAI's; a field the request
sets always wins; the response reports the values used; the same on /v1/responses (JSON,
SSE, socket) and /v1/chat/completions. Also the vLLM extensions ``ignore_eos`` and
``min_tokens`` end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ignis.config import SamplingDefaults
from ignis.model import generation_config
from ignis.server.params import RequestDefaults
from protocol.sampling import SamplingFields
from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import Frames, client, http, make_config


def test_resolution_order_and_sources():
    configured = SamplingDefaults(temperature=0.2, max_output_tokens=512)
    d = RequestDefaults.resolve(configured, {"temperature": 0.7, "top_p": 0.8, "top_k": 20})
    assert dict(d.values) == {"temperature": 0.2, "top_p": 0.8, "top_k": 20, "max_output_tokens": 512}
    assert d.sources["temperature"] == "model.sampling" and d.sources["top_p"] == "checkpoint"
    assert "temperature=0.2 (model.sampling)" in d.describe() and "top_k=20 (checkpoint)" in d.describe()
    plain = RequestDefaults.resolve()
    assert dict(plain.values) == {"temperature": 1.0, "top_p": 1.0} and plain.sources["top_p"] == "OpenAI"


def test_fill_keeps_what_the_request_set_and_caps_the_output():
    d = RequestDefaults.resolve(SamplingDefaults(temperature=0.2, top_p=0.9, max_output_tokens=512), server_cap=300)
    assert d.values["max_output_tokens"] == 300 and d.sources["max_output_tokens"] == "server.max_output_tokens"
    filled = d.fill(SamplingFields(temperature=0.0, seed=3))
    assert (filled.temperature, filled.top_p, filled.max_output_tokens, filled.seed) == (0.0, 0.9, 300, 3)
    assert d.fill(SamplingFields(max_output_tokens=1000)).max_output_tokens == 300
    assert d.fill(SamplingFields(max_output_tokens=20)).max_output_tokens == 20
    full = SamplingFields(temperature=1.0, top_p=1.0, top_k=5, min_p=0.1, repetition_penalty=1.1,
                          presence_penalty=0.0, frequency_penalty=0.0, max_output_tokens=5)
    assert d.fill(full) is full


def test_generation_config_json(tmp_path: Path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 2048,
        "repetition_penalty": "high", "min_p": 7, "bos_token_id": 1}))
    assert generation_config.from_hf_dir(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                        "max_output_tokens": 2048}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "top_p": 0.9}))
    assert generation_config.from_hf_dir(tmp_path) == {"top_p": 0.9, "temperature": 0.0}  # greedy
    (tmp_path / "generation_config.json").write_text("{not json")
    assert generation_config.from_hf_dir(tmp_path) == {}
    assert generation_config.from_hf_dir(tmp_path / "absent") == {}


def test_gguf_sampling_metadata(tmp_path: Path):
    import gguf
    import numpy as np

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_float32("general.sampling.temp", 0.25)
    w.add_int32("general.sampling.top_k", 40)
    w.add_float32("general.sampling.top_p", 3.0)  # out of range: dropped
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = generation_config.from_gguf(gguf.GGUFReader(path))
    assert got == {"temperature": 0.25, "top_k": 40}


@pytest.fixture(scope="module")
def defaults_server(tiny_server_model: Any) -> Any:
    """The tiny model (greedy never meets EOS: a run goes to its limit) with model.sampling
    set as a model group would set it."""
    from ignis.server.background import BackgroundServer

    cfg = make_config()
    cfg.model.sampling = SamplingDefaults(temperature=0.0, top_p=0.5, max_output_tokens=7)
    srv = BackgroundServer(cfg, tiny_server_model).start()
    yield srv
    srv.stop()


def test_a_plain_request_gets_the_model_defaults_on_every_transport(defaults_server):
    srv = defaults_server
    r = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hello"})
    plain = r.json()
    validate_response(plain)
    assert (plain["temperature"], plain["top_p"], plain["max_output_tokens"]) == (0.0, 0.5, 7)
    assert plain["status"] == "incomplete" and plain["usage"]["output_tokens"] == 7
    # Greedy by default: the same text again.
    text = plain["output"][0]["content"][0]["text"]
    again = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hello"}).json()
    assert again["output"][0]["content"][0]["text"] == text

    r = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hello", "stream": True})
    events = [json.loads(b.split("\n")[1][6:]) for b in r.text.split("\n\n") if b]
    final = check_grammar(events)
    assert (final["temperature"], final["top_p"], final["max_output_tokens"]) == (0.0, 0.5, 7)
    assert events[0]["response"]["temperature"] == 0.0  # response.created reports it too

    with client(srv).responses.connect() as conn:
        frames = Frames(conn)
        conn.response.create(model="tiny", input="Hello")
        final = frames.terminal()[-1]["response"]
    assert (final["temperature"], final["top_p"], final["max_output_tokens"]) == (0.0, 0.5, 7)
    assert final["usage"]["output_tokens"] == 7

    c = http(srv, "POST", "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]})
    assert c.json()["usage"]["completion_tokens"] == 7 and c.json()["choices"][0]["finish_reason"] == "length"
    assert c.json()["choices"][0]["message"]["content"] == text


def test_what_the_request_sets_wins(defaults_server):
    srv = defaults_server
    r = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hello", "temperature": 1.5,
                                                  "top_p": 1, "max_output_tokens": 3, "seed": 1})
    resp = r.json()
    assert (resp["temperature"], resp["top_p"], resp["max_output_tokens"]) == (1.5, 1.0, 3)
    assert resp["usage"]["output_tokens"] == 3
    c = http(srv, "POST", "/v1/chat/completions", json={"model": "tiny", "max_tokens": 12,
                                                        "messages": [{"role": "user", "content": "Hello"}]})
    assert c.json()["usage"]["completion_tokens"] == 12


def test_ignore_eos_and_min_tokens_are_accepted_on_both_endpoints(srv):
    r = http(srv, "POST", "/v1/responses", json={"model": "tiny", "input": "Hi", "temperature": 0,
                                                  "max_output_tokens": 4, "ignore_eos": True, "min_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 4, r.text
    c = http(srv, "POST", "/v1/chat/completions", json={"model": "tiny", "max_tokens": 4, "ignore_eos": True,
                                                        "min_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 4, c.text
    bad = http(srv, "POST", "/v1/chat/completions", json={"model": "tiny", "max_tokens": 4, "min_tokens": 5,
                                                          "messages": [{"role": "user", "content": "Hi"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_tokens"
