"""One turn, transport-neutral: engine outputs -> output parser -> deltas -> encoder events.

HTTP (`http_turn.run_turn`, JSON and SSE) and the socket (`socket_session`) both run a
turn through `drive`. The encoder is an `Encoder`: `protocol.stream.ResponseStream`
or `protocol.chat_response.ChatStream`; `emit` writes a batch of events (SSE lines,
socket frames, or nothing when building a JSON body).

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
from typing import Any, Protocol

from ignis.engine import EngineFinish, RequestOutput, RequestStream
from ignis.engine.grammar import is_grammar_failure
from ignis.model.tokenizer import Tokenizer
from ignis.server.chat_formats import OutputReader
from ignis.server.logprobs import LogprobRouter, token_logprobs
from ignis.server.tool_forcing import missing_call_message
from protocol.deltas import Delta, ReasoningDelta, ToolCallEnd
from protocol.response import Usage

__all__ = ["Encoder", "Emit", "Outcome", "TurnEnding", "client_closed", "drive", "timeout_message"]

Event = dict[str, Any]
Emit = Callable[[list[Event]], Awaitable[None]]


class Encoder(Protocol):
    """What a turn writes its output through: one response (Responses) or completion
    (chat), as wire events. Each call returns the events it produced, in order."""

    id: str

    def feed(self, delta: Delta) -> list[Event]: ...

    def finish(self, reason: str = "stop", usage: Usage | None = None) -> list[Event]: ...

    def cancel(self, usage: Usage | None = None) -> list[Event]: ...

    def fail(self, message: str, code: str = "server_error", usage: Usage | None = None) -> list[Event]: ...


@dataclass(frozen=True)
class TurnEnding:
    """How a transport words the endings that differ between them."""

    timeout_message: str = "Timed out."
    timeout_code: str = "server_error"  # chat: "timeout"
    abort_error: str | None = None  # an encoder with no cancelled ending (chat): fail with this


def timeout_message(key: str, limit: float | None) -> str:
    """The message of a turn past its deadline; `key` names the server setting."""
    if key == "request_timeout":
        return f"Timed out: the request did not finish within server.request_timeout ({limit or 0:g} s)."
    return f"Timed out: the response did not finish within server.stream_timeout ({limit or 0:g} s) of its admission."


@dataclass
class Outcome:
    status: str  # completed | incomplete | cancelled | failed | timeout | client_closed
    finish: EngineFinish | None
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
        accepted_prediction_tokens=u.accepted_draft_tokens,
        rejected_prediction_tokens=u.draft_tokens - u.accepted_draft_tokens,
    )


def client_closed(final: Any, started: float) -> Outcome:
    """How a turn ended whose client went away: its engine final output (ABORT, with the
    usage of every token made for it) read after the fact."""
    return Outcome("client_closed", final.finish_reason, _usage(final, 0), None, None, time.monotonic() - started)


def _parse(out: RequestOutput, parser: OutputReader, router: LogprobRouter | None, tokenizer: Tokenizer) -> list[Delta]:
    """One engine output's deltas (the parser's tail too when it is the final one), with
    each answer token's logprob on the text it ends up in."""
    # Token ids too: a format may read its special tokens (harmony), which are no text.
    deltas = parser.feed_output(out.text, out.token_ids) if out.text or out.token_ids else []
    if router is not None:
        router.add(token_logprobs(tokenizer, out) if out.logprobs else [], out.text)
        if deltas:
            deltas = router.attach(deltas, parser.text_spans)
        router.settle(parser.settled)
    if out.finished and out.finish_reason is not EngineFinish.ERROR:
        tail = parser.finish()
        deltas += router.attach(tail, parser.text_spans) if router is not None else tail
    return deltas


def _through_first_call(deltas: list[Delta]) -> tuple[list[Delta], bool]:
    """`deltas` up to and including the first call's end, and whether one ended."""
    end = next((k for k, d in enumerate(deltas) if type(d) is ToolCallEnd), None)
    return (deltas, False) if end is None else (deltas[: end + 1], True)


def _end(final: RequestOutput | None, reason: EngineFinish, parser: OutputReader, encoder: Encoder, usage: Usage,
         ending: TurnEnding) -> tuple[str, str | None, list[Event]]:
    """(status, error, terminal events) for the engine's finish reason (the table above)."""
    required = parser.config.required_tools
    if reason is EngineFinish.STOP and required and not any(n in required for n in parser.call_names):
        # tool_choice demanded a call (its start was forced) and none came out valid:
        # the model's malformed block is text, and the response must not pass for a call.
        error = missing_call_message(required)
        return "failed", error, encoder.fail(error, "server_error", usage)
    if reason is EngineFinish.STOP or reason is EngineFinish.PREWARM:
        return "completed", None, encoder.finish("tool_calls" if parser.saw_tool_call else "stop", usage)
    if reason is EngineFinish.LENGTH:
        return "incomplete", None, encoder.finish("length", usage)
    if reason is EngineFinish.ABORT:
        if ending.abort_error is None:
            return "cancelled", None, encoder.cancel(usage)
        return "cancelled", ending.abort_error, encoder.fail(ending.abort_error, "server_shutting_down", usage)
    if reason is EngineFinish.DEADLINE:
        return "timeout", ending.timeout_message, encoder.fail(ending.timeout_message, ending.timeout_code, usage)
    error = (final.error if final is not None else None) or "The engine failed this request."
    # The request's own grammar (a limit of the grammar engine, nothing allowed): the client's
    # to fix, a 400 where the endpoint has a status to give (chat completions).
    code = "invalid_grammar" if is_grammar_failure(error) else "server_error"
    return "failed", error, encoder.fail(f"The engine failed this request: {error}", code, usage)


async def drive(
    stream: RequestStream,
    parser: OutputReader,
    encoder: Encoder,
    emit: Emit,
    *,
    tokenizer: Tokenizer,
    started: float,
    logprobs: bool = False,
    ending: TurnEnding = TurnEnding(),
    single_call: bool = False,
) -> Outcome:
    """Consume `stream` to its end, emitting events as they come; return how it ended.

    `single_call` (``parallel_tool_calls: false``): the output ends with the first tool
    call: nothing the model writes after it is emitted, and the engine stops there."""
    ttft: float | None = None
    cut = False  # single_call: the first call has ended; the rest is dropped
    router = LogprobRouter() if logprobs else None
    reasoning_tokens = 0
    in_reasoning = parser.config.reasoning and parser.config.starts_in_reasoning
    final = None
    events: list[Event] = []
    async for out in stream:
        if out.token_ids and ttft is None:
            ttft = time.monotonic() - started
        deltas = _parse(out, parser, router, tokenizer)
        if single_call and deltas:
            if cut:
                deltas = []
            else:
                deltas, cut = _through_first_call(deltas)
                if cut and not out.finished:
                    stream.abort()  # ends with ABORT, read below as the call's STOP
        if deltas:
            in_reasoning = all(type(d) is ReasoningDelta for d in deltas)
        if in_reasoning:
            reasoning_tokens += len(out.token_ids)
        events = [e for d in deltas for e in encoder.feed(d)]
        if out.finished:
            final = out
            break
        if events:
            await emit(events)
            events = []
    reason = final.finish_reason if final is not None else EngineFinish.ERROR
    if cut and reason is EngineFinish.ABORT:
        reason = EngineFinish.STOP
    usage = _usage(final, reasoning_tokens)
    status, error, terminal = _end(final, reason, parser, encoder, usage, ending)
    events += terminal
    if events:
        await emit(events)
    return Outcome(status, reason, usage, error, ttft, time.monotonic() - started)
