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
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ignis.engine import EngineFinish, RequestStream
from ignis.output_parser import OutputParser
from ignis.server.constraints import missing_call_message
from protocol.deltas import Delta, ReasoningDelta, TextDelta, ToolCallEnd
from protocol.events import TokenLogprob
from protocol.response import Usage

__all__ = ["Outcome", "drive", "Emit", "client_closed"]

Emit = Callable[[list[dict[str, Any]]], Awaitable[None]]


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
    )


def client_closed(final: Any, started: float) -> Outcome:
    """How a turn ended whose client went away: its engine final output (ABORT, with the
    usage of every token made for it) read after the fact."""
    return Outcome("client_closed", final.finish_reason, _usage(final, 0), None, None, time.monotonic() - started)


# Per tokenizer: token id -> (text, bytes). A step with top_logprobs names 1 + N ids,
# and decoding each alone on the event loop at every step adds up; at most one entry per
# vocabulary id (<= ~152k). Weak keys: the entry goes with its model's tokenizer.
_PIECES: weakref.WeakKeyDictionary[Any, dict[int, tuple[str, bytes | None]]] = weakref.WeakKeyDictionary()


def _pieces(tokenizer: Any) -> dict[int, tuple[str, bytes | None]]:
    try:
        cache = _PIECES.get(tokenizer)
        if cache is None:
            cache = _PIECES[tokenizer] = {}
    except TypeError:  # a tokenizer that takes no weak reference: no cache
        cache = {}
    return cache


def _token_logprobs(tokenizer: Any, out: Any) -> list[TokenLogprob]:
    """The step's tokens with their logprobs and, when asked, their alternatives. Text:
    the id decoded alone, specials included (OpenAI's token field; part of a UTF-8
    character reads U+FFFD). Bytes: the token's own (`Tokenizer.token_bytes`, for
    byte-level vocabularies; an added token's are its UTF-8), or None where the
    vocabulary has none (the encoder then sends the text's UTF-8)."""
    cache = _pieces(tokenizer)
    token_bytes = tokenizer.token_bytes if getattr(tokenizer, "is_byte_level", False) else None

    def one(t: int, lp: float, alts: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
        piece = cache.get(t)
        if piece is None:
            raw = token_bytes(t) if token_bytes is not None else None
            piece = cache[t] = (tokenizer.decode([t], skip_special_tokens=False), raw)
        return TokenLogprob(piece[0], float(lp), alts, piece[1])

    tops = out.top_logprobs or [()] * len(out.token_ids)
    return [
        one(t, lp, tuple(one(a, alp) for a, alp in top))
        for t, lp, top in zip(out.token_ids, out.logprobs, tops, strict=False)
    ]


class _LogprobRouter:
    """Puts each token's logprob on the `TextDelta` its text ends up in; the tokens of
    reasoning, of tool-call blocks and of dropped whitespace get none (OpenAI reports
    logprobs of output text only).

    Positions are character offsets into the text fed to the parser (the outputs'
    ``text``, concatenated). `add` gives each token a stretch of it, and `attach` puts
    a token on the `TextDelta` that holds the first character of its stretch that is
    answer text (the parser's `text_spans`); a token none of whose stretch is answer
    text gets dropped, as do tokens with no text at the end (a stop token, the tokens
    of a stop string).

    The stretches: an output's text is split among its tokens (and those carried from
    earlier outputs) by their own texts (decoded alone), in order, while those match
    it exactly. A token whose own text ends in an unfinished character (U+FFFD) the
    engine held back also covers the next character (where that character comes).
    Tokens left once the text is used up (their text held back: the rest of a
    character split across tokens, a possible stop string) wait for the next output
    with text. At the first token that does not match, it and the tokens after it
    share the rest of the output's text.

    So it is exact for one token per output (the engine sends one per step) whose text
    alone is its text in the stream, which holds for whole characters and for a
    character split across tokens. The approximation is in the sharing: tokens whose
    text alone differs from their text in context (a SentencePiece word's leading
    space; a special token left out of the text, which goes with the next token) all
    go with the delta of the shared stretch's first answer character, or are all
    dropped when none of it is answer text.
    """

    __slots__ = ("_queue", "_carry", "_pos")

    def __init__(self) -> None:
        # (start, end, token), start and end non-decreasing
        self._queue: deque[tuple[int, int, TokenLogprob]] = deque()
        self._carry: list[TokenLogprob] = []
        self._pos = 0

    def add(self, tokens: list[TokenLogprob], text: str) -> None:
        """One engine output: its tokens and the text it adds to the parser's input."""
        tokens = self._carry + tokens if self._carry else tokens
        self._carry = []
        if not text:
            self._carry = tokens
            return
        start, end = self._pos, self._pos + len(text)
        self._pos = end
        queue = self._queue
        cursor = 0
        for k, t in enumerate(tokens):
            if cursor == len(text):  # text used up: the rest wait for more
                self._carry = tokens[k:]
                return
            piece = t.token
            if piece and text.startswith(piece, cursor):
                queue.append((start + cursor, start + cursor + len(piece), t))
                cursor += len(piece)
            elif piece[-1:] == "\ufffd" and cursor + len(piece) - 1 == len(text) and text.startswith(piece[:-1], cursor):
                queue.append((start + cursor, end + 1, t))  # and the held-back character
                cursor = len(text)
            else:
                queue.extend((start + cursor, end, u) for u in tokens[k:])
                return

    def attach(self, deltas: list[Delta], spans: list[tuple[int, int]]) -> list[Delta]:
        """`deltas` (one feed's, coalesced) with the logprobs of their answer tokens; `spans`:
        the parser's `text_spans` for them (their texts are the `TextDelta`s', in order)."""
        queue = self._queue
        spans_iter = iter(spans)
        out: list[Delta] = []
        for d in deltas:
            if type(d) is not TextDelta:
                out.append(d)
                continue
            need = len(d.text)
            lps: list[TokenLogprob] = []
            while need > 0:
                s, e = next(spans_iter, (0, 0))
                if e <= s:  # (no span left: cannot happen with OutputParser)
                    break
                need -= e - s
                while queue and queue[0][0] < e:
                    _, t_end, t = queue.popleft()
                    if t_end > s:  # some of it is in this span: its first answer char
                        lps.append(t)
                    # else: all of it before this span and in no earlier one: not answer
            out.append(TextDelta(d.text, tuple(lps)) if lps else d)
        return out

    def settle(self, offset: int) -> None:
        """Drop the tokens that end before `offset` (the parser's `settled`): their text
        was emitted or dropped, and what was answer text took them already."""
        queue = self._queue
        while queue and queue[0][1] <= offset:
            queue.popleft()


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
    single_call: bool = False,
) -> Outcome:
    """Consume `stream` to its end, emitting events as they come; return how it ended.

    `single_call` (``parallel_tool_calls: false``): the output ends with the first tool
    call: nothing the model writes after it is emitted, and the engine stops there."""
    ttft: float | None = None
    cut = False  # single_call: the first call has ended; the rest is dropped
    router = _LogprobRouter() if logprobs else None
    reasoning_tokens = 0
    in_reasoning = parser.config.reasoning and parser.config.starts_in_reasoning
    final = None
    async for out in stream:
        if out.token_ids and ttft is None:
            ttft = time.monotonic() - started
        deltas = parser.feed(out.text) if out.text else []
        if router is not None:
            router.add(_token_logprobs(tokenizer, out) if out.logprobs else [], out.text)
            if deltas:
                deltas = router.attach(deltas, parser.text_spans)
            router.settle(parser.settled)
        if out.finished:
            final = out
            if out.finish_reason is not EngineFinish.ERROR:
                tail = parser.finish()
                deltas += router.attach(tail, parser.text_spans) if router is not None else tail
        if single_call and deltas:
            if cut:
                deltas = []
            else:
                end = next((k for k, d in enumerate(deltas) if type(d) is ToolCallEnd), None)
                if end is not None:
                    deltas, cut = deltas[: end + 1], True
                    if not out.finished:
                        stream.abort()  # ends with ABORT, read below as the call's STOP
        if deltas:
            in_reasoning = all(type(d) is ReasoningDelta for d in deltas)
        if in_reasoning:
            reasoning_tokens += len(out.token_ids)
        events: list[dict[str, Any]] = []
        for d in deltas:
            events += encoder.feed(d)
        if final is not None:
            break
        if events:
            await emit(events)
    else:  # the stream ended without a final output (cannot happen with RequestStream)
        events = []
    reason = final.finish_reason if final is not None else EngineFinish.ERROR
    if cut and reason is EngineFinish.ABORT:
        reason = EngineFinish.STOP
    usage = _usage(final, reasoning_tokens)
    error = None
    required = parser.config.required_tools
    if reason is EngineFinish.STOP and required and not any(n in required for n in parser.call_names):
        # tool_choice demanded a call (its start was forced) and none came out valid:
        # the model's malformed block is text, and the response must not pass for a call.
        status = "failed"
        error = missing_call_message(required)
        events += encoder.fail(error, "server_error", usage)
    elif reason is EngineFinish.STOP or reason is EngineFinish.PREWARM:
        status = "completed"
        events += encoder.finish("tool_calls" if parser.saw_tool_call else "stop", usage)
    elif reason is EngineFinish.LENGTH:
        status = "incomplete"
        events += encoder.finish("length", usage)
    elif reason is EngineFinish.ABORT:
        status = "cancelled"
        if abort_error is None:
            events += encoder.cancel(usage)
        else:  # an encoder with no cancelled ending (chat): a failure saying why
            error = abort_error
            events += encoder.fail(abort_error, "server_shutting_down", usage)
    elif reason is EngineFinish.DEADLINE:
        status, error = "timeout", timeout_message
        events += encoder.fail(timeout_message, timeout_code, usage)
    else:
        status = "failed"
        error = (final.error if final is not None else None) or "The engine failed this request."
        events += encoder.fail(f"The engine failed this request: {error}", "server_error", usage)
    if events:
        await emit(events)
    return Outcome(status, reason, usage, error, ttft, time.monotonic() - started)
