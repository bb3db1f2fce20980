"""GET / PATCH /admin/config: read the server's settings, change the live ones.

Live keys (seconds, >= 0, 0 = off): ``request_timeout`` and ``stream_timeout`` (they
apply to requests that start after the change) and ``socket_idle_close`` (open sockets
see it within a second). Authentication: server.api_key like /v1 (without a key, only
loopback clients). Keys are never returned.

    curl -X PATCH localhost:8000/admin/config -H 'Authorization: Bearer KEY' \\
         -d '{"socket_idle_close": 60}'
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sanic import HTTPResponse, Request

from ignis.server.context import LIVE_KEYS, ServerContext
from ignis.server.errors import json_response
from protocol.decode import decode_json
from protocol.errors import Refusal

__all__ = ["get_config", "patch_config"]

log = logging.getLogger("ignis.server")


def _view(ctx: ServerContext) -> dict[str, Any]:
    cfg = ctx.cfg
    return {
        "live": ctx.live.as_dict(),
        "server": {
            "host": cfg.host,
            "port": cfg.port,
            "api_key_set": ctx.api_key is not None,
            "model_aliases": list(cfg.model_aliases),
            "max_request_bytes": cfg.max_request_bytes,
            "retry_after": cfg.retry_after,
            "cors_origins": list(cfg.cors_origins),
            "access_log": cfg.access_log,
            "shutdown_grace": cfg.shutdown_grace,
        },
        "model": {"name": ctx.model_name, "max_model_len": ctx.max_model_len},
    }


async def get_config(request: Request) -> HTTPResponse:
    return json_response(_view(request.app.ctx.ignis))


async def patch_config(request: Request) -> HTTPResponse:
    ctx: ServerContext = request.app.ctx.ignis
    body = decode_json(request.body)
    changes: dict[str, float] = {}
    for key, value in body.items():
        if key not in LIVE_KEYS:
            raise Refusal(
                f"'{key}' cannot be changed while the server runs; live keys: {', '.join(LIVE_KEYS)}.",
                param=key, code="unsupported_parameter",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise Refusal(f"Invalid '{key}': expected a number of seconds >= 0 (0 = off).", param=key,
                          code="invalid_value")
        changes[key] = float(value)
    for key, value in changes.items():
        setattr(ctx.live, key, value)
        log.info("admin: %s = %g", key, value)
    return json_response(_view(ctx))
