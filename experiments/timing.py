"""Timing helpers the experiment scripts share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(fn: Callable[[], object], n: int, *, warmup: bool = True) -> float:
    """Median wall time of `n` calls of `fn`, in milliseconds (one untimed call first
    unless `warmup` is False)."""
    if warmup:
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)
