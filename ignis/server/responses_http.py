"""POST /v1/responses: a JSON response object, or server-sent events with stream: true.

Body -> `protocol.decode.decode_request` (refusals are 4xx with a param) -> the shared
conversation path (`render`) -> engine, or 503 with Retry-After when it has no room
(HTTP does not queue; the socket does). ``previous_response_id`` is refused over HTTP
(ignis stores no responses; clients resend the history, as Codex does).

Deadlines: a non-streaming request must finish within server.request_timeout of its
arrival, a streaming one within server.stream_timeout of its admission. Past it the
response ends with ``response.failed`` (error.code ``server_error``, message
"Timed out: ...") and keeps the output made so far; a non-streaming request returns
that failed response object with status 200, as it returns any finished response.
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
from ignis.server.errors import json_response, overloaded
from ignis.server.generation import drive
from ignis.server.sampling import check_context, engine_params
from ignis.server.sse import open_sse, responses_text
from protocol.decode import decode_json, decode_request
from protocol.request import ResponsesRequest
from protocol.responses_conversation import to_conversation
from protocol.stream import ResponseStream

__all__ = ["create_response", "prepare", "timeout_message"]

log = logging.getLogger("ignis.server")


def timeout_message(key: str, limit: float | None) -> str:
    if key == "request_timeout":
        return f"Timed out: the request did not finish within server.request_timeout ({limit or 0:g} s)."
    return f"Timed out: the response did not finish within server.stream_timeout ({limit or 0:g} s) of its admission."


def prepare(ctx: ServerContext, request: ResponsesRequest, *, generation: bool = True) -> tuple[Any, Any]:
    """(Prompt, SamplingParams) for a decoded request whose input is the whole conversation."""
    conv = to_conversation(request)
    limit = ctx.max_model_len - (1 if generation else 0)
    prompt = ctx.renderer.render(
        conv.messages, conv.tools, conv.tool_choice,
        thinking=request.sampling.thinking, generation=generation, param="input",
        max_tokens=limit, truncate=request.truncation == "auto",
    )
    if not generation:
        check_context(len(prompt.ids), ctx.max_model_len, "input", prewarm=True)
        return prompt, None
    params = engine_params(
        request.sampling, prompt_len=len(prompt.ids), max_model_len=ctx.max_model_len,
        logprobs=request.include_logprobs or bool(request.top_logprobs), param="input",
    )
    return prompt, params


def _decode_and_prepare(ctx: ServerContext, raw: bytes) -> tuple[ResponsesRequest, Any, Any]:
    req = decode_request(decode_json(raw), transport="http", reasoning_key=ctx.reasoning_key)
    ctx.check_model(req.model)
    prompt, params = prepare(ctx, req)
    return req, prompt, params


async def create_response(request: Request) -> HTTPResponse | None:
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
        ctx.metrics.refused("responses", 503)
        return overloaded(ctx.cfg.retry_after)
    enc = ResponseStream(req, reasoning_key=ctx.reasoning_key, emit=req.stream)
    parser = OutputParser(prompt.parser)
    kw = dict(tokenizer=ctx.loaded.tokenizer, started=arrival, logprobs=params.logprobs, timeout_message=message)
    try:
        async with stream:
            if req.stream:
                resp = await open_sse(request)

                async def emit(events: list[dict[str, Any]]) -> None:
                    await resp.send(responses_text(events))

                await emit(enc.start())
                outcome = await drive(stream, parser, enc, emit, **kw)
                await resp.eof()
            else:
                outcome = await drive(stream, parser, enc, _discard, **kw)
    except asyncio.CancelledError:
        if ctx.cfg.access_log:
            log.info("POST /v1/responses %s: client went away; aborted", enc.id)
        raise
    ctx.metrics.finished("responses", "sse" if req.stream else "http", outcome, time.monotonic() - arrival)
    log_outcome("POST /v1/responses", enc.id, outcome, enabled=ctx.cfg.access_log)
    if req.stream:
        return None
    return json_response(enc.response)


async def _discard(events: list[dict[str, Any]]) -> None:
    return None
