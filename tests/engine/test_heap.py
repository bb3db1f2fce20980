"""The engine hands the C heap's free memory back when it falls idle after a long prompt
(ignis/engine/heap.py)."""

from __future__ import annotations

import sys

import pytest

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.heap import HeapTrimmer
from ignis.model import LoadedModel


def test_trims_only_when_idle_after_enough_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    heap = HeapTrimmer(after_tokens=100)
    monkeypatch.setattr(heap, "_trim", lambda pad: calls.append(pad) or 1)
    heap.computed(60)
    assert not heap.idle() and not calls  # a few steps' worth: the heap has not grown
    heap.computed(40)
    assert heap.idle() and calls == [0]
    assert not heap.idle()  # nothing computed since
    assert heap.trims == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_engine_trims_after_a_long_prompt(tiny: LoadedModel) -> None:
    engine = LLMEngine(tiny, EngineConfig(num_kv_blocks=128, block_size=4))
    assert engine.heap._trim is not None  # glibc here
    engine.heap.after_tokens = 200
    params = SamplingParams.greedy(2, ignore_eos=True)
    engine.generate([list(range(3, 20))], params)
    assert engine.heap.trims == 0  # short: no trim
    engine.add_request("long", list(range(3, 240)), params)
    engine.add_request("short", [5, 6, 7], SamplingParams.greedy(40, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        if engine.has_unfinished_requests():
            assert engine.heap.trims == 0  # never while a request is running
    assert engine.heap.trims == 1 and engine.heap.pending == 0
