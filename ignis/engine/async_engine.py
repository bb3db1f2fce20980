"""The asyncio front: the engine core runs in a thread of its own; the event loop talks
to it through a command list (submit, abort) and gets outputs back through
loop.call_soon_threadsafe into one asyncio.Queue per request.

    engine = AsyncEngine(loaded, cfg.engine)
    stream = engine.submit(prompt_ids, SamplingParams(max_tokens=64))
    async for out in stream:            # RequestOutput deltas; the last has finished=True
        ...
    engine.abort(stream.request_id)     # frees its blocks before the next step

Threads: the core thread owns every piece of engine state and sleeps on a condition
when it has nothing to do. Room (capacity): at most max_in_flight requests (default
engine.max_num_seqs) are in flight; has_room() / try_submit() answer at once (HTTP
turns "no" into a 503), submit_when_room() waits in FIFO order (the socket's queue).
submit() itself never refuses: past capacity requests wait inside the engine.

Failures: a request the engine cannot take (bad stop string, prompt too long, ...)
ends with one ERROR output; when a batched forward fails, each of its requests is run
alone and only those that fail alone end with ERROR (the others go on); if the core
thread itself dies, every open stream gets an ERROR output, `healthy` turns False and
submit() raises EngineDeadError. The same happens when the runner fails for good
(FatalRunnerError: a tensor-parallel worker exited, mid-step or between steps).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack

import torch

from ignis.config import EngineConfig
from ignis.engine.engine import EngineStats, LLMEngine
from ignis.engine.model_runner import FatalRunnerError
from ignis.engine.openmp import release_thread_pool
from ignis.engine.outputs import Completion, EngineFinish, EngineUsage, RequestOutput
from ignis.engine.sampling_params import SamplingParams
from ignis.model.loader import LoadedModel

log = logging.getLogger(__name__)
_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class _Add:
    """To the engine thread: admit a request (its outputs go back to `loop`)."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    deadline: float | None
    prewarm: bool
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True, slots=True)
class _Abort:
    """To the engine thread: end a request."""

    request_id: str

class SubmitOptions(TypedDict, total=False):
    """What a submission may add to its prompt and params (all three submit calls)."""

    request_id: str | None  # default: a fresh "req-N"
    # A time.monotonic() value, or `timeout`: seconds from now (not both); past it the
    # request ends with finish reason DEADLINE.
    deadline: float | None
    timeout: float | None
    # Prefill and publish the prompt's blocks, sample nothing (one final output, finish
    # reason PREWARM, with usage).
    prewarm: bool


class EngineDeadError(RuntimeError):
    """The engine's core thread is gone (it crashed, or the engine was shut down)."""


class RequestStream:
    """The outputs of one request, as an async iterator. Use `async with` to abort the
    request when the consumer leaves early (a dropped client)."""

    def __init__(self, engine: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.finished = False  # the final output has been delivered to the queue
        self.final: RequestOutput | None = None
        self._consumed_final = False
        self._on_final: Callable[[RequestOutput], None] | None = None

    def _put(self, out: RequestOutput) -> None:
        if out.finished:
            self.finished = True
            self.final = out
            if self._on_final is not None:
                self._on_final(out)
        self._queue.put_nowait(out)

    def on_final(self, callback: Callable[[RequestOutput], None]) -> None:
        """Call `callback` (on the event loop) with the final output when it arrives, at once
        if it has: a consumer that left early (a client gone) still learns the usage,
        tokens generated after it left included."""
        if self.final is not None:
            callback(self.final)
        else:
            self._on_final = callback

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._consumed_final:
            raise StopAsyncIteration
        out = await self._queue.get()
        if out.finished:
            self._consumed_final = True
        return out

    async def collect(self) -> Completion:
        """Wait for the end and fold every output into one Completion."""
        return Completion.fold(self.request_id, [out async for out in self])

    def abort(self) -> None:
        if not self.finished:
            self._engine.abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.abort()


class AsyncEngine:
    def __init__(
        self,
        loaded: LoadedModel | None = None,
        config: EngineConfig | None = None,
        *,
        engine: LLMEngine | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        if engine is None:
            if loaded is None:
                raise ValueError("AsyncEngine needs a LoadedModel (or a ready LLMEngine)")
            engine = LLMEngine(loaded, config)
        self.engine = engine
        self.max_in_flight = max_in_flight or engine.config.max_num_seqs
        # Shared with the core thread, under _cv's lock.
        self._cv = threading.Condition()
        self._commands: list[_Add | _Abort] = []
        self._stopping = False
        self._kicked = False  # a grammar mask fill ended (see _wake)
        self._dead = False
        self._failure: str | None = None  # the runner failed between steps (a worker exited)
        self.error: BaseException | None = None  # what killed the core thread
        # Loop side (guarded by _lock: several loops may use one engine).
        self._lock = threading.Lock()
        self._streams: dict[str, RequestStream] = {}
        self._slots = 0  # in flight + reserved for woken waiters
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._stats = engine.stats()
        if engine.runner.device.type == "cpu":
            # The model was loaded and packed in this thread: free its idle OpenMP team, so
            # that the core thread's is the process's only one (see ignis/engine/openmp.py:
            # otherwise libgomp makes the core thread's workers sleep between parallel
            # regions, -20-30% tokens/s on 2 cores).
            release_thread_pool()
        engine.watch_failures(self._runner_failed)
        engine.on_wake = self._wake
        self._thread = threading.Thread(target=self._run, name="ignis-engine", daemon=True)
        self._thread.start()

    # -- submitting -----------------------------------------------------------------

    def submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, **options: Unpack[SubmitOptions]
    ) -> RequestStream:
        """Queue a request (from the event loop); iterate the returned stream. Options:
        see `SubmitOptions`."""
        return self._submit(prompt_token_ids, params, reserved=False, **options)

    def has_room(self) -> bool:
        """Would a request submitted now start without queueing behind others?"""
        with self._lock:
            return not self._waiters and self._slots < self.max_in_flight

    def try_submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, **options: Unpack[SubmitOptions]
    ) -> RequestStream | None:
        """submit() if there is room now, else None (nothing queued)."""
        with self._lock:
            if self._waiters or self._slots >= self.max_in_flight:
                return None
            self._slots += 1  # reserve it atomically with the check
        return self._submit_reserved(prompt_token_ids, params, options)

    async def submit_when_room(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, **options: Unpack[SubmitOptions]
    ) -> RequestStream:
        """Wait (FIFO among waiters) until there is room, then submit. A timeout counts
        from the submission, not from the start of the wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and self._slots < self.max_in_flight:
                self._slots += 1
                fut = None
            else:
                fut = loop.create_future()
                self._waiters.append(fut)
        if fut is not None:
            try:
                await fut  # resolved with a slot reserved for us
            except asyncio.CancelledError:
                with self._lock:
                    if fut in self._waiters:
                        self._waiters.remove(fut)
                        fut = None
                if fut is not None and fut.done() and not fut.cancelled():
                    self._release_slot()  # woken, then cancelled: pass the slot on
                raise
        return self._submit_reserved(prompt_token_ids, params, options)

    def _submit_reserved(self, prompt: Sequence[int], params: SamplingParams | None,
                         options: SubmitOptions) -> RequestStream:
        try:
            return self._submit(prompt, params, reserved=True, **options)
        except BaseException:
            self._release_slot()
            raise

    def _submit(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None,
        *,
        reserved: bool,
        request_id: str | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        prewarm: bool = False,
    ) -> RequestStream:
        loop = asyncio.get_running_loop()
        if timeout is not None:
            if deadline is not None:
                raise ValueError("pass deadline or timeout, not both")
            deadline = time.monotonic() + timeout
        rid = request_id if request_id is not None else f"req-{next(_ids)}"
        stream = RequestStream(self, rid, loop)
        with self._lock:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already in flight")
            self._streams[rid] = stream
            if not reserved:
                self._slots += 1
        with self._cv:
            if self._dead or self._stopping:
                with self._lock:
                    del self._streams[rid]
                    if not reserved:
                        self._slots -= 1
                raise EngineDeadError("the engine is not running" + (f": {self.error!r}" if self.error else ""))
            self._commands.append(_Add(rid, list(prompt), params or SamplingParams(), deadline, prewarm, loop))
            self._cv.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """End a request (running or waiting) and free its blocks; its stream gets a final
        ABORT output. Unknown or finished ids are ignored."""
        with self._cv:
            if not self._dead:
                self._commands.append(_Abort(request_id))
                self._cv.notify()

    # -- state ----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return not self._dead and self._failure is None and self._thread.is_alive()

    def _wake(self) -> None:
        """From a grammar mask fill's thread: a sequence may be able to run again."""
        with self._cv:
            self._kicked = True
            self._cv.notify()

    def _runner_failed(self, message: str) -> None:
        """From the runner's watcher: wake the core thread, which then stops (see _run)."""
        with self._cv:
            self._failure = message
            self._cv.notify()

    @property
    def stats(self) -> EngineStats:
        """Gauges: running, waiting, free blocks, prefix-cache hit tokens, in flight, ..."""
        with self._lock:
            return replace(self._stats, num_in_flight=len(self._streams), num_room_waiters=len(self._waiters))

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the core thread; open requests end with ABORT. Blocking (see aclose)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.shutdown)

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- loop side --------------------------------------------------------------------

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """On the event loop: route outputs to their streams; free slots of finished ones."""
        freed = 0
        for out in outputs:
            with self._lock:
                stream = self._streams.get(out.request_id)
                if stream is not None and out.finished:
                    del self._streams[out.request_id]
                    freed += 1
            if stream is not None:
                stream._put(out)
        for _ in range(freed):
            self._release_slot()

    def _release_slot(self) -> None:
        """One slot is free: hand it to the first live waiter, if any."""
        with self._lock:
            while self._waiters:
                fut = self._waiters.popleft()
                if not fut.done():
                    break
            else:
                self._slots -= 1
                return
        # The slot passes straight to the waiter (count unchanged).
        if fut.get_loop() is _running_loop():
            fut.set_result(None)
        else:
            fut.get_loop().call_soon_threadsafe(self._resolve, fut)

    def _resolve(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():  # gave up while the slot was on its way: pass it on
            self._release_slot()
        elif not fut.done():
            fut.set_result(None)

    # -- core thread ------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        loops: dict[str, asyncio.AbstractEventLoop] = {}
        try:
            torch.set_num_threads(engine.num_threads)  # per thread in OpenMP (see LLMEngine)
            device = engine.runner.device
            if device.type == "cuda":  # so is the current CUDA device
                torch.cuda.set_device(device)
            while True:
                with self._cv:
                    while not self._commands and not self._stopping and self._failure is None:
                        if self._kicked:  # a grammar mask ended since the last step
                            break
                        pause = engine.pause()
                        if pause <= 0:
                            break
                        self._cv.wait(None if pause == float("inf") else pause)
                        if pause != float("inf"):
                            break  # a poll: step again (a deadline, a mask timeout)
                    self._kicked = False
                    commands, self._commands = self._commands, []
                    stopping = self._stopping
                    if self._failure is not None:
                        self._commands = commands  # answered with the open streams below
                        raise FatalRunnerError(self._failure)
                outputs: list[RequestOutput] = []
                for cmd in commands:
                    if isinstance(cmd, _Add):
                        loops[cmd.request_id] = cmd.loop
                        try:
                            engine.add_request(cmd.request_id, cmd.prompt, cmd.params, deadline=cmd.deadline,
                                               prewarm=cmd.prewarm)
                        except Exception as exc:  # noqa: BLE001 - this request alone fails
                            outputs.append(_error_output(cmd.request_id, len(cmd.prompt), str(exc)))
                    else:
                        engine.abort_request(cmd.request_id)
                if stopping:
                    for rid in list(engine.seqs):
                        engine.abort_request(rid)
                outputs.extend(engine.step())
                self._stats = engine.stats()
                self._send(outputs, loops)
                if stopping:
                    return
        except FatalRunnerError as exc:
            log.error("the engine stops: %s", exc)
            self.error = exc
        except BaseException as exc:
            log.exception("the engine thread died")
            self.error = exc
        finally:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - the streams below must still hear of it
                log.exception("closing the engine's runner failed")
            with self._cv:
                self._dead = True
                leftovers, self._commands = self._commands, []
            for cmd in leftovers:
                if isinstance(cmd, _Add):
                    loops[cmd.request_id] = cmd.loop
            message = f"engine died: {self.error!r}" if self.error else "engine shut down"
            reason = EngineFinish.ERROR if self.error else EngineFinish.ABORT
            self._send(
                [_error_output(rid, 0, message, reason) for rid in loops],
                loops,
            )

    def _send(self, outputs: list[RequestOutput], loops: dict[str, asyncio.AbstractEventLoop]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[RequestOutput]] = {}
        for out in outputs:
            loop = loops.get(out.request_id)
            if loop is None:
                continue
            if out.finished:
                del loops[out.request_id]
            by_loop.setdefault(loop, []).append(out)
        for loop, outs in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._deliver, outs)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass


def _error_output(rid: str, prompt_tokens: int, message: str, reason: EngineFinish = EngineFinish.ERROR) -> RequestOutput:
    return RequestOutput(
        rid,
        finished=True,
        finish_reason=reason,
        error=message if reason is EngineFinish.ERROR else None,
        usage=EngineUsage(prompt_tokens=prompt_tokens, cached_tokens=0, output_tokens=0),
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

