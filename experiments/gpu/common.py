"""Shared helpers of the GPU check scripts: timing, copy bandwidth, rows, the deadline.

Imports cleanly on a CPU machine: nothing touches CUDA until a function is called.
Stable API (other check modules import it):

  Case(op, shape, run, method="", baseline="")   one planned row; run(ctx) -> dict | list[dict]
  Context                                         what a case gets: device, copy_gbs, deadline, flush
  row(op, shape, ms, ...) -> dict                 a result row in the table's format
  bench(fns, ...) -> Timing                       median ms per call, method chosen by size
  cuda_time(fn, iters=100, warmup=10) -> float    median ms of fn(), CUDA events per call
  measure_copy_bandwidth(nbytes=1 << 30) -> float GB/s, read + write counted
  gbs(nbytes, ms) -> float

Timing method (experiments/RESULTS.md says why): a call that takes under ~0.2 ms is
timed by replaying a CUDA graph of many back-to-back calls (one launch's CPU overhead
and the event resolution would otherwise be most of what is measured), falling back to
events around a loop of back-to-back launches when capture fails. Longer calls get one
event pair each, with the L2 cleared before each call when asked (`flush=True`), since
an input that fits the 50-60 MB L2 would otherwise be re-read from cache. Rotating
between several copies of the inputs (`fns` as a list) does the same inside a graph.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

GRAPH_BELOW_MS = 0.2  # calls shorter than this are timed by graph replay


@dataclass
class Deadline:
    """Wall-clock budget of the whole run (seconds from its creation)."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def expired(self) -> bool:
        return self.remaining() <= 0


@dataclass
class Context:
    """What every case gets. dry: plan only (no CUDA, no kernel launch)."""

    device: torch.device
    copy_gbs: float | None
    deadline: Deadline
    dry: bool = False
    small: bool = False
    _flusher: torch.Tensor | None = None

    def flush_l2(self) -> None:
        """Overwrite a buffer twice the L2's size, evicting whatever a previous call left."""
        if self.device.type != "cuda":
            return
        if self._flusher is None:
            l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 64 << 20) or (64 << 20)
            self._flusher = torch.empty(2 * l2 // 4, dtype=torch.float32, device=self.device)
        self._flusher.zero_()


@dataclass
class Case:
    """One row (or a few) a check module will produce; run(ctx) returns them.

    op and shape are what the dry run prints; method and baseline say how it is timed
    and against what."""

    op: str
    shape: str
    run: Callable[[Context], "dict | list[dict]"]
    method: str = ""
    baseline: str = ""


@dataclass
class Timing:
    ms: float  # median per call
    method: str  # "graph xN", "loop xN", "events", "wall"
    spread: float  # (max - min) / median over the repeats, as a noise gauge

    def label(self) -> str:
        return f"{self.method}, spread {100 * self.spread:.0f}%"


def row(op: str, shape: str, ms: float | None, *, nbytes: float | None = None, copy_gbs: float | None = None,
        ok: bool = True, max_err: float | None = None, vs: str = "", **extra: object) -> dict:
    """A result row: GB/s counts nbytes (what the op must move) over ms; frac_bw is that
    over the measured copy bandwidth."""
    rate = None if nbytes is None or not ms else gbs(nbytes, ms)
    frac = None if rate is None or not copy_gbs else rate / copy_gbs
    return {"op": op, "shape": shape, "ms": ms, "gbs": rate, "frac_bw": frac, "vs": vs,
            "max_err": max_err, "ok": ok, **extra}


def _events_per_call(fns: Sequence[Callable[[], object]], iters: int, flush: Callable[[], None] | None) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i, (start, end) in enumerate(zip(starts, ends)):
        if flush is not None:
            flush()
        start.record()
        fns[i % len(fns)]()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def cuda_time(fn: Callable[[], object], iters: int = 100, warmup: int = 10) -> float:
    """Median wall time of fn() in milliseconds, measured with CUDA events per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(_events_per_call([fn], iters, None))


def _graph_time(fns: Sequence[Callable[[], object]], reps: int, repeats: int) -> list[float]:
    """Per-call ms of a CUDA graph holding `reps` calls (rotating over fns), replayed `repeats` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm the allocator and autotuners outside the capture
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    del graph
    return times


def _loop_time(fns: Sequence[Callable[[], object]], reps: int, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(reps):
            fns[i % len(fns)]()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return times


def _summary(times: list[float], method: str) -> Timing:
    med = statistics.median(times)
    spread = (max(times) - min(times)) / med if med > 0 else 0.0
    return Timing(med, method, spread)


def bench(fns: Callable[[], object] | Sequence[Callable[[], object]], *, iters: int = 50, flush: bool = False,
          ctx: Context | None = None, graph: bool = True) -> Timing:
    """Median ms per call of fns (one callable, or several to rotate among: e.g. one per copy
    of the inputs, so that consecutive calls do not find their input in L2).

    On CUDA: a rough first measure picks the method (module doc). Elsewhere (smoke runs
    under the interpreter) the wall clock of a few calls."""
    fns = [fns] if callable(fns) else list(fns)
    if not torch.cuda.is_available():
        times = []
        for i in range(3):
            t = time.perf_counter()
            fns[i % len(fns)]()
            times.append((time.perf_counter() - t) * 1e3)
        return _summary(times, "wall")
    for f in fns:  # compile, autotune, allocate
        f()
    torch.cuda.synchronize()
    rough = statistics.median(_loop_time(fns, 5, 3))
    if rough < GRAPH_BELOW_MS:
        # Enough calls per replay that one replay lasts ~2 ms: launch gaps and event
        # resolution vanish in the division.
        reps = max(len(fns), min(2000, int(2.0 / max(rough, 1e-3))))
        reps -= reps % len(fns)
        if graph:
            try:
                return _summary(_graph_time(fns, reps, 20), f"graph x{reps}")
            except Exception:  # something in fn cannot be captured (a host sync): loop instead
                torch.cuda.synchronize()
        return _summary(_loop_time(fns, reps, 20), f"loop x{reps}")
    flusher = ctx.flush_l2 if (flush and ctx is not None) else None
    return _summary(_events_per_call(fns, iters, flusher), "events+flush" if flusher else "events")


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
