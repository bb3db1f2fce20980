"""Errors as OpenAI shapes them, for every route: refusals, 401, 404, 413, 503, 500.

A client's mistake is always a 4xx with OpenAI's envelope
``{"error": {"message", "type", "param", "code"}}``; only ignis's own failures are 5xx.
Handlers raise `protocol.errors.Refusal` (or a Sanic exception) and `error_handler`
turns it into the response.
"""

from __future__ import annotations

import logging
from typing import Any

from sanic import HTTPResponse, Request
from sanic.exceptions import SanicException

from ignis.engine.async_engine import EngineDeadError
from protocol.errors import Refusal
from protocol.events import dumps

log = logging.getLogger("ignis.server")

__all__ = [
    "json_response",
    "refusal_response",
    "error_handler",
    "overloaded",
    "engine_unavailable",
    "shutting_down",
    "unauthorized",
    "model_not_found",
    "context_too_long",
    "text_too_long",
]


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> HTTPResponse:
    # backslashreplace: a lone surrogate (which the decoders refuse) would still leave as a
    # JSON escape instead of failing the response.
    body = dumps(obj).encode("utf-8", "backslashreplace")
    return HTTPResponse(body, status=status, headers=headers, content_type="application/json")


def refusal_response(refusal: Refusal, headers: dict[str, str] | None = None) -> HTTPResponse:
    return json_response(refusal.envelope(), status=refusal.status, headers=headers)


def unauthorized(missing: bool) -> Refusal:
    if missing:
        message = (
            "You didn't provide an API key. Send it as 'Authorization: Bearer KEY' (or, on the "
            "WebSocket upgrade, as the subprotocol 'openai-insecure-api-key.KEY')."
        )
    else:
        message = "Incorrect API key provided."
    return Refusal(message, param=None, code="invalid_api_key", status=401)


def overloaded(retry_after: int) -> HTTPResponse:
    """503 with Retry-After: the engine has no room now (HTTP does not queue)."""
    refusal = Refusal(
        f"The engine is at capacity; retry in {retry_after} s (or use the WebSocket mode, which queues).",
        param=None,
        code="engine_overloaded",
        type="server_error",
        status=503,
    )
    return refusal_response(refusal, headers={"Retry-After": str(retry_after)})


def engine_unavailable() -> Refusal:
    """The engine thread is gone: 503, as /health says (never a 500 and a traceback)."""
    return Refusal("The engine is not running; try again later.", code="engine_unavailable",
                   type="server_error", status=503)


def shutting_down(retry_after: int) -> Refusal:
    """The server is draining (SIGTERM): new work is refused with 503 (see shutdown.py)."""
    return Refusal(f"The server is shutting down; retry in {retry_after} s (on another instance, or once it is back).",
                   code="server_shutting_down", type="server_error", status=503)


# The unknown name is echoed up to this many characters: a client's multi-megabyte
# `model` must not come back (nor be logged) whole.
MODEL_ECHO_CHARS = 64


def model_not_found(model: str, served: tuple[str, ...]) -> Refusal:
    shown = model if len(model) <= MODEL_ECHO_CHARS else model[:MODEL_ECHO_CHARS] + f"... ({len(model)} characters)"
    return Refusal(
        f"The model '{shown}' does not exist; this server serves {', '.join(repr(m) for m in served)}.",
        param="model",
        code="model_not_found",
        status=404,
    )


def context_too_long(tokens: int, limit: int, param: str) -> Refusal:
    return Refusal(f"This model's maximum context length is {limit} tokens; your {param} has {tokens} tokens "
                   "(the context must also hold at least one output token).", param=param,
                   code="context_length_exceeded")


def text_too_long(chars: int, max_tokens: int, param: str) -> Refusal:
    """Refused before tokenizing: `chars` characters cannot fit in `max_tokens` tokens."""
    return Refusal(f"This model's maximum context length is {max_tokens} prompt tokens; your {param} renders to "
                   f"{chars} characters, more than that many tokens can hold.", param=param,
                   code="context_length_exceeded")


_STATUS_CODES = {
    400: "bad_request",
    404: "unknown_url",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    414: "uri_too_long",
    416: "range_not_satisfiable",
    417: "expectation_failed",
    426: "upgrade_required",
}


def sanic_refusal(request: Request, exc: SanicException) -> Refusal:
    status = int(getattr(exc, "status_code", 500) or 500)
    message = str(exc) or "Error"
    if isinstance(message, bytes):  # Sanic passes the websockets handshake body through
        message = message.decode("utf-8", "replace")
    message = message.strip()
    if status == 404:
        message = f"Invalid URL ({request.method} {request.path})."
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.path}."
    elif status == 413:
        message = "The request body is too large (server.max_request_bytes)."
    kind = "invalid_request_error" if status < 500 else "server_error"
    return Refusal(message, param=None, code=_STATUS_CODES.get(status), type=kind, status=status)


async def error_handler(request: Request, exc: Exception) -> HTTPResponse:
    """The app-wide exception handler: every error leaves as OpenAI's envelope."""
    if isinstance(exc, Refusal):
        refusal = exc
    elif isinstance(exc, EngineDeadError):
        # /health already says 503; every request must say the same, not 500 + a traceback.
        refusal = engine_unavailable()
    elif isinstance(exc, SanicException):
        refusal = sanic_refusal(request, exc)
        if refusal.status >= 500:
            log.error("%s %s: %s", request.method, request.path, refusal.message)
    else:
        log.exception("%s %s failed", request.method, request.path)
        refusal = Refusal("The server had an error while processing your request.", code="server_error",
                          type="server_error", status=500)
    return refusal_response(refusal)
