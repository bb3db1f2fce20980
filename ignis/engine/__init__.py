"""The engine: continuous batching over a paged KV cache with prefix caching.

    sequence.py       one request's tokens, blocks and progress
    block_manager.py  blocks, reference counts, the prefix cache (hash chain, LRU)
    scheduler.py      waiting queue, running set, token budget, chunked prefill, preemption
    model_runner.py   the flat batch, the forward, the head at the sampling rows
    sampler.py        logits -> tokens: grammar masks, spent thinking budgets, penalties, ignis_kernels.sample, logprobs
    engine.py         LLMEngine: the synchronous core (add_request / abort_request / step)
    async_engine.py   AsyncEngine: the core in its own thread, asyncio streams, capacity
    stop.py           incremental detokenization and stop strings
    grammar.py        output grammars (llguidance): one matcher per sequence, next-token bitmasks
    thinking.py       thinking budgets: the closing tag forced once a think block is full
    sampling_params.py, outputs.py   what a request asks for, what comes back
    cpu_weights.py    oneDNN-packed linear weights for the CPU
    tensor_parallel.py  TP: the rank-0 runner, spawned / torchrun workers, failure watch
    tp_group.py       TP: process groups, the per-step broadcast, the logits gather
"""

from ignis.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
from ignis.engine.engine import EngineStats, LLMEngine
from ignis.engine.outputs import Completion, EngineFinish, EngineUsage, RequestOutput
from ignis.engine.sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "Completion",
    "EngineDeadError",
    "EngineFinish",
    "EngineStats",
    "EngineUsage",
    "LLMEngine",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
]
