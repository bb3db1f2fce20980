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
from typing import Any

from sanic import HTTPResponse, Request

from ignis.output_parser import OutputParser
from ignis.server.access import log_client_closed, log_outcome
from ignis.server.context import ServerContext
from ignis.server.errors import overloaded, refusal_response, shutting_down
from ignis.server.generation import Outcome, client_closed, drive
from ignis.server.sse import open_sse

log = logging.getLogger("ignis.server")


def timeout_message(key: str, limit: float | None) -> str:
    if key == "request_timeout":
        return f"Timed out: the request did not finish within server.request_timeout ({limit or 0:g} s)."
    return f"Timed out: the response did not finish within server.stream_timeout ({limit or 0:g} s) of its admission."


async def _discard(events: list[dict[str, Any]]) -> None:
    return None


async def run_turn(
    request: Request,
    ctx: ServerContext,
    *,
    endpoint: str,
    sse: bool,
    prompt: Any,
    params: Any,
    encoder: Any,
    arrival: float,
    to_text: Callable[[list[dict[str, Any]]], str],
    start: Callable[[], list[dict[str, Any]]] | None = None,
    trailer: str | None = None,
    timeout_code: str = "server_error",
    abort_error: str | None = None,
    single_call: bool = False,
) -> Outcome | HTTPResponse:
    """Run the turn; an HTTPResponse (a 503) when the engine has no room or the server
    is shutting down. Over HTTP the engine aborts a turn only when the server shuts down
    (a client that went away is not answered): `abort_error`, when given, ends it as a
    failure with that message (chat has no cancelled ending) instead of cancelled."""
    if ctx.draining:
        ctx.metrics.refused(endpoint, 503)
        retry = ctx.cfg.retry_after
        return refusal_response(shutting_down(retry), headers={"Retry-After": str(retry)})
    if sse:
        key, limit = "stream_timeout", ctx.seconds(ctx.live.stream_timeout)
        timing: dict[str, Any] = {"timeout": limit}
    else:
        key, limit = "request_timeout", ctx.seconds(ctx.live.request_timeout)
        timing = {"deadline": arrival + limit if limit else None}
    stream = ctx.admission.try_now(prompt.ids, params, **timing)
    if stream is None:
        ctx.metrics.refused(endpoint, 503)
        return overloaded(ctx.cfg.retry_after)
    parser = OutputParser(prompt.parser)
    kw = dict(tokenizer=ctx.loaded.tokenizer, started=arrival, logprobs=params.logprobs,
              timeout_message=timeout_message(key, limit), timeout_code=timeout_code, abort_error=abort_error,
              single_call=single_call)
    route = f"{request.method} {request.path}"
    ctx.http_streams.add(stream)
    try:
        async with stream:
            if sse:
                resp = await open_sse(request)

                async def emit(events: list[dict[str, Any]]) -> None:
                    await resp.send(to_text(events))

                if start is not None:
                    await emit(start())
                outcome = await drive(stream, parser, encoder, emit, **kw)
                if trailer is not None:
                    await resp.send(trailer)
                await resp.eof()
            else:
                outcome = await drive(stream, parser, encoder, _discard, **kw)
    except asyncio.CancelledError:
        # The client went away (Sanic cancels the handler): the stream's exit aborted the
        # engine side; its final output, when it comes, is counted and logged as a 499.
        transport = "sse" if sse else "http"
        request.ctx.client_closed = True

        def gone(final: Any) -> None:
            outcome = client_closed(final, arrival)
            ctx.metrics.finished(endpoint, transport, outcome, outcome.elapsed)
            log_client_closed(request, encoder.id, outcome, enabled=ctx.cfg.access_log)

        stream.on_final(gone)
        raise
    finally:
        ctx.http_streams.discard(stream)
    ctx.metrics.finished(endpoint, "sse" if sse else "http", outcome, time.monotonic() - arrival)
    log_outcome(route, encoder.id, outcome, enabled=ctx.cfg.access_log)
    return outcome
