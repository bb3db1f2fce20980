"""Slow, idle and surplus connections (mixed into the protocol class ignis runs with).

Sanic's own timers see the time since the last byte: its REQUEST_TIMEOUT restarts on
every byte, so a client sending one header line every 15 s holds a connection forever.
On top of them:

- A deadline for the whole request head and body: ``server.receive_timeout`` seconds
  from the request's first byte (Sanic's REQUEST_TIMEOUT, set to the same value, still
  bounds the silence between two bytes). Past it the client gets 408 and the
  connection closes.
- At most ``server.max_connections`` open connections (HTTP and WebSocket; fewer when
  the descriptor limit leaves less room, see `connection_cap`). One more is
  answered ``503`` (OpenAI's error shape, ``Retry-After``) and closed before any request
  is read; its unread bytes are drained for a moment so the close sends no RST over
  the answer.
- A client that goes away before its request is complete (head or body) is nobody to
  answer: no response, no access line, no traceback (Sanic's default answers it with a
  500 it cannot send, and fails on a request it never parsed when the server aborts
  the connection at shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from sanic.exceptions import BadRequest, RequestCancelled, RequestTimeout
from sanic.http import Http, Stage

from protocol.errors import Refusal
from protocol.events import dumps

__all__ = ["IgnisHttp", "ConnectionLimits", "ClientGone", "connection_cap"]

log = logging.getLogger("ignis.server")

# Refused connections drained at once at most (each holds a descriptor meanwhile), and
# for how long: past either, they are aborted.
_MAX_LINGERING = 64
_LINGER_SECONDS = 1.0
# Descriptors kept for everything but client connections (model files, the listening
# socket, the event loop, logs) and for refused connections being drained.
_FD_RESERVE = 64 + _MAX_LINGERING


def connection_cap(configured: int) -> int:
    """server.max_connections, lowered (with a warning) to what the process's descriptor
    limit leaves: past that limit accept() fails and /health with it."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or configured <= soft - _FD_RESERVE:
        return configured
    cap = max(1, soft - _FD_RESERVE)
    log.warning("server.max_connections=%d lowered to %d: the descriptor limit (ulimit -n) is %d", configured, cap,
                soft)
    return cap


class ClientGone(Exception):
    """The connection was lost while a request was still being received."""


class IgnisHttp(Http):
    """Sanic's HTTP/1.1 request cycle, plus the request's receive deadline."""

    __slots__ = ("deadline",)

    def init_for_request(self) -> None:
        super().init_for_request()
        # Bytes of the next request already buffered (pipelining): it started now. Else
        # the deadline starts when its first byte arrives (ConnectionLimits.receive_more).
        self.deadline: float | None = self.protocol.loop.time() + self.protocol.receive_timeout \
            if self.recv_buffer else None

    async def error_response(self, exception: Exception) -> None:
        lost = self.protocol.conn_info is not None and self.protocol.conn_info.lost
        if isinstance(exception, ClientGone) or (lost and isinstance(exception, RequestCancelled)
                                                 and (self.request is None or self.request_body)):
            self.keep_alive = False
            self.request_body = None  # nothing left to read: there is no one sending it
            return
        await super().error_response(exception)


class ConnectionLimits:
    """Mixin for the Sanic protocol class (before `WebSocketProtocol` in its bases)."""

    HTTP_CLASS = IgnisHttp
    _lingering = 0  # refused connections being drained, process-wide

    # -- the connection cap ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.refused = False
        cfg = self.app.ctx.ignis.cfg  # type: ignore[attr-defined]
        self.receive_timeout = float(cfg.receive_timeout)
        cap = self.app.ctx.connection_cap  # type: ignore[attr-defined]
        if len(self.connections) >= cap:  # type: ignore[attr-defined]
            self._refuse(transport, cap, cfg.retry_after)
            return
        super().connection_made(transport)  # type: ignore[misc]

    def _refuse(self, transport: Any, cap: int, retry_after: int) -> None:
        self.refused = True
        self.transport = transport
        self.app.ctx.ignis.metrics.refused("other", 503)  # type: ignore[attr-defined]
        log.warning("connection refused: %d open connections (server.max_connections)", cap)
        body = dumps(Refusal(f"The server has {cap} open connections, its limit (server.max_connections); retry "
                             f"in {retry_after} s.", code="too_many_connections", type="server_error",
                             status=503).envelope()).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
                f"\r\nretry-after: {retry_after}\r\nconnection: close\r\n\r\n").encode()
        transport.write(head + body)
        if ConnectionLimits._lingering >= _MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        ConnectionLimits._lingering += 1
        transport.write_eof()  # our half closed; their request is read and dropped until they close
        self._linger = asyncio.get_running_loop().call_later(_LINGER_SECONDS, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        super().data_received(data)  # type: ignore[misc]

    def eof_received(self) -> bool | None:
        if self.refused:
            return False  # close
        return super().eof_received()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            linger = getattr(self, "_linger", None)
            if linger is not None:
                linger.cancel()
                ConnectionLimits._lingering -= 1
            self.transport = None
            return
        super().connection_lost(exc)  # type: ignore[misc]

    # -- the receive deadline ---------------------------------------------------------------

    async def receive_more(self) -> None:
        http = getattr(self, "_http", None)
        loop = self.loop  # type: ignore[attr-defined]
        if http is None or http.stage is Stage.IDLE:
            await super().receive_more()  # type: ignore[misc]
            if http is not None and http.deadline is None:
                http.deadline = loop.time() + self.receive_timeout  # the first byte of a request
            return
        if http.deadline is None:
            http.deadline = loop.time() + self.receive_timeout
        try:
            async with asyncio.timeout_at(http.deadline):
                await super().receive_more()  # type: ignore[misc]
        except TimeoutError:
            http.keep_alive = False
            if http.stage in (Stage.REQUEST, Stage.HANDLER):
                http.request_body = None
                raise RequestTimeout(f"The request was not received within server.receive_timeout "
                                     f"({self.receive_timeout:g} s).") from None
            raise BadRequest("Request body not received in time") from None  # leftover body: Sanic drops us
        except asyncio.CancelledError:
            lost = self.conn_info is not None and self.conn_info.lost  # type: ignore[attr-defined]
            if lost and http.request is None:
                raise ClientGone() from None  # Sanic would fail on the request it never parsed
            raise

    def close_if_idle(self) -> bool:
        # At shutdown: a connection still sending its request head has nothing to lose.
        http = getattr(self, "_http", None)
        if getattr(self, "websocket", None) is None and http is not None and http.stage is Stage.REQUEST \
                and http.request is None:
            self.close()  # type: ignore[attr-defined]
            return True
        return super().close_if_idle()  # type: ignore[misc]
