"""Structured outputs over the server (ignis/server/structured.py): Responses ``text.format``
and chat ``response_format`` json_schema / json_object, and strict tools under a demanded
call, with the tiny random model (whatever it writes is held to the grammar: a completed
response is valid JSON of the schema, one cut by max_output_tokens is incomplete) and the
400s: strict-subset violations, schemas the grammar engine rejects, stop strings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.protocol.responses_sdk import check_grammar, validate_response
from tests.server.server_harness import http

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["kind", "ok", "n"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "name": "pet", "schema": SCHEMA, "strict": True}


def post(srv: Any, path: str, **body: Any) -> Any:
    body.setdefault("model", "tiny")
    return http(srv, "POST", path, json=body)


def output_text(resp: dict[str, Any]) -> str:
    return "".join(p["text"] for item in resp["output"] if item["type"] == "message" for p in item["content"])


def check_json_outcome(status: str, text: str, schema: dict[str, Any] | None) -> None:
    """Completed: valid JSON (of the schema). Incomplete: cut by the length limit. Never
    invalid JSON reported as completed."""
    assert status in ("completed", "incomplete"), status
    if status == "completed":
        value = json.loads(text)
        if schema is not None:
            jsonschema.validate(value, schema)
        else:
            assert isinstance(value, dict)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_responses_json_schema(srv: Any, temperature: float) -> None:
    r = post(srv, "/v1/responses", input="A pet as JSON.", text={"format": FORMAT}, temperature=temperature,
             seed=7, max_output_tokens=200, reasoning={"effort": "none"})
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert resp["text"]["format"] == {"description": None, **FORMAT}  # echoed as sent, with every field
    check_json_outcome(resp["status"], output_text(resp), SCHEMA)
    if temperature == 0:  # every value is bounded: the greedy output closes well within the limit
        assert resp["status"] == "completed", resp


def test_responses_json_object_streamed_and_cut(srv: Any) -> None:
    r = post(srv, "/v1/responses", input="JSON please.", text={"format": {"type": "json_object"}}, stream=True,
             temperature=1.0, seed=3, max_output_tokens=4)
    assert r.status_code == 200, r.text
    events = [json.loads(b.split("\n")[1][6:]) for b in r.text.split("\n\n") if b]
    final = check_grammar(events)
    assert final["text"]["format"] == {"type": "json_object"}
    assert final["status"] == "incomplete"  # 4 tokens cannot close the object... or say so
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_chat_response_format(srv: Any) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    for response_format, schema in ((fmt, SCHEMA), ({"type": "json_object"}, None)):
        r = post(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "A pet."}],
                 response_format=response_format, temperature=0, max_tokens=200, reasoning_effort="none")
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        status = {"stop": "completed", "length": "incomplete"}[choice["finish_reason"]]
        check_json_outcome(status, choice["message"]["content"], schema)
        if schema is not None:
            assert status == "completed", choice


def test_required_strict_tool_arguments_match(srv: Any) -> None:
    tool = {"type": "function", "name": "pick", "parameters": SCHEMA, "strict": True}
    r = post(srv, "/v1/responses", input="Pick.", tools=[tool], tool_choice="required", temperature=0,
             max_output_tokens=200, reasoning={"effort": "none"}, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    resp = r.json()
    validate_response(resp)
    assert resp["status"] == "completed", resp
    if resp["status"] == "completed":
        calls = [i for i in resp["output"] if i["type"] == "function_call"]
        assert len(calls) == 1 and calls[0]["name"] == "pick"
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMA)


@pytest.mark.parametrize("path,body,param,code,words", [
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}, "required": ["a"],
        "additionalProperties": False}}]}, "tools[0].parameters", "invalid_function_parameters",
     ["function 'f'", "'uniqueItems'"]),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}, "text.format.schema",
     "invalid_json_schema", ["response_format 'x'"]),
    ("/v1/responses", {"text": {"format": {"type": "json_object"}}, "stop": ["}"]}, "stop", "invalid_value",
     ["'stop'"]),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
        "schema": {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}},
                   "required": ["a"], "additionalProperties": False}}}},
     "response_format.json_schema.schema", "invalid_json_schema", ["no-such-format"]),
])
def test_refused(srv: Any, path: str, body: dict[str, Any], param: str, code: str, words: list[str]) -> None:
    base = {"input": "hi"} if path == "/v1/responses" else {"messages": [{"role": "user", "content": "hi"}]}
    r = post(srv, path, **base, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    for w in words:
        assert w in err["message"], err
