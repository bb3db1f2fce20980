"""Grammar bitmasks, filled off the engine's thread, never holding a step up for long.

A grammar row's next-token bitmask usually takes microseconds, but some grammars make
llguidance work for a while each token (a 300 KB string literal: ~80 ms a mask). So the
engine never waits on a mask beyond a step's worth of time:

- `MaskFiller.start(states)` starts a fill for every state that has none for its
  position: the states that have shown their masks are quick (a fill under `FAST_S`)
  in one batch (llguidance's executor, its own threads); the others (a new grammar's
  first mask, one that fell behind) each alone, on a lane of lower CPU priority (nice
  19): a grammar that makes llguidance work long takes the cores only when the
  model's threads leave them.
- `MaskFiller.ready(states, wait)`: the sampler waits at most `wait` seconds (about the
  forward's time) for the masks of the rows it samples. A row whose mask is not ready
  then is deferred: it samples nothing this step (the engine recomputes its last token
  next time), and its state is marked `late`: from then on it fills alone, and its
  sequence is scheduled only once its mask is ready (`blocked`). Other rows never wait
  for it.
- A fill that runs past `MASK_TIMEOUT_S` fails its request (`overdue`).
- A speculative draft's positions after the first (`start_drafts`, `draft_masks`): only
  quick states draft (ignis/engine/speculation.py), and their draft masks fill on the
  batch lane right after the position's own (one worker: never two fills on a matcher at
  once), during the forward; the sampler waits for them as for the first.

Fills run on threads with a large stack (ignis/engine/grammar_thread.py); each one's
end calls `wake` (the AsyncEngine's core thread sleeps while every sequence waits on
a mask).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

import numpy as np

from ignis.engine.grammar import GrammarState, fill_draft_masks, fill_masks
from ignis.engine.grammar_thread import BigStackPool

__all__ = ["MASK_TIMEOUT_S", "MaskFill", "MaskFiller", "blocked", "overdue"]

# The longest one mask may take before its request fails.
MASK_TIMEOUT_S = 20.0
# A late state whose fill took less than this fills in the batch again.
FAST_S = 0.002


@dataclass(eq=False)
class MaskFill:
    """One state's bitmask for the token after `position` output tokens: row `row` of
    `rows`, written by `future`."""

    future: Future[float]  # its result: the seconds llguidance took
    rows: np.ndarray
    row: int
    position: int
    started: float

    @property
    def done(self) -> bool:
        return self.future.done()

    @property
    def took(self) -> float | None:
        """Seconds the fill took (None: not done, or it failed)."""
        if not self.future.done() or self.future.exception() is not None:
            return None
        return self.future.result()

    def mask(self) -> np.ndarray:
        """The filled row (raises what the fill raised)."""
        self.future.result()
        return self.rows[self.row]


def _timed_fill(states: list[GrammarState], rows: np.ndarray) -> float:
    started = time.perf_counter()
    fill_masks(states, rows)
    return time.perf_counter() - started


def _timed_draft_fill(state: GrammarState, draft: list[int], rows: np.ndarray) -> float:
    started = time.perf_counter()
    fill_draft_masks(state, draft, rows)
    return time.perf_counter() - started


def _current(state: GrammarState) -> MaskFill | None:
    fill = state.fill
    return fill if fill is not None and fill.position == state.num_tokens else None


def blocked(state: GrammarState) -> bool:
    """A late state whose mask (or a draft's masks) is still being filled: its sequence
    waits (not scheduled), and nothing touches its matcher meanwhile."""
    fill = _current(state)
    drafting = state.draft_fill is not None and not state.draft_fill.done
    return state.late and (drafting or (fill is not None and not fill.done))


def overdue(state: GrammarState, now: float) -> bool:
    fill = _current(state)
    return fill is not None and not fill.done and now - fill.started > MASK_TIMEOUT_S


class MaskFiller:
    """The engine's mask fills: a batch lane and a lane for late states."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.wake = wake
        self._batch = BigStackPool("ignis-masks", workers=1)
        self._alone = BigStackPool("ignis-masks-alone", workers=1, nice=19)

    def start(self, states: list[GrammarState]) -> None:
        """Start filling each state's mask for its current position, unless one is."""
        fresh = list({id(s): s for s in states if _current(s) is None}.values())  # one fill a matcher
        if not fresh:
            return
        now = time.monotonic()
        together = [s for s in fresh if s.quick and not s.late]
        if together:
            self._launch(self._batch, together, now)
        for s in fresh:
            if not s.quick or s.late:
                self._launch(self._alone, [s], now)

    def start_drafts(self, drafts: list[tuple[GrammarState, list[int]]]) -> None:
        """Start filling the masks at each state's draft positions after the first (after
        `start`, on the same lane: its position's own fill runs first)."""
        now = time.monotonic()
        for state, draft in drafts:
            rows = np.zeros((len(draft), state.mask_words), dtype=np.int32)
            future = self._batch.submit(_timed_draft_fill, state, draft, rows)
            state.draft_fill = MaskFill(future, rows, 0, state.num_tokens, now)

    def draft_masks(self, state: GrammarState, wait: float | None) -> np.ndarray | None:
        """The masks at the state's current draft's positions after the first ([k, W]),
        after waiting at most `wait` seconds; None: not filled in time (or it failed). A
        state whose draft masks were slow drafts no more (`slow_drafts`)."""
        fill = state.draft_fill
        if fill is None or fill.position != state.num_tokens:
            return None
        if not fill.done:
            wait_futures({fill.future}, timeout=wait)
        took = fill.took
        if took is None or took > FAST_S * len(fill.rows):
            state.slow_drafts = True
        return fill.rows if took is not None else None

    def _launch(self, pool: BigStackPool, states: list[GrammarState], now: float) -> None:
        rows = np.zeros((len(states), max(s.mask_words for s in states)), dtype=np.int32)
        future = pool.submit(_timed_fill, states, rows)
        for k, s in enumerate(states):
            s.fill = MaskFill(future, rows, k, s.num_tokens, now)
        if self.wake is not None:
            wake = self.wake
            future.add_done_callback(lambda _: wake())

    def ready(self, states: list[GrammarState], wait: float | None) -> list[bool]:
        """Whether each state's mask for its position is filled, after waiting at most `wait`
        seconds (None: as long as it takes) for the ones under way. Starts the missing ones.
        A state still not ready is marked late."""
        self.start(states)
        fills = [_current(s) for s in states]
        pending = {f.future for f in fills if f is not None and not f.done}
        if pending:
            wait_futures(pending, timeout=wait)
        out = []
        for s, f in zip(states, fills):
            ok = f is not None and f.done
            if not ok:
                s.late = True
            elif f.took is not None and f.took < FAST_S:
                s.late, s.quick = False, True
            out.append(ok)
        return out

    def wait_any(self, states: list[GrammarState], timeout: float) -> None:
        """Sleep until one of these states' fills ends, at most `timeout` seconds."""
        pending = {f.future for s in states if (f := _current(s)) is not None and not f.done}
        if pending:
            wait_futures(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        else:
            time.sleep(min(timeout, 0.001))
