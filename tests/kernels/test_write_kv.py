"""KV-cache write: the Triton kernel (through the interpreter) against the reference.

Caches start as NaN; the kernel must write exactly the rows the slots name (bit-exact:
a write is a copy, or a cast the same as torch's), leave every other row NaN, skip
slot -1, and honour strides (fused [blocks, 2, ...] caches, K/V sliced from a qkv
projection). Each test draws a fresh seed (IGNIS_TEST_SEED replays one).
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from ignis_kernels import write_kv, write_kv_ref
from ignis_kernels.kv_cache_triton import write_kv_triton


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("IGNIS_TEST_SEED", random.randrange(2**31)))


def caches(num_blocks: int, block_size: int, heads: int, dim: int, dtype: torch.dtype, fused: bool):
    if fused:
        kv = torch.full((num_blocks, 2, block_size, heads, dim), float("nan"), dtype=dtype)
        return kv[:, 0], kv[:, 1]
    full = lambda: torch.full((num_blocks, block_size, heads, dim), float("nan"), dtype=dtype)  # noqa: E731
    return full(), full()


def slots_for(gen: torch.Generator, num_tokens: int, num_blocks: int, block_size: int) -> torch.Tensor:
    """Distinct random slots, about a quarter of them -1 (padding)."""
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.25] = -1
    return slots


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(
    "heads,dim", [(2, 64), (3, 128), (1, 80), (16, 128)], ids=lambda x: str(x)
)
def test_write_kv_matches_reference(seed, heads, dim, block_size, fused):
    gen = torch.Generator().manual_seed(seed)
    num_blocks, num_tokens = 4, 13
    key = torch.randn(num_tokens, heads, dim, generator=gen)
    value = torch.randn(num_tokens, heads, dim, generator=gen)
    slots = slots_for(gen, num_tokens, num_blocks, block_size)
    k_cache, v_cache = caches(num_blocks, block_size, heads, dim, torch.float32, fused)
    k_ref, v_ref = caches(num_blocks, block_size, heads, dim, torch.float32, fused)

    write_kv_triton(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)

    msg = lambda m: f"{m}\nseed={seed} slots={slots.tolist()}"  # noqa: E731
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0, equal_nan=True, msg=msg)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0, equal_nan=True, msg=msg)
    # Exactly the named rows were written; the rest (and every -1 token) left untouched.
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    rows = k_cache.reshape(num_blocks * block_size, -1)
    assert not rows[written].isnan().any(), f"seed={seed}"
    assert rows[~written].isnan().all(), f"seed={seed}"


@pytest.mark.parametrize("src,dst", [
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
    (torch.float32, torch.bfloat16),  # cast on store, as the reference does
], ids=str)
def test_write_kv_dtypes(seed, src, dst):
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(9, 2, 64, generator=gen).to(src)
    value = torch.randn(9, 2, 64, generator=gen).to(src)
    slots = slots_for(gen, 9, 3, 16)
    k_cache, v_cache = caches(3, 16, 2, 64, dst, fused=True)
    k_ref, v_ref = caches(3, 16, 2, 64, dst, fused=True)
    write_kv_triton(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    # Interpreter trap: its fp32 -> bf16 cast truncates (the GPU rounds to nearest even),
    # so a casting write may differ by one bf16 ulp here; copies must be exact.
    rtol = 2**-7 if src != dst and dst == torch.bfloat16 else 0.0
    for got, want in ((k_cache, k_ref), (v_cache, v_ref)):
        torch.testing.assert_close(got, want, atol=0, rtol=rtol, equal_nan=True, msg=lambda m: f"{m}\nseed={seed}")


def test_write_kv_strided_sources_int32_slots(seed):
    """K and V sliced out of one fused qkv projection; slot_mapping as int32."""
    gen = torch.Generator().manual_seed(seed)
    heads, dim = 2, 32
    qkv = torch.randn(11, 4 + 2 * heads, dim, generator=gen)
    key, value = qkv[:, 4 : 4 + heads], qkv[:, 4 + heads :]
    slots = slots_for(gen, 11, 2, 16).to(torch.int32)
    k_cache, v_cache = caches(2, 16, heads, dim, torch.float32, fused=True)
    k_ref, v_ref = caches(2, 16, heads, dim, torch.float32, fused=True)
    write_kv_triton(key, value, k_cache, v_cache, slots)
    write_kv_ref(key, value, k_ref, v_ref, slots)
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0, equal_nan=True, msg=lambda m: f"{m}\nseed={seed}")
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0, equal_nan=True, msg=lambda m: f"{m}\nseed={seed}")


def test_write_kv_all_padding_and_empty():
    k_cache, v_cache = caches(2, 16, 2, 32, torch.float32, fused=False)
    key = torch.randn(4, 2, 32)
    write_kv_triton(key, key, k_cache, v_cache, torch.full((4,), -1))
    assert k_cache.isnan().all() and v_cache.isnan().all()
    write_kv_triton(key[:0], key[:0], k_cache, v_cache, torch.empty(0, dtype=torch.long))
    assert k_cache.isnan().all()


def test_write_kv_dispatch(seed):
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(5, 2, 32, generator=gen)
    value = torch.randn(5, 2, 32, generator=gen)
    slots = slots_for(gen, 5, 2, 16)
    expect = caches(2, 16, 2, 32, torch.float32, fused=False)
    write_kv_ref(key, value, *expect, slots)
    for backend in ("torch", "auto", "triton"):
        got = caches(2, 16, 2, 32, torch.float32, fused=False)
        write_kv(key, value, *got, slots, backend=backend)
        for a, b in zip(got, expect):
            torch.testing.assert_close(a, b, atol=0, rtol=0, equal_nan=True, msg=lambda m: f"{m}\nseed={seed}")


def test_write_kv_rejects_mismatched_shapes():
    k_cache, v_cache = caches(2, 16, 2, 32, torch.float32, fused=False)
    with pytest.raises(ValueError):
        write_kv_triton(torch.randn(3, 2, 64), torch.randn(3, 2, 64), k_cache, v_cache, torch.zeros(3, dtype=torch.long))
