"""Large packed weights in transparent huge pages (2 MB), where the kernel offers them.

    t = hold(array)   # a CPU tensor with array's values: in huge pages from MIN_BYTES on

A one-user decode step reads every weight once, at the memory's speed. With 4 KB pages a
2-core Zen 4 VM streamed 18 MB buffers at 25 GB/s and the same buffers in 2 MB pages at
34.5 (a 1B model's Q4_K gate|up GEMM at one row: 20 -> 29 GB/s): every 4 KB is another TLB
miss on the way. llama.cpp gets large pages from the page cache, which holds the GGUF it maps
in large folios. Arrays from MIN_BYTES on are copied into anonymous mappings advised
MADV_HUGEPAGE (Linux's THP `enabled` = `madvise` or `always`), packed one after another in
CHUNK-sized mappings so no tensor rounds up to a 2 MB page of its own (a chunk's untouched
tail is never resident). MIN_BYTES is small enough for the per-group arrays read beside a
weight's values (an MXFP4 expert's exponents, a Q8_0 matrix's scales: 0.26-0.9 MB for
gpt-oss-20b's): in 4 KB pages they held gpt-oss-20b's decode at 1.07x the time, median of six
alternated runs on a 2-core Xeon (a 2880 x 2880 MXFP4 GEMM 8.2 -> 9.7 GB/s). Smaller arrays,
THP `never`, other systems or IGNIS_HUGE_PAGES=0: torch.from_numpy, as before. A chunk lives
as long as any tensor in it.
"""

from __future__ import annotations

import mmap
import os
import threading
from functools import cache
from pathlib import Path

import numpy as np
import torch

MIN_BYTES = 64 << 10
PAGE = 2 << 20
CHUNK = 256 << 20
_ALIGN = 64  # each tensor starts on a cache line (the GEMMs' 512-bit loads)
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@cache
def enabled() -> bool:
    """Whether hold() places large arrays in huge pages here."""
    if os.environ.get("IGNIS_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in _THP.read_text()
    except OSError:
        return False


class _Chunk:
    """One anonymous mapping, its huge-page-aligned part handed out front to back."""

    def __init__(self, size: int) -> None:
        # private: a shared anonymous mapping is shmem, whose huge pages are another switch
        self.map = mmap.mmap(-1, size + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # room to start on 2 MB
        base = torch.frombuffer(self.map, dtype=torch.uint8, count=1).data_ptr()
        self.next = -base % PAGE
        self.end = self.next + size
        self.map.madvise(mmap.MADV_HUGEPAGE, self.next, size)

    def take(self, nbytes: int) -> int | None:
        at = -(-self.next // _ALIGN) * _ALIGN
        if at + nbytes > self.end:
            return None
        self.next = at + nbytes
        return at


_lock = threading.Lock()
_current: _Chunk | None = None


def hold(a: np.ndarray) -> torch.Tensor:
    """`a` as a CPU tensor: a copy in huge pages where a is large and they are enabled, else
    torch.from_numpy(a) (sharing a's memory)."""
    global _current
    a = np.ascontiguousarray(a)
    if a.nbytes < MIN_BYTES or not enabled():
        return torch.from_numpy(a)
    with _lock:
        at = _current.take(a.nbytes) if _current is not None else None
        if at is None:  # a fresh chunk (an array larger than CHUNK gets one of its own size)
            _current = _Chunk(max(CHUNK, -(-a.nbytes // PAGE) * PAGE))
            at = _current.take(a.nbytes)
        chunk = _current
    src = torch.from_numpy(a)
    out = torch.frombuffer(chunk.map, dtype=src.dtype, count=src.numel(), offset=at).view(src.shape)
    out.copy_(src)
    return out
