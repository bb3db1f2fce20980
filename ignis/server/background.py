"""Run the server in a background thread of this process (tests, notebooks).

    with BackgroundServer(cfg, loaded) as srv:        # cfg: IgnisConfig
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="...")

The server gets its own event loop in a daemon thread and its own AsyncEngine (built
from cfg.engine unless one is given); it listens on cfg.server.host and an ephemeral
port (or cfg.server.port with `port=`). `stop()` closes the sockets, shuts the
engine down and joins the thread. The product entry point is `ignis.serve`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from ignis.config import IgnisConfig
from ignis.engine import AsyncEngine
from ignis.model.loader import LoadedModel

__all__ = ["BackgroundServer"]


class BackgroundServer:
    def __init__(self, cfg: IgnisConfig, loaded: LoadedModel, *, engine: AsyncEngine | None = None,
                 port: int | None = 0, start_timeout: float = 60.0) -> None:
        self.cfg = cfg
        self.loaded = loaded
        self.engine = engine
        self._sock = socket.socket(socket.AF_INET6 if ":" in cfg.server.host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((cfg.server.host, cfg.server.port if port is None else port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.app: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"ignis-server-{self.port}", daemon=True)
        self._start_timeout = start_timeout

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http://", "ws://", 1)

    @property
    def ctx(self) -> Any:
        return self.app.ctx.ignis

    def start(self) -> BackgroundServer:
        self._thread.start()
        if not self._ready.wait(self._start_timeout):
            raise TimeoutError("the server did not start in time")
        if self._error is not None:
            raise RuntimeError("the server failed to start") from self._error
        return self

    def call(self, fn: Any, *args: Any) -> Any:
        """Run fn(*args) on the server's loop and return its result (a coroutine function
        is awaited there)."""
        async def run() -> Any:
            out = fn(*args)
            return await out if asyncio.iscoroutine(out) else out

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        from ignis.server.app import create_app
        from ignis.server.websocket_protocol import IgnisWebSocketProtocol

        self._stop = asyncio.Event()
        engine = self.engine or AsyncEngine(self.loaded, self.cfg.engine)
        self.engine = engine
        self.app = app = create_app(self.cfg, self.loaded, engine)
        server = await app.create_server(sock=self._sock, protocol=IgnisWebSocketProtocol,
                                         return_asyncio_server=True, access_log=False)
        await server.startup()
        await server.before_start()
        await server.after_start()
        self._ready.set()
        await self._stop.wait()
        await server.before_stop()
        # Cancel open websocket handlers, then stop listening.
        for task in list(app.websocket_tasks):
            task.cancel()
        for conn in list(server.connections):
            conn.close_if_idle()
        server.close()
        await server.wait_closed()
        for conn in list(server.connections):
            conn.close()
        await server.after_stop()
