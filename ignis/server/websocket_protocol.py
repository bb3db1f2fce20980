"""The Sanic WebSocket protocol class ignis runs with (`app.run(protocol=...)`).

Sanic builds websockets' `ServerProtocol` itself, with neither extensions nor a
subprotocol selector we can choose. This subclass builds it with:

- permessage-deflate (Codex and the OpenAI SDK offer it; accepting it shrinks the
  multi-kilobyte history frames), inflating no more than a message may hold, and the
  messages assembled by `socket_intake.Intake` (bounded memory, see there);
- a subprotocol selector: the first offered entry that is not
  ``openai-insecure-api-key.*`` in any casing (a browser drops a socket whose offered protocols got
  no answer), none when only the key (or nothing) was offered. The key entry is never
  selected, so it is never echoed in the handshake answer.

Declaring ``subprotocols=[...]`` on the route instead would refuse every client that
offers none (Codex and the SDK offer none) with HTTP 400.

Slow, idle and surplus connections are handled by `connections.ConnectionLimits`.

It also sets TCP_NODELAY on every connection (HTTP and WebSocket alike). asyncio does
that only for sockets created with proto IPPROTO_TCP, and Sanic's listening socket is
created with proto 0: without it, each small event written after the first one of a
response waits for the client's delayed ACK (~40 ms on Linux) on keep-alive connections.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from sanic.exceptions import SanicException
from sanic.log import websockets_logger
from sanic.server.protocols.websocket_protocol import WebSocketProtocol
from sanic.server.websockets.impl import WebsocketImplProtocol
from websockets.frames import Frame
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from ignis.server.auth import is_key_entry
from ignis.server.connections import ConnectionLimits
from ignis.server.socket_intake import DATA_OPCODES, BudgetedDeflateFactory, Intake, IntakeHook, RefusedMessage

__all__ = ["IgnisWebSocketProtocol", "select_subprotocol"]


def select_subprotocol(_protocol: object, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    for entry in offered:
        if not is_key_entry(entry):
            return entry
    return None


class IgnisWebsocket(WebsocketImplProtocol):
    """Sanic's socket connection, with messages read from an `Intake` (socket_intake.py)
    instead of Sanic's frame assembler. `recv()` returns a text or binary message, a
    `RefusedMessage` to answer with an error event, or None once the socket is closing."""

    def __init__(self, ws_proto: ServerProtocol, intake: Intake, **kwargs: object) -> None:
        super().__init__(ws_proto, **kwargs)
        self.intake = intake

    async def process_events(self, events):  # noqa: ANN001, ANN201
        # Data frames arrive empty (their payloads went to the intake as they were decoded).
        await super().process_events([e for e in events if not (isinstance(e, Frame) and e.opcode in DATA_OPCODES)])

    def data_received(self, data):  # noqa: ANN001, ANN201
        super().data_received(data)
        if self.intake.ready:
            self.pause_frames()  # a whole message waits for the reader: read no more for now

    def connection_lost(self, exc):  # noqa: ANN001, ANN201
        super().connection_lost(exc)
        self.intake.close()

    async def recv(self, timeout: float | None = None) -> str | bytes | RefusedMessage | None:
        async with self.recv_lock:
            while True:
                message = self.intake.next()
                if message is not None:
                    if not self.intake.ready:
                        self.resume_frames()
                    return message
                if self.intake.closed or self.ws_proto.state is not State.OPEN:
                    return None
                self.resume_frames()
                self.recv_cancel = asyncio.get_running_loop().create_future()  # Sanic cancels it on close / EOF
                waiter = asyncio.ensure_future(self.intake.arrived.wait())
                try:
                    done, _ = await asyncio.wait((self.recv_cancel, waiter), timeout=timeout,
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    self.recv_cancel = None
                if not done:
                    return None  # timed out



class IgnisWebSocketProtocol(ConnectionLimits, WebSocketProtocol):
    def connection_made(self, transport):  # noqa: ANN001, ANN201
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        super().connection_made(transport)

    async def websocket_handshake(self, request, subprotocols=None):  # noqa: ANN001, ANN201
        # As Sanic's own (25.12), with our ServerProtocol.
        ctx = self.app.ctx
        intake = Intake(ctx.socket_buffers, ctx.ignis.cfg.max_request_bytes)
        try:
            ws_proto = ServerProtocol(
                max_size=self.websocket_max_size,
                extensions=[BudgetedDeflateFactory(intake)],
                select_subprotocol=select_subprotocol,
                state=State.OPEN,
                logger=websockets_logger,
            )
            resp = ws_proto.accept(self.sanic_request_to_ws_request(request))
            # Decoding applies the extensions last to first: the intake takes each frame last.
            ws_proto.extensions.insert(0, IntakeHook(intake))
        except Exception as exc:  # noqa: BLE001
            raise SanicException("Failed to open a WebSocket connection.", status_code=500) from exc
        if not 100 <= resp.status_code <= 299:
            body = resp.body.decode("utf-8", "replace") if resp.body else resp.reason_phrase
            raise SanicException(body, resp.status_code)
        head = bytearray(f"HTTP/1.1 {resp.status_code} {resp.reason_phrase}\r\n".encode())
        head += "".join(f"{k}: {v}\r\n" for k, v in resp.headers.raw_items()).encode()
        head += b"\r\n"
        await super(WebSocketProtocol, self).send(head)
        self.websocket = IgnisWebsocket(
            ws_proto,
            intake,
            ping_interval=self.websocket_ping_interval,
            ping_timeout=self.websocket_ping_timeout,
            close_timeout=self.websocket_timeout,
        )
        loop = getattr(getattr(request, "transport", None), "loop", None)
        await self.websocket.connection_made(self, loop=loop)
        self.websocket_url = self._http.request.url
        self.websocket_peer = f"{id(self):X}"[-5:-1] + "unx"
        if ip := self._http.request.client_ip:
            self.websocket_peer = f"{ip}:{self._http.request.port}"
        self.log_websocket("OPEN")
        return self.websocket
