"""Validation against Open Responses' published JSON schema (tests/data/openresponses).

The SDK's pydantic types accept a missing optional field; this schema requires every
field of the response object (``presence_penalty``, ``frequency_penalty``, ...), so each
response, streamed event and socket frame the tests see is checked against both.

ignis speaks OpenAI's Responses API, and a few OpenAI shapes have no counterpart in the
peer schema. `peer_view` maps each onto its nearest one before validating, so the rest
of the object is still checked (the SDK's types check the OpenAI shapes themselves):

- ``response.reasoning_text.*`` events (OpenAI's name) -> ``response.reasoning.*``;
- custom tools and ``custom_tool_call`` items / ``response.custom_tool_call_input.*``
  events -> function tools, ``function_call`` items and argument events;
- ``namespace`` tools -> the function tools inside them;
- reasoning effort ``minimal`` (OpenAI's, and described in the peer schema's own
  ``x-enumDescriptions``, but missing from its enum) -> ``low``;
- a ``json_schema`` text format's ``schema`` object -> null (the peer schema's generated
  type allows nothing else there, which its own examples contradict).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "openresponses" / "openapi.json"
_URI = "urn:openresponses:openapi"

_RENAMED_EVENTS = {
    "response.reasoning_text.delta": "response.reasoning.delta",
    "response.reasoning_text.done": "response.reasoning.done",
    "response.custom_tool_call_input.delta": "response.function_call_arguments.delta",
    "response.custom_tool_call_input.done": "response.function_call_arguments.done",
}


@cache
def _document() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@cache
def _validator(name: str) -> Draft202012Validator:
    doc = _document()
    if name not in doc["components"]["schemas"]:
        raise KeyError(f"the Open Responses schema has no component {name!r}")
    registry = Registry().with_resource(_URI, Resource(contents=doc, specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"{_URI}#/components/schemas/{name}"}, registry=registry)


@cache
def event_schemas() -> dict[str, str]:
    """Streaming event type -> the component that describes it (the SSE union's members)."""
    doc = _document()
    union = doc["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    out = {}
    for ref in union:
        name = ref["$ref"].rsplit("/", 1)[-1]
        (kind,) = doc["components"]["schemas"][name]["properties"]["type"]["enum"]
        out[kind] = name
    return out


def _check(name: str, obj: Any, what: str) -> None:
    errors = sorted(_validator(name).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message[:300]}" for e in errors[:8]]
        raise AssertionError(f"{what} does not validate against Open Responses' {name}:\n" + "\n".join(lines))


# -- OpenAI shapes the peer schema lacks ------------------------------------------------


def _tool(tool: dict[str, Any]) -> list[dict[str, Any]]:
    kind = tool.get("type")
    if kind == "namespace":
        return [t for inner in tool.get("tools", []) for t in _tool(inner)]
    if kind == "custom":
        return [{"type": "function", "name": tool["name"], "description": tool.get("description"),
                 "parameters": None, "strict": None}]
    return [tool]


def _item(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") == "custom_tool_call":
        out = {k: v for k, v in item.items() if k not in ("input", "namespace")}
        out.update(type="function_call", arguments=item.get("input", ""), status=item.get("status", "completed"))
        return out
    return item


def _choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") == "custom":
            return {"type": "function", "name": choice.get("name")}
        if choice.get("type") == "allowed_tools":
            return dict(choice, tools=[_choice(t) for t in choice.get("tools", [])])
    return choice


def _response(resp: dict[str, Any]) -> dict[str, Any]:
    out = dict(resp)
    out["tools"] = [t for tool in resp.get("tools") or [] for t in _tool(tool)]
    out["tool_choice"] = _choice(resp.get("tool_choice"))
    out["output"] = [_item(i) for i in resp.get("output") or []]
    reasoning = resp.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") == "minimal":
        out["reasoning"] = dict(reasoning, effort="low")
    fmt = (resp.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        out["text"] = dict(resp["text"], format=dict(fmt, schema=None))
    return out


def peer_view(obj: dict[str, Any]) -> dict[str, Any]:
    """A response or event with the OpenAI-only shapes above mapped onto the peer's."""
    obj = copy.deepcopy(obj)
    if obj.get("object") == "response":
        return _response(obj)
    kind = obj.get("type", "")
    if kind in _RENAMED_EVENTS:
        obj["type"] = _RENAMED_EVENTS[kind]
        if kind == "response.custom_tool_call_input.done":
            obj["arguments"] = obj.pop("input")
    if isinstance(obj.get("response"), dict):
        obj["response"] = _response(obj["response"])
    if isinstance(obj.get("item"), dict):
        obj["item"] = _item(obj["item"])
    return obj


# -- the checks -------------------------------------------------------------------------


def check_response(resp: dict[str, Any]) -> None:
    """A response object (a JSON body, or the one an event carries)."""
    _check("ResponseResource", peer_view(resp), f"response {resp.get('id')}")


def check_event(ev: dict[str, Any], *, socket: bool = False) -> None:
    """One streamed event (SSE, or a socket frame: `socket` admits the socket's own
    ``error`` frame, WebSocketErrorEvent, in place of the SSE error event)."""
    if socket and ev.get("type") == "error" and "status" in ev:
        _check("WebSocketErrorEvent", ev, "socket error frame")
        return
    view = peer_view(ev)
    name = event_schemas().get(view.get("type", ""))
    assert name is not None, f"event type {ev.get('type')!r} is not in the Open Responses schema"
    _check(name, view, f"event {ev.get('type')} #{ev.get('sequence_number')}")


def check_compaction(body: dict[str, Any]) -> None:
    """A POST /v1/responses/compact body (CompactResource)."""
    _check("CompactResource", body, "compaction response")


def check_create_frame(frame: dict[str, Any]) -> None:
    """A client's ``response.create`` frame (WebSocketResponseCreateEvent)."""
    _check("WebSocketResponseCreateEvent", frame, "response.create frame")
