"""Chat-completions output: semantic deltas in, ``chat.completion(.chunk)`` dicts out.

The engine's output parser turns token text into semantic deltas, the very
`protocol.deltas` objects the Responses encoder (`protocol.stream.ResponseStream`)
consumes, so one parser drives both endpoints:

=====================  ===============================================================
delta                  meaning
=====================  ===============================================================
`ReasoningDelta`       thinking text
`TextDelta`            answer text (with the per-token logprobs of its tokens, if asked)
`ToolCallStart`        the model began a function call: its name (and call id)
`ToolCallArguments`    a chunk of the open call's JSON arguments
`ToolCallEnd`          the open call is complete
`Finish`               generation ended: the engine's reason and `protocol.response.Usage`
`Failure`              generation failed (a server error, after the stream started)
=====================  ===============================================================

`ChatStream` is a pure state machine with `ResponseStream`'s interface: `feed(delta)`
(or the methods `reasoning`, `text`, `tool_call_start`, `tool_call_arguments`,
`tool_call_end`, `finish`, `cancel`, `fail`) returns the ``chat.completion.chunk``
dicts to send, each one SSE ``data:`` line; after the last one the caller writes
``data: [DONE]``. After the end, `completion()` returns the ``chat.completion``
object. A non-streaming request feeds the same deltas (``emit=False`` skips
building chunks) and sends `completion()`, so the non-streaming response is, by
construction, what a client accumulates from the stream. As in `ResponseStream`,
deltas after the end are dropped (a cancel may race the engine), and arguments or
an end with no call open raise `StreamStateError` (a parser bug).

Finish reasons: the engine's ``stop`` (or ``tool_calls``) becomes ``tool_calls`` when
a call was made, else ``stop``; ``length``/``max_output_tokens`` -> ``length``;
``content_filter`` as is; ``cancelled`` -> ``stop`` (nobody is listening anyway).
Usage: ``prompt_tokens`` = input, ``completion_tokens`` = output (reasoning
included), ``prompt_tokens_details.cached_tokens``,
``completion_tokens_details.reasoning_tokens``.

Stream shape (as OpenAI sends it):

- first chunk: ``delta = {"role": "assistant", "content": "" | null, "refusal": null}``
  (content ``""`` when the first delta is answer text, null otherwise, so that an
  accumulating client ends with content null for a tool-call-only answer);
- ``{"content": text}`` chunks (with ``logprobs: {"content": [...], "refusal": null}``
  when logprobs were asked), ``{"reasoning_content": text}`` chunks (ignis
  extension, vLLM's name), and ``{"tool_calls": [{"index", "id", "type": "function",
  "function": {"name", "arguments": ""}}]}`` then ``{"tool_calls": [{"index",
  "function": {"arguments": chunk}}]}`` chunks;
- last choice chunk: ``delta = {}`` (or ``{"content": ""}`` if there was neither text
  nor a tool call) with ``finish_reason``: ``tool_calls`` if any call was made and
  the engine stopped naturally, else the engine's ``stop`` / ``length``;
- with ``include_usage``: every chunk carries ``"usage": null`` and one more chunk
  follows with ``choices: []`` and the usage.

On `Failure`, `feed` returns one ``{"error": {...}}`` dict (OpenAI's error object,
type ``server_error``; send it as a ``data:`` line, then ``[DONE]``), and
`completion()` raises the matching `Refusal` (status 500) for a non-streaming
request to send instead.

The whole endpoint, sketched (`protocol.chat_request` decodes the body)::

    req = decode_chat_request_bytes(body)            # or Refusal -> status + envelope()
    msgs = to_template_messages(req.messages)        # render, tokenize once
    enc = ChatStream(model=req.model, include_usage=req.include_usage,
                     logprobs=req.logprobs, emit=req.stream)
    for delta in engine_deltas:                      # protocol.deltas: TextDelta, ...
        for chunk in enc.feed(delta):
            write(f"data: {json.dumps(chunk)}\\n\\n")
    write("data: [DONE]\\n\\n")                       # streaming
    # or, not streaming: send enc.completion()

Pure stdlib: no ignis, sanic, torch or asyncio.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from protocol.deltas import Delta, dispatch
from protocol.errors import Refusal
from protocol.events import TokenLogprob
from protocol.ids import call_id as new_call_id, completion_id
from protocol.response import Usage
from protocol.stream import StreamStateError

__all__ = [
    "ChatStream",
    "build_completion",
    "chat_usage",
    "chat_logprob",
]

Chunks = list[dict[str, Any]]


def chat_logprob(t: TokenLogprob) -> dict[str, Any]:
    """One token in chat's ``logprobs.content`` shape: the same fields as a Responses
    ``output_text`` part's entry (`TokenLogprob.output_dict`: the token's own ``bytes``,
    NaN / -inf floored at `LOGPROB_FLOOR`, OpenAI's -9999.0)."""
    return t.output_dict()


def chat_usage(usage: Usage | None) -> dict[str, Any]:
    """`protocol.response.Usage` in chat's ``usage`` shape (zeros when None)."""
    u = usage or Usage()
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "accepted_prediction_tokens": u.accepted_prediction_tokens,
            "rejected_prediction_tokens": u.rejected_prediction_tokens,
        },
    }


# Failure codes that are the request's fault (its output grammar could not go on).
CLIENT_FAILURE_CODES = frozenset({"invalid_grammar"})

_REASONS = {
    "stop": "stop",
    "tool_calls": "stop",  # -> "tool_calls" when a call was made
    "cancelled": "stop",
    "length": "length",
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}


class ChatStream:
    """The chat-completions encoder for one request (one choice, index 0)."""

    def __init__(
        self,
        *,
        model: str,
        id: str | None = None,
        created: int | None = None,
        include_usage: bool = False,
        logprobs: bool = False,
        emit: bool = True,
    ) -> None:
        self.id = id or completion_id()
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.emit = emit
        self._started = False
        self._content_sent = False  # has any chunk carried a (string) content yet?
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._token_logprobs: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []  # {"id", "name", "arguments": [chunks]}
        self._open = False
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._failure: Refusal | None = None

    # ------------------------------------------------------------------ state

    @property
    def done(self) -> bool:
        return self._finish_reason is not None or self._failure is not None

    # ------------------------------------------------------------------ deltas

    def feed(self, delta: Delta) -> Chunks:
        """Dispatch one `protocol.deltas` object to the matching method."""
        return dispatch(self, delta)

    def feed_all(self, deltas: Iterable[Delta]) -> Chunks:
        out: Chunks = []
        for d in deltas:
            out.extend(self.feed(d))
        return out

    def reasoning(self, text: str) -> Chunks:
        """A piece of thinking text (sent as ``delta.reasoning_content``)."""
        if self.done:
            return []
        out = self._begin(first_is_text=False)
        if text:
            self._reasoning.append(text)
            out.append(self._chunk({"reasoning_content": text}))
        return self._out(out)

    def text(self, text: str, logprobs: Iterable[TokenLogprob] | None = None) -> Chunks:
        """A piece of answer text, with its tokens' logprobs when the request asked."""
        if self.done:
            return []
        out = self._begin(first_is_text=True)
        self._text.append(text)
        lp = None
        if self.logprobs and logprobs:
            wire = [chat_logprob(t) for t in logprobs]
            if wire:
                self._token_logprobs.extend(wire)
                lp = {"content": wire, "refusal": None}
        if text or lp is not None:
            self._content_sent = True
            out.append(self._chunk({"content": text}, logprobs=lp))
        return self._out(out)

    def tool_call_start(self, name: str, call_id: str | None = None) -> Chunks:
        """The model began a call to `name` (`call_id` None: a fresh ``call_`` id)."""
        if self.done:
            return []
        out = self._begin(first_is_text=False)
        self._open = True
        cid = call_id or new_call_id()
        index = len(self._calls)
        self._calls.append({"id": cid, "name": name, "arguments": []})
        call = {"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
        out.append(self._chunk({"tool_calls": [call]}))
        return self._out(out)

    def tool_call_arguments(self, chunk: str) -> Chunks:
        """A piece of the open call's JSON arguments."""
        if self.done:
            return []
        if not self._open:
            raise StreamStateError("tool-call arguments with no tool call open")
        if not chunk:
            return []
        index = len(self._calls) - 1
        self._calls[index]["arguments"].append(chunk)
        return self._out([self._chunk({"tool_calls": [{"index": index, "function": {"arguments": chunk}}]})])

    def tool_call_end(self) -> Chunks:
        """The open call is complete (nothing to send: chat has no call-done chunk)."""
        if self.done:
            return []
        if not self._open:
            raise StreamStateError("tool-call end with no tool call open")
        self._open = False
        return []

    def finish(self, reason: str = "stop", usage: Usage | None = None) -> Chunks:
        """The generation ended: the chunk with ``finish_reason``, then the usage chunk
        when ``include_usage``."""
        if self.done:
            return []
        wire = _REASONS.get(reason)
        if wire is None:
            raise ValueError(f"unknown finish reason {reason!r}")
        if wire == "stop" and self._calls:
            wire = "tool_calls"
        out = self._begin(first_is_text=False)
        self._open = False
        self._finish_reason = wire
        self._usage = usage
        # Content ends up null only for a tool-call answer without text (as OpenAI's).
        last: dict[str, Any] = {}
        if not self._content_sent and not self._calls:
            last = {"content": ""}
            self._content_sent = True
        out.append(self._chunk(last, finish_reason=wire))
        if self.include_usage:
            out.append(self._envelope([], usage=chat_usage(usage)))
        return self._out(out)

    def cancel(self, usage: Usage | None = None) -> Chunks:
        """The client went away: finish as ``stop`` (for logs; there is no one to send to)."""
        return self.finish("cancelled", usage)

    def fail(self, message: str, code: str | None = "server_error", usage: Usage | None = None) -> Chunks:
        """The generation broke: one ``{"error": {...}}`` dict to send."""
        if self.done:
            return []
        self._open = False
        self._usage = usage
        # A failure the request's own output grammar caused is the client's: 400.
        client = code in CLIENT_FAILURE_CODES
        self._failure = Refusal(message, param=None, code=code, type="invalid_request_error" if client else "server_error",
                                status=400 if client else 500)
        return [self._failure.envelope()] if self.emit else []

    # ------------------------------------------------------------------ output

    def completion(self) -> dict[str, Any]:
        """The ``chat.completion`` object (after the end). Raises the `Refusal` of a failure."""
        if self._failure is not None:
            raise self._failure
        if self._finish_reason is None:
            raise StreamStateError("ChatStream.completion() before the end")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text) if self._content_sent else None,
            "refusal": None,
        }
        if self._calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                for c in self._calls
            ]
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        logprobs = {"content": list(self._token_logprobs), "refusal": None} if self._token_logprobs else None
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": self._finish_reason}],
            "usage": chat_usage(self._usage),
        }

    # ------------------------------------------------------------------ helpers

    def _begin(self, *, first_is_text: bool) -> Chunks:
        """The role chunk, before the first delta's own chunk."""
        if self._started:
            return []
        self._started = True
        self._content_sent = first_is_text
        return [self._chunk({"role": "assistant", "content": "" if first_is_text else None, "refusal": None})]

    def _out(self, out: Chunks) -> Chunks:
        return out if self.emit else []

    def _chunk(
        self, delta: dict[str, Any], *, logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        return self._envelope([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])

    def _envelope(self, choices: list[dict[str, Any]], *, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        return chunk


def build_completion(
    deltas: Iterable[Delta],
    *,
    model: str,
    id: str | None = None,
    created: int | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` for a finished delta sequence."""
    stream = ChatStream(model=model, id=id, created=created, logprobs=logprobs, emit=False)
    stream.feed_all(deltas)
    return stream.completion()
