"""The Playground: a chat page served by the same app (`GET /`, assets under /playground/).

The page is plain HTML/CSS/JS in `ignis/server/playground/` (shipped as package data,
no build step, nothing fetched from a CDN). It talks to the Responses WebSocket mode of
this server; see `playground/connection.js` for the socket lifecycle.

These routes need no key (the page holds no secret; the user types the key, which the
page sends as the ``openai-insecure-api-key.<key>`` subprotocol). They carry a strict
Content-Security-Policy: the page renders model output, and it must never run any.
"""

from __future__ import annotations

from pathlib import Path

from sanic import HTTPResponse, Request, Sanic
from sanic.response import file

__all__ = ["PLAYGROUND_DIR", "add_playground"]

PLAYGROUND_DIR = Path(__file__).resolve().parent / "playground"

# Same-origin scripts and styles only; the socket goes back to this origin.
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def add_playground(app: Sanic) -> None:
    """Register `GET /` (the page) and `/playground/<file>` (its assets) on `app`."""
    app.add_route(_index, "/", methods=["GET"], name="playground_index")
    app.static("/playground", PLAYGROUND_DIR, name="playground_assets", index="index.html")
    app.register_middleware(_security_headers, "response")


async def _index(request: Request) -> HTTPResponse:
    return await file(PLAYGROUND_DIR / "index.html", mime_type="text/html; charset=utf-8")


async def _security_headers(request: Request, response: HTTPResponse) -> None:
    if request.path == "/" or request.path.startswith("/playground"):
        response.headers.setdefault("Content-Security-Policy", _CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        # Revalidate (Last-Modified) every load: an upgraded server must not run yesterday's script.
        response.headers.setdefault("Cache-Control", "no-cache")
