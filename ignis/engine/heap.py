"""Hand the C heap's free memory back to the OS when the engine falls idle.

A long prefill allocates hundreds of MB of activations (a 2048-token chunk's MLP alone is
tens of MB per op) through torch's CPU allocator, that is glibc's malloc. glibc keeps
what is freed in its arenas for reuse, so after a 5.6k-token prompt an idle SmolLM2
server stayed ~200 MB above what it holds (830 -> 633 MB after `malloc_trim(0)`,
experiments/RESULTS.md). The engine trims once it has no request left and has computed enough tokens
since the last trim to have grown the heap; a trim costs a few milliseconds, paid only
while idle. Elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

# Tokens computed since the last trim before an idle engine trims again: one long prompt
# (or many short steps) grows the heap; a few decode steps do not. A ~950-token prompt left a
# 1B model's server 200 MB above what it holds (1608 -> 1407 MB trimmed; its prefill takes
# seconds, the next request's page faults tens of ms); trimming after every short chat turn
# measured ~10% slower turns.
TRIM_AFTER_TOKENS = 512


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    """Counts the tokens the engine computes; `idle()` trims when enough have passed."""

    def __init__(self, after_tokens: int = TRIM_AFTER_TOKENS) -> None:
        self.after_tokens = after_tokens
        self.pending = 0
        self.trims = 0
        self._trim = _malloc_trim()

    def computed(self, num_tokens: int) -> None:
        self.pending += num_tokens

    def idle(self) -> bool:
        """The engine has nothing left to run: trim if the heap may have grown (True if so)."""
        if self._trim is None or self.pending < self.after_tokens:
            return False
        self.pending = 0
        self._trim(0)
        self.trims += 1
        return True
