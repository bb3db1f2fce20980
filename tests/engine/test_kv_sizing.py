"""The engine's KV-cache size on the CPU: what max_num_seqs full-length sequences need,
bounded by memory, and lazily resident."""

from __future__ import annotations

import numpy as np

from ignis.config import EngineConfig
from ignis.engine.engine import kv_cache_num_blocks
from ignis.model.kv_cache import allocate_kv_caches


def test_cpu_blocks_follow_context_and_max_num_seqs(tiny) -> None:
    model_len = 64
    one = kv_cache_num_blocks(tiny, EngineConfig(max_num_seqs=1, block_size=4, max_model_len=model_len))
    many = kv_cache_num_blocks(tiny, EngineConfig(max_num_seqs=8, block_size=4, max_model_len=model_len))
    assert one == model_len // 4
    assert many == 8 * model_len // 4
    assert kv_cache_num_blocks(tiny, EngineConfig(num_kv_blocks=7)) == 7


def test_cpu_cache_is_zero_and_writable(tiny) -> None:
    caches = allocate_kv_caches(tiny.config, 5, 4)
    k, v = caches[0]
    assert k.shape == (5, 4, tiny.config.num_kv_heads, tiny.config.head_dim)
    assert not k.any() and not v.any()
    k[1, 2] = 1.0
    assert float(caches[0][0].sum()) == np.prod(k.shape[2:])
    # layers are views of one allocation: writing one leaves the others untouched
    assert not caches[1][0].any()
