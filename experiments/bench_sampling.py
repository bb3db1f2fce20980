"""Benchmarks of batched sampling (pytest-benchmark): the PyTorch reference, the Triton
kernel (CUDA only) and the usual torch.sort-based top-k/top-p sampler.

    make bench PYTEST_ARGS='-k sampling'      # or: python -m pytest experiments/bench_sampling.py --benchmark-only

Modest sizes on a CPU; the full 256 x 151,936 on a GPU. Full-size correctness and CUDA
event timings are in experiments/gpu/sampling_check.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from experiments.gpu.sampling_check import make_logits, make_params, sort_sampler
from ignis_kernels.sampling_ref import sample_ref

CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
DEVICE = "cuda" if CUDA else "cpu"
SHAPES = [(32, 151_936), (256, 151_936), (256, 32_000)] if CUDA else [(4, 32_000), (8, 151_936)]


def _sync(fn):
    def run():
        out = fn()
        if CUDA:
            torch.cuda.synchronize()
        return out

    return run


@pytest.fixture(params=SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def batch(request):
    rows, vocab = request.param
    x = make_logits(rows, vocab, torch.bfloat16, DEVICE)
    return x, make_params(rows, "topk_topp", DEVICE, vocab=vocab)


def test_bench_sort_sampler(benchmark, batch):
    x, p = batch
    benchmark(_sync(lambda: sort_sampler(x, p.temperature, p.top_k, p.top_p)))


def test_bench_sample_ref(benchmark, batch):
    x, p = batch
    benchmark(_sync(lambda: sample_ref(x, p)))


@pytest.mark.skipif(not CUDA, reason="the Triton kernel is timed on CUDA only (the interpreter is ~1e5x slower)")
@pytest.mark.parametrize("kind", ["topk_topp", "mixed", "greedy", "temperature"])
def test_bench_sample_triton(benchmark, batch, kind):
    from ignis_kernels.sampling_triton import sample_triton

    x, p = batch
    if kind != "topk_topp":
        p = make_params(x.shape[0], kind, DEVICE, vocab=x.shape[1])
    sample_triton(x, p)  # compile outside the timing
    benchmark(_sync(lambda: sample_triton(x, p)))
