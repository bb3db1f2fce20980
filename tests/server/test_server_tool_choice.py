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

from ignis.engine.thinking import ThinkBudget
from ignis.output_parser import ParserConfig
from ignis.server.render import hermes_tools_block
from ignis.server.tool_forcing import call_prefix, required_tools
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


def test_chat_named_function_is_held_to_a_call(srv) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": msgs, "tools": CHAT_TOOLS, "tool_choice": CHAT_NAMED, "temperature": 0, "max_tokens": 40}
    r = chat(srv, **body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "length":  # the random model's JSON arguments ran past 40 tokens
        text = choice["message"]["content"]
        assert text.startswith(WEATHER) and len(text) > len(WEATHER)
    else:  # the grammar closed a well-formed call
        assert choice["finish_reason"] == "tool_calls"
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


def test_stop_with_a_demanded_call(srv) -> None:
    """A stop string (which would cut a grammar's text) with non-strict tools: kept, the
    answer unconstrained, and a turn the stop string ends without a valid call fails.
    With a strict tool among the demanded ones: a 400 at ``stop``."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": msgs, "tools": CHAT_TOOLS, "temperature": 0, "max_tokens": 12}
    for tool_choice in (CHAT_NAMED, "required"):
        r = chat(srv, **body, tool_choice=tool_choice, stop=["\u0000never"])
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
        assert not text.startswith("<tool_call>")  # free: the random model's own words
        word = next(w for w in text.split() if w.strip())
        r = chat(srv, **body, tool_choice=tool_choice, stop=[word])
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "server_error" and FAILED in err["message"]
        chunks = chat_sse(srv, **body, tool_choice=tool_choice, stop=[word])
        assert chunks[-1]["error"]["code"] == "server_error" and FAILED in chunks[-1]["error"]["message"]
    strict = [{"type": "function", "function": {**CHAT_TOOLS[0]["function"], "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}]
    r = chat(srv, **{**body, "tools": strict}, tool_choice="required", stop=["\n"])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stop"
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
    assert [p.grammar is None for p in seen] == [True, True, True, False]


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


def test_scripted_malformed_call(scripted_server) -> None:
    """The script's reply opens the call but never closes its arguments. Held to the call
    grammar, the reply goes on inside the call until the token limit: incomplete, never a
    call reported complete. Unconstrained (a stop string keeps the grammar off), the
    parser makes the block text and every transport ends the turn failed, saying why."""
    oslo = "What is the forecast for Oslo?"
    resp = scripted(scripted_server, input=oslo, tools=TOOLS, tool_choice="required", max_output_tokens=40)
    assert resp["status"] == "incomplete" and resp["incomplete_details"]["reason"] == "max_output_tokens"
    assert text_of(resp).startswith(WEATHER + '{"city": "Oslo"') and not calls_of(resp)
    free = {"stop": ["never said"]}
    resp = scripted(scripted_server, input=oslo, tools=TOOLS, tool_choice="required", **free)
    assert resp["status"] == "failed" and resp["error"]["code"] == "server_error"
    assert FAILED in resp["error"]["message"] and "get_weather" in resp["error"]["message"]
    assert text_of(resp).startswith(WEATHER + '{"city": "Oslo"')  # what the model wrote stays visible
    sse = responses_sse(scripted_server, model="scripted", input=oslo, tools=TOOLS, tool_choice=NAMED, **free)
    assert sse["status"] == "failed" and FAILED in sse["error"]["message"]
    r = chat(scripted_server, model="scripted", messages=[{"role": "user", "content": oslo}], tools=CHAT_TOOLS,
             tool_choice="required", **free)
    assert r.status_code == 500 and FAILED in r.json()["error"]["message"]
    with client(scripted_server).responses.connect() as conn:
        frames = Frames(conn)
        conn.send({"type": "response.create", "model": "scripted", "input": oslo, "tools": TOOLS,
                   "tool_choice": NAMED, **free})
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
    tok = ctx.loaded.tokenizer
    think, end = tok.added_tokens["<think>"], tok.added_tokens["</think>"]

    def params(**body: Any) -> Any:
        req = decode_request({"model": "tiny", "input": "hi", **body}, transport="http")
        return prepare(ctx, req)[1]

    p = params(reasoning={"effort": "minimal"})
    assert p.grammar is None and p.think_budget == ThinkBudget(256, end, think, False)
    assert params(reasoning={"effort": "high"}).think_budget.tokens == 16384
    for unbounded in ({"effort": "xhigh"}, {"effort": "none"}, {}):
        assert params(reasoning=unbounded).think_budget is None
    # With a demanded call the budget rides in the call grammar, on its think rule.
    p = params(reasoning={"effort": "low"}, tools=TOOLS, tool_choice=NAMED)
    assert p.think_budget is None and "think[max_tokens=1024]" in p.grammar.source
    assert "get_weather" in p.grammar.source and "get_time" not in p.grammar.source

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
    assert seen[-1].think_budget.tokens == 2


def test_grammar_per_tool_choice(srv) -> None:
    """Which calls each tool_choice holds the answer to (the grammar's alternatives), and
    the required tools the server checks for."""
    from ignis.server.prepare import prepare_response as prepare

    def prepared(tool_choice: Any) -> tuple[Any, Any]:
        req = decode_request({"model": "tiny", "input": "hi", "tools": TOOLS, "tool_choice": tool_choice},
                             transport="http")
        return prepare(srv.ctx, req)

    for free in ("auto", "none"):
        prompt, p = prepared(free)
        assert p.grammar is None and prompt.parser.required_tools == ()
    prompt, p = prepared(NAMED)
    assert prompt.parser.required_tools == ("get_weather",)
    assert "get_weather" in p.grammar.source and "get_time" not in p.grammar.source
    prompt, p = prepared("required")
    assert prompt.parser.required_tools == ("get_weather", "get_time")
    assert "get_weather" in p.grammar.source and "get_time" in p.grammar.source
    only_time = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    prompt, p = prepared(only_time)
    assert prompt.parser.required_tools == ("get_time",) and "get_weather" not in p.grammar.source
    prompt, p = prepared({**only_time, "mode": "auto"})
    assert p.grammar is None
    assert required_tools(ToolChoice("required", "f"), [FunctionTool("g")]) == ("f",)


def test_hostile_sizes_under_a_demanded_call(srv) -> None:
    """A thinking budget past any context (10**30, 2**64) is no budget, not a grammar the
    engine cannot parse; thousands of non-strict tools share one arguments rule, so their
    call grammar stays within the grammar engine's symbol limit (it was 'panic: assertion
    failed' at 3,000 tools); the server serves on."""
    from ignis.server.structured import output_grammar
    from protocol.sampling import SamplingFields
    from protocol.structured import TextFormat

    tool = {"type": "function", "function": {"name": "f", "parameters": PARAMS}}
    for budget in (10**30, 2**64):
        r = chat(srv, messages=[{"role": "user", "content": "hi"}], max_tokens=2, tools=[tool], tool_choice="required",
                 thinking={"type": "enabled", "budget_tokens": budget})
        assert r.status_code == 200, r.text
    ctx = srv.ctx
    tools = [FunctionTool(f"tool_{i}", None, {"type": "object"}) for i in range(3000)]
    grammar = output_grammar(ParserConfig(), TextFormat(), tools, ToolChoice("required"), SamplingFields(),
                             parallel=True, tokenizer=ctx.loaded.tokenizer, vocab_size=ctx.loaded.config.vocab_size,
                             format_param="text.format", tool_param=lambda name: "tools")
    assert grammar is not None and "tool_2999" in grammar.source
    assert responses(srv, input="hi", max_output_tokens=2)["status"] in ("completed", "incomplete")
