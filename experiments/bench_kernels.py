"""pytest-benchmark of the attention and KV-write kernels.

    .venv/bin/python -m pytest experiments/bench_kernels.py --benchmark-only -q

For each op and size: the PyTorch reference, the Triton kernel (CUDA only; skipped on
CPU) and, for attention, torch SDPA on the same K/V laid out densely (what a
non-paged engine would run). Sizes are modest on CPU so the file runs in a couple of
minutes; on CUDA they reach the shapes of experiments/gpu/attention_check.py.
extra_info carries the bytes an op must move and the GB/s the median achieves.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton

from ignis_kernels import paged_attention, write_kv, write_kv_ref

# The random paged batches of the attention tests.
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from paged_batch import PagedBatch, make_paged_batch  # noqa: E402

CUDA = torch.cuda.is_available()


@dataclass(frozen=True)
class Shape:
    num_seqs: int
    context: int  # cached positions per sequence, new tokens included
    q_len: int  # new tokens per sequence
    q_heads: int
    kv_heads: int
    head_dim: int

    def __str__(self) -> str:
        return f"{self.num_seqs}x{self.context}/q{self.q_len}/h{self.q_heads}:{self.kv_heads}/d{self.head_dim}"


if CUDA:
    DTYPE = torch.bfloat16
    DECODE = [Shape(8, 4096, 1, 32, 8, 128), Shape(64, 4096, 1, 32, 8, 128), Shape(4, 32768, 1, 32, 8, 128)]
    PREFILL = [Shape(1, 4096, 4096, 32, 8, 128), Shape(4, 2048, 1024, 32, 8, 128)]
    WRITE_TOKENS = [64, 4096]
else:  # SmolLM2-135M's heads; small enough for the CPU references
    DTYPE = torch.float32
    DECODE = [Shape(4, 512, 1, 9, 3, 64), Shape(16, 1024, 1, 9, 3, 64)]
    PREFILL = [Shape(1, 512, 512, 9, 3, 64), Shape(2, 512, 128, 9, 3, 64)]
    WRITE_TOKENS = [64, 512]
BLOCK_SIZE = 16
IMPLS = ["reference", "triton", "sdpa_dense"]


def synced(fn):
    """Benchmarks time wall clock: wait for the device inside the timed call."""
    if not CUDA:
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def record(benchmark, nbytes: int) -> None:
    benchmark.extra_info["MB"] = round(nbytes / 1e6, 2)
    if benchmark.stats is not None:
        benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 2)


def batch_for(shape: Shape, device: torch.device) -> PagedBatch:
    gen = torch.Generator(device=device).manual_seed(0)
    n = shape.num_seqs
    return make_paged_batch(
        [shape.context] * n, [shape.q_len] * n, shape.q_heads, shape.kv_heads, shape.head_dim, BLOCK_SIZE,
        dtype=DTYPE, device=device, generator=gen, poison=False,
    )


def dense(batch: PagedBatch, shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, Hq, q_len, D] and K/V [B, Hkv, context, D], contiguous: SDPA's own layout."""
    ks, vs = zip(*(batch.dense_kv(i) for i in range(shape.num_seqs)))
    k = torch.stack(ks).transpose(1, 2).contiguous()
    v = torch.stack(vs).transpose(1, 2).contiguous()
    q = batch.q.view(shape.num_seqs, shape.q_len, shape.q_heads, shape.head_dim).transpose(1, 2).contiguous()
    return q, k, v


def attention_bytes(shape: Shape, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    kv = 2 * shape.num_seqs * shape.context * shape.kv_heads * shape.head_dim
    qo = 2 * shape.num_seqs * shape.q_len * shape.q_heads * shape.head_dim
    return (kv + qo) * elem


def run_attention(benchmark, impl: str, shape: Shape, device: torch.device) -> None:
    if impl == "triton" and not CUDA:
        pytest.skip("Triton kernels are benchmarked on CUDA only")
    batch = batch_for(shape, device)
    if impl == "sdpa_dense":
        q, k, v = dense(batch, shape)
        # Decode sees the whole context; prefill here has no prefix when q_len == context.
        causal = shape.q_len > 1
        if causal and shape.q_len != shape.context:
            pos_q = torch.arange(shape.context - shape.q_len, shape.context, device=device)[:, None]
            mask = torch.arange(shape.context, device=device)[None, :] <= pos_q
            fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
        else:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # noqa: E731
    else:
        out = torch.empty_like(batch.q)
        backend = "triton" if impl == "triton" else "torch"
        fn = lambda: paged_attention(  # noqa: E731
            *batch.args(), out=out, backend=backend,
            max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len,
        )
    benchmark(synced(fn))
    record(benchmark, attention_bytes(shape, DTYPE))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", DECODE, ids=str)
def test_decode_attention(benchmark, impl, shape, device):
    benchmark.group = f"decode {shape}"
    run_attention(benchmark, impl, shape, device)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", PREFILL, ids=str)
def test_prefill_attention(benchmark, impl, shape, device):
    benchmark.group = f"prefill {shape}"
    run_attention(benchmark, impl, shape, device)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("num_tokens", WRITE_TOKENS)
def test_write_kv(benchmark, impl, num_tokens, device):
    if impl == "triton" and not CUDA:
        pytest.skip("Triton kernels are benchmarked on CUDA only")
    benchmark.group = f"write_kv {num_tokens} tokens"
    heads, dim = (8, 128) if CUDA else (3, 64)
    num_blocks = 4 * triton.cdiv(num_tokens, BLOCK_SIZE)
    kv = torch.zeros(num_blocks, 2, BLOCK_SIZE, heads, dim, dtype=DTYPE, device=device)
    key = torch.randn(num_tokens, heads, dim, device=device, dtype=DTYPE)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device=device)[:num_tokens]
    fn = write_kv_ref if impl == "reference" else lambda *a: write_kv(*a, backend="triton")
    benchmark(synced(lambda: fn(key, value, kv[:, 0], kv[:, 1], slots)))
    record(benchmark, 4 * key.numel() * key.element_size())  # read K, V; write K, V

