"""A tiny random gpt-oss (sinks, windowed layers, biased experts) through the engine: the
CPU attention paths with sinks, chunked prefill beside decodes, the prefix cache and
preemption give the greedy tokens of the engine-free reference loop (the kernels'
reference, one prefill), which tests/model/test_families.py holds to transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.model import LoadedModel, load_model
from tests.model.reference_generate import generate
from tests.model.test_families import GPT_OSS
from tests.model.tiny_models import build_tiny_model

PROMPTS = [list(range(5, 26)), list(range(5, 19)) + [40, 41], [3, 4], list(range(30, 60))]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path: Path = build_tiny_model(tmp_path_factory.mktemp("gpt-oss") / "tiny", "gpt_oss", seed=5, **GPT_OSS)
    return load_model(str(path), progress=False)


def test_engine_matches_the_reference_loop(gpt_oss: LoadedModel) -> None:
    want = generate(gpt_oss.model, PROMPTS, max_new_tokens=12, block_size=4).token_ids
    engine = LLMEngine(gpt_oss, EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=9))
    params = SamplingParams.greedy(12, ignore_eos=True)
    assert [c.token_ids for c in engine.generate(PROMPTS, params)] == want
    # Again: the shared prefixes now come from the cache.
    assert [c.token_ids for c in engine.generate(PROMPTS, params)] == want
    assert engine.stats().prefix_cache_hit_tokens > 0


def test_preemption_keeps_the_tokens(gpt_oss: LoadedModel) -> None:
    want = generate(gpt_oss.model, PROMPTS, max_new_tokens=12, block_size=4).token_ids
    tight = LLMEngine(gpt_oss, EngineConfig(num_kv_blocks=16, block_size=4, enable_prefix_caching=False))
    got = [c.token_ids for c in tight.generate(PROMPTS, SamplingParams.greedy(12, ignore_eos=True))]
    assert tight.scheduler.num_preemptions > 0
    assert got == want


def test_mxfp4_checkpoint_serves_packed(gpt_oss: LoadedModel, tmp_path: Path) -> None:
    """The released checkpoints' form (MXFP4 experts): load_model keeps the experts packed
    on the CPU (mxfp4 GEMMs over the file's nibbles, no dense copy) and the engine's greedy
    tokens equal the reference loop's over the same values held dense."""
    from ignis_kernels import cpu_native
    from tests.model.tiny_models import mxfp4_gpt_oss

    dense_dir, mx_dir = mxfp4_gpt_oss(Path(gpt_oss.path), tmp_path / "dense", tmp_path / "mxfp4")
    loaded = load_model(str(mx_dir), progress=False)
    experts = loaded.model.layers[0].mlp.experts
    assert experts.gate_up_proj is None  # never widened
    if cpu_native.load():
        assert experts.expert_ops is not None and experts.gate_up_proj_blocks.device.type == "meta"
    reference = load_model(str(dense_dir), progress=False)
    want = generate(reference.model, PROMPTS, max_new_tokens=12, block_size=4).token_ids
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64, block_size=4, max_num_batched_tokens=9))
    assert [c.token_ids for c in engine.generate(PROMPTS, SamplingParams.greedy(12, ignore_eos=True))] == want
