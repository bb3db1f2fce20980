"""One generation turn over HTTP, shared by /v1/responses and /v1/chat/completions.

The deadline (server.request_timeout from arrival for JSON, server.stream_timeout from
admission for SSE), admission or a 503, the engine stream driven into the endpoint's
encoder (as SSE lines or silently for the final JSON body), and the metrics and
access-log line of how it ended. The routes keep only decoding and their final body.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sanic import HTTPResponse, Request

from ignis.engine import SamplingParams
from ignis.server.access import log_client_closed, log_outcome
from ignis.server.context import ServerContext
from ignis.server.errors import overloaded, refusal_response, shutting_down
from ignis.server.render import Prompt
from ignis.server.sse import open_sse
from ignis.server.turn import Emit, Encoder, Event, Outcome, TurnEnding, client_closed, drive, timeout_message

log = logging.getLogger("ignis.server")


async def _discard(events: list[Event]) -> None:
    return None


def _sender(resp: Any, to_text: Callable[[list[Event]], str]) -> Emit:
    """Events written to an open SSE response as `to_text` frames them."""
    async def emit(events: list[Event]) -> None:
        await resp.send(to_text(events))

    return emit


def _deadline(ctx: ServerContext, sse: bool, arrival: float) -> tuple[str, float | None, dict[str, Any]]:
    """(setting, seconds, admission timing): a stream's limit counts from admission, a
    JSON request's from arrival."""
    if sse:
        limit = ctx.seconds(ctx.live.stream_timeout)
        return "stream_timeout", limit, {"timeout": limit}
    limit = ctx.seconds(ctx.live.request_timeout)
    return "request_timeout", limit, {"deadline": arrival + limit if limit else None}


async def run_turn(
    request: Request,
    ctx: ServerContext,
    *,
    endpoint: str,
    sse: bool,
    prompt: Prompt,
    params: SamplingParams,
    encoder: Encoder,
    arrival: float,
    to_text: Callable[[list[Event]], str],
    start: Callable[[], list[Event]] | None = None,
    trailer: str | None = None,
    ending: TurnEnding = TurnEnding(),
    single_call: bool = False,
) -> Outcome | HTTPResponse:
    """Run the turn; an HTTPResponse (a 503) when the engine has no room or the server
    is shutting down. Over HTTP the engine aborts a turn only when the server shuts down
    (a client that went away is not answered): `ending.abort_error`, when given, ends it
    as a failure with that message (chat has no cancelled ending) instead of cancelled.
    `ending`'s timeout message is this function's (it knows the deadline)."""
    if ctx.draining:
        ctx.metrics.refused(endpoint, 503)
        retry = ctx.cfg.retry_after
        return refusal_response(shutting_down(retry), headers={"Retry-After": str(retry)})
    key, limit, timing = _deadline(ctx, sse, arrival)
    stream = ctx.admission.try_now(prompt.ids, params, **timing)
    if stream is None:
        ctx.metrics.refused(endpoint, 503)
        return overloaded(ctx.cfg.retry_after)
    ending = replace(ending, timeout_message=timeout_message(key, limit))
    transport = "sse" if sse else "http"
    ctx.http_streams.add(stream)
    try:
        async with stream:
            resp = await open_sse(request) if sse else None
            emit: Emit = _discard if resp is None else _sender(resp, to_text)
            if resp is not None and start is not None:
                await emit(start())
            outcome = await drive(stream, prompt.output_parser(), encoder, emit, tokenizer=ctx.loaded.tokenizer,
                                  started=arrival, logprobs=params.logprobs, ending=ending, single_call=single_call)
            if resp is not None:
                if trailer is not None:
                    await resp.send(trailer)
                await resp.eof()
    except asyncio.CancelledError:
        # The client went away (Sanic cancels the handler): the stream's exit aborted the
        # engine side; its final output, when it comes, is counted and logged as a 499.
        request.ctx.client_closed = True

        def gone(final: Any) -> None:
            outcome = client_closed(final, arrival)
            ctx.metrics.finished(endpoint, transport, outcome, outcome.elapsed)
            log_client_closed(request, encoder.id, outcome, enabled=ctx.cfg.access_log)

        stream.on_final(gone)
        raise
    finally:
        ctx.http_streams.discard(stream)
    ctx.metrics.finished(endpoint, transport, outcome, time.monotonic() - arrival)
    log_outcome(f"{request.method} {request.path}", encoder.id, outcome, enabled=ctx.cfg.access_log)
    return outcome
