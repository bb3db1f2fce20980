"""Admission to the engine: HTTP takes room or gets a 503; sockets wait in one FIFO.

The engine admits at most `engine.max_in_flight` requests (engine.max_num_seqs). Past
that, the AsyncEngine keeps ONE first-in first-out list of waiters
(`submit_when_room`), shared by every caller of this process: every socket
connection of the server queues there, in arrival order, whatever connection or lane
it came from. HTTP never queues (`try_now` -> None -> 503 with Retry-After), and it
does not overtake queued sockets either (`has_room` is false while anyone waits).

`wait` tells its caller, before waiting, that the request is queued (the socket sends
``response.queued``); the request joins the FIFO before that notice goes out, so
sending it cannot cost its place. Cancelling the waiting task (``response.cancel``,
a closed socket) leaves the queue and hands any slot it was given to the next waiter.
Deadlines passed as `timeout` count from admission: the engine starts the clock when
the request is submitted, after the wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ignis.engine import AsyncEngine, RequestStream, SamplingParams

__all__ = ["Admission"]


class Admission:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.queued = 0  # socket requests waiting for room (the metrics gauge)

    def has_room(self) -> bool:
        return self.engine.has_room()

    def try_now(self, prompt: Sequence[int], params: SamplingParams | None, **kwargs: Any) -> RequestStream | None:
        """Submit if there is room now (HTTP); None when the engine is full."""
        return self.engine.try_submit(prompt, params, **kwargs)

    async def wait(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None,
        *,
        on_queued: Callable[[], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> RequestStream:
        """Submit now, or queue (FIFO, server-wide) until there is room."""
        if self.engine.has_room():
            # No await happens before the slot is taken: nobody can get in between.
            return await self.engine.submit_when_room(prompt, params, **kwargs)
        self.queued += 1
        notice = asyncio.ensure_future(on_queued()) if on_queued is not None else None
        try:
            # Joins the engine's waiter list before the first await inside it.
            stream = await self.engine.submit_when_room(prompt, params, **kwargs)
        except BaseException:
            if notice is not None and not notice.done():
                notice.cancel()
            raise
        finally:
            self.queued -= 1
        if notice is not None:
            try:
                await notice
            except BaseException:
                stream.abort()
                raise
        return stream
