"""POST /v1/chat/completions: a ``chat.completion``, or ``chat.completion.chunk`` SSE
lines ending with ``data: [DONE]``.

The messages go through the same conversation path as /v1/responses (`prepare`), so
the same conversation gives the same prompt tokens and a follow-up through either
endpoint hits the prefix cache. Engine full: 503 with Retry-After.

Deadlines (server.request_timeout for a non-streaming request from its arrival,
server.stream_timeout for a stream from its admission): a stream gets one
``data: {"error": {..., "code": "timeout"}}`` line then ``[DONE]``; a non-streaming
request gets 504 with that error. An engine failure: the same with code
``server_error`` (500), or ``invalid_grammar`` (400) where the request's own output grammar
could not go on (a limit of the grammar engine). Cut by a server shutdown: the same with code
``server_shutting_down`` (503).
"""

from __future__ import annotations

import asyncio
import time

from sanic import HTTPResponse, Request

from ignis.server.context import ServerContext
from ignis.server.errors import json_response, refusal_response
from ignis.engine import SamplingParams
from ignis.server.http_turn import run_turn
from ignis.server.prepare import prepare_chat
from ignis.server.render import Prompt
from ignis.server.sse import SSE_DONE, chat_text
from ignis.server.turn import TurnEnding
from protocol.chat_request import ChatRequest, decode_chat_request_bytes
from protocol.chat_response import ChatStream
from protocol.errors import Refusal

__all__ = ["create_chat_completion"]

_SHUTDOWN = "The server shut down before this completion finished (server.shutdown_grace); retry it."


def _decode_and_prepare(ctx: ServerContext, raw: bytes) -> tuple[ChatRequest, Prompt, SamplingParams]:
    req = ctx.accept(decode_chat_request_bytes(raw))
    prompt, params = prepare_chat(ctx, req)
    return req, prompt, params


async def create_chat_completion(request: Request) -> HTTPResponse | None:
    ctx: ServerContext = request.app.ctx.ignis
    arrival = time.monotonic()
    # Decoding, rendering and tokenizing are CPU work: off the event loop.
    req, prompt, params = await asyncio.to_thread(_decode_and_prepare, ctx, request.body)
    enc = ChatStream(model=req.model, include_usage=req.include_usage, logprobs=req.logprobs, emit=req.stream)
    outcome = await run_turn(request, ctx, endpoint="chat", sse=req.stream, prompt=prompt, params=params,
                             encoder=enc, arrival=arrival, to_text=chat_text, trailer=SSE_DONE,
                             ending=TurnEnding(timeout_code="timeout", abort_error=_SHUTDOWN),
                             single_call=not req.parallel_tool_calls)
    if isinstance(outcome, HTTPResponse):
        return outcome
    if req.stream:
        return None
    try:
        return json_response(enc.completion())
    except Refusal as failure:
        if outcome.status == "timeout":
            failure.status = 504
        elif outcome.status == "cancelled":  # the server shut down before it finished
            failure.status = 503
        return refusal_response(failure)
