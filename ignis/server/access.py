"""Access logs: one INFO line per HTTP request and per finished response or socket,
on the ``ignis.access`` logger. Method, path, status, ids, token counts and timings
only: never a header (so never a key), never prompt or output text. The one header
value logged is the client's request id (``x-client-request-id``, as Codex and the
SDKs send it), as ``req=ID``, when it is a plain id (at most 128 characters of
letters, digits and ``._:-``): it ties a line to the client's own logs."""

from __future__ import annotations

import logging
import re
import time

from sanic import Request
from sanic.response import BaseHTTPResponse

from ignis.server.turn import Outcome

__all__ = ["access_log", "on_request", "on_response", "log_outcome", "log_client_closed", "request_id"]

# nginx's status for "client closed request": the client went away before the response ended.
CLIENT_CLOSED = 499
# An error message in a line is cut to this (a message may quote what a client sent).
ERROR_CHARS = 300

access_log = logging.getLogger("ignis.access")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def request_id(request: Request) -> str:
    """`` req=ID`` for the client's request id, or "" (none sent, or not a plain id:
    a header is client input, and a log line must not carry what it likes)."""
    value = request.headers.get("x-client-request-id")
    return f" req={value}" if value and _REQUEST_ID.fullmatch(value) else ""


async def on_request(request: Request) -> None:
    request.ctx.t0 = time.monotonic()


async def on_response(request: Request, response: BaseHTTPResponse) -> None:
    if not request.app.ctx.ignis.cfg.access_log or getattr(request.ctx, "client_closed", False):
        return  # a client that left was logged as a 499 (log_client_closed), not as Sanic's 500
    t0 = getattr(request.ctx, "t0", None)
    ms = (time.monotonic() - t0) * 1000 if t0 is not None else 0.0
    kind = " (stream)" if response.content_type and "event-stream" in response.content_type else ""
    access_log.info("%s %s %s %s %d%s %.1f ms%s", request.ip, request.method, request.path, _proto(request),
                    response.status, kind, ms, request_id(request))


def log_client_closed(request: Request, response_id: str, outcome: Outcome, *, enabled: bool = True) -> None:
    """The access line of an HTTP request whose client left mid-response (no response
    line is written for it): status 499, with the tokens made for it."""
    if not enabled:
        return
    u = outcome.usage
    access_log.info("%s %s %s %s %d (client closed request) %.1f ms: %s input=%d output=%d%s", request.ip,
                    request.method, request.path, _proto(request), CLIENT_CLOSED, outcome.elapsed * 1000,
                    response_id, u.input_tokens, u.output_tokens, request_id(request))


def _cut(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def _proto(request: Request) -> str:
    return f"HTTP/{request.version}"


def log_outcome(where: str, response_id: str, outcome: Outcome, *, stream_id: str | None = None,
                enabled: bool = True, answered: float | None = None) -> None:
    """`answered`: a socket prewarm completed that many seconds in, before its prefill
    ended; the line (written at the prefill's end) then says how the prefill ended."""
    if not enabled:
        return
    u = outcome.usage
    lane = f" stream_id={stream_id}" if stream_id is not None else ""
    ttft = f" ttft={outcome.ttft:.3f}s" if outcome.ttft is not None else ""
    status = f"{CLIENT_CLOSED} client closed" if outcome.status == "client_closed" else outcome.status
    if answered is not None:
        status = f"prewarm answered completed at {answered:.3f}s, prefill {status}"
    access_log.info(
        "%s %s%s %s: input=%d cached=%d output=%d%s total=%.3fs%s",
        where, response_id, lane, status, u.input_tokens, u.cached_tokens, u.output_tokens, ttft,
        outcome.elapsed, f" ({_cut(outcome.error)})" if outcome.error and outcome.status == "failed" else "",
    )
