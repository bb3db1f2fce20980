"""Clients, unmodified, against a tiny gpt-oss served by ignis (the harmony chat format):
the OpenAI SDK's `responses.create` with a demanded call and with a JSON `text.format`, its
`chat.completions.create` (tool_calls, a JSON response_format, streamed), and
Codex CLI 0.171 with its default tool set (the freeform apply_patch, its namespace and goal
tools) over HTTP and over the socket.

The model is random, its tokenizer gpt-oss's real one (o200k_harmony, built offline:
tests/model/tiny_models.build_tiny_gpt_oss); what makes its answers usable is the output
grammar (ignis/server/chat_formats/harmony_grammar.py): the harmony header of each message,
and a call's arguments held to the tool's schema. Its weights lean toward harmony's message
ends (`ending_bias`), so each message it opens closes and Codex's turns complete; what it
writes in between is noise. Every answer is validated with the SDK's own types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai_harmony")

from tests.clients.codex import codex_home, run_codex  # noqa: E402
from tests.protocol.responses_sdk import validate_response  # noqa: E402
from tests.server.server_harness import KEY, client, http  # noqa: E402

MODEL = "tiny-gpt-oss"
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": CITY,
           "strict": True}
FREE = {"type": "function", "name": "note", "description": "Write a note.", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def gpt_oss_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from ignis.model import load_model
    from ignis.server.background import BackgroundServer
    from tests.model.tiny_models import build_tiny_gpt_oss
    from tests.server.server_harness import make_config

    path = build_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "tiny", seed=3, ending_bias=3.0)
    loaded = load_model(str(path), dtype="float32", device="cpu", name=MODEL, progress=False)
    assert loaded.chat_template.chat_format == "harmony"
    # A cap on every response (server.max_output_tokens): a random model inside a long grammar
    # (apply_patch's Lark) may not reach its end by chance; cut, the response ends incomplete.
    cfg = make_config(engine={"num_kv_blocks": 8192, "max_num_seqs": 8}, max_output_tokens=400)
    cfg.model.sampling.temperature = 0.0  # greedy for clients that send none (Codex): a repeatable run
    srv = BackgroundServer(cfg, loaded).start()
    yield srv
    srv.stop()


# -- the OpenAI SDK -------------------------------------------------------------------------


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"])
def test_sdk_demanded_call(gpt_oss_server, choice) -> None:
    c = client(gpt_oss_server)
    r = c.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER, FREE],
                           tool_choice=choice, max_output_tokens=200, temperature=0)
    validate_response(r.to_dict())
    assert r.status == "completed", r.output
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1
    if choice != "required":
        assert calls[0].name == "get_weather"
    if calls[0].name == "get_weather":
        assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    else:
        assert isinstance(json.loads(calls[0].arguments), dict)


def test_sdk_json_schema_final_answer(gpt_oss_server) -> None:
    c = client(gpt_oss_server)
    fmt = {"type": "json_schema", "name": "pick", "schema": CITY, "strict": True}
    r = c.responses.create(model=MODEL, input="Pick a city.", text={"format": fmt}, max_output_tokens=200,
                           temperature=0)
    validate_response(r.to_dict())
    assert r.status == "completed", r.output
    assert json.loads(r.output_text)["city"] in ("Paris", "Rome")
    # Streamed: the same grammar, the SDK's event types.
    events = list(c.responses.create(model=MODEL, input="Pick a city.", text={"format": fmt}, max_output_tokens=200,
                                     stream=True))
    assert events[-1].type == "response.completed"
    assert json.loads(events[-1].response.output_text)["city"] in ("Paris", "Rome")


def test_sdk_strict_tool_under_auto(gpt_oss_server) -> None:
    """auto with a strict tool: the final text or a call held to its schema; the raw
    wire answer validated too."""
    body = {"model": MODEL, "input": "Weather in Rome?", "tools": [WEATHER], "max_output_tokens": 200}
    r = http(gpt_oss_server, "POST", "/v1/responses", json=body)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert resp["status"] == "completed", resp["output"]
    for item in resp["output"]:
        if item["type"] == "function_call":
            assert item["name"] == "get_weather" and json.loads(item["arguments"])["city"] in ("Paris", "Rome")


def test_sdk_chat_completions_under_harmony(gpt_oss_server) -> None:
    """/v1/chat/completions renders and parses harmony too: a demanded call comes back as
    the message's tool_calls (finish_reason tool_calls), a JSON response_format as content,
    streamed chunks add up to the same call; each checked by the SDK's types."""
    c = client(gpt_oss_server)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": CITY, "strict": True}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, tools=[tool], tool_choice="required",
                                  max_tokens=200, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    assert "<|" not in (choice.message.content or "")  # no harmony token leaks into the text
    # The call's result back, then a JSON answer.
    follow = [*messages, choice.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": CITY, "strict": True}}
    r2 = c.chat.completions.create(model=MODEL, messages=follow, response_format=fmt, max_tokens=200, temperature=0)
    assert r2.choices[0].finish_reason == "stop", r2.choices[0]
    assert json.loads(r2.choices[0].message.content)["city"] in ("Paris", "Rome")
    # Streamed: the call's name once, its arguments in pieces that parse when joined.
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, tools=[tool], tool_choice="required",
                                            max_tokens=200, temperature=0, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas if d.function and d.function.name] == ["get_weather"]
    joined = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert joined == call.function.arguments  # greedy: the same call
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]


# -- Codex CLI ------------------------------------------------------------------------------


def check_codex_turn(run: Any) -> None:
    assert run.rc == 0, (run.events[-4:], run.stderr[-2000:])
    assert run.events[-1]["type"] == "turn.completed"
    assert run.events[-1]["usage"]["input_tokens"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("websockets", [False, True], ids=["http", "socket"])
def test_codex_exec_default_tools(gpt_oss_server, tmp_path: Path, websockets: bool) -> None:
    """`codex exec` with Codex's default tool set (the freeform apply_patch makes the
    grammar hold every call): each turn completes, over HTTP and over the socket. Codex
    sends no temperature: the server's default here is greedy, so the run repeats (sampled,
    a random model's calls sometimes give Codex arguments it rejects: 2 failures in 7 runs,
    measured). Read-only sandbox: the commands a random model writes change nothing."""
    home = codex_home(tmp_path / "home", gpt_oss_server.base_url, model=MODEL, websockets=websockets,
                      freeform_apply_patch=True)
    run = run_codex(home, tmp_path / "work", "Say hello.", key=KEY, disable=(), sandbox="read-only")
    check_codex_turn(run)
    resumed = run_codex(home, tmp_path / "work", "And again?", key=KEY, disable=(), resume=True,
                        sandbox="read-only")
    check_codex_turn(resumed)
