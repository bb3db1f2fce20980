"""Tensor parallelism over gloo on the CPU: TP=2 gives TP=1's logits, step by step.

Each engine here starts one real worker process (spawned, gloo over 127.0.0.1). Every
sampler call's logits are recorded on rank 0 and compared with the same call at TP=1:
prefill (chunked), decode, a prompt whose prefix comes from the cache, and preemption
(a KV cache too small for the batch)."""

from __future__ import annotations

import pytest
import torch

from ignis.config import EngineConfig, KernelBackend
from ignis.engine import LLMEngine, SamplingParams
from ignis.model import load_model
from ignis.model.config import ModelConfig
from ignis.model.sharding import plan_shard
from tests.distributed.tp_models import TP_MODELS, build, torch_threads


def _record(engine: LLMEngine) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    sample = engine.runner.sampler.sample

    def recording(logits, seqs, **kwargs):
        seen.append(logits.detach().clone())
        return sample(logits, seqs, **kwargs)

    engine.runner.sampler.sample = recording  # type: ignore[method-assign]
    return seen


def _scenario(engine: LLMEngine) -> list[list[int]]:
    """A prompt, then one that shares its cached prefix, then four prompts that do not fit
    the cache together (preemption), prefilled in chunks."""
    base = [(5 * j) % 300 + 5 for j in range(10)]
    cached = engine.generate([base], SamplingParams.greedy(4))
    cached += engine.generate([base[:8] + [11, 12, 13]], SamplingParams.greedy(6))
    prompts = [[(7 * i + 3 * j) % 300 + 5 for j in range(10 + i)] for i in range(4)]
    return [c.token_ids for c in cached + engine.generate(prompts, SamplingParams.greedy(12))]


def _config(tp: int) -> EngineConfig:
    return EngineConfig(kernel_backend=KernelBackend.torch, block_size=4, num_kv_blocks=14,
                        max_num_batched_tokens=16, max_num_seqs=4, cpu_threads=1, tensor_parallel_size=tp)


@pytest.mark.parametrize("name", list(TP_MODELS))
def test_tp2_logits_equal_tp1(tmp_path, name):
    loaded = load_model(str(build(tmp_path, name)), progress=False)
    with torch_threads():
        one = LLMEngine(loaded, _config(1))
        logits_1 = _record(one)
        tokens_1 = _scenario(one)
        two = LLMEngine(loaded, _config(2))
        try:
            logits_2 = _record(two)
            tokens_2 = _scenario(two)
            stats = two.stats()
        finally:
            two.close()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hit_tokens >= 8
    assert stats == one.stats()  # same schedule: same steps, preemptions, cache hits
    assert tokens_2 == tokens_1
    assert len(logits_2) == len(logits_1) > 10
    for a, b in zip(logits_1, logits_2):
        assert b.shape == a.shape == (a.shape[0], loaded.config.vocab_size)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert not [p for p in two.runner.workers if p.is_alive()]


def test_shard_plans():
    def config(heads, kv, inter=96):
        return ModelConfig("llama", 400, 64, 2, heads, kv, 16, inter)

    # KV heads split when there are enough of them, else each rank keeps the one it reads.
    assert [plan_shard(config(8, 4), r, 2).kv_heads for r in range(2)] == [range(0, 2), range(2, 4)]
    assert [plan_shard(config(4, 1), r, 2).kv_heads for r in range(2)] == [range(0, 1)] * 2
    assert [plan_shard(config(8, 2), r, 4).kv_heads for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert plan_shard(config(4, 2), 1, 2).vocab == range(200, 400)
    with pytest.raises(ValueError, match=r"attention heads \(6\).*KV heads \(3"):
        plan_shard(config(6, 3), 0, 4)
    with pytest.raises(ValueError, match=r"MLP intermediate size \(95\)"):
        plan_shard(config(4, 2, 95), 0, 2)


def test_a_model_that_does_not_split_is_refused_before_any_process_starts(tmp_path):
    from tests.model.tiny_models import build_tiny_model

    loaded = load_model(str(build_tiny_model(tmp_path / "m", "llama", hidden_size=48, num_heads=3, num_kv_heads=3,
                                             head_dim=16)), progress=False)
    with torch_threads(), pytest.raises(ValueError, match=r"tensor_parallel_size=2 must divide.*heads \(3\)"):
        LLMEngine(loaded, _config(2))
