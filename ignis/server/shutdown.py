"""Graceful shutdown: what SIGTERM (or SIGINT, or `BackgroundServer.stop`) does.

Sanic stops its loop on the signal and then runs the ``before_server_stop`` listeners
while the listening socket is still open; `drain` is ours:

1. Draining starts: new generation requests and upgrades get 503
   ``server_shutting_down`` (with Retry-After), a socket's new ``response.create`` an
   ``error`` event with that code, and ``/health`` says 503 so balancers stop routing.
2. Responses not started yet (waiting in their lane, or queued for the engine) are
   cancelled at once, each with its full cancelled life (``response.incomplete``,
   status ``cancelled``).
3. Running responses get up to ``server.shutdown_grace`` seconds to finish.
4. Those still running then are aborted in the engine: each ends with its terminal
   event (Responses: ``response.incomplete`` with status ``cancelled``; chat: an error
   chunk with code ``server_shutting_down`` and ``[DONE]``, or 503 for a JSON request).
5. Every socket is closed with code 1001 (going away).

Then Sanic closes the listener and idle keep-alive connections and stops the engine.
A second SIGTERM during the drain kills the process (Sanic has removed its handlers); a
second SIGINT makes Sanic run the drain again, which then cuts the grace period short.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("ignis.server")

__all__ = ["drain", "GOING_AWAY", "SHUTDOWN_REASON"]

GOING_AWAY = 1001
SHUTDOWN_REASON = "server shutting down"
_TERMINAL_WAIT = 5.0  # seconds for cancelled responses to send their terminal events


def _busy(ctx: Any) -> bool:
    return bool(ctx.http_streams) or any(s.busy for s in list(ctx.sockets))


async def _wait(ctx: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while _busy(ctx) and time.monotonic() < end:
        await asyncio.sleep(0.02)


async def drain(ctx: Any, grace: float | None = None) -> dict[str, float]:
    """Run the shutdown steps above on the server's loop; returns figures for the log."""
    grace = float(ctx.cfg.shutdown_grace if grace is None else grace)
    if ctx.draining:  # run again (Sanic retries its listeners after a second Ctrl-C): cut now
        grace = 0.0
    t0 = time.monotonic()
    ctx.draining = True
    sockets = list(ctx.sockets)
    http_running = len(ctx.http_streams)
    socket_running = sum(len(session.responses) for session in sockets)
    log.info("shutting down: %d HTTP and %d socket responses live, %d sockets open; grace %g s",
             http_running, socket_running, len(sockets), grace)
    for session in sockets:
        await session.cancel_all(running=False)
    await _wait(ctx, grace)
    cut = 0
    if _busy(ctx):
        for stream in list(ctx.http_streams):
            stream.abort()
            cut += 1
        for session in list(ctx.sockets):
            cut += await session.cancel_all(running=True)
        await _wait(ctx, _TERMINAL_WAIT)
    closing = list(ctx.sockets)
    await asyncio.gather(*(s.close(GOING_AWAY, SHUTDOWN_REASON) for s in closing), return_exceptions=True)
    figures = {"seconds": time.monotonic() - t0, "cancelled_running": cut, "sockets_closed": len(closing)}
    log.info("shutdown drained in %.2f s: %d running responses cancelled at the end of the grace period, "
             "%d sockets closed (1001)", figures["seconds"], cut, len(closing))
    return figures
