"""POST /v1/chat/completions: a ``chat.completion``, or ``chat.completion.chunk`` SSE
lines ending with ``data: [DONE]``.

The messages go through the same conversation path as /v1/responses (`render`), so
the same conversation gives the same prompt tokens and a follow-up through either
endpoint hits the prefix cache. Engine full: 503 with Retry-After.

Deadlines (server.request_timeout for a non-streaming request from its arrival,
server.stream_timeout for a stream from its admission): a stream gets one
``data: {"error": {..., "code": "timeout"}}`` line then ``[DONE]``; a non-streaming
request gets 504 with that error. An engine failure: the same with code
``server_error`` (500).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sanic import HTTPResponse, Request

from ignis.output_parser import OutputParser
from ignis.server.access import log_outcome
from ignis.server.context import ServerContext
from ignis.server.errors import json_response, overloaded, refusal_response
from ignis.server.generation import drive
from ignis.server.responses_http import timeout_message
from ignis.server.sampling import engine_params
from ignis.server.sse import SSE_DONE, chat_text, open_sse
from protocol.chat_request import decode_chat_request_bytes
from protocol.chat_response import ChatStream
from protocol.errors import Refusal

__all__ = ["create_chat_completion"]

log = logging.getLogger("ignis.server")


def _decode_and_prepare(ctx: ServerContext, raw: bytes) -> tuple[Any, Any, Any]:
    req = decode_chat_request_bytes(raw)
    ctx.check_model(req.model)
    prompt = ctx.renderer.render(req.messages, req.tools, req.tool_choice, thinking=req.sampling.thinking,
                                 param="messages")
    params = engine_params(req.sampling, prompt_len=len(prompt.ids), max_model_len=ctx.max_model_len,
                           logprobs=req.logprobs, param="messages")
    return req, prompt, params


async def create_chat_completion(request: Request) -> HTTPResponse | None:
    ctx: ServerContext = request.app.ctx.ignis
    arrival = time.monotonic()
    # Decoding, rendering and tokenizing are CPU work: off the event loop.
    req, prompt, params = await asyncio.to_thread(_decode_and_prepare, ctx, request.body)
    live = ctx.live
    if req.stream:
        limit = ctx.seconds(live.stream_timeout)
        timing: dict[str, Any] = {"timeout": limit}
        message = timeout_message("stream_timeout", limit)
    else:
        limit = ctx.seconds(live.request_timeout)
        timing = {"deadline": arrival + limit if limit else None}
        message = timeout_message("request_timeout", limit)
    stream = ctx.admission.try_now(prompt.ids, params, **timing)
    if stream is None:
        ctx.metrics.refused("chat", 503)
        return overloaded(ctx.cfg.retry_after)
    enc = ChatStream(model=req.model, include_usage=req.include_usage, logprobs=req.logprobs, emit=req.stream)
    parser = OutputParser(prompt.parser)
    kw = dict(tokenizer=ctx.loaded.tokenizer, started=arrival, logprobs=params.logprobs, timeout_message=message,
              timeout_code="timeout")
    try:
        async with stream:
            if req.stream:
                resp = await open_sse(request)

                async def emit(chunks: list[dict[str, Any]]) -> None:
                    await resp.send(chat_text(chunks))

                outcome = await drive(stream, parser, enc, emit, **kw)
                await resp.send(SSE_DONE)
                await resp.eof()
            else:
                outcome = await drive(stream, parser, enc, _discard, **kw)
    except asyncio.CancelledError:
        if ctx.cfg.access_log:
            log.info("POST /v1/chat/completions %s: client went away; aborted", enc.id)
        raise
    ctx.metrics.finished("chat", "sse" if req.stream else "http", outcome, time.monotonic() - arrival)
    log_outcome("POST /v1/chat/completions", enc.id, outcome, enabled=ctx.cfg.access_log)
    if req.stream:
        return None
    try:
        return json_response(enc.completion())
    except Refusal as failure:
        if outcome.status == "timeout":
            failure.status = 504
        return refusal_response(failure)


async def _discard(events: list[dict[str, Any]]) -> None:
    return None
