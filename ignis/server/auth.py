"""API-key authentication for /v1 routes, the WebSocket upgrade and /admin.

With `server.api_key` (or IGNIS_API_KEY) set, a request must carry
``Authorization: Bearer KEY``. On the WebSocket upgrade, browsers cannot set headers,
so a ``Sec-WebSocket-Protocol`` entry ``openai-insecure-api-key.KEY`` is accepted too
(that entry is never selected as the subprotocol: see `websocket_protocol`). A wrong or
missing key is a 401 in OpenAI's envelope, before the handshake. Keys are compared in
constant time and never logged.

/admin without a configured key: only loopback clients (the whole server is open then,
but a misconfigured public bind must not expose live settings).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from sanic import HTTPResponse, Request

from ignis.server.errors import refusal_response, unauthorized
from protocol.errors import Refusal

__all__ = ["KEY_SUBPROTOCOL_PREFIX", "is_key_entry", "resolve_api_key", "offered_subprotocols", "check_request", "is_protected"]

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def resolve_api_key(configured: str | None) -> str | None:
    """server.api_key, else $IGNIS_API_KEY; empty means none."""
    key = configured if configured is not None else os.environ.get("IGNIS_API_KEY")
    return key or None


def offered_subprotocols(headers: object) -> list[str]:
    """Every entry of every Sec-WebSocket-Protocol header, in order."""
    values = headers.getall("sec-websocket-protocol", [])  # type: ignore[attr-defined]
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def is_key_entry(entry: str) -> bool:
    """The subprotocol entry that carries the key, in any casing (header tokens are
    case-insensitive to some clients; the key itself is not)."""
    return entry[: len(KEY_SUBPROTOCOL_PREFIX)].lower() == KEY_SUBPROTOCOL_PREFIX


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _upgrade_key(request: Request) -> str | None:
    if request.headers.get("upgrade", "").lower() != "websocket":
        return None
    for entry in offered_subprotocols(request.headers):
        if is_key_entry(entry):
            return entry[len(KEY_SUBPROTOCOL_PREFIX):] or None
    return None


def _same(supplied: str, key: str) -> bool:
    """Constant time: compare_digest over SHA-256 digests, so that not even the key's
    length shows in the timing (compare_digest alone returns early on a length mismatch)."""
    a = hashlib.sha256(supplied.encode("utf-8", "surrogatepass")).digest()
    b = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return hmac.compare_digest(a, b)


def is_protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path == "/admin" or path.startswith("/admin/")


def check_request(request: Request, api_key: str | None) -> HTTPResponse | None:
    """None to go on, or the 401/403 response that ends the request (before any upgrade)."""
    path = request.path
    if not is_protected(path) or request.method == "OPTIONS":
        return None
    if api_key is None:
        if path.startswith("/admin") and request.ip not in _LOOPBACK:
            return refusal_response(Refusal(
                "The admin routes need server.api_key when the client is not on loopback.",
                code="admin_disabled", status=403,
            ))
        return None
    bearer = _bearer(request)
    if bearer is not None and _same(bearer, api_key):
        return None
    # On the upgrade a browser may send a stale header and the right subprotocol: either works.
    entry = _upgrade_key(request)
    if entry is not None and _same(entry, api_key):
        return None
    return refusal_response(unauthorized(missing=bearer is None and entry is None))
