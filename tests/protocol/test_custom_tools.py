"""Custom (freeform) and namespace tools in the protocol: decoded, echoed as sent, their
calls streamed as OpenAI streams them (validated by the SDK's own types and an
independent event-grammar check), and their items read back into the conversation."""

from __future__ import annotations

import json

import pytest

from protocol.decode import decode_item, decode_request
from protocol.deltas import ToolCallArguments, ToolCallEnd, ToolCallStart, TextDelta
from protocol.items import CustomToolCall, CustomToolCallOutput, FunctionCall
from protocol.responses_conversation import to_conversation
from protocol.stream import ResponseStream
from tests.protocol.responses_sdk import check_grammar, wire

PATCH_GRAMMAR = 'start: "*** Begin Patch\\n" /(.|\\n)*/ "*** End Patch\\n"'
TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Run.", "parameters": {"type": "object"}, "strict": False},
    {"type": "custom", "name": "apply_patch", "description": "Edit files.",
     "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}},
    {"type": "custom", "name": "note", "description": None, "format": {"type": "text"}},
    {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "spawn", "description": "Spawn one.", "parameters": {"type": "object"},
         "strict": None},
        {"type": "custom", "name": "script", "description": "A script.", "format": {"type": "text"}},
    ]},
]


def _request(**extra):
    return decode_request({"model": "m", "input": "hi", "tools": TOOLS, **extra})


def test_tools_decode_flat_under_qualified_names_and_echo_as_sent() -> None:
    req = _request(tool_choice={"type": "custom", "name": "apply_patch"})
    assert [t.name for t in req.tools] == ["exec_command", "apply_patch", "note", "agents.spawn", "agents.script"]
    assert [t.is_custom for t in req.tools] == [False, True, True, False, True]
    assert req.tools[3].namespace == "agents" and req.tools[3].wire_name == "spawn"
    assert wire(req.tools_to_wire()) == wire(TOOLS)
    assert req.tool_choice.to_wire() == {"type": "custom", "name": "apply_patch"}
    # What the model sees: every tool a function; a custom one takes a string, `input`.
    shown = {t.to_template()["function"]["name"]: t.to_template()["function"] for t in to_conversation(req).tools}
    assert shown["apply_patch"]["parameters"]["required"] == ["input"]
    assert PATCH_GRAMMAR in shown["apply_patch"]["parameters"]["properties"]["input"]["description"]
    assert "agents.spawn" in shown


def _events(stream: ResponseStream, chunks: list[str], name: str) -> list[dict]:
    events = stream.start()
    events += stream.feed(TextDelta("Patching."))
    events += stream.feed(ToolCallStart(name))
    for c in chunks:
        events += stream.feed(ToolCallArguments(c))
    events += stream.feed(ToolCallEnd())
    return events


PATCH = '*** Begin Patch\n*** Update File: a.py\n-x = "1"\n+x = "2\\t"\n*** End Patch\n'


@pytest.mark.parametrize("cut", [1, 3, 7, 12])
def test_a_custom_call_streams_its_input_decoded(cut: int) -> None:
    arguments = json.dumps({"input": PATCH}, ensure_ascii=False)
    chunks = [arguments[k:k + cut] for k in range(0, len(arguments), cut)]
    stream = ResponseStream(_request())
    events = _events(stream, chunks, "apply_patch")
    events += stream.feed(ToolCallStart("agents.spawn"))
    events += stream.feed(ToolCallArguments('{"task": "t"}'))
    events += stream.feed(ToolCallEnd())
    events += stream.finish("tool_calls")
    final = check_grammar(events)
    call, spawn = final["output"][1], final["output"][2]
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch" and call["input"] == PATCH
    assert "namespace" not in call
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == PATCH and len(deltas) > 1  # streamed, not sent at the end
    assert spawn == {**spawn, "type": "function_call", "name": "spawn", "namespace": "agents", "arguments": '{"task": "t"}'}
    # The stream's items are the response's output as the decoder reads it back.
    assert [decode_item(o) for o in wire(final["output"])][1:] == stream.output_items[1:]


def test_custom_arguments_of_another_shape_end_as_their_text() -> None:
    stream = ResponseStream(_request())
    events = _events(stream, ['{"patch": ', '"x"}'], "note")
    events += stream.finish("tool_calls")
    final = check_grammar(events)
    assert final["output"][1]["input"] == '{"patch": "x"}'


def test_history_items_become_calls_the_template_renders() -> None:
    items = [
        {"type": "message", "role": "user", "content": "fix it"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
        {"type": "function_call", "call_id": "c2", "name": "spawn", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "ok"},
    ]
    req = decode_request({"model": "m", "input": items, "tools": TOOLS})
    assert isinstance(req.input[1], CustomToolCall) and isinstance(req.input[2], CustomToolCallOutput)
    assert req.input[3] == FunctionCall("c2", "spawn", "{}", namespace="agents")
    assert [decode_item(i.to_dict()) for i in req.input] == list(req.input)
    messages = to_conversation(req).messages
    patch_call = messages[1].tool_calls[0]
    assert patch_call.name == "apply_patch" and json.loads(patch_call.arguments) == {"input": PATCH}
    assert messages[2].role == "tool" and messages[2].name == "apply_patch" and messages[2].content == "Done!"
    assert messages[3].tool_calls[0].name == "agents.spawn" and messages[4].name == "agents.spawn"
