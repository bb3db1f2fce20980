"""engine.kv_cache_dtype: which dtype each model's KV cache gets, its allocation (zero pages
of an anonymous mapping, resident only as written, 4 KiB at a time), its sizing, and an
engine serving from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ignis.config import EngineConfig, KVCacheDType
from ignis.engine import LLMEngine, SamplingParams
from ignis.engine.engine import kv_cache_dtype, kv_cache_num_blocks
from ignis.model import LoadedModel, load_model
from ignis.model.kv_cache import (
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    resolve_kv_cache_dtype,
)
from tests.model.tiny_models import build_tiny_gguf, build_tiny_model

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "choice, form, model_dtype, triton, want",
    [
        ("auto", "quantized", FP32, False, BF16),  # the packed CPU forms: half the memory
        ("auto", "mixed", FP32, False, BF16),
        ("auto", "bfloat16", FP32, False, BF16),
        ("auto", "float32", FP32, False, FP32),  # the reference path stays exact
        ("float32", "quantized", FP32, False, FP32),
        ("bfloat16", "float32", FP32, False, BF16),  # CPU attention reads either
        ("auto", "float32", BF16, True, BF16),  # CUDA: the model's dtype
        ("bfloat16", "float32", BF16, True, BF16),
        ("float32", "float32", FP32, True, FP32),
    ],
)
def test_resolution(choice: str, form: str, model_dtype: torch.dtype, triton: bool, want: torch.dtype) -> None:
    assert resolve_kv_cache_dtype(choice, model_dtype=model_dtype, weight_form=form, triton=triton) == want


def test_triton_refuses_a_cache_unlike_the_model() -> None:
    # The Triton kernels take q and the cache in one dtype.
    with pytest.raises(ValueError, match="kv_cache_dtype=bfloat16 needs the model in that dtype"):
        resolve_kv_cache_dtype("bfloat16", model_dtype=FP32, weight_form="float32", triton=True)
    with pytest.raises(ValueError, match="kv_cache_dtype=float32"):
        resolve_kv_cache_dtype("float32", model_dtype=BF16, weight_form="float32", triton=True)
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        resolve_kv_cache_dtype("float16", model_dtype=FP32, weight_form="float32", triton=False)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_bf16_cache_is_lazy_zero_and_writable(tiny: LoadedModel) -> None:
    c = tiny.config
    caches = allocate_kv_caches(c, 5, 4, dtype=BF16)
    k, v = caches[0]
    assert k.dtype == v.dtype == BF16 and k.shape == (5, 4, c.num_kv_heads, c.head_dim)
    assert not k.any() and not v.any()
    k[1, 2] = 1.5
    assert float(caches[0][0].float().sum()) == 1.5 * c.num_kv_heads * c.head_dim
    assert not caches[1][0].any()
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc: resident memory unknown")
    # 512 MiB of cache: only the pages written become resident (torch.zeros would touch all).
    blocks = (512 << 20) // kv_cache_bytes_per_block(c, 16, BF16)
    before = _rss_bytes()
    big = allocate_kv_caches(c, blocks, 16, dtype=BF16)
    assert big[0][0].dtype == BF16 and big[0][0].shape[0] == blocks
    big[0][0][0].fill_(1.0)  # one block of one layer
    assert _rss_bytes() - before < (64 << 20)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_a_short_request_makes_little_of_the_cache_resident(tiny: LoadedModel, dtype: torch.dtype) -> None:
    """Every layer's K and V get their first block written: with 2 MiB (huge) pages that
    was a 2 MiB page per region (120 MiB for SmolLM2's 60), here a 4 KiB page each."""
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc: resident memory unknown")
    c = tiny.config
    blocks = (256 << 20) // kv_cache_bytes_per_block(c, 16, dtype)
    regions = 64
    before = _rss_bytes()
    caches = allocate_kv_caches(c, blocks, 16, dtype=dtype)
    storage = torch.empty(0, dtype=dtype).set_(caches[0][0].untyped_storage())  # the whole allocation
    step = storage.numel() // regions
    storage[::step].fill_(1.0)  # one element in each of 64 regions 4 MiB apart
    assert _rss_bytes() - before < regions * (1 << 20)  # huge pages: >= 128 MiB


def test_sizing_counts_two_bytes_an_element(tiny: LoadedModel) -> None:
    c = tiny.config
    assert kv_cache_bytes_per_block(c, 16, BF16) == 2 * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 2
    assert kv_cache_bytes_per_block(c, 16, FP32) == 2 * kv_cache_bytes_per_block(c, 16, BF16)
    # The same memory budget holds twice the blocks (the cap on blocks set high enough).
    cfg = {"kv_cache_gib": 0.001, "max_num_seqs": 64, "max_model_len": 4096, "block_size": 16}
    fp32 = kv_cache_num_blocks(tiny, EngineConfig(**cfg, kv_cache_dtype=KVCacheDType.float32))
    bf16 = kv_cache_num_blocks(tiny, EngineConfig(**cfg, kv_cache_dtype=KVCacheDType.bfloat16))
    assert fp32 > 1 and bf16 == 2 * fp32


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    tmp = tmp_path_factory.mktemp("kvdtype")
    model_dir = build_tiny_model(tmp / "llama", "llama", num_heads=4, num_kv_heads=2, intermediate_size=128)
    path = build_tiny_gguf(model_dir, tmp / "llama.gguf", {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_1})
    return load_model(str(path), progress=False, weight_form="quantized")


@pytest.mark.parametrize("native", [True, False])
def test_quantized_engine_serves_from_a_bf16_cache(quantized: LoadedModel, native: bool) -> None:
    """auto gives the quantized form a bf16 cache; the engine prefills (eager, flash split),
    decodes (natively, or eagerly through the batched CPU attention) and generates."""
    assert kv_cache_dtype(quantized, EngineConfig()) == BF16
    engine = LLMEngine(quantized, EngineConfig(max_num_seqs=2, num_kv_blocks=32, block_size=4,
                                               cpu_native_decode=native))
    assert engine.kv_cache_dtype == BF16
    assert all(k.dtype == v.dtype == BF16 for k, v in engine.runner.kv_caches)
    prompts = [list(range(3, 20)), list(range(30, 41))]
    out = engine.generate(prompts, SamplingParams.greedy(8, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [8, 8]
    assert engine.runner.kv_caches[0][0].float().abs().sum() > 0  # written
    single = engine.generate(prompts[:1], SamplingParams.greedy(4, ignore_eos=True))  # one user's step
    assert len(single[0].token_ids) == 4


def test_float32_form_and_explicit_float32_keep_fp32(tiny: LoadedModel, quantized: LoadedModel) -> None:
    assert LLMEngine(tiny, EngineConfig(num_kv_blocks=8)).runner.kv_caches[0][0].dtype == FP32
    engine = LLMEngine(quantized, EngineConfig(num_kv_blocks=8, kv_cache_dtype=KVCacheDType.float32))
    assert engine.runner.kv_caches[0][0].dtype == FP32
