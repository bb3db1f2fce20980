"""Threads with a large native stack for llguidance's grammar work.

llguidance compiles a grammar recursively: each level of a ``$ref`` chain, or of a rule
that refers to the next, costs about 3.4 KB of native stack (llguidance 1.9.1, measured
here: a thread with a 2 MB stack overflows, SIGSEGV, past ~580 levels, an 8 MB one past
~2,400, a 16 MB one past ~4,800). A native stack overflow kills the whole process, so
every call that hands llguidance a client's grammar (conversion, compile, validation,
mask computation) runs on a thread made here with `STACK_BYTES` of stack, and the
server bounds the depth of what it accepts (ignis/server/grammar_bounds.py) well inside
what that stack holds. The stack is virtual memory: only the pages a compile reaches
are ever touched.

    pool = BigStackPool("ignis-grammar", workers=2)
    matcher = pool.call(llguidance.LLMatcher, tokenizer, text)   # blocks the caller
    future = pool.submit(fill, states, out)                       # or not
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["STACK_BYTES", "BigStackPool", "compile_pool", "on_grammar_thread"]

# 256 MiB: ~75,000 levels at the measured cost, 75x the depth the server accepts.
STACK_BYTES = 256 << 20

T = TypeVar("T")
_creating = threading.Lock()  # threading.stack_size is process-wide: set it for our threads only


class BigStackPool:
    """`workers` daemon threads with `stack` bytes of stack each, started on first use,
    running submitted calls in FIFO order; `nice` > 0 lowers their CPU priority (they
    yield the cores to the engine's threads)."""

    def __init__(self, name: str, workers: int = 1, stack: int = STACK_BYTES, nice: int = 0) -> None:
        self.name = name
        self.workers = workers
        self.stack = stack
        self.nice = nice
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue())
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            with _creating:
                previous = threading.stack_size(self.stack)
                try:
                    for k in range(self.workers):
                        t = threading.Thread(target=self._work, name=f"{self.name}-{k}", daemon=True)
                        t.start()
                        self._threads.append(t)
                finally:
                    threading.stack_size(previous)

    def _work(self) -> None:
        if self.nice:
            try:  # Linux: a thread's own niceness (raising it needs no privilege). Not SCHED_IDLE:
                # a busy engine would starve an ordinary grammar's first mask past its timeout.
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            else:
                future.set_result(result)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        if not self._threads:
            self._start()
        future: Future[T] = Future()
        self._queue.put((future, fn, args))
        return future

    def owns_current_thread(self) -> bool:
        return threading.current_thread() in self._threads

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on one of the pool's threads; the caller waits (a call made from one of
        them runs at once: no thread waits on its own queue)."""
        if self.owns_current_thread():
            return fn(*args)
        return self.submit(fn, *args).result()


# Grammar conversion, validation and compilation (two: one slow compile leaves room for others).
compile_pool = BigStackPool("ignis-grammar", workers=2)


def on_grammar_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a compile thread (the caller waits; its own thread's stack is not used)."""
    return compile_pool.call(fn, *args)
