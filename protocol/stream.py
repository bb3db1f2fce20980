"""The per-response stream state machine: semantic deltas in, OpenAI events out.

`ResponseStream` is pure (no I/O, no clock but `created_at`/`completed_at`, no
global state). Every method returns the list of events (plain dicts, ready for
`json.dumps`) that the transport must write, in order. The first delta starts the
response if `start()` was not called.

Life of a response::

    start()                     response.created, response.in_progress
      (queued=True)             response.created, response.queued
    admitted()                  response.in_progress              (queued only)
    reasoning(text)             [close other item] output_item.added (reasoning),
                                content_part.added (reasoning_text), then
                                response.reasoning_text.delta per call
    text(text, logprobs)        [close other item] output_item.added (message),
                                content_part.added (output_text), then
                                response.output_text.delta per call
    tool_call_start(name, id)   [close other item] output_item.added (function_call, or
                                custom_tool_call for a custom tool)
    tool_call_arguments(chunk)  response.function_call_arguments.delta (custom: the input
                                decoded from them, response.custom_tool_call_input.delta)
    tool_call_end()             response.function_call_arguments.done (custom:
                                response.custom_tool_call_input.done), output_item.done
    finish(reason, usage)       closes the open item, then ONE of
                                response.completed ("stop", "tool_calls"),
                                response.incomplete ("length"/"max_output_tokens" ->
                                  incomplete_details.reason "max_output_tokens";
                                  "content_filter"; "cancelled" -> status "cancelled")
    fail(message, code, usage)  closes the open item (incomplete), response.failed

Closing an item: reasoning -> response.reasoning_text.done, content_part.done,
output_item.done; message -> response.output_text.done, content_part.done,
output_item.done; function call -> arguments.done, output_item.done. An item still
open at an incomplete/failed end gets status "incomplete".

A call's `name` is the one the model used (a namespaced tool's ``NAMESPACE.NAME``): the
item carries the tool's own ``name`` and its ``namespace``. `output_items` holds the
finished items as `protocol.items` objects (a socket lane's history is built from them).

After the terminal event the stream is closed: every method returns [] (late
deltas, e.g. after a cancel, are dropped).

Reasoning is streamed as ``reasoning_text`` content (what open-weights models
produce). ignis has no summarizer: reasoning items carry ``summary: []`` and no
``reasoning_summary_*`` events are sent, whatever ``reasoning.summary`` asks (Codex
shows raw reasoning with ``show_raw_agent_reasoning = true``). With
``include: ["reasoning.encrypted_content"]`` each finished reasoning item also
carries ``encrypted_content`` (`protocol.encrypted.seal_reasoning`), beside its
``content``.

``emit=False`` builds the same final response without creating event dicts (the
non-streaming path); `response` is the response object either way.
``stream_id`` (socket lanes) is added to every event when given.
"""

from __future__ import annotations

import time
from typing import Any

from protocol import ids
from protocol.conversation import FunctionTool
from protocol.custom_input import InputStream, final_input
from protocol.deltas import (
    Delta,
    dispatch,
)
from protocol.encrypted import seal_reasoning
from protocol.events import TokenLogprob
from protocol.items import CustomToolCall, FunctionCall, Item, Message, OutputText, Reasoning, ReasoningText
from protocol.request import ResponsesRequest
from protocol.response import RESPONSE_ERROR_CODES, Usage, new_response

__all__ = ["ResponseStream", "StreamStateError"]

Events = list[dict[str, Any]]

_COMPLETED = {"stop": None, "tool_calls": None, "end_turn": None}
_INCOMPLETE = {"length": "max_output_tokens", "max_output_tokens": "max_output_tokens", "content_filter": "content_filter"}


def _as_item(d: dict[str, Any]) -> Item:
    """A finished output item (its wire dict, as `_close` built it) as a `protocol.items` object."""
    kind = d["type"]
    if kind == "message":
        part = d["content"][0]
        return Message("assistant", (OutputText(part["text"], (), tuple(part["logprobs"])),), d["id"], d["status"])
    if kind == "reasoning":
        text = d["content"][0]["text"]
        return Reasoning(d["id"], (), (ReasoningText(text),), d.get("encrypted_content"), d.get("status"))
    if kind == "custom_tool_call":
        return CustomToolCall(d["call_id"], d["name"], d["input"], d["id"], d.get("namespace"))
    return FunctionCall(d["call_id"], d["name"], d["arguments"], d["id"], d["status"], d.get("namespace"))


class StreamStateError(RuntimeError):
    """A delta that makes no sense here (tool-call arguments with no call open)."""


class ResponseStream:
    __slots__ = (
        "request",
        "id",
        "response",
        "_state",
        "_seq",
        "_emit",
        "_sid",
        "_seal",
        "_key",
        "_kind",
        "_item_id",
        "_index",
        "_buf",
        "_lps",
        "_call",
        "_tools",
        "_input",
        "_sent",
        "output_items",
    )

    def __init__(
        self,
        request: ResponsesRequest,
        *,
        response_id: str | None = None,
        created_at: int | None = None,
        queued: bool = False,
        reasoning_key: bytes | None = None,
        stream_id: str | None = None,
        emit: bool = True,
    ) -> None:
        self.request = request
        self.id = response_id or ids.response_id()
        self.response: dict[str, Any] = new_response(
            request, response_id=self.id, created_at=created_at, status="queued" if queued else "in_progress"
        )
        self._state = "queued_new" if queued else "new"  # -> queued -> running -> done
        self._seq = 0
        self._emit = emit
        self._sid = stream_id
        self._seal = request.include_encrypted_reasoning
        self._key = reasoning_key
        self._kind: str | None = None  # open item: "reasoning" | "message" | "call" | None
        self._item_id = ""
        self._index = -1
        self._buf: list[str] = []
        self._lps: list[TokenLogprob] = []
        self._call: tuple[str, FunctionTool] = ("", FunctionTool(""))  # (call_id, tool) of the open call
        self._tools = {t.name: t for t in request.tools}
        self._input = InputStream()  # the open custom call's input, decoded as it streams
        self._sent: list[str] = []  # the input sent in deltas so far
        self.output_items: list[Item] = []

    # -- state -----------------------------------------------------------------------

    @property
    def status(self) -> str:
        return self.response["status"]

    @property
    def done(self) -> bool:
        return self._state == "done"

    # -- event plumbing --------------------------------------------------------------

    def _stamped(self, ev: dict[str, Any]) -> dict[str, Any]:
        """`ev` with its sequence number (and the socket lane's stream id)."""
        ev["sequence_number"] = self._seq
        self._seq += 1
        if self._sid is not None:
            ev["stream_id"] = self._sid
        return ev

    def _ev(self, out: Events, ev: dict[str, Any]) -> None:
        out.append(self._stamped(ev))

    def _snapshot(self) -> dict[str, Any]:
        r = dict(self.response)
        r["output"] = list(r["output"])
        return r

    def _lifecycle(self, out: Events, kind: str) -> None:
        if self._emit:
            self._ev(out, {"type": kind, "response": self._snapshot()})

    def _running(self, out: Events) -> None:
        """Bring a new/queued stream to in_progress, emitting what that takes."""
        if self._state in ("new", "queued_new"):
            self._start(out)
        if self._state == "queued":
            self._admit(out)

    def _start(self, out: Events) -> None:
        self._lifecycle(out, "response.created")
        if self._state == "queued_new":
            self._lifecycle(out, "response.queued")
            self._state = "queued"
        else:
            self._lifecycle(out, "response.in_progress")
            self._state = "running"

    def _admit(self, out: Events) -> None:
        self.response["status"] = "in_progress"
        self._lifecycle(out, "response.in_progress")
        self._state = "running"

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Events:
        """``response.created`` + ``response.in_progress`` (or ``response.queued``)."""
        out: Events = []
        if self._state in ("new", "queued_new"):
            self._start(out)
        return out

    def admitted(self) -> Events:
        """A queued response got its turn: ``response.in_progress``."""
        out: Events = []
        self._running(out)
        return out

    # -- items -----------------------------------------------------------------------

    def _open(self, out: Events, kind: str) -> None:
        self._close(out, "completed")
        self._kind = kind
        self._index = len(self.response["output"])
        self._buf = []
        part: dict[str, Any] | None = None  # the content part it opens with (not calls)
        if kind == "reasoning":
            self._item_id = ids.reasoning_id()
            item: dict[str, Any] = {"id": self._item_id, "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        elif kind == "message":
            self._item_id = ids.message_id()
            self._lps = []
            item = {"id": self._item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        elif kind == "custom":
            self._item_id = ids.custom_tool_call_id()
            self._input, self._sent = InputStream(), []
            item = {"id": self._item_id, "type": "custom_tool_call", "call_id": self._call[0], "input": "",
                    **self._call_name()}
        else:  # call
            self._item_id = ids.function_call_id()
            item = {
                "id": self._item_id,
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": self._call[0],
                **self._call_name(),
            }
        if not self._emit:
            return
        self._ev(out, {"type": "response.output_item.added", "output_index": self._index, "item": item})
        if part is not None:
            self._ev(out, {
                "type": "response.content_part.added",
                "item_id": self._item_id,
                "output_index": self._index,
                "content_index": 0,
                "part": part,
            })

    def _call_name(self) -> dict[str, str]:
        """The open call's ``name`` (and ``namespace``) fields."""
        tool = self._call[1]
        if tool.namespace is None:
            return {"name": tool.name}
        return {"name": tool.wire_name, "namespace": tool.namespace}

    def _close(self, out: Events, status: str) -> None:
        kind = self._kind
        if kind is None:
            return
        self._kind = None
        text = "".join(self._buf)
        iid, idx, emit = self._item_id, self._index, self._emit
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item: dict[str, Any] = {"id": iid, "type": "reasoning", "summary": [], "content": [part]}
            if self._seal:
                item["encrypted_content"] = seal_reasoning(text, self._key)
            if status != "completed":
                item["status"] = status
            if emit:
                self._ev(out, {"type": "response.reasoning_text.done", "item_id": iid, "output_index": idx, "content_index": 0, "text": text})
                self._ev(out, {"type": "response.content_part.done", "item_id": iid, "output_index": idx, "content_index": 0, "part": dict(part)})
        elif kind == "message":
            lps = self._lps
            part = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": [lp.output_dict() for lp in lps],
            }
            item = {"id": iid, "type": "message", "status": status, "role": "assistant", "content": [part]}
            if emit:
                self._ev(out, {
                    "type": "response.output_text.done",
                    "item_id": iid,
                    "output_index": idx,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [lp.delta_dict() for lp in lps],
                })
                self._ev(out, {"type": "response.content_part.done", "item_id": iid, "output_index": idx, "content_index": 0, "part": part})
        elif kind == "custom":
            item = self._close_custom(out, text)
        else:
            item = {"id": iid, "type": "function_call", "status": status, "arguments": text, "call_id": self._call[0],
                    **self._call_name()}
            if emit:
                self._ev(out, {"type": "response.function_call_arguments.done", "item_id": iid, "output_index": idx, "arguments": text})
        self.response["output"].append(item)
        self.output_items.append(_as_item(item))
        if emit:
            self._ev(out, {"type": "response.output_item.done", "output_index": idx, "item": item})
        self._buf = []

    def _close_custom(self, out: Events, arguments: str) -> dict[str, Any]:
        """A custom call's end: what the input has beyond the deltas sent, then its done."""
        value = final_input(arguments)
        sent = "".join(self._sent)
        iid, idx = self._item_id, self._index
        if self._emit:
            if value.startswith(sent) and len(value) > len(sent):
                self._ev(out, {"type": "response.custom_tool_call_input.delta", "item_id": iid, "output_index": idx,
                               "delta": value[len(sent):]})
            self._ev(out, {"type": "response.custom_tool_call_input.done", "item_id": iid, "output_index": idx,
                           "input": value})
        return {"id": iid, "type": "custom_tool_call", "call_id": self._call[0], "input": value, **self._call_name()}

    # -- deltas (hot path) -----------------------------------------------------------

    def reasoning(self, text: str) -> Events:
        """A piece of reasoning text."""
        if not text or self._state == "done":
            return []
        if self._kind == "reasoning":
            self._buf.append(text)
            if not self._emit:
                return []
            return [self._stamped({
                "type": "response.reasoning_text.delta",
                "item_id": self._item_id,
                "output_index": self._index,
                "content_index": 0,
                "delta": text,
            })]
        out: Events = []
        self._running(out)
        self._open(out, "reasoning")
        return out + self.reasoning(text)

    def text(self, text: str, logprobs: list[TokenLogprob] | tuple[TokenLogprob, ...] | None = None) -> Events:
        """A piece of answer text, with the logprobs of its tokens when requested."""
        if not text or self._state == "done":
            return []
        if self._kind == "message":
            self._buf.append(text)
            if logprobs:
                self._lps.extend(logprobs)
            if not self._emit:
                return []
            return [self._stamped({
                "type": "response.output_text.delta",
                "item_id": self._item_id,
                "output_index": self._index,
                "content_index": 0,
                "delta": text,
                "logprobs": [lp.delta_dict() for lp in logprobs] if logprobs else [],
            })]
        out: Events = []
        self._running(out)
        self._open(out, "message")
        return out + self.text(text, logprobs)

    def tool_call_start(self, name: str, call_id: str | None = None) -> Events:
        """The model began a call to `name` (`call_id` None: a fresh ``call_`` id)."""
        if self._state == "done":
            return []
        out: Events = []
        self._running(out)
        self._close(out, "completed")
        tool = self._tools.get(name) or FunctionTool(name)
        self._call = (call_id or ids.call_id(), tool)
        self._open(out, "custom" if tool.is_custom else "call")
        return out

    def tool_call_arguments(self, chunk: str) -> Events:
        """A piece of the open call's JSON arguments."""
        if self._state == "done":
            return []
        if self._kind not in ("call", "custom"):
            raise StreamStateError("tool-call arguments with no tool call open")
        if not chunk:
            return []
        self._buf.append(chunk)
        if self._kind == "custom":
            return self._custom_input(self._input.feed(chunk))
        return self._call_delta("response.function_call_arguments.delta", chunk)

    def _custom_input(self, text: str) -> Events:
        if not text:
            return []
        self._sent.append(text)
        return self._call_delta("response.custom_tool_call_input.delta", text)

    def _call_delta(self, event_type: str, delta: str) -> Events:
        """The open call's delta event (none when events are not emitted)."""
        if not self._emit:
            return []
        return [self._stamped({"type": event_type, "item_id": self._item_id, "output_index": self._index,
                               "delta": delta})]

    def tool_call_end(self) -> Events:
        """The open call is complete."""
        if self._state == "done":
            return []
        if self._kind not in ("call", "custom"):
            raise StreamStateError("tool-call end with no tool call open")
        out: Events = []
        self._close(out, "completed")
        return out

    # -- terminal --------------------------------------------------------------------

    def _terminal(self, out: Events, status: str, kind: str, usage: Usage | None) -> Events:
        r = self.response
        r["status"] = status
        r["usage"] = usage.to_dict() if usage is not None else None
        if status == "completed":
            r["completed_at"] = int(time.time())
        self._state = "done"
        if self._emit:
            self._ev(out, {"type": kind, "response": r})
            return out
        return []

    def finish(self, reason: str = "stop", usage: Usage | None = None) -> Events:
        """The generation ended; `reason`: stop | tool_calls | length | max_output_tokens
        | content_filter | cancelled. Emits the one terminal event."""
        if self._state == "done":
            return []
        out: Events = []
        self._running(out)
        if reason in _COMPLETED:
            self._close(out, "completed")
            return self._terminal(out, "completed", "response.completed", usage)
        if reason == "cancelled":
            return self.cancel(usage, _out=out)
        detail = _INCOMPLETE.get(reason)
        if detail is None:
            raise ValueError(f"unknown finish reason {reason!r}")
        self._close(out, "incomplete")
        self.response["incomplete_details"] = {"reason": detail}
        return self._terminal(out, "incomplete", "response.incomplete", usage)

    def cancel(self, usage: Usage | None = None, *, _out: Events | None = None) -> Events:
        """The client cancelled (socket ``response.cancel``): status "cancelled", sent as
        ``response.incomplete`` (the SDK has no ``response.cancelled`` stream event)."""
        if self._state == "done":
            return []
        out: Events = [] if _out is None else _out
        self._running(out)
        self._close(out, "incomplete")
        return self._terminal(out, "cancelled", "response.incomplete", usage)

    def fail(self, message: str, code: str = "server_error", usage: Usage | None = None) -> Events:
        """The generation broke (engine error): ``response.failed`` with ``error``.

        `code` must be one of the SDK's `ResponseError` codes; any other is sent as
        ``server_error`` (the SDK's type is a closed set)."""
        if self._state == "done":
            return []
        out: Events = []
        self._running(out)
        self._close(out, "incomplete")
        self.response["error"] = {"code": code if code in RESPONSE_ERROR_CODES else "server_error", "message": message}
        return self._terminal(out, "failed", "response.failed", usage)

    # -- dispatch --------------------------------------------------------------------

    def feed(self, delta: Delta) -> Events:
        """Dispatch one `protocol.deltas` object to the matching method."""
        return dispatch(self, delta)
