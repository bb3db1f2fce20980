"""Drive one admitted request: engine outputs -> output parser -> deltas -> encoder events.

The same loop serves every transport. The encoder is `protocol.stream.ResponseStream`
or `protocol.chat_response.ChatStream` (same interface); `emit` writes a batch of
events (SSE lines, socket frames, or nothing when building a JSON body).

How the engine's finish reasons end a response:

=============  ==========================================================================
engine         response
=============  ==========================================================================
STOP           completed (chat ``stop``, or ``tool_calls`` when the parser saw a call);
               failed, ``server_error``, when tool_choice demanded a call and the output
               holds no valid call to a required tool (chat: an error chunk / 500)
LENGTH         incomplete, ``max_output_tokens`` (own limit or the end of the context)
PREWARM        completed, no output (``generate: false``)
ABORT          cancelled (``response.cancel``, or the server shutting down); chat, which
               has no cancelled ending: an error chunk / 503, ``server_shutting_down``
DEADLINE       failed, ``server_error`` "Timed out: ..." (the SDK's error codes are a
               closed set); chat: an error chunk / 504, code ``timeout``
ERROR          failed, ``server_error`` with the engine's message (this request only)
=============  ==========================================================================
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ignis.engine import FinishReason, RequestStream
from ignis.output_parser import OutputParser
from ignis.server.constraints import missing_call_message
from protocol.deltas import ReasoningDelta, TextDelta
from protocol.events import TokenLogprob
from protocol.response import Usage

__all__ = ["Outcome", "drive", "Emit"]

Emit = Callable[[list[dict[str, Any]]], Awaitable[None]]


@dataclass
class Outcome:
    status: str  # completed | incomplete | cancelled | failed | timeout
    finish: FinishReason | None
    usage: Usage
    error: str | None = None
    ttft: float | None = None  # seconds from `started` to the first output token
    elapsed: float = 0.0


def _usage(out: Any, reasoning_tokens: int) -> Usage:
    u = out.usage if out is not None else None
    if u is None:
        return Usage()
    kept = max(0, u.output_tokens - u.rewound_tokens)
    return Usage(
        input_tokens=u.prompt_tokens,
        output_tokens=kept,
        cached_tokens=u.cached_tokens,
        reasoning_tokens=min(reasoning_tokens, kept),
        rewound_tokens=u.rewound_tokens,
    )


def _token_logprobs(tokenizer: Any, out: Any) -> list[TokenLogprob]:
    """The step's tokens with their logprobs and, when asked, their alternatives: each
    token's text is its own id decoded alone, specials included (OpenAI's token field)."""
    def text(t: int) -> str:
        return tokenizer.decode([t], skip_special_tokens=False)

    tops = out.top_logprobs or [()] * len(out.token_ids)
    return [
        TokenLogprob(text(t), float(lp), tuple((text(a), float(alp)) for a, alp in top))
        for t, lp, top in zip(out.token_ids, out.logprobs, tops, strict=False)
    ]


async def drive(
    stream: RequestStream,
    parser: OutputParser,
    encoder: Any,
    emit: Emit,
    *,
    tokenizer: Any,
    started: float,
    logprobs: bool = False,
    timeout_message: str = "Timed out.",
    timeout_code: str = "server_error",
    abort_error: str | None = None,
) -> Outcome:
    """Consume `stream` to its end, emitting events as they come; return how it ended."""
    ttft: float | None = None
    pending_lps: list[TokenLogprob] = []
    reasoning_tokens = 0
    in_reasoning = parser.config.reasoning and parser.config.starts_in_reasoning
    final = None
    async for out in stream:
        if out.token_ids and ttft is None:
            ttft = time.monotonic() - started
        if logprobs and out.logprobs:
            pending_lps.extend(_token_logprobs(tokenizer, out))
        deltas = parser.feed(out.text) if out.text else []
        if out.finished:
            final = out
            if out.finish_reason is not FinishReason.ERROR:
                deltas += parser.finish()
        if deltas:
            in_reasoning = all(type(d) is ReasoningDelta for d in deltas)
        if in_reasoning:
            reasoning_tokens += len(out.token_ids)
        events: list[dict[str, Any]] = []
        for d in deltas:
            if pending_lps and type(d) is TextDelta:
                d = TextDelta(d.text, tuple(pending_lps))
                pending_lps = []
            events += encoder.feed(d)
        if final is not None:
            break
        if events:
            await emit(events)
    else:  # the stream ended without a final output (cannot happen with RequestStream)
        events = []
    reason = final.finish_reason if final is not None else FinishReason.ERROR
    usage = _usage(final, reasoning_tokens)
    error = None
    required = parser.config.required_tools
    if reason is FinishReason.STOP and required and not any(n in required for n in parser.call_names):
        # tool_choice demanded a call (its start was forced) and none came out valid:
        # the model's malformed block is text, and the response must not pass for a call.
        status = "failed"
        error = missing_call_message(required)
        events += encoder.fail(error, "server_error", usage)
    elif reason is FinishReason.STOP or reason is FinishReason.PREWARM:
        status = "completed"
        events += encoder.finish("tool_calls" if parser.saw_tool_call else "stop", usage)
    elif reason is FinishReason.LENGTH:
        status = "incomplete"
        events += encoder.finish("length", usage)
    elif reason is FinishReason.ABORT:
        status = "cancelled"
        if abort_error is None:
            events += encoder.cancel(usage)
        else:  # an encoder with no cancelled ending (chat): a failure saying why
            error = abort_error
            events += encoder.fail(abort_error, "server_shutting_down", usage)
    elif reason is FinishReason.DEADLINE:
        status, error = "timeout", timeout_message
        events += encoder.fail(timeout_message, timeout_code, usage)
    else:
        status = "failed"
        error = (final.error if final is not None else None) or "The engine failed this request."
        events += encoder.fail(f"The engine failed this request: {error}", "server_error", usage)
    if events:
        await emit(events)
    return Outcome(status, reason, usage, error, ttft, time.monotonic() - started)
