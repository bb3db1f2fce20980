"""Shared helpers of the GPU check scripts: CUDA-event timing and copy bandwidth.

Imports cleanly on a CPU machine: nothing touches CUDA until a function is called.
Stable API (other check scripts import it):
  cuda_time(fn, iters=100, warmup=10) -> float   median milliseconds of fn()
  measure_copy_bandwidth(nbytes=1 << 30, iters=20) -> float   GB/s, read + write counted
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def cuda_time(fn: Callable[[], object], iters: int = 100, warmup: int = 10) -> float:
    """Median wall time of fn() in milliseconds, measured with CUDA events per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def measure_copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 bytes/s), counting read + write bytes."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = cuda_time(lambda: dst.copy_(src), iters=iters, warmup=3)
    moved = 2 * src.numel() * src.element_size()
    src = dst = None  # free both before empty_cache (the lambda holds the cells)
    torch.cuda.empty_cache()
    return moved / (ms * 1e-3) / 1e9


def gbs(nbytes: float, ms: float) -> float:
    """Bytes moved in ms milliseconds, as GB/s."""
    return nbytes / (ms * 1e-3) / 1e9
