"""POST /v1/responses: a JSON response object, or server-sent events with stream: true.

Body -> `protocol.decode.decode_request` (refusals are 4xx with a param) -> the shared
conversation path (`prepare`) -> engine, or 503 with Retry-After when it has no room
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
import time

from sanic import HTTPResponse, Request

from ignis.server.context import ServerContext
from ignis.server.errors import json_response
from ignis.server.http_turn import run_turn
from ignis.engine import SamplingParams
from ignis.server.prepare import prepare_response
from ignis.server.render import Prompt
from ignis.server.sse import responses_text
from protocol.decode import decode_json, decode_request
from protocol.request import ResponsesRequest
from protocol.stream import ResponseStream

__all__ = ["create_response"]


def _decode_and_prepare(ctx: ServerContext, raw: bytes) -> tuple[ResponsesRequest, Prompt, SamplingParams | None]:
    req = ctx.accept(decode_request(decode_json(raw), transport="http", reasoning_key=ctx.reasoning_key))
    prompt, params = prepare_response(ctx, req)
    return req, prompt, params


async def create_response(request: Request) -> HTTPResponse | None:
    ctx: ServerContext = request.app.ctx.ignis
    arrival = time.monotonic()
    # Decoding, rendering and tokenizing are CPU work: off the event loop.
    req, prompt, params = await asyncio.to_thread(_decode_and_prepare, ctx, request.body)
    enc = ResponseStream(req, reasoning_key=ctx.reasoning_key, emit=req.stream)
    outcome = await run_turn(request, ctx, endpoint="responses", sse=req.stream, prompt=prompt, params=params,
                             encoder=enc, arrival=arrival, to_text=responses_text, start=enc.start,
                             single_call=not req.parallel_tool_calls)
    if isinstance(outcome, HTTPResponse):
        return outcome
    return None if req.stream else json_response(enc.response)
