"""Giving the engine's thread the process's only OpenMP team.

torch's CPU ops run their parallel regions on OpenMP (GNU libgomp in the Linux wheels).
Each thread that runs a parallel region gets a team of its own, and its worker threads
stay, idle, after the region ends. The AsyncEngine steps in a thread of its own, but
the model was loaded (dequantized, packed) in the thread that built it, whose team
outlives the loading. libgomp then counts more OpenMP threads than CPUs and, for that
case, throttles its workers' spin-waiting (a few spins, then sleep) between regions:
each of the hundreds of parallel regions of a step pays a wake-up. Measured here on 2
cores, 64 sequences: 140-150% CPU and 20-30% fewer tokens/s than the same engine
stepped in the main thread (195-200%); see experiments/RESULTS.md.

`release_thread_pool()` frees the calling thread's team (OpenMP 5.0's
`omp_pause_resource_all(omp_pause_soft)`); the next parallel region of that thread
simply builds a new one. The AsyncEngine calls it in the thread that constructs it.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import lru_cache

log = logging.getLogger(__name__)

__all__ = ["release_thread_pool"]

_OMP_PAUSE_SOFT = 1
_LIBRARIES = ("libgomp.so.1", "libgomp.so", "libiomp5.so", "libomp.so", "libomp.dylib", "libiomp5.dylib")


@lru_cache(maxsize=1)
def _pause_function() -> object | None:
    import torch

    folder = os.path.join(os.path.dirname(torch.__file__), "lib")
    for name in _LIBRARIES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's idle OpenMP worker threads. False when torch's OpenMP
    runtime is not found or refuses (nothing changes then)."""
    fn = _pause_function()
    if fn is None:
        return False
    ok = fn(_OMP_PAUSE_SOFT) == 0
    if not ok:
        log.debug("omp_pause_resource_all refused")
    return ok
