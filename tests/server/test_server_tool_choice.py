"""tool_choice that demands a call (``"required"``, a named function, ``allowed_tools``
with mode ``required``): the answer's start is forced to a call of an allowed tool, and a
turn that still holds no valid call fails. Over /v1/responses (JSON, SSE, the socket)
and /v1/chat/completions, with the tiny random model (garbage arguments: the forced
start shows, the turn runs out of tokens or fails) and the scripted one (whose reply is
the call: it comes back completed). ``auto`` and ``none`` are left as they were."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ignis.output_parser import ParserConfig
from ignis.server.render import hermes_tools_block
from ignis.server.tool_forcing import call_prefix, constrain_output, required_tools
from protocol.conversation import ChatMessage, FunctionTool, ToolCall, ToolChoice
from protocol.decode import decode_request
from protocol.responses_conversation import to_conversation
from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import Frames, client, http

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": PARAMS},
         {"type": "function", "name": "get_time", "description": "The time in a city.", "parameters": PARAMS}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
NAMED = {"type": "function", "name": "get_weather"}
CHAT_NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER = call_prefix("get_weather", ParserConfig())
FAILED = "did not produce a valid call"


def responses(srv: Any, **body: Any) -> dict[str, Any]:
    body.setdefault("model", "tiny")
    r = http(srv, "POST", "/v1/responses", json=body)
    assert r.status_code == 200, r.text
    validate_response(r.json())
    return r.json()


def responses_sse(srv: Any, **body: Any) -> dict[str, Any]:
    body.setdefault("model", "tiny")
    r = http(srv, "POST", "/v1/responses", json={**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = [json.loads(b.split("\n")[1][6:]) for b in r.text.split("\n\n") if b]
    return check_grammar(events)


def chat(srv: Any, **body: Any) -> Any:
    body.setdefault("model", "tiny")
    return http(srv, "POST", "/v1/chat/completions", json=body)


def chat_sse(srv: Any, **body: Any) -> list[dict[str, Any]]:
    r = chat(srv, **body, stream=True)
    assert r.status_code == 200, r.text
    blocks = [b for b in r.text.split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]"
    return [json.loads(b[6:]) for b in blocks[:-1]]


def text_of(resp: dict[str, Any]) -> str:
    return "".join(p["text"] for item in resp["output"] if item["type"] == "message" for p in item["content"])


def calls_of(resp: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["name"], i["arguments"]) for i in resp["output"] if i["type"] == "function_call"]


def check_forced(resp: dict[str, Any], name: str = "get_weather") -> None:
    """The random model's answer: a call of `name`, a failure saying why, or (cut by
    max_output_tokens, still incomplete) text that opens with the forced call."""
    if resp["status"] == "completed":
        assert [n for n, _ in calls_of(resp)][:1] == [name], resp["output"]
    elif resp["status"] == "failed":
        assert resp["error"]["code"] == "server_error" and FAILED in resp["error"]["message"]
    else:
        assert resp["status"] == "incomplete" and resp["incomplete_details"]["reason"] == "max_output_tokens"
        assert text_of(resp).startswith(call_prefix(name, ParserConfig())), text_of(resp)[:200]


# -- the forced text and who is forced ------------------------------------------------


def test_the_forced_start_is_the_format_the_prompt_teaches(srv, scripted_server) -> None:
    assert WEATHER == '<tool_call>\n{"name": "get_weather", "arguments": '
    # The Hermes block's instruction, with the name filled in, begins the same way ...
    taught = hermes_tools_block([FunctionTool("get_weather")], ToolChoice("required", "get_weather"))
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in taught
    # ... and past calls render that way, in the Hermes adaptation (SmolLM2's ChatML) and in
    # a native Qwen3-style template (the tiny model's).
    history = [ChatMessage("user", "Weather in Paris?"),
               ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
               ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather"),
               ChatMessage("user", "And now?")]
    tools = [FunctionTool("get_weather", None, PARAMS)]
    for renderer in (scripted_server.ctx.renderer, srv.ctx.renderer):
        ids = renderer.render(history, tools, ToolChoice("auto")).ids
        text = renderer.tokenizer.decode(ids)
        assert WEATHER + '{"city": "Paris"}}\n</tool_call>' in text, text


def test_constrain_output_per_tool_choice(srv) -> None:
    ctx = srv.ctx
    tok, vocab = ctx.loaded.tokenizer, ctx.loaded.config.vocab_size

    def prepared(tool_choice: Any) -> tuple[Any, Any, Any]:
        req = decode_request({"model": "tiny", "input": "hi", "tools": TOOLS, "tool_choice": tool_choice},
                             transport="http")
        conv = to_conversation(req)
        prompt = ctx.renderer.render(conv.messages, conv.tools, conv.tool_choice)
        return prompt, *constrain_output(prompt, conv.tool_choice, conv.tools, tok, vocab)

    for free in ("auto", "none"):
        prompt, same, constraint = prepared(free)
        assert same is prompt and constraint is None  # exactly as before
    _, prompt, c = prepared(NAMED)
    assert prompt.parser.required_tools == ("get_weather",) and c.choices == (WEATHER.encode(),)
    # The tiny tokenizer spells the think tags as single ids: reasoning may come first.
    assert (c.think_start_id, c.think_end_id) == (tok.added_tokens["<think>"], tok.added_tokens["</think>"])
    _, prompt, c = prepared("required")
    assert prompt.parser.required_tools == ("get_weather", "get_time") and len(c.choices) == 2
    _, prompt, c = prepared({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                                                    "name": "get_time"}]})
    assert prompt.parser.required_tools == ("get_time",)
    assert c.choices == (call_prefix("get_time", ParserConfig()).encode(),)
    _, _, c = prepared({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]})
    assert c is None
    assert required_tools(ToolChoice("required", "f"), [FunctionTool("g")]) == ("f",)


# -- the tiny random model: the forced start shows --------------------------------------


def test_responses_named_function_json_and_sse(srv) -> None:
    body = {"input": "What is the weather in Paris?", "tools": TOOLS, "tool_choice": NAMED, "temperature": 0,
            "max_output_tokens": 40}
    json_resp = responses(srv, **body)
    check_forced(json_resp)
    sse_resp = responses_sse(srv, **body)
    check_forced(sse_resp)
    assert sse_resp["output"] == [{**o, "id": s["id"]} for o, s in zip(json_resp["output"], sse_resp["output"])]
    # allowed_tools narrows "required" to the allowed ones.
    only_time = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    check_forced(responses(srv, **{**body, "tool_choice": only_time}), "get_time")


def test_chat_named_function_then_a_malformed_call_fails(srv) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": msgs, "tools": CHAT_TOOLS, "tool_choice": CHAT_NAMED, "temperature": 0, "max_tokens": 40}
    r = chat(srv, **body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    text = choice["message"]["content"]
    assert text.startswith(WEATHER) and len(text) > len(WEATHER)
    # Stop the same greedy answer right after the forced start: the call is cut, so the
    # turn ends (stop) without a valid call, and it fails instead of passing for an answer.
    rest = text[len(WEATHER):]
    stop = next(rest[:k] for k in range(1, len(rest) + 1) if rest[:k].strip() and rest[:k] not in WEATHER)
    r = chat(srv, **body, stop=[stop])
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "server_error" and FAILED in err["message"]
    assert "get_weather" in err["message"]
    chunks = chat_sse(srv, **body, stop=[stop])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c.get("choices")) \
        .startswith(WEATHER)
    assert chunks[-1]["error"]["code"] == "server_error" and FAILED in chunks[-1]["error"]["message"]


def test_a_stop_string_that_would_cut_the_forced_start_is_refused(srv) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": msgs, "tools": CHAT_TOOLS, "temperature": 0, "max_tokens": 8}
    for tool_choice in (CHAT_NAMED, "required"):
        for stop in (["\n"], ["name"], ['arguments": {'], ["zz", ": {"]):  # inside it, or running out of it
            r = chat(srv, **body, tool_choice=tool_choice, stop=stop)
            assert r.status_code == 400, (stop, r.text)
            err = r.json()["error"]
            assert err["param"] == "stop" and err["code"] == "invalid_value" and "tool_choice" in err["message"]
    # Stop strings that cannot meet the forced text, or no demand for a call: accepted.
    assert chat(srv, **body, tool_choice=CHAT_NAMED, stop=["zz"]).status_code == 200
    assert chat(srv, **body, tool_choice="auto", stop=["\n"]).status_code == 200


def test_auto_and_none_are_not_forced(srv, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = srv.ctx.admission.try_now

    def spy(ids: Any, params: Any, **kw: Any) -> Any:
        seen.append(params)
        return real(ids, params, **kw)

    monkeypatch.setattr(srv.ctx.admission, "try_now", spy)
    for tc in ("auto", "none"):
        resp = responses(srv, input="What is the weather in Paris?", tools=TOOLS, tool_choice=tc, temperature=0,
                         max_output_tokens=8)
        assert resp["status"] == "incomplete" and not text_of(resp).startswith("<tool_call>")
    r = chat(srv, messages=[{"role": "user", "content": "Hi"}], tools=CHAT_TOOLS, tool_choice="auto", max_tokens=4)
    assert r.status_code == 200
    responses(srv, input="x", tools=TOOLS, tool_choice=NAMED, max_output_tokens=1)
    assert [p.constraint is None for p in seen] == [True, True, True, False]


# -- the scripted model: a reply that is the call comes back completed ------------------


def scripted(srv: Any, **body: Any) -> dict[str, Any]:
    return responses(srv, model="scripted", **body)


def test_scripted_call_is_completed_under_every_demand(scripted_server) -> None:
    rome = "What is the forecast for Rome?"
    for tc in (NAMED, "required"):
        for resp in (scripted(scripted_server, input=rome, tools=TOOLS, tool_choice=tc),
                     responses_sse(scripted_server, model="scripted", input=rome, tools=TOOLS, tool_choice=tc)):
            assert resp["status"] == "completed", resp
            assert calls_of(resp) == [("get_weather", '{"city": "Rome"}')]
    r = chat(scripted_server, model="scripted", messages=[{"role": "user", "content": rome}], tools=CHAT_TOOLS,
             tool_choice=CHAT_NAMED)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


def test_scripted_malformed_call_fails(scripted_server) -> None:
    """The script's reply opens the call as forced but never closes its arguments: the
    parser makes the block text, and every transport ends the turn failed, saying why."""
    paris = "What is the forecast for Oslo?"
    resp = scripted(scripted_server, input=paris, tools=TOOLS, tool_choice="required")
    assert resp["status"] == "failed" and resp["error"]["code"] == "server_error"
    assert FAILED in resp["error"]["message"] and "get_weather" in resp["error"]["message"]
    assert text_of(resp).startswith(WEATHER + '{"city": "Oslo"')  # what the model wrote stays visible
    sse = responses_sse(scripted_server, model="scripted", input=paris, tools=TOOLS, tool_choice=NAMED)
    assert sse["status"] == "failed" and FAILED in sse["error"]["message"]
    r = chat(scripted_server, model="scripted", messages=[{"role": "user", "content": paris}], tools=CHAT_TOOLS,
             tool_choice="required")
    assert r.status_code == 500 and FAILED in r.json()["error"]["message"]
    with client(scripted_server).responses.connect() as conn:
        frames = Frames(conn)
        conn.response.create(model="scripted", input=paris, tools=TOOLS, tool_choice=NAMED)
        events = frames.terminal()
        check_grammar(events)
        assert events[-1]["type"] == "response.failed" and FAILED in events[-1]["response"]["error"]["message"]
        # The socket goes on; a reply that is the call completes.
        conn.response.create(model="scripted", input="What is the forecast for Rome?", tools=TOOLS, tool_choice=NAMED)
        events = frames.terminal()
        assert events[-1]["type"] == "response.completed"
        assert calls_of(events[-1]["response"]) == [("get_weather", '{"city": "Rome"}')]


def test_scripted_auto_and_none_as_before(scripted_server) -> None:
    paris = "What is the weather in Paris?"
    resp = scripted(scripted_server, input=paris, tools=TOOLS, tool_choice="auto")
    assert resp["status"] == "completed" and [o["type"] for o in resp["output"]] == ["reasoning", "function_call"]
    assert calls_of(resp) == [("get_weather", '{"city": "Paris"}')]
    # No call under auto is a plain answer, not a failure.
    resp = scripted(scripted_server, input="Say hi", tools=TOOLS, tool_choice="auto")
    assert resp["status"] == "completed" and text_of(resp) == "Hi!"
    resp = scripted(scripted_server, input=paris, tools=TOOLS, tool_choice="none")
    assert resp["status"] == "completed" and not calls_of(resp) and "<tool_call>" in text_of(resp)


def test_thinking_budget_from_reasoning_effort_and_chat_thinking(srv, monkeypatch: pytest.MonkeyPatch) -> None:
    from ignis.server.prepare import prepare_response as prepare

    ctx = srv.ctx
    end = ctx.loaded.tokenizer.added_tokens["</think>"]

    def constraint(**body: Any) -> Any:
        req = decode_request({"model": "tiny", "input": "hi", **body}, transport="http")
        return prepare(ctx, req)[1].constraint

    c = constraint(reasoning={"effort": "minimal"})
    assert (c.think_budget, c.think_end_id, c.choices) == (256, end, ())
    assert constraint(reasoning={"effort": "high"}).think_budget == 16384
    for unbounded in ({"effort": "xhigh"}, {"effort": "none"}, {}):
        assert constraint(reasoning=unbounded) is None
    # With a required call the same constraint also forces the call's start.
    c = constraint(reasoning={"effort": "low"}, tools=TOOLS, tool_choice=NAMED)
    assert (c.think_budget, c.choices) == (1024, (WEATHER.encode(),))


    # Chat's own knob, through the route to the engine.
    seen: list[Any] = []
    real = ctx.admission.try_now

    def spy(ids: Any, params: Any, **kw: Any) -> Any:
        seen.append(params)
        return real(ids, params, **kw)

    monkeypatch.setattr(ctx.admission, "try_now", spy)
    r = chat(srv, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
             thinking={"type": "enabled", "budget_tokens": 2})
    assert r.status_code == 200, r.text
    assert seen[-1].constraint.think_budget == 2
