"""What a local server refuses before any work: requests a web page could forge.

A page the user visits can make the browser talk to ``http://127.0.0.1:8000``. Without
these checks it could drive the model with no key configured (the `make serve` default):

- WebSocket upgrades carry no CORS protection, but browsers always send ``Origin`` on
  them. An upgrade whose ``Origin`` is present and is neither this server's own origin
  nor listed in ``server.cors_origins`` gets 403 (``forbidden_origin``). Clients that
  send no ``Origin`` (Codex, the SDKs, curl) are not affected.
- DNS rebinding: a page at ``evil.example`` whose name later resolves to 127.0.0.1 is
  same-origin with the server as far as the browser knows, but every request it makes
  carries ``Host: evil.example``. When the server is bound to a loopback address only
  loopback names (``localhost``, ``127.0.0.1``, ``[::1]``, any port) and the names in
  ``server.allowed_hosts`` are accepted (403 ``host_not_allowed``). Other binds are
  reachable under names we cannot know, so they keep accepting any ``Host``.
- "Simple" cross-site requests: a page may POST ``text/plain`` (or a typeless blob)
  without a CORS preflight. POST and PATCH bodies on ``/v1`` and ``/admin`` must be
  ``application/json`` (what the SDKs send; JSON forces a preflight on browsers), else 415.
- A path holding a NUL byte names no file and no route: 404 (the static file handler
  would fail on it with a 500).
- ``Host`` itself (RFC 9112, 3.2): a request with more than one ``Host`` line, or an
  HTTP/1.1 request with none, is a 400 (``invalid_host_header``) on every bind: the
  allow-list above can only be trusted when exactly one name is given.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote, urlsplit

from sanic import HTTPResponse, Request

from ignis.config import ServerConfig
from ignis.server.auth import is_protected
from ignis.server.errors import refusal_response
from protocol.errors import Refusal

__all__ = ["check_request", "is_loopback_bind", "LOOPBACK_NAMES"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def is_loopback_bind(host: str) -> bool:
    """Whether the server listens on a loopback address only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` header -> (lower-case name without brackets, port or None); None if malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        return (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is not a number, an unbalanced bracket
        return None


def _same_origin(origin: str, host: str | None) -> bool:
    if not host:
        return False
    try:
        o = urlsplit(origin)
        o_port = o.port
    except ValueError:
        return False
    if o.scheme not in _DEFAULT_PORTS or not o.hostname:
        return False  # "null", file://, anything a page can send that is no origin of ours
    h = _split_host(host)
    if h is None:
        return False
    default = _DEFAULT_PORTS[o.scheme]
    return o.hostname.lower() == h[0] and (o_port or default) == (h[1] or default)


def _origin_allowed(origin: str, host: str | None, cors_origins: list[str]) -> bool:
    return _same_origin(origin, host) or "*" in cors_origins or origin in cors_origins


def _host_allowed(host: str | None, allowed: list[str]) -> bool:
    if host is None:
        return True  # HTTP/1.0 without Host: no browser sends that, so no rebinding either
    parsed = _split_host(host)
    if parsed is None:
        return False
    name = parsed[0]
    return name in LOOPBACK_NAMES or "*" in allowed or name in {a.lower().strip("[]") for a in allowed}


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def check_request(request: Request, cfg: ServerConfig) -> HTTPResponse | None:
    """None to go on, or the refusal that ends the request (before any upgrade or work)."""
    if "\x00" in unquote(request.path):  # the path as sent is still percent-encoded
        return refusal_response(Refusal(f"Invalid URL ({request.method} {request.path!r}).", code="unknown_url",
                                        status=404))
    hosts = request.headers.getall("host", [])
    # (Sanic answers a head that never fully arrived, a 408 say, through a stand-in request
    # with no headers and method "NONE": not a request that came without a Host.)
    if len(hosts) > 1 or (not hosts and request.version != "1.0" and request.method != "NONE"):
        return refusal_response(Refusal(
            f"A request must carry exactly one Host header; this one has {len(hosts)}.",
            code="invalid_host_header", status=400,
        ))
    host = hosts[0] if hosts else None
    if is_loopback_bind(cfg.host) and not _host_allowed(host, cfg.allowed_hosts):
        return refusal_response(Refusal(
            "This server is bound to a loopback address and answers only to loopback host names "
            "(add the name to server.allowed_hosts to reach it under another).",
            code="host_not_allowed", status=403,
        ))
    origin = request.headers.get("origin")
    upgrade = request.headers.get("upgrade", "").lower() == "websocket"
    if upgrade and origin is not None and not _origin_allowed(origin, host, cfg.cors_origins):
        return refusal_response(Refusal(
            "WebSocket connections from this origin are not allowed (list it in server.cors_origins).",
            code="forbidden_origin", status=403,
        ))
    if request.method in ("POST", "PATCH") and is_protected(request.path) and not _is_json(
            request.headers.get("content-type")):
        return refusal_response(Refusal(
            "The request body must be JSON, sent with 'Content-Type: application/json'.",
            code="unsupported_media_type", status=415,
        ))
    return None
