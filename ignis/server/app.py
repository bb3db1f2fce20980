"""The Sanic app: `create_app(cfg, loaded, engine)`.

Routes
  POST /v1/responses           JSON, or SSE with stream: true      (responses_http)
  POST /v1/responses/compact   a conversation -> a compacted item list (compact_http)
  GET  /v1/responses           WebSocket upgrade: the socket mode  (socket_session)
  POST /v1/chat/completions    JSON, or SSE chunks + [DONE]        (chat_http)
  GET  /v1/models[/{id}]       the served model (and its aliases), with Codex's catalog (codex_catalog)
  GET  /health                 200 while the engine runs, else 503 (also while shutting down)
  GET  /metrics                Prometheus text                     (metrics)
  GET|PATCH /admin/config      live settings                       (admin)
  GET  /, /playground/*        the Playground chat page            (playground_routes)

Run it with `app.run(host, port, single_process=True, protocol=IgnisWebSocketProtocol)`
(`ignis.serve` does): one process owns the model and the KV cache.
On SIGTERM / SIGINT the server drains (shutdown.py): new work gets 503, running
responses get server.shutdown_grace seconds, then are cancelled; sockets close with 1001.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from sanic import HTTPResponse, Request, Sanic

from ignis.config import IgnisConfig, ServerConfig
from ignis.engine import AsyncEngine
from ignis.model.loader import LoadedModel
from ignis.server import access, admin, auth, guard
from ignis.server.body_encoding import inflate_body
from ignis.server.chat_http import create_chat_completion
from ignis.server.codex_catalog import catalog_entry
from ignis.server.compact_http import compact_response
from ignis.server.connections import connection_cap
from ignis.server.context import ServerContext
from ignis.server.errors import error_handler, json_response, model_not_found, refusal_response, shutting_down
from protocol.errors import Refusal
from ignis.server.metrics import CONTENT_TYPE
from ignis.server.playground_routes import add_playground
from ignis.server.responses_http import create_response
from ignis.server.shutdown import drain
from ignis.server.socket_intake import SocketBuffers
from ignis.server.socket_session import responses_socket

__all__ = ["create_app"]

log = logging.getLogger("ignis.server")
_names = itertools.count()
# Our own deadlines end responses; Sanic's response timeout (an idle timer between two
# writes) must never cut a long prefill or a quiet stream first.
_SANIC_RESPONSE_TIMEOUT = 7 * 24 * 3600


def create_app(cfg: IgnisConfig | ServerConfig, loaded: LoadedModel, engine: AsyncEngine, *,
               close_engine: bool = True) -> Sanic:
    """A Sanic app serving `loaded` through `engine`. With `close_engine`, the engine is
    shut down when the server stops."""
    server_cfg: ServerConfig = cfg.server if isinstance(cfg, IgnisConfig) else cfg
    n = next(_names)
    app = Sanic("ignis" if n == 0 else f"ignis_{n}", configure_logging=False)
    app.config.REQUEST_MAX_SIZE = int(server_cfg.max_request_bytes)
    # A socket message over max_request_bytes gets an error event and the socket lives on
    # (socket_session); the transport closes it (1009) only past twice that.
    app.config.WEBSOCKET_MAX_SIZE = 2 * int(server_cfg.max_request_bytes)
    # Our drain (shutdown.py) has already finished or cut every response when Sanic waits
    # for the connections left: only idle keep-alive ones remain.
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = 1.0
    app.config.RESPONSE_TIMEOUT = _SANIC_RESPONSE_TIMEOUT
    # Sanic's idle timer while a request arrives; the whole request's deadline is ours
    # (connections.py), with the same value.
    app.config.REQUEST_TIMEOUT = float(server_cfg.receive_timeout)
    app.config.ACCESS_LOG = False  # ours is `ignis.access`
    app.config.NOISY_EXCEPTIONS = False
    app.config.FALLBACK_ERROR_FORMAT = "json"
    app.config.MOTD = False
    # Sanic's "touchup" rewrites methods of the Sanic class itself at start-up; a second
    # app in one process (tests, BackgroundServer) would fail on it.
    app.config.TOUCHUP = False
    ctx = ServerContext.build(server_cfg, loaded, engine,
                              sampling=cfg.model.sampling if isinstance(cfg, IgnisConfig) else None)
    app.ctx.ignis = ctx
    if server_cfg.socket_buffer_bytes < server_cfg.max_request_bytes:
        raise ValueError("server.socket_buffer_bytes must be at least server.max_request_bytes (one whole message)")
    app.ctx.socket_buffers = SocketBuffers(server_cfg.socket_buffer_bytes)
    app.ctx.connection_cap = connection_cap(int(server_cfg.max_connections))
    if ctx.api_key is None:
        log.warning("no API key set (server.api_key / IGNIS_API_KEY): every route is open")

    app.add_route(create_response, "/v1/responses", methods=["POST"], name="responses_create")
    app.add_route(compact_response, "/v1/responses/compact", methods=["POST"], name="responses_compact")
    app.add_websocket_route(responses_socket, "/v1/responses", name="responses_socket")
    app.add_route(create_chat_completion, "/v1/chat/completions", methods=["POST"], name="chat_create")
    app.add_route(list_models, "/v1/models", methods=["GET"], name="models_list")
    app.add_route(get_model, "/v1/models/<model_id:path>", methods=["GET"], name="models_get")
    app.add_route(health, "/health", methods=["GET"], name="health")
    app.add_route(metrics, "/metrics", methods=["GET"], name="metrics")
    app.add_route(admin.get_config, "/admin/config", methods=["GET"], name="admin_get")
    app.add_route(admin.patch_config, "/admin/config", methods=["PATCH"], name="admin_patch")
    add_playground(app)

    app.error_handler.add(Exception, _counting(error_handler))
    app.register_middleware(_before, "request")
    app.register_middleware(_after, "response")

    @app.before_server_stop
    async def _drain(app: Sanic) -> None:
        await drain(app.ctx.ignis)

    if close_engine:
        @app.after_server_stop
        async def _close_engine(app: Sanic) -> None:
            await app.ctx.ignis.engine.aclose()

    return app


def _endpoint(path: str) -> str:
    if path.startswith("/v1/responses"):
        return "responses"
    if path.startswith("/v1/chat"):
        return "chat"
    return "other"


def _counting(handler: Any) -> Any:
    async def handle(request: Request, exc: Exception) -> HTTPResponse:
        resp = await handler(request, exc)
        ignis = getattr(request.app.ctx, "ignis", None)
        if ignis is not None:
            ignis.metrics.refused(_endpoint(request.path), resp.status)
        return resp

    return handle


def _cors_headers(ctx: ServerContext, request: Request) -> dict[str, str]:
    origins = ctx.cfg.cors_origins
    origin = request.headers.get("origin")
    if not origins or not origin:
        return {}
    if "*" in origins:
        allowed = "*"
    elif origin in origins:
        allowed = origin
    else:
        return {}
    return {
        "Access-Control-Allow-Origin": allowed,
        "Access-Control-Allow-Methods": "GET, POST, PATCH, OPTIONS",
        "Access-Control-Allow-Headers": "Authorization, Content-Type, Content-Encoding, OpenAI-Beta, session_id, "
                                        "X-Client-Request-Id, X-Stainless-Lang, "
                                        "X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, "
                                        "X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Retry-Count, "
                                        "X-Stainless-Timeout",
        "Access-Control-Max-Age": "600",
        "Vary": "Origin",
    }


async def _before(request: Request) -> HTTPResponse | None:
    await access.on_request(request)
    ctx: ServerContext = request.app.ctx.ignis
    refused = guard.check_request(request, ctx.cfg)
    if refused is not None:
        ctx.metrics.refused(_endpoint(request.path), refused.status)
        return refused
    if request.method == "OPTIONS" and request.headers.get("access-control-request-method"):
        headers = _cors_headers(ctx, request)
        return HTTPResponse(status=204, headers=headers) if headers else None
    refused = auth.check_request(request, ctx.api_key)
    if refused is None and ctx.draining and _generates(request):
        ctx.metrics.refused(_endpoint(request.path), 503)
        retry = ctx.cfg.retry_after
        refused = refusal_response(shutting_down(retry), headers={"Retry-After": str(retry)})
    if refused is None and request.headers.get("content-encoding"):
        refused = await _inflate(request, ctx)
    return refused


async def _inflate(request: Request, ctx: ServerContext) -> HTTPResponse | None:
    """A compressed body, inflated in place (body_encoding.py); only for a client that
    passed the key check, off the event loop (up to server.max_request_bytes of work)."""
    try:
        request.body = await asyncio.to_thread(inflate_body, request.body, request.headers.get("content-encoding"),
                                               int(ctx.cfg.max_request_bytes))
    except Refusal as refusal:
        ctx.metrics.refused(_endpoint(request.path), refusal.status)
        return refusal_response(refusal)
    return None


def _generates(request: Request) -> bool:
    """A request that would start work: a generation POST or the socket's upgrade."""
    if request.path in ("/v1/responses", "/v1/responses/compact", "/v1/chat/completions"):
        return request.method == "POST" or request.headers.get("upgrade", "").lower() == "websocket"
    return False


async def _after(request: Request, response: HTTPResponse) -> None:
    ctx: ServerContext = request.app.ctx.ignis
    for k, v in _cors_headers(ctx, request).items():
        response.headers.setdefault(k, v)
    await access.on_response(request, response)


def _model_object(ctx: ServerContext, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": ctx.started, "owned_by": "ignis"}


async def list_models(request: Request) -> HTTPResponse:
    """OpenAI's list, and Codex's catalog of the same names (codex_catalog.py)."""
    ctx: ServerContext = request.app.ctx.ignis
    models = [catalog_entry(n, context_window=ctx.max_model_len, reasoning=ctx.renderer.reasoning_tags, priority=i + 1)
              for i, n in enumerate(ctx.model_names)]
    return json_response({"object": "list", "data": [_model_object(ctx, n) for n in ctx.model_names],
                          "models": models})


async def get_model(request: Request, model_id: str) -> HTTPResponse:
    ctx: ServerContext = request.app.ctx.ignis
    if model_id not in ctx.model_names:
        raise model_not_found(model_id, ctx.model_names)
    return json_response(_model_object(ctx, model_id))


async def health(request: Request) -> HTTPResponse:
    ctx: ServerContext = request.app.ctx.ignis
    if not ctx.engine.healthy:
        return json_response({"status": "engine_down", "model": ctx.model_name}, status=503)
    if ctx.draining:
        return json_response({"status": "shutting_down", "model": ctx.model_name}, status=503)
    return json_response({"status": "ok", "model": ctx.model_name})


async def metrics(request: Request) -> HTTPResponse:
    return HTTPResponse(request.app.ctx.ignis.metrics.render(), content_type=CONTENT_TYPE)
