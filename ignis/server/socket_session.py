"""GET /v1/responses upgraded to a WebSocket: OpenAI's Responses socket mode.

The client sends ``response.create`` frames (the HTTP body's fields, plus
``stream_id`` and ``generate``) and ``response.cancel`` frames; the server answers
with the SSE stream's events, one per text frame (a ``stream_id`` on every event of a
named stream).

Rules (one `SocketSession` per connection):

- History: each stream (lane) keeps its latest finished response (completed,
  incomplete or cancelled; not failed): the whole conversation it saw plus its
  output. ``previous_response_id`` naming the latest response of any lane of this
  connection continues from it with only the new items; naming it from a new
  ``stream_id`` forks that conversation. Any other id: an ``error`` frame with code
  ``previous_response_not_found`` (Codex then resends the full history). A
  continuation that fails (refused, e.g. a ``function_call_output`` answering no call
  in the conversation, or ending ``failed``) evicts the response it continued from:
  the next use of that id is ``previous_response_not_found``.
- ``generate: false`` is a prewarm: the prompt (rendered without the generation
  prompt, so that it is a prefix of the next turn's) is prefilled and its KV blocks
  are published to the prefix cache. The response completes (no output, an id to chain
  from, ``usage.input_tokens`` its prompt) as soon as the engine has taken the prompt,
  and the prefill goes on: the lane's next request starts when it is done and finds
  those tokens cached. Codex gives its startup prewarm a deadline (about 15 s in
  0.171), then drops the socket and resends everything on a new one: a prewarm
  answered only after a long prefill was cut off and its work lost. The access line,
  written when the prefill ends, says when the response was answered and how the
  prefill ended (a closed socket still stops it).
- Lanes: ``stream_id`` (1-256 chars of ``[A-Za-z0-9_.-]``), at most 32 per connection
  (the default lane, no ``stream_id``, does not count; the 33rd gets
  ``websocket_stream_limit_reached``). Requests run in order within a
  lane and concurrently across lanes, at most 16 lanes active per connection (the rest
  wait their turn).
- Admission: when the engine is full a request gets ``response.created`` +
  ``response.queued`` and waits in the server-wide FIFO (`admission`); its deadline
  (server.stream_timeout) counts from admission.
- ``response.cancel`` (``response_id``, else the latest live response of the given
  lane, default lane when none) ends one running, queued or waiting response with
  status ``cancelled`` (a ``response.incomplete`` event). Closing the socket cancels
  everything it had; the engine frees their KV blocks.
- ``response.steer`` -> ``error`` ``steering_not_supported``. A bad frame (not JSON,
  not UTF-8, binary, unknown type, over server.max_request_bytes, over the server-wide
  server.socket_buffer_bytes, a refused request) -> an ``error`` frame; the socket stays
  open (see socket_intake.py).
- No time limit on the connection. Idle close: nothing live (running, queued or
  waiting) and no text or binary frame from the client (pings do not count) for
  server.socket_idle_close seconds (counted from the later of the last frame and the
  end of the last response) -> close code 1000 with a reason saying so. The value is
  read live, so PATCH /admin/config reaches open sockets within a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from dataclasses import replace
from typing import Any

from sanic import Request
from websockets.protocol import State

from ignis.engine import RequestStream, SamplingParams
from ignis.engine.async_engine import EngineDeadError
from ignis.server.access import access_log, log_outcome, request_id
from ignis.server.context import ServerContext
from ignis.server.errors import engine_unavailable, shutting_down
from ignis.server.prepare import prepare_response
from ignis.server.render import Prompt
from ignis.server.turn import Outcome, TurnEnding, client_closed, drive, timeout_message
from ignis.server.socket_intake import RefusedMessage
from protocol import ids
from protocol.errors import Refusal
from protocol.events import dumps
from protocol.items import Item
from protocol.response import Usage
from protocol.responses_conversation import check_call_outputs
from protocol.socket_events import (
    CancelEvent,
    CreateEvent,
    SocketError,
    decode_frame,
    error_event,
)
from protocol.stream import ResponseStream

__all__ = ["SocketSession", "responses_socket", "MAX_STREAMS", "MAX_ACTIVE"]

log = logging.getLogger("ignis.server.socket")

MAX_STREAMS = 32  # named lanes per connection
MAX_ACTIVE = 16  # lanes running at once per connection
_FINISHED_MEMORY = 1024  # recently finished ids: a late cancel of one is not an error
_WATCH_INTERVAL = 0.25  # seconds between idle checks (live patches land within it)


async def _discard(events: list[dict[str, Any]]) -> None:
    return None


class SocketClosed(Exception):
    """The socket is closed: nothing more can be sent."""


class SocketResponse:
    """One ``response.create``, from its frame to its terminal event."""

    def __init__(self, session: SocketSession, event: CreateEvent) -> None:
        self.session = session
        self.event = event
        self.stream_id = event.stream_id
        self.id = ids.response_id()
        self.arrival = time.monotonic()
        self.task: asyncio.Task[None] | None = None
        self.engine_stream: RequestStream | None = None
        self.encoder: ResponseStream | None = None
        self.cancel_requested = False
        self.done = False
        self.answered_at: float | None = None  # a prewarm answered before its prefill ended: when

    def cancel(self) -> None:
        if self.done or self.cancel_requested or self.answered_at is not None:
            return
        self.cancel_requested = True
        if self.engine_stream is not None:
            self.engine_stream.abort()  # the engine ends it: finish reason ABORT -> cancelled
        elif self.task is not None:
            self.task.cancel()  # queued for the engine, or still preparing

    async def run(self) -> None:
        session, request = self.session, self.event.request
        previous = request.previous_response_id
        try:
            items = request.input
            if previous is not None:
                history = session.lookup(previous)
                items = history + items
                check_call_outputs(items, first=len(history))
            # Rendering and tokenizing a long history is CPU work: off the event loop.
            prompt, params = await asyncio.to_thread(prepare_response, session.ctx, replace(request, input=items),
                                                     generation=self.event.generate)
        except Refusal as refusal:
            if previous is not None:
                session.evict(previous)
            await session.error(refusal, self.stream_id)
            return
        except asyncio.CancelledError:
            if self.cancel_requested and not session.closing:  # cancelled while rendering
                await self.cancel_unstarted()
                return
            raise
        self.encoder = ResponseStream(request, response_id=self.id, queued=not session.ctx.admission.has_room(),
                                      reasoning_key=session.ctx.reasoning_key, stream_id=self.stream_id)
        stream = await self._admit(prompt, params, items)
        if stream is None:
            return
        self.engine_stream = stream
        async with stream:
            if self.cancel_requested:
                stream.abort()
            outcome = await self._drive(stream, prompt, params, items)
        if self.answered_at is None:
            session.remember(self.stream_id, self.id, items, self.encoder)
        elif session.closing and outcome.status == "cancelled":
            outcome.status = "client_closed"  # the prefill of an answered prewarm, stopped by the socket's close
        if self.encoder.status == "failed" and previous is not None:
            session.evict(previous)
        self._count(outcome, time.monotonic() - self.arrival)

    async def _admit(self, prompt: Prompt, params: SamplingParams | None,
                     items: tuple[Item, ...]) -> RequestStream | None:
        """The engine stream, after waiting in the server-wide queue when the engine is full
        (``response.created`` + ``response.queued`` sent then); None when the response
        ended while it waited (cancelled, or the engine is gone)."""
        session, encoder = self.session, self.encoder
        assert encoder is not None
        announced = False

        async def announce() -> None:
            nonlocal announced
            announced = True
            await session.send(encoder.start())

        try:
            return await session.ctx.admission.wait(prompt.ids, params, on_queued=announce,
                                                    timeout=session.ctx.seconds(session.ctx.live.stream_timeout),
                                                    prewarm=not self.event.generate)
        except asyncio.CancelledError:
            if self.cancel_requested and not session.closing:
                await session.send(encoder.cancel())
                session.remember(self.stream_id, self.id, items, encoder)
                return None
            raise
        except EngineDeadError:  # as HTTP's 503: the engine thread is gone
            refusal = engine_unavailable()
            if announced:
                session.ctx.metrics.refused("responses", refusal.status)
                await session.send(encoder.fail(refusal.message))
            else:
                await session.error(refusal, self.stream_id)
            return None

    async def _drive(self, stream: RequestStream, prompt: Prompt, params: SamplingParams | None,
                     items: tuple[Item, ...]) -> Outcome:
        session, encoder = self.session, self.encoder
        assert encoder is not None
        limit = session.ctx.seconds(session.ctx.live.stream_timeout)
        emit = session.send
        try:
            await session.send(encoder.admitted())
            if not self.event.generate:
                await self._answer_prewarm(len(prompt.ids), items)
                emit = _discard
            return await drive(
                stream, prompt.output_parser(), encoder, emit,
                tokenizer=session.ctx.loaded.tokenizer, started=self.arrival,
                logprobs=bool(params and params.logprobs),
                ending=TurnEnding(timeout_message=timeout_message("stream_timeout", limit)),
                single_call=not self.event.request.parallel_tool_calls,
            )
        except (SocketClosed, asyncio.CancelledError):
            # The socket went away under the response (the engine side is aborted as the
            # stream closes): counted, with its tokens, once the engine's final output
            # comes, as a client that closed (499).
            stream.on_final(lambda final: self._count(client_closed(final, self.arrival)))
            raise

    async def _answer_prewarm(self, prompt_tokens: int, items: tuple[Item, ...]) -> None:
        """Complete a prewarm now, its prefill still running (see the module docstring): it
        is a finished response from here on (a cancel of it changes nothing), remembered
        for continuations, while its lane waits for the prefill."""
        session, encoder = self.session, self.encoder
        assert encoder is not None
        await session.send(encoder.finish("stop", Usage(input_tokens=prompt_tokens)))
        session.remember(self.stream_id, self.id, items, encoder)
        self.answered_at = time.monotonic() - self.arrival
        session.answered(self)

    def _count(self, outcome: Outcome, elapsed: float | None = None) -> None:
        ctx = self.session.ctx
        ctx.metrics.finished("responses", "socket", outcome, outcome.elapsed if elapsed is None else elapsed)
        log_outcome("socket", self.id, outcome, stream_id=self.stream_id, enabled=ctx.cfg.access_log,
                    answered=self.answered_at)

    async def cancel_unstarted(self) -> None:
        """Cancelled before it began: the full life of a cancelled response, at once."""
        session = self.session
        encoder = ResponseStream(self.event.request, response_id=self.id, reasoning_key=session.ctx.reasoning_key,
                                 stream_id=self.stream_id)
        await session.send(encoder.cancel())


class Lane:
    def __init__(self, stream_id: str | None) -> None:
        self.stream_id = stream_id
        self.pending: deque[SocketResponse] = deque()  # not started yet, in order
        self.current: SocketResponse | None = None
        self.worker: asyncio.Task[None] | None = None
        self.latest: tuple[str, tuple[Item, ...]] | None = None  # (response id, whole conversation)

    def live(self) -> list[SocketResponse]:
        return ([self.current] if self.current is not None else []) + list(self.pending)


class SocketSession:
    def __init__(self, ctx: ServerContext, ws: Any, peer: str = "") -> None:
        self.ctx = ctx
        self.ws = ws
        self.peer = peer
        self.lanes: dict[str | None, Lane] = {}
        self.responses: dict[str, SocketResponse] = {}  # live responses by response id
        self.prefilling: set[SocketResponse] = set()  # answered prewarms whose prefill still runs
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.active = asyncio.Semaphore(MAX_ACTIVE)
        self.closing = False
        self.last_frame = self.last_busy = time.monotonic()
        self.close_reason: str | None = None

    # -- I/O ------------------------------------------------------------------------

    async def send(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            if self.closing or self.ws.ws_proto.state is not State.OPEN:
                raise SocketClosed()
            try:
                await self.ws.send(dumps(ev))
            except Exception as exc:  # noqa: BLE001 - Sanic's WebsocketClosed, websockets' ConnectionClosed
                if self.ws.ws_proto.state is not State.OPEN:
                    raise SocketClosed() from exc
                raise

    async def error(self, refusal: Refusal, stream_id: str | None = None) -> None:
        self.ctx.metrics.refused("responses", refusal.status)
        try:
            await self.send([error_event(refusal, stream_id)])
        except SocketClosed:
            pass

    # -- history --------------------------------------------------------------------

    def lookup(self, response_id: str) -> tuple[Item, ...]:
        for lane in self.lanes.values():
            if lane.latest is not None and lane.latest[0] == response_id:
                return lane.latest[1]
        raise Refusal(
            f"Previous response with id '{response_id}' not found on this connection (each stream keeps only "
            "its latest response; resend the full input without previous_response_id).",
            param="previous_response_id",
            code="previous_response_not_found",
        )

    def evict(self, response_id: str) -> None:
        """Forget `response_id` (a continuation from it failed): it can be continued no more."""
        for lane in self.lanes.values():
            if lane.latest is not None and lane.latest[0] == response_id:
                lane.latest = None

    def answered(self, response: SocketResponse) -> None:
        """A prewarm answered before its prefill ended (`SocketResponse._answer_prewarm`)."""
        self.responses.pop(response.id, None)
        self.finished[response.id] = None
        self.prefilling.add(response)

    def remember(self, stream_id: str | None, response_id: str, items: tuple[Item, ...], encoder: ResponseStream) -> None:
        if encoder.status not in ("completed", "incomplete", "cancelled"):
            return
        self.lanes[stream_id].latest = (response_id, tuple(items) + tuple(encoder.output_items))

    # -- the connection ---------------------------------------------------------------

    async def serve(self) -> None:
        watchdog = asyncio.ensure_future(self._idle_watchdog())
        try:
            while True:
                data = await self.ws.recv()
                if data is None:
                    if self.ws.ws_proto.state in (State.CLOSING, State.CLOSED):
                        break
                    continue
                self.last_frame = time.monotonic()
                await self._on_frame(data)
                data = None  # answered: not held while waiting for the next one
        finally:
            self.closing = True
            watchdog.cancel()
            self._cancel_everything()

    async def _on_frame(self, data: str | bytes | RefusedMessage) -> None:
        if isinstance(data, RefusedMessage):  # too large, over the server's buffer budget, not UTF-8
            await self.error(data.refusal)
            return
        if not isinstance(data, str):
            await self.error(Refusal("Binary frames are not supported: send each event as a JSON text frame.",
                                     param=None, code="invalid_frame"))
            return
        ev = decode_frame(data, reasoning_key=self.ctx.reasoning_key)
        if isinstance(ev, SocketError):
            await self.error(ev.refusal, ev.stream_id)
        elif isinstance(ev, CancelEvent):
            await self._cancel(ev)
        else:
            await self._create(ev)

    async def _create(self, ev: CreateEvent) -> None:
        stream_id = ev.stream_id
        if self.ctx.draining:
            await self.error(shutting_down(self.ctx.cfg.retry_after), stream_id)
            return
        if stream_id is not None and stream_id not in self.lanes and sum(k is not None for k in self.lanes) >= MAX_STREAMS:
            await self.error(Refusal(f"At most {MAX_STREAMS} stream_id values per connection.", param="stream_id",
                                     code="websocket_stream_limit_reached"), stream_id)
            return
        try:
            ev = replace(ev, request=self.ctx.accept(ev.request))
        except Refusal as refusal:
            await self.error(refusal, stream_id)
            return
        lane = self.lanes.get(stream_id)
        if lane is None:
            lane = self.lanes[stream_id] = Lane(stream_id)
        response = SocketResponse(self, ev)
        self.responses[response.id] = response
        lane.pending.append(response)
        if lane.worker is None:
            lane.worker = asyncio.ensure_future(self._run_lane(lane))

    async def _run_lane(self, lane: Lane) -> None:
        try:
            while lane.pending:
                response = lane.pending[0]
                async with self.active:
                    if response.done:  # cancelled while waiting for a slot (already removed)
                        continue
                    lane.pending.popleft()
                    lane.current = response
                    response.task = asyncio.ensure_future(self._guarded(response))
                    await asyncio.wait([response.task])
                    lane.current = None
        finally:
            lane.worker = None

    async def _guarded(self, response: SocketResponse) -> None:
        try:
            await response.run()
        except SocketClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one response fails, the socket lives on
            log.exception("socket response %s failed", response.id)
            message = "The server had an error while processing this response."
            try:
                if response.encoder is None:
                    await self.send([error_event(Refusal(message, code="server_error", type="server_error",
                                                         status=500), response.stream_id)])
                elif not response.encoder.done:
                    await self.send(response.encoder.fail(message))
            except SocketClosed:
                pass
        finally:
            self._finished(response)

    def _finished(self, response: SocketResponse) -> None:
        response.done = True
        self.responses.pop(response.id, None)
        self.prefilling.discard(response)
        self.finished[response.id] = None
        while len(self.finished) > _FINISHED_MEMORY:
            self.finished.popitem(last=False)
        self.last_busy = time.monotonic()

    async def _cancel(self, ev: CancelEvent) -> None:
        if ev.response_id is not None:
            response = self.responses.get(ev.response_id)
            if response is None:
                if ev.response_id not in self.finished:
                    await self.error(Refusal(f"No response with id '{ev.response_id}' on this connection.",
                                             param="response_id", code="response_not_found", status=404),
                                     ev.stream_id)
                return
        else:
            lane = self.lanes.get(ev.stream_id)
            live = lane.live() if lane is not None else []
            if not live:
                return  # nothing to cancel (it may have just finished)
            response = live[-1]
        if response.task is None:  # waiting in its lane: never started
            await self._cancel_unstarted(self.lanes[response.stream_id], response)
            return
        response.cancel()

    async def _cancel_unstarted(self, lane: Lane, response: SocketResponse) -> None:
        """End a response still waiting in its lane (it never reached the engine)."""
        if response in lane.pending:
            lane.pending.remove(response)
        self._finished(response)
        try:
            await response.cancel_unstarted()
        except SocketClosed:
            pass

    def _cancel_everything(self) -> None:
        for lane in self.lanes.values():
            for response in list(lane.pending):
                response.done = True
            lane.pending.clear()
            if lane.worker is not None:
                lane.worker.cancel()
        for response in list(self.responses.values()):
            if response.task is not None:
                response.task.cancel()  # `async with stream` aborts it in the engine
            elif response.engine_stream is not None:
                response.engine_stream.abort()
        for response in list(self.prefilling):  # answered prewarms: their task logs how the prefill ended
            if response.engine_stream is not None:
                response.engine_stream.abort()

    async def cancel_all(self, *, running: bool) -> int:
        """Server shutdown: cancel every response not started in the engine yet (waiting in
        its lane, preparing, queued), and with `running` the running ones too; each ends
        with its terminal event. Returns how many running ones were cancelled."""
        for lane in list(self.lanes.values()):
            for response in list(lane.pending):
                await self._cancel_unstarted(lane, response)
        cut = 0
        for response in list(self.responses.values()):
            if response.task is None:
                continue
            if response.engine_stream is None or running:
                cut += response.engine_stream is not None
                response.cancel()
        if running:
            for response in list(self.prefilling):
                if response.engine_stream is not None:
                    response.engine_stream.abort()
        return cut

    async def close(self, code: int, reason: str) -> None:
        self.close_reason = reason
        await self.ws.close(code, reason)

    @property
    def busy(self) -> bool:
        return bool(self.responses) or bool(self.prefilling)

    async def _idle_watchdog(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL)
            idle = self.ctx.live.socket_idle_close
            if not idle or idle <= 0 or self.busy:
                continue
            since = max(self.last_frame, self.last_busy)
            if time.monotonic() - since >= idle:
                self.close_reason = f"idle for {idle:g} s with nothing running (server.socket_idle_close)"
                await self.ws.close(1000, self.close_reason)
                return


async def responses_socket(request: Request, ws: Any) -> None:
    """The Sanic websocket handler of GET /v1/responses."""
    ctx: ServerContext = request.app.ctx.ignis
    peer = f"{request.ip}:{request.port}"
    session = SocketSession(ctx, ws, peer)
    ctx.sockets.add(session)
    ctx.metrics.sockets_opened.inc()
    extensions = ",".join(type(e).__name__ for e in getattr(ws.ws_proto, "extensions", []))
    if ctx.cfg.access_log:
        access_log.info("%s socket open GET /v1/responses%s%s", peer, f" ({extensions})" if extensions else "",
                        request_id(request))
    try:
        await session.serve()
    finally:
        ctx.sockets.discard(session)
        if ctx.cfg.access_log:
            why = session.close_reason or "closed"
            access_log.info("%s socket %s", peer, why)
