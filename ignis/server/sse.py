"""Server-sent events over a Sanic streaming response.

Responses: ``event: <type>`` + ``data: <json>`` per event (`protocol.events.sse`); the
stream ends after the terminal event. Chat completions: ``data: <json>`` per chunk, then
``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sanic import Request
from sanic.response import BaseHTTPResponse

from protocol.events import SSE_DONE, dumps, sse

__all__ = ["open_sse", "responses_text", "chat_text", "SSE_DONE"]

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def open_sse(request: Request) -> BaseHTTPResponse:
    """Send the headers; write with ``await resp.send(text)``, end with ``await resp.eof()``."""
    return await request.respond(content_type="text/event-stream; charset=utf-8", headers=dict(HEADERS))


def responses_text(events: Iterable[dict[str, Any]]) -> str:
    return "".join(sse(ev) for ev in events)


def chat_text(chunks: Iterable[dict[str, Any]]) -> str:
    return "".join(f"data: {dumps(c)}\n\n" for c in chunks)
