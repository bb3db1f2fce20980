"""Structured outputs in the protocol (protocol/structured.py): text.format and chat
response_format decoded and echoed as sent (the echo validates against the SDK's
Response strictly), and OpenAI's strict subset for formats and function tools."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.chat_request import decode_chat_request
from protocol.decode import decode_request
from protocol.errors import Refusal
from protocol.response import Usage
from protocol.stream import ResponseStream
from protocol.structured import TextFormat, check_strict_schema
from tests.protocol.responses_sdk import validate_response

STRICT = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                           "c": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
          "required": ["a", "b", "c"], "additionalProperties": False,
          "$defs": {"item": {"type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"],
                             "additionalProperties": False}}}


def responses(**body: Any) -> Any:
    return decode_request({"model": "m", "input": "hi", **body})


def chat(**body: Any) -> Any:
    return decode_chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "name": "answer", "schema": STRICT, "strict": True},
    {"type": "json_schema", "name": "loose", "schema": {"type": "object", "minProperties": 1}, "description": "d"},
    {"type": "json_object"},
    {"type": "text"},
])
def test_responses_format_is_echoed_as_sent(fmt: dict[str, Any]) -> None:
    """Echoed as sent, with every field OpenAI echoes: a json_schema format's
    `description` (null when not sent) and `strict` (false when not sent)."""
    req = responses(text={"format": fmt, "verbosity": "low"})
    assert req.text.format.is_json == (fmt["type"] != "text")
    stream = ResponseStream(req, response_id="resp_1", created_at=1)
    r = stream.finish("stop", Usage())[-1]["response"]
    echoed = {"description": None, "strict": False, **fmt} if fmt["type"] == "json_schema" else fmt
    assert r["text"] == {"format": echoed, "verbosity": "low"}
    m = validate_response(r)
    assert m.text.format.type == fmt["type"]


def test_chat_response_format() -> None:
    assert chat(response_format={"type": "json_object"}).response_format == TextFormat("json_object")
    req = chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": STRICT, "strict": True}})
    assert req.response_format.schema == STRICT and req.response_format.strict is True
    assert chat(response_format={"type": "json_schema", "json_schema": {"name": "n"}}).response_format.schema is None
    assert chat().response_format == TextFormat()


@pytest.mark.parametrize("schema,words", [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "'additionalProperties' is required"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
     "Missing 'a'"),
    ({"type": "array", "items": {}}, "root schema must be an object"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"z": {"type": "string"}},
      "required": ["z"]}}, "required": ["a"], "additionalProperties": False},
     "context=('properties', 'a'), 'additionalProperties'"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
      "required": ["a"], "additionalProperties": False}, "context=('properties', 'a'), 'uniqueItems' is not permitted"),
    ({"type": "object", "properties": {}, "additionalProperties": False, "$defs": {"d": {"not": {}}}},
     "context=('$defs', 'd'), 'not' is not permitted"),
])
def test_strict_subset(schema: dict[str, Any], words: str) -> None:
    with pytest.raises(Refusal) as info:
        check_strict_schema(schema, owner="function 'f'", param="tools[0].parameters", code="invalid_function_parameters")
    assert words in info.value.message and "function 'f'" in info.value.message
    assert info.value.param == "tools[0].parameters" and info.value.status == 400


def test_strict_schema_accepted_and_strict_tools_checked_in_both_endpoints() -> None:
    check_strict_schema(STRICT, owner="x", param="p", code="c")
    bad = {"type": "object", "properties": {"a": {"type": "string"}}}
    with pytest.raises(Refusal) as info:
        responses(tools=[{"type": "function", "name": "f", "parameters": bad, "strict": True}])
    assert info.value.param == "tools[0].parameters" and info.value.code == "invalid_function_parameters"
    with pytest.raises(Refusal) as info:
        chat(tools=[{"type": "function", "function": {"name": "g", "parameters": bad, "strict": True}}])
    assert info.value.param == "tools[0].function.parameters" and "function 'g'" in info.value.message
    # strict false (or absent): any schema is accepted; the grammar compiles it leniently.
    assert responses(tools=[{"type": "function", "name": "f", "parameters": bad, "strict": False}]).tools
    with pytest.raises(Refusal) as info:
        responses(text={"format": {"type": "json_schema", "name": "n", "schema": bad, "strict": True}})
    assert info.value.param == "text.format.schema" and "response_format 'n'" in info.value.message


def test_a_strict_schema_whose_required_is_not_a_list_is_refused_not_a_crash():
    from protocol.errors import Refusal
    from protocol.structured import check_strict_schema

    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False, "required": 1}
    with pytest.raises(Refusal, match="'required' must be an array"):
        check_strict_schema(schema, owner="function 'f'", param="tools[0].parameters", code="invalid_function_parameters")
