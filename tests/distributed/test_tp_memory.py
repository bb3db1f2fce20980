"""Tensor parallelism's memory: rank 0 holds only its shard of the weights (nothing the
engine or the server keeps reaches a full copy), and its KV cache holds only its KV heads,
so a block costs 1/N of TP=1's and a memory budget buys N times the blocks."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ignis.config import EngineConfig, KernelBackend
from ignis.engine import LLMEngine, SamplingParams
from ignis.model import load_model
from ignis.model.kv_cache import kv_cache_bytes_per_block
from ignis.model.sharding import shard_parameter_bytes
from ignis.server.background import BackgroundServer
from tests.distributed.tp_models import build, torch_threads
from tests.server.server_harness import client, make_config


def parameter_bytes(roots: Iterable[Any]) -> int:
    """Bytes of the distinct nn.Parameter storages reachable from `roots` (not through
    modules' globals, which reach everything the process imported)."""
    skip = {id(vars(m)) for m in list(sys.modules.values()) if m is not None}
    seen: set[int] = set()
    storages: dict[int, int] = {}
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in skip or isinstance(obj, (types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, nn.Parameter):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        todo.extend(gc.get_referents(obj))
    return sum(storages.values())


def _config(tp: int, **keys: Any) -> EngineConfig:
    cfg: dict[str, Any] = {"kernel_backend": KernelBackend.torch, "block_size": 4, "max_num_batched_tokens": 16,
                           "max_num_seqs": 4, "max_model_len": 512, "cpu_threads": 1, "tensor_parallel_size": tp}
    return EngineConfig(**(cfg | keys))


def _kv_block_bytes(engine: LLMEngine) -> int:
    return sum(k.nbytes + v.nbytes for k, v in engine.runner.kv_caches) // engine.num_blocks


def test_rank0_holds_its_shard_and_a_kv_cache_of_its_heads(tmp_path):
    path = str(build(tmp_path, "qwen3"))
    full = load_model(path, progress=False)
    config = full.config
    assert config.num_kv_heads == 2
    shard_bytes = shard_parameter_bytes(config, 0, 2, torch.float32)
    assert parameter_bytes([full]) == shard_parameter_bytes(config, 0, 1, torch.float32)
    assert shard_bytes < 0.75 * parameter_bytes([full])
    weightless = load_model(path, progress=False, weights=False)
    assert weightless.model is None and parameter_bytes([weightless]) == 0
    block_bytes = kv_cache_bytes_per_block(config, 4, torch.float32)  # TP=1's
    budget = 64 * block_bytes / (1 << 30)  # engine.kv_cache_gib: 64 blocks at TP=1
    with torch_threads():
        one = LLMEngine(full, _config(1, kv_cache_gib=budget))
        two = LLMEngine(weightless, _config(2, kv_cache_gib=budget))
        try:
            assert parameter_bytes([two, weightless]) == shard_bytes
            assert _kv_block_bytes(one) == block_bytes
            assert _kv_block_bytes(two) == block_bytes // 2
            assert (one.num_blocks, two.num_blocks) == (64, 128)
            prompt = [5, 17, 29, 41]
            tokens = [e.generate([prompt], SamplingParams.greedy(6))[0].token_ids for e in (one, two)]
        finally:
            two.close()
    assert tokens[0] == tokens[1]


def test_a_full_model_handed_to_a_tp_engine_is_not_kept(tmp_path):
    loaded = load_model(str(build(tmp_path, "llama-one-kv-head")), progress=False)
    model = weakref.ref(loaded.model)
    shard_bytes = shard_parameter_bytes(loaded.config, 0, 2, torch.float32)
    with torch_threads():
        engine = LLMEngine(loaded, _config(2, num_kv_blocks=32))
        try:
            del loaded
            gc.collect()
            assert model() is None
            assert engine.loaded.model is None
            assert parameter_bytes([engine]) == shard_bytes
            # One KV head, replicated: each rank's cache holds that one head, as TP=1's.
            assert engine.kv_config.num_kv_heads == 1
            assert engine.generate([[3, 4, 5]], SamplingParams.greedy(4))[0].token_ids
        finally:
            engine.close()


def test_a_tp_server_keeps_no_full_weights(tiny_server_model):
    loaded = load_model(tiny_server_model.path, dtype="float32", device="cpu", name="tiny", progress=False,
                        weights=False)
    with torch_threads():
        srv = BackgroundServer(make_config(engine={"tensor_parallel_size": 2}), loaded).start()
        try:
            r = client(srv).responses.create(model="tiny", input="Hello", max_output_tokens=4, temperature=0)
            assert r.output_text
            kept = parameter_bytes([srv.loaded, srv.ctx, srv.engine])
        finally:
            srv.stop()
    assert kept == shard_parameter_bytes(loaded.config, 0, 2, torch.float32)
