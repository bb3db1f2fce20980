"""POST /v1/responses/compact: the served model summarises a conversation
(`protocol.compaction`); the answer is a ``response.compaction`` object whose output
(the user messages and one ``compaction`` item) the client sends back as input.

The summary is one generation through the HTTP turn (`http_turn.run_turn`: the same
deadline, admission or 503, access line and metrics as a non-streaming response). A
generation that fails is a 500 (``server_error``); one cut by its token limit keeps
what it wrote.
"""

from __future__ import annotations

import asyncio
import time

from sanic import HTTPResponse, Request

from ignis.engine import SamplingParams
from ignis.server.context import ServerContext
from ignis.server.errors import json_response, refusal_response
from ignis.server.http_turn import run_turn
from ignis.server.prepare import prepare_response
from ignis.server.render import Prompt
from ignis.server.sse import responses_text
from protocol.compaction import CompactRequest, compacted, decode_compact_request, summary_request
from protocol.decode import decode_json
from protocol.errors import Refusal
from protocol.items import Message
from protocol.request import ResponsesRequest
from protocol.response import Usage
from protocol.stream import ResponseStream

__all__ = ["compact_response"]


def _decode_and_prepare(ctx: ServerContext, raw: bytes) -> tuple[CompactRequest, ResponsesRequest, Prompt,
                                                                  SamplingParams | None]:
    compact = decode_compact_request(decode_json(raw), reasoning_key=ctx.reasoning_key)
    compact = CompactRequest(ctx.accept(compact.request))
    req = summary_request(compact, ctx.cfg.max_output_tokens)
    prompt, params = prepare_response(ctx, req)
    return compact, req, prompt, params


async def compact_response(request: Request) -> HTTPResponse:
    ctx: ServerContext = request.app.ctx.ignis
    arrival = time.monotonic()
    compact, req, prompt, params = await asyncio.to_thread(_decode_and_prepare, ctx, request.body)
    enc = ResponseStream(req, reasoning_key=ctx.reasoning_key, emit=False)
    outcome = await run_turn(request, ctx, endpoint="responses", sse=False, prompt=prompt, params=params,
                             encoder=enc, arrival=arrival, to_text=responses_text)
    if isinstance(outcome, HTTPResponse):
        return outcome
    if enc.status in ("failed", "cancelled"):
        error = (enc.response.get("error") or {}).get("message") or "The summary could not be written."
        return refusal_response(Refusal(f"Compaction failed: {error}", code="server_error", type="server_error",
                                        status=500))
    summary = "".join(item.text for item in enc.output_items if isinstance(item, Message))
    usage = Usage(outcome.usage.input_tokens, outcome.usage.output_tokens, outcome.usage.cached_tokens)
    return json_response(compacted(compact, summary, usage, key=ctx.reasoning_key, response_id=enc.id))
