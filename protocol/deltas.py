"""Semantic deltas: what the output parser says happened, one token (or a few) at a time.

The engine's output parser speaks in these (or calls the matching
`ResponseStream` methods directly); `ResponseStream.feed` turns each into events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

from protocol.events import TokenLogprob
from protocol.response import Usage

__all__ = [
    "ReasoningDelta",
    "TextDelta",
    "ToolCallStart",
    "ToolCallArguments",
    "ToolCallEnd",
    "Finish",
    "Failure",
    "Delta",
    "FinishReason",
    "dispatch",
]

FinishReason = Literal["stop", "tool_calls", "length", "max_output_tokens", "content_filter", "cancelled"]


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    name: str
    call_id: str | None = None  # None: a fresh call_... id


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    chunk: str


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    pass


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason = "stop"
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    message: str
    code: str = "server_error"
    usage: Usage | None = None


Delta = Union[ReasoningDelta, TextDelta, ToolCallStart, ToolCallArguments, ToolCallEnd, Finish, Failure]


def dispatch(sink: Any, delta: Delta) -> Any:
    """Call the `sink` method that matches `delta` (the Responses and chat streams share
    these method names) and return what it returns."""
    t = type(delta)
    if t is TextDelta:
        return sink.text(delta.text, delta.logprobs)
    if t is ReasoningDelta:
        return sink.reasoning(delta.text)
    if t is ToolCallArguments:
        return sink.tool_call_arguments(delta.chunk)
    if t is ToolCallStart:
        return sink.tool_call_start(delta.name, delta.call_id)
    if t is ToolCallEnd:
        return sink.tool_call_end()
    if t is Finish:
        return sink.finish(delta.reason, delta.usage)
    if t is Failure:
        return sink.fail(delta.message, delta.code, delta.usage)
    raise TypeError(f"not a delta: {delta!r}")
