"""ignis/model/huge_pages.py: large packed weights copied into anonymous mappings advised
MADV_HUGEPAGE, packed one after another; small ones, and the switched-off case, as before."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from ignis.model import huge_pages


def _mapping_of(ptr: int) -> tuple[int, int, set[str]] | None:
    """(start, end, VmFlags) of this process's mapping holding address ptr, or None."""
    start = end = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            start, end = (lo, hi) if lo <= ptr < hi else (None, None)
        elif head == "VmFlags:" and start is not None:
            return start, end, set(line.split()[1:])
    return None


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """The module with small chunks (4 MB) and no chunk in use; huge pages as this machine has them."""
    monkeypatch.setattr(huge_pages, "CHUNK", 4 << 20)
    monkeypatch.setattr(huge_pages, "_current", None)
    yield huge_pages
    huge_pages.enabled.cache_clear()


def test_small_arrays_stay_numpy_memory(fresh) -> None:
    a = np.arange(1000, dtype=np.float32)
    t = fresh.hold(a)
    assert t.data_ptr() == a.ctypes.data and torch.equal(t, torch.from_numpy(a))


@pytest.mark.skipif(not huge_pages.enabled(), reason="no transparent huge pages here (THP never, or not Linux)")
def test_large_arrays_pack_into_advised_chunks(fresh) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (2 << 20) + 1, dtype=np.uint8).reshape(-1, 1)  # not a multiple of 64
    b = rng.standard_normal((1 << 20) // 4 + 5).astype(np.float32)
    ta, tb = fresh.hold(a), fresh.hold(b.reshape(-1, 1))
    assert torch.equal(ta, torch.from_numpy(a)) and torch.equal(tb[:, 0], torch.from_numpy(b))
    assert ta.shape == a.shape and tb.dtype == torch.float32
    # one chunk, one after the other on cache lines: no tensor rounds up to a page of its own
    assert ta.data_ptr() % (2 << 20) == 0 and tb.data_ptr() == ta.data_ptr() + -(-a.nbytes // 64) * 64
    start, end, flags = _mapping_of(ta.data_ptr())
    assert "hg" in flags and start <= tb.data_ptr() < end  # MADV_HUGEPAGE, the same mapping
    # the next one does not fit: a chunk of its own size, and the first lives on with its tensors
    c = fresh.hold(np.ones(5 << 20, dtype=np.uint8))
    assert _mapping_of(c.data_ptr())[0] != start and c.sum().item() == 5 << 20
    first = ta.data_ptr()
    del ta, tb
    gc.collect()
    gone = _mapping_of(first)
    assert gone is None or gone[:2] != (start, end)  # unmapped with its last tensor


def test_switched_off(fresh, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IGNIS_HUGE_PAGES", "0")
    fresh.enabled.cache_clear()
    a = np.ones(2 << 20, dtype=np.uint8)
    assert not fresh.enabled() and fresh.hold(a).data_ptr() == a.ctypes.data
