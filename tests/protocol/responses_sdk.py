"""Helpers for the Responses tests: strict validation against the OpenAI SDK's own
pydantic types and against Open Responses' published schema (tests/openresponses.py),
and an independent checker of OpenAI's event grammar."""

from __future__ import annotations

import json
import re
from typing import Any

from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from tests import openresponses

EVENT = TypeAdapter(ResponseStreamEvent)
WS_EVENT = TypeAdapter(ResponsesServerEvent)
RESPONSE = TypeAdapter(Response)

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def wire(obj: Any) -> Any:
    """What the client receives: the object through JSON text."""
    return json.loads(json.dumps(obj, allow_nan=False))


def validate_event(ev: dict[str, Any]) -> Any:
    """Strictly validate one event as the SDK would parse it, and against the Open
    Responses schema; returns the SDK's model."""
    w = wire(ev)
    openresponses.check_event(w, socket="stream_id" in w)
    if "stream_id" in w:  # socket lanes: only the WebSocket event types carry it
        model = WS_EVENT.validate_python(w, strict=True)
    else:
        model = EVENT.validate_python(w, strict=True)
        if w["type"] != "error":  # the socket's error frame has its own (nested) shape
            WS_EVENT.validate_python(w, strict=True)  # the same frame is a valid socket event
    assert model.type == ev["type"], (model.type, ev["type"])
    return model


def validate_response(resp: dict[str, Any]) -> Response:
    w = wire(resp)
    openresponses.check_response(w)
    return RESPONSE.validate_python(w, strict=True)


def check_grammar(events: list[dict[str, Any]], *, queued: bool = False) -> dict[str, Any]:
    """Assert OpenAI's event order; returns the terminal response.

    Written apart from `protocol.stream` on purpose: it re-derives every item from
    the events and compares it with what the stream says it finished with.
    """
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for e in events:
        validate_event(e)
    types = [e["type"] for e in events]
    head = ["response.created", "response.queued", "response.in_progress"] if queued else ["response.created", "response.in_progress"]
    assert types[: len(head)] == head, types[:4]
    assert types[-1] in TERMINAL
    assert sum(t in TERMINAL for t in types) == 1
    rid = events[0]["response"]["id"]
    assert all(e["response"]["id"] == rid for e in events if "response" in e)
    assert events[0]["response"]["status"] == ("queued" if queued else "in_progress")

    i = len(head)
    body = events[i:-1]
    items: list[dict[str, Any]] = []
    k = 0
    while k < len(body):
        added = body[k]
        assert added["type"] == "response.output_item.added", added["type"]
        idx = added["output_index"]
        assert idx == len(items)
        item = added["item"]
        iid = item["id"]
        kind = item["type"]
        k += 1
        pieces: list[str] = []
        if kind in ("message", "reasoning"):
            part_type = "output_text" if kind == "message" else "reasoning_text"
            delta_type = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
            done_type = "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
            assert body[k]["type"] == "response.content_part.added"
            assert body[k]["part"]["type"] == part_type and body[k]["part"]["text"] == ""
            k += 1
            while body[k]["type"] == delta_type:
                assert body[k]["item_id"] == iid and body[k]["output_index"] == idx and body[k]["content_index"] == 0
                pieces.append(body[k]["delta"])
                k += 1
            assert body[k]["type"] == done_type, body[k]["type"]
            assert body[k]["text"] == "".join(pieces)
            k += 1
            assert body[k]["type"] == "response.content_part.done"
            assert body[k]["part"]["text"] == "".join(pieces) and body[k]["part"]["type"] == part_type
            k += 1
        else:
            assert kind in ("custom_tool_call", "function_call") and item["call_id"]
            prefix, field = (("response.custom_tool_call_input", "input") if kind == "custom_tool_call"
                             else ("response.function_call_arguments", "arguments"))
            if kind == "custom_tool_call":
                assert item["input"] == ""
            while body[k]["type"] == f"{prefix}.delta":
                assert body[k]["item_id"] == iid and body[k]["output_index"] == idx
                pieces.append(body[k]["delta"])
                k += 1
            assert body[k]["type"] == f"{prefix}.done"
            assert body[k][field] == "".join(pieces)
            k += 1
        done = body[k]
        assert done["type"] == "response.output_item.done" and done["output_index"] == idx
        assert done["item"]["id"] == iid and done["item"]["type"] == kind
        text = "".join(pieces)
        if kind == "message":
            assert done["item"]["content"][0]["text"] == text
            assert re.fullmatch(r"msg_[0-9a-f]{48}", iid)
        elif kind == "reasoning":
            assert done["item"]["content"][0]["text"] == text
            assert re.fullmatch(r"rs_[0-9a-f]{48}", iid)
        elif kind == "custom_tool_call":
            assert done["item"]["input"] == text
            assert re.fullmatch(r"ctc_[0-9a-f]{48}", iid)
        else:
            assert done["item"]["arguments"] == text
            assert re.fullmatch(r"fc_[0-9a-f]{48}", iid)
        items.append(done["item"])
        k += 1
    final = events[-1]["response"]
    assert wire(final["output"]) == wire(items)
    validate_response(final)
    return final
