"""Decoding Responses requests: recorded Codex traffic, refusals and their params,
item round trips."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from protocol.decode import decode_input, decode_item, decode_json, decode_request
from protocol.encrypted import seal_reasoning
from protocol.errors import Refusal
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Message,
    OutputText,
    Reasoning,
    ReasoningText,
    SummaryText,
)
from protocol.responses_conversation import to_conversation
from protocol.socket_events import CreateEvent, decode_frame

DATA = Path(__file__).parent / "data" / "codex_requests.jsonl"
RECORDED = [json.loads(line) for line in DATA.read_text().splitlines()]
# Cases run with the function-only model catalog: Codex sent function tools only.
FUNCTION_ONLY = {"http_reasoning", "ws_function_only", "ws_reasoning"}


def body_of(entry):
    if entry["transport"] == "http":
        return entry["body"]
    return {k: v for k, v in entry["frame"].items() if k not in ("type", "generate", "stream_id")}


def ids(entry):
    return f"{entry['case']}#{entry['n']}"


def refusal(body, **kw) -> Refusal:
    with pytest.raises(Refusal) as info:
        decode_request(body, **kw)
    return info.value


def test_recorded_data_is_all_there():
    assert len(RECORDED) >= 30
    assert {e["case"] for e in RECORDED} >= FUNCTION_ONLY | {"http_output_schema", "http_tool", "ws_tool"}


@pytest.mark.parametrize("entry", RECORDED, ids=ids)
def test_recorded_codex_requests(entry):
    body = body_of(entry)
    transport = entry["transport"]
    if entry["case"] == "http_output_schema":  # codex exec --output-schema: a strict json_schema format
        # Still refused for Codex's web_search tool (hosted), not for the format or the namespace.
        r = refusal(body, transport=transport)
        assert r.param.startswith("tools[") and r.param.endswith(".type") and "web_search" in r.message
        body = {**body, "tools": [t for t in body["tools"] if t.get("type") != "web_search"]}
        req = decode_request(body, transport=transport)
        assert req.text.format.type == "json_schema" and req.text.format.strict is True
        assert req.text.to_wire()["format"] == {"description": None, **body["text"]["format"]}  # echoed as sent
        return
    if entry["case"] in FUNCTION_ONLY:
        req = decode_request(body, transport=transport)
        assert req.model == "fake-model" and req.tools and req.tool_choice.mode == "auto"
        assert req.include_encrypted_reasoning and req.store is False
        assert req.sampling.thinking is True and req.sampling.thinking_budget == 4096  # effort medium
        if transport == "socket" and "previous_response_id" in body:
            assert req.previous_response_id == body["previous_response_id"]
        return
    # Codex's default tools: a `namespace` tool (accepted) and a `web_search` tool (hosted: refused).
    r = refusal(body, transport=transport)
    i = int(r.param.split("[")[1].split("]")[0])
    assert r.param == f"tools[{i}].type" and body["tools"][i]["type"] == "web_search"
    assert r.code == "unsupported_value"
    # Without it (Codex's `web_search = "disabled"`) the request is fine, the namespace's tools
    # flattened under qualified names and echoed back inside their namespace.
    trimmed = dict(body, tools=[t for t in body["tools"] if t["type"] != "web_search"])
    req = decode_request(trimmed, transport=transport)
    space = next(t for t in trimmed["tools"] if t["type"] == "namespace")
    assert {f"{space['name']}.{t['name']}" for t in space["tools"]} <= {t.name for t in req.tools}
    echoed = next(t for t in req.tools_to_wire() if t["type"] == "namespace")
    assert [t["name"] for t in echoed["tools"]] == [t["name"] for t in space["tools"]]


@pytest.mark.parametrize("entry", [e for e in RECORDED if e["transport"] == "socket"], ids=ids)
def test_recorded_frames_decode(entry):
    ev = decode_frame(json.dumps(entry["frame"]))
    if entry["case"] in FUNCTION_ONLY:
        assert isinstance(ev, CreateEvent), ev
        assert ev.generate is (entry["frame"].get("generate", True))
        assert ev.request.stream is True
    else:
        assert ev.to_dict()["error"]["param"].startswith("tools[")


def test_http_previous_response_id_refused_socket_accepts():
    body = {"model": "m", "input": [], "previous_response_id": "resp_abc"}
    r = refusal(body)
    assert (r.param, r.code, r.status) == ("previous_response_id", "previous_response_not_found", 400)
    assert decode_request(body, transport="socket").previous_response_id == "resp_abc"
    assert decode_request(body, accept_previous_response_id=True).previous_response_id == "resp_abc"


def test_full_history_http_request():
    """Codex's second HTTP request: reasoning with content null, echoed function_call,
    function_call_output; plus an assistant output_text message as Codex resends it."""
    entry = next(e for e in RECORDED if e["case"] == "http_reasoning" and e["n"] == 1)
    body = copy.deepcopy(entry["body"])
    body["input"].append({
        "type": "message", "role": "assistant", "id": "msg_1",
        "content": [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}],
    })
    body["input"].append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]})
    req = decode_request(body)
    kinds = [type(i).__name__ for i in req.input]
    assert kinds == ["Message"] * 4 + ["Reasoning", "FunctionCall", "FunctionCallOutput", "Message", "Message"]
    rs = req.input[4]
    assert rs.content is None and rs.encrypted_content and rs.recovered_text is None  # another server's token
    assert rs.summary == (SummaryText("Planning to run echo."),)
    fc = req.input[5]
    assert fc.status == "completed" and fc.name == "exec_command" and fc.call_id.startswith("call_")
    assert req.input[7].content[0] == OutputText("hello", (), ())
    conv = to_conversation(req)
    roles = [m.role for m in conv.messages]
    assert roles == ["developer", "developer", "user", "user", "assistant", "tool", "assistant", "user"]
    assert conv.messages[4].tool_calls[0].name == "exec_command" and conv.messages[5].name == "exec_command"


def test_encrypted_reasoning_restored_from_null_content():
    key = b"k"
    token = seal_reasoning("the exact thinking", key)
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": token}
    body = {"model": "m", "input": [item, {"type": "message", "role": "assistant", "content": "hi"}]}
    req = decode_request(body, reasoning_key=key)
    assert req.input[0].recovered_text == "the exact thinking" and req.input[0].text == "the exact thinking"
    assert to_conversation(req).messages[0].reasoning == "the exact thinking"
    # wrong key: dropped by default, refused when strict
    assert decode_request(body, reasoning_key=b"other").input[0].recovered_text is None
    r = refusal(body, reasoning_key=b"other", strict_encrypted=True)
    assert r.param == "input[0].encrypted_content" and r.code == "invalid_encrypted_content"


def test_string_input_and_bare_messages():
    assert decode_request({"model": "m", "input": "hi"}).input == (Message("user", "hi"),)
    req = decode_request({"model": "m", "input": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
    assert req.input == (Message("system", "s"), Message("user", "u"))


def test_defaults():
    req = decode_request({"model": "m", "input": "x"})
    assert req.tools == () and req.tool_choice.mode == "auto" and req.parallel_tool_calls is True
    assert req.truncation == "disabled" and req.include == () and req.stream is False
    assert req.sampling.thinking is None and req.reasoning is None
    assert decode_request({"input": "x"}, default_model="dflt").model == "dflt"


def test_extensions_and_thinking():
    req = decode_request({
        "model": "m", "input": "x", "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 7, "stop": ["\n\n", "END"],
        "thinking": {"type": "enabled", "budget_tokens": 100}, "reasoning": {"effort": "none"},
    })
    s = req.sampling
    assert (s.top_k, s.min_p, s.repetition_penalty, s.seed, s.stop) == (40, 0.05, 1.1, 7, ("\n\n", "END"))
    assert (s.thinking, s.thinking_budget) == (True, 100)  # explicit thinking wins over effort
    assert decode_request({"model": "m", "input": "x", "reasoning": {"effort": "none"}}).sampling.thinking is False


def test_accepted_and_ignored_fields():
    req = decode_request({
        "model": "m", "input": "x", "store": True, "metadata": {"a": "b"}, "prompt_cache_key": "k",
        "service_tier": "flex", "safety_identifier": "s", "client_metadata": {"turn_id": "t"},
        "prompt_cache_retention": "in_memory", "stream_options": {"include_obfuscation": False},
        "background": False, "user": "u", "include": ["file_search_call.results"],
    })
    assert req.include == ("file_search_call.results",) and not req.include_encrypted_reasoning


def test_json_decoding():
    assert decode_json(b'{"a": 1}') == {"a": 1}
    for raw in [b"{", b"[]", b"1", b'{"a": NaN}', b"\xff", "{" * 100000 + "}" * 100000, b""]:
        with pytest.raises(Refusal) as info:
            decode_json(raw)
        assert info.value.code == "invalid_json" and info.value.status == 400


BASE = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}], "tools": [{"type": "function", "name": "f"}]}


def with_(**kw):
    b = copy.deepcopy(BASE)
    b.update(kw)
    return b


def with_input(*items):
    return with_(input=list(items))


MSG = {"type": "message", "role": "user", "content": "x"}

# (body, param, code)
BAD = [
    ({"input": "x"}, "model", "missing_required_parameter"),
    ({"model": "m"}, "input", "missing_required_parameter"),
    ({"model": 3, "input": "x"}, "model", "invalid_type"),
    ({"model": "", "input": "x"}, "model", "empty_string"),
    (with_(foo=1), "foo", "unknown_parameter"),
    (with_(conversation="conv_1"), "conversation", "unsupported_parameter"),
    (with_(max_tool_calls=3), "max_tool_calls", "unsupported_parameter"),
    (with_(background=True), "background", "unsupported_value"),
    (with_(background="yes"), "background", "invalid_type"),
    (with_(input=5), "input", "invalid_type"),
    (with_input(MSG, MSG, MSG, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}), "input[3].content[0].text", "invalid_type"),
    (with_input(MSG, {"type": "message", "role": "user", "content": [{"type": "input_text"}]}), "input[1].content[0].text", "missing_required_parameter"),
    (with_input({"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}), "input[0].content[0].type", "unsupported_value"),
    (with_input({"type": "message", "role": "user", "content": [{"type": "banana"}]}), "input[0].content[0].type", "invalid_value"),
    (with_input({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a", "x": 1}]}), "input[0].content[0].x", "unknown_parameter"),
    (with_input({"type": "message", "role": "robot", "content": "x"}), "input[0].role", "invalid_value"),
    (with_input({"type": "message", "content": "x"}), "input[0].role", "missing_required_parameter"),
    (with_input({"type": "message", "role": "user"}), "input[0].content", "missing_required_parameter"),
    (with_input({"type": "message", "role": "user", "content": 1}), "input[0].content", "invalid_type"),
    (with_input({"type": "message", "role": "user", "content": "x", "status": "done"}), "input[0].status", "invalid_value"),
    (with_input({"type": "item_reference", "id": "msg_1"}), "input[0].type", "unsupported_value"),
    (with_input(MSG, {"type": "computer_call_output", "call_id": "c"}), "input[1].type", "unsupported_value"),
    (with_input({"type": "nope"}), "input[0].type", "invalid_value"),
    (with_input({"content": "x"}), "input[0].type", "missing_required_parameter"),
    (with_input("x"), "input[0]", "invalid_type"),
    (with_input({"type": "function_call", "name": "f", "arguments": "{}"}), "input[0].call_id", "missing_required_parameter"),
    (with_input({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}), "input[0].arguments", "invalid_type"),
    (with_input({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "caller": {"type": "direct"}}), "input[0].caller", "unsupported_parameter"),
    (with_input({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "extra": None}), "input[0].extra", "unknown_parameter"),
    (with_input({"type": "function_call_output", "call_id": "c", "output": "", "caller": {"type": "direct"}}), "input[0].caller", "unsupported_parameter"),
    (with_input({"type": "function_call_output", "call_id": "c"}), "input[0].output", "missing_required_parameter"),
    (with_input({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}), "input[0].output[0].type", "unsupported_value"),
    (with_input({"type": "function_call_output", "call_id": "c", "output": 3}), "input[0].output", "invalid_type"),
    (with_input({"type": "reasoning", "summary": []}), "input[0].id", "missing_required_parameter"),
    (with_input({"type": "reasoning", "id": "rs_1"}), "input[0].summary", "missing_required_parameter"),
    (with_input({"type": "reasoning", "id": "rs_1", "summary": [{"type": "reasoning_text", "text": "a"}]}), "input[0].summary[0].type", "invalid_value"),
    (with_input({"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text"}]}), "input[0].content[0].text", "missing_required_parameter"),
    (with_input({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": 1}), "input[0].encrypted_content", "invalid_type"),
    (with_(tools=[{"type": "function", "name": "f"}, {"type": "web_search"}]), "tools[1].type", "unsupported_value"),
    (with_(tools=[{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]), "tools[0].format.syntax", "invalid_value"),
    (with_(tools=[{"type": "namespace", "name": "x", "description": "d", "tools": [{"type": "web_search"}]}]), "tools[0].tools[0].type", "invalid_value"),
    (with_(tools=[{"type": "function", "name": "f"}, {"type": "custom", "name": "f"}]), "tools[1].name", "invalid_value"),
    (with_(tools=[{"type": "tool_search"}]), "tools[0].type", "unsupported_value"),
    (with_(tools=[{"type": "gizmo"}]), "tools[0].type", "invalid_value"),
    (with_(tools=[{"name": "f"}]), "tools[0].type", "missing_required_parameter"),
    (with_(tools=[{"type": "function"}]), "tools[0].name", "missing_required_parameter"),
    (with_(tools=[{"type": "function", "name": "bad name"}]), "tools[0].name", "invalid_value"),
    (with_(tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "g", "parameters": []}]), "tools[1].parameters", "invalid_type"),
    (with_(tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "g", "parameters": {"type": "string"}}]), "tools[1].parameters", "invalid_function_parameters"),
    (with_(tools=[{"type": "function", "name": "f", "strict": "yes"}]), "tools[0].strict", "invalid_type"),
    (with_(tools=[{"type": "function", "name": "f", "defer_loading": True}]), "tools[0].defer_loading", "unsupported_parameter"),
    (with_(tools=[{"type": "function", "name": "f", "whatever": 1}]), "tools[0].whatever", "unknown_parameter"),
    (with_(tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]), "tools[1].name", "invalid_value"),
    (with_(tools={"type": "function"}), "tools", "invalid_type"),
    (with_(tool_choice="sometimes"), "tool_choice", "invalid_value"),
    (with_(tool_choice={"type": "function", "name": "zzz"}), "tool_choice.name", "invalid_value"),
    (with_(tool_choice={"type": "function"}), "tool_choice.name", "missing_required_parameter"),
    (with_(tool_choice={"type": "allowed_tools", "mode": "maybe", "tools": []}), "tool_choice.mode", "invalid_value"),
    (with_(tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "zzz"}]}), "tool_choice.tools[0].name", "invalid_value"),
    (with_(tool_choice={"type": "web_search_preview"}), "tool_choice.type", "unsupported_value"),
    (with_(tools=[], tool_choice="required"), "tool_choice", "invalid_value"),
    (with_(parallel_tool_calls="yes"), "parallel_tool_calls", "invalid_type"),
    (with_(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema", "missing_required_parameter"),
    (with_(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": {"a": {}}},
                            "strict": True}}), "text.format.schema", "invalid_json_schema"),
    (with_(text={"format": {"type": "json_object", "schema": {}}}), "text.format.schema", "unknown_parameter"),
    (with_(text={"format": {"type": "yaml"}}), "text.format.type", "invalid_value"),
    (with_(text={"format": {"type": "yaml"}}), "text.format.type", "invalid_value"),
    (with_(text={"verbosity": "loud"}), "text.verbosity", "invalid_value"),
    (with_(text={"colour": 1}), "text.colour", "unknown_parameter"),
    (with_(reasoning={"effort": "extreme"}), "reasoning.effort", "invalid_value"),
    (with_(reasoning={"effort": 3}), "reasoning.effort", "invalid_type"),
    (with_(reasoning={"summary": "long"}), "reasoning.summary", "invalid_value"),
    (with_(reasoning={"mode": "pro"}), "reasoning.mode", "unsupported_value"),
    (with_(reasoning="high"), "reasoning", "invalid_type"),
    (with_(include=["reasoning.encrypted_content", "everything"]), "include[1]", "invalid_value"),
    (with_(include="reasoning.encrypted_content"), "include", "invalid_type"),
    (with_(truncation="sometimes"), "truncation", "invalid_value"),
    (with_(temperature=2.5), "temperature", "decimal_above_max_value"),
    (with_(temperature=-0.1), "temperature", "decimal_below_min_value"),
    (with_(temperature="hot"), "temperature", "invalid_type"),
    (with_(top_p=1.5), "top_p", "decimal_above_max_value"),
    (with_(top_k=-2), "top_k", "integer_below_min_value"),
    (with_(top_k=1.5), "top_k", "invalid_type"),
    (with_(min_p=2), "min_p", "decimal_above_max_value"),
    (with_(repetition_penalty=0), "repetition_penalty", "decimal_below_min_value"),
    (with_(presence_penalty=3), "presence_penalty", "decimal_above_max_value"),
    (with_(frequency_penalty=-3), "frequency_penalty", "decimal_below_min_value"),
    (with_(seed="7"), "seed", "invalid_type"),
    (with_(seed=True), "seed", "invalid_type"),
    (with_(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length"),
    (with_(stop=["a", ""]), "stop[1]", "empty_string"),
    (with_(stop=[1]), "stop[0]", "invalid_type"),
    (with_(max_output_tokens=0), "max_output_tokens", "integer_below_min_value"),
    (with_(top_logprobs=21), "top_logprobs", "integer_above_max_value"),
    (with_(thinking={"type": "maybe"}), "thinking.type", "invalid_value"),
    (with_(thinking={"type": "enabled", "budget_tokens": -1}), "thinking.budget_tokens", "integer_below_min_value"),
    (with_(thinking={"type": "disabled", "budget_tokens": 5}), "thinking.budget_tokens", "invalid_value"),
    (with_(metadata={"a": 1}), "metadata.a", "invalid_type"),
    (with_(metadata={str(i): "v" for i in range(17)}), "metadata", "object_above_max_properties"),
    (with_(service_tier="gold"), "service_tier", "invalid_value"),
    (with_(store="no"), "store", "invalid_type"),
    (with_(stream_options={"include_usage": True}), "stream_options.include_usage", "unknown_parameter"),
    (with_(stream=1), "stream", "invalid_type"),
    (with_(prompt_cache_retention="forever"), "prompt_cache_retention", "invalid_value"),
    (with_(instructions=["a"]), "instructions", "invalid_type"),
]


@pytest.mark.parametrize("body,param,code", BAD, ids=[f"{p}:{c}" for _, p, c in BAD])
def test_refusal_params(body, param, code):
    r = refusal(body)
    assert (r.param, r.code) == (param, code), r.message
    env = r.envelope()
    assert env == {"error": {"message": r.message, "type": "invalid_request_error", "param": param, "code": code}}
    assert r.status == 400 and r.message


ITEMS = [
    Message("user", "plain"),
    Message("developer", (InputText("a"), InputText("b")), id="msg_1", status="completed"),
    Message("assistant", (OutputText("hi", (), ()),), id="msg_2", status="completed", phase="final_answer"),
    Message("assistant", (OutputText("cite", ({"type": "url_citation", "url": "u", "title": "t", "start_index": 0, "end_index": 1},), None),)),
    Message("system", ()),
    FunctionCall("call_1", "f", '{"a": 1}'),
    FunctionCall("call_2", "g", "", id="fc_1", status="incomplete"),
    FunctionCallOutput("call_1", "result"),
    FunctionCallOutput("call_1", (InputText("part"),), id="fco_1", status="completed", name="f"),
    Reasoning("rs_1"),
    Reasoning("rs_2", (SummaryText("s"),), (ReasoningText("r1"), ReasoningText("r2")), "opaque", "completed"),
    Reasoning("rs_3", (), None, "gAAAA-not-ours"),
    Reasoning("rs_4", (), (), None),
]


@pytest.mark.parametrize("item", ITEMS, ids=[f"{type(i).__name__}{n}" for n, i in enumerate(ITEMS)])
def test_item_round_trip(item):
    wire = json.loads(json.dumps(item.to_dict()))
    assert decode_item(wire) == item
    assert decode_input([wire]) == (item,)


def test_reasoning_round_trip_with_recovery():
    token = seal_reasoning("exact", None)
    item = Reasoning("rs_9", (), None, token, recovered_text="exact")
    assert decode_item(item.to_dict()) == item


def test_null_openai_fields_accepted():
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": None, "caller": None, "async": None}
    assert decode_item(item) == FunctionCall("c", "f", "{}")


def test_every_output_item_replays_as_input():
    """The Agents SDK and Codex send our output items back as input: they must decode."""
    from protocol.response import Usage
    from protocol.stream import ResponseStream

    req = decode_request({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"], "tools": [{"type": "function", "name": "f"}]})
    key = b"k"
    s = ResponseStream(req, reasoning_key=key)
    s.reasoning("think")
    s.text("answer")
    s.tool_call_start("f")
    s.tool_call_arguments('{"a": 1}')
    s.finish("length", Usage(1, 1))
    output = json.loads(json.dumps(s.response["output"]))
    items = decode_input(output, reasoning_key=key)
    assert [type(i).__name__ for i in items] == ["Reasoning", "Message", "FunctionCall"]
    assert items[0].text == "think" and items[1].text == "answer" and items[2].status == "incomplete"
    # as Codex resends it: content null, only the encrypted content
    codex = dict(output[0], content=None)
    assert decode_item(codex, reasoning_key=key).text == "think"
    # and a second turn built from them decodes
    decode_request({"model": "m", "input": output + [{"type": "function_call_output", "call_id": items[2].call_id, "output": "1"}]}, reasoning_key=key)
