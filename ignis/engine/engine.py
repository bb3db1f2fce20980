"""The synchronous engine core: requests in, one step at a time, outputs out.

    engine = LLMEngine(loaded, EngineConfig(...))
    engine.add_request("a", prompt_ids, SamplingParams.greedy(32))
    while engine.has_unfinished_requests():
        for out in engine.step(): ...

It owns the scheduler, block manager and model runner; it is not thread-safe (the
AsyncEngine's thread is its only caller there). A step: expire deadlines, schedule,
run the model, then per sequence append the sampled token, detokenize, check the stop
conditions, publish newly full blocks to the prefix cache and free finished ones.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import torch

import ignis_kernels
from ignis.config import EngineConfig
from ignis.engine.block_manager import BlockManager
from ignis.engine.grammar import GrammarState, ll_tokenizer
from ignis.engine.grammar_masks import MASK_TIMEOUT_S, overdue
from ignis.engine.heap import HeapTrimmer
from ignis.engine.model_runner import FatalRunnerError, ModelRunner, StepResult
from ignis.engine.outputs import Completion, EngineFinish, EngineUsage, RequestOutput
from ignis.engine.sampler import TopLogprobs
from ignis.engine.sampling_params import SamplingParams
from ignis.engine.scheduler import ScheduledBatch, Scheduler
from ignis.engine.sequence import Sequence
from ignis.engine.speculation import NgramDrafter
from ignis.engine.stop import TextStream
from ignis.engine.thinking import BudgetState
from ignis.engine.tp_group import RunnerSpec
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import kv_cache_bytes_per_block, resolve_kv_cache_dtype
from ignis.model.layers import exact_step_rows
from ignis.model.loader import LoadedModel

if TYPE_CHECKING:
    from ignis.engine.tensor_parallel import TensorParallelStart

log = logging.getLogger(__name__)

_GIB = 1 << 30
# CPU KV cache: at most this fraction of the memory free at start-up.
CPU_KV_MEMORY_FRACTION = 0.25


@dataclass(frozen=True)
class EngineStats:
    """Gauges for metrics (a snapshot; the AsyncEngine refreshes it after every step)."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0  # evictable prefix-cache blocks included
    num_blocks: int = 0
    block_size: int = 0
    prefix_cache_hit_tokens: int = 0  # cumulative, prompt tokens served from the cache
    prefix_cache_query_tokens: int = 0  # cumulative, prompt tokens looked up
    num_preemptions: int = 0
    num_steps: int = 0
    num_generated_tokens: int = 0
    # Speculative decoding, cumulative: draft tokens checked, and those kept.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    # Filled in by the AsyncEngine: requests submitted and not finished, and callers
    # queued in submit_when_room.
    num_in_flight: int = 0
    num_room_waiters: int = 0


def kv_cache_dtype(loaded: LoadedModel, cfg: EngineConfig) -> torch.dtype:
    """The KV cache's dtype for this model under engine.kv_cache_dtype (resolve_kv_cache_dtype).
    Without weights (a tensor-parallel rank 0) the shards are dense: the float32 form; the
    scripted model (no weight form) keeps token ids in its cache, exact only in fp32."""
    form = getattr(loaded.model, "weight_form", "float32")
    backend = getattr(cfg.kernel_backend, "value", cfg.kernel_backend)
    return resolve_kv_cache_dtype(
        getattr(cfg.kv_cache_dtype, "value", cfg.kv_cache_dtype), model_dtype=loaded.dtype, weight_form=form,
        triton=loaded.device.type == "cuda" or backend == "triton",
    )


def kv_cache_num_blocks(loaded: LoadedModel, cfg: EngineConfig, shard: ModelConfig | None = None,
                        ranks_on_host: int = 1) -> int:
    """cfg.num_kv_blocks, else the memory budget (kv_cache_gib, or auto) / bytes per block,
    at most max_num_seqs full-length sequences. Tensor parallelism: `shard` is this rank's
    config (its cache holds only its KV heads) and every rank allocates as many blocks;
    on CUDA the free memory is measured beside the shard, and on the CPU the automatic
    budget is split between the `ranks_on_host` processes that share the RAM."""
    if cfg.num_kv_blocks is not None:
        return int(cfg.num_kv_blocks)
    kv_config = shard or loaded.config
    dtype = kv_cache_dtype(loaded, cfg)
    per_block = kv_cache_bytes_per_block(kv_config, cfg.block_size, dtype)
    if cfg.kv_cache_gib is not None:
        budget = cfg.kv_cache_gib * _GIB
    elif loaded.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(loaded.device)
        budget = 0.9 * free - 0.5 * _GIB  # headroom for activations and the sampler
    else:
        # CPU: what max_num_seqs sequences at full length need (the cap below), unless that
        # exceeds a quarter of the memory free now. Pages are touched as blocks fill
        # (allocate_kv_caches), so an idle server's resident memory stays small either way.
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        budget = CPU_KV_MEMORY_FRACTION * available / ranks_on_host
    # More blocks than every sequence at full length can hold only feed the prefix cache;
    # the cap matters for tiny-KV models (the scripted one), whose budget would be millions.
    model_len = cfg.max_model_len or loaded.config.max_position_embeddings
    cap = cfg.max_num_seqs * -(-model_len // cfg.block_size)
    blocks = max(1, min(cap, int(budget // per_block)))
    source = (", engine.kv_cache_gib" if cfg.kv_cache_gib is not None else
              ", 90% of free GPU memory" if loaded.device.type == "cuda" else
              f", {CPU_KV_MEMORY_FRACTION:.0%} of free RAM" + (f" / {ranks_on_host} ranks" if ranks_on_host > 1 else ""))
    per_rank = ("" if shard is None else
                f" per rank, {per_block / 1024:.1f} KiB a block: the shard's {shard.num_kv_heads} of "
                f"{loaded.config.num_kv_heads} KV heads")
    log.info(
        "KV cache: %d blocks (%.2f GiB, %s%s): %s (max_num_seqs %d x %d tokens = %d blocks; budget %.2f GiB%s)",
        blocks, blocks * per_block / _GIB, str(dtype).removeprefix("torch."), per_rank,
        "every sequence at full length" if blocks == cap else "the memory budget",
        cfg.max_num_seqs, model_len, cap, budget / _GIB, source,
    )
    return blocks


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        cfg = config or EngineConfig()
        self.config = cfg
        self.loaded = loaded
        ignis_kernels.set_backend(getattr(cfg.kernel_backend, "value", cfg.kernel_backend))
        tp = int(cfg.tensor_parallel_size)
        if tp < 1:
            raise ValueError(f"engine.tensor_parallel_size must be at least 1, got {tp}")
        if loaded.device.type == "cpu" and tp > 1:
            # The ranks share this host's cores.
            from ignis.engine.tensor_parallel import cpu_threads_per_rank

            torch.set_num_threads(cpu_threads_per_rank(tp, cfg.cpu_threads))
        elif loaded.device.type == "cpu" and cfg.cpu_threads:
            torch.set_num_threads(int(cfg.cpu_threads))
        # OpenMP's thread count is per calling thread: whoever steps the engine from another
        # thread (the AsyncEngine) must set it again there.
        self.num_threads = torch.get_num_threads()
        self.block_size = cfg.block_size
        self.kv_cache_dtype = kv_cache_dtype(loaded, cfg)  # refused here, before any rank starts
        tp_start = None
        if tp == 1:
            if loaded.model is None:
                raise ValueError("this model was loaded without weights (load_model(weights=False)): "
                                 "only a tensor-parallel engine, which loads its shards itself, can serve it")
            kv_config = loaded.config
        else:
            from ignis.engine.tensor_parallel import start_tensor_parallel

            # Every rank loads only its shard; the engine keeps no reference to any full
            # weights the caller loaded (they are its to drop).
            if loaded.model is not None:
                log.info("tensor parallel: rank 0 loads its shard from %s; the full weights loaded here are "
                         "not used (load_model(weights=False) skips them)", loaded.path)
            tp_start = start_tensor_parallel(loaded, tp, kernel_backend=ignis_kernels.get_backend(),
                                             cpu_threads=self.num_threads)
            self.loaded = loaded = loaded.without_weights()
            kv_config = tp_start.shard.config
        try:
            self._start(loaded, cfg, kv_config, tp_start)
        except BaseException:
            if tp_start is not None:
                tp_start.abort()
            raise
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        self.seqs: dict[str, Sequence] = {}
        self.heap = HeapTrimmer()
        self._num_deadlines = 0
        self._done: list[RequestOutput] = []  # finished outside a step (abort), reported by the next one
        # Grammar masks: a fill's end calls on_wake (from its thread); `stalled` says the
        # last step found nothing to run (every sequence waiting on its mask).
        self.on_wake: Callable[[], None] | None = None
        self.masks = getattr(getattr(self.runner, "sampler", None), "masks", None)
        if self.masks is not None:
            self.masks.wake = self._wake
        self._num_grammars = 0
        self.stalled = False
        self.num_steps = 0
        self.num_generated_tokens = 0
        self.num_draft_tokens = 0
        self.num_accepted_draft_tokens = 0
        log.info(
            "engine: %d KV blocks of %d tokens (%.2f GiB, %s), max_model_len %d, max_num_seqs %d, "
            "max_num_batched_tokens %d, prefix caching %s",
            self.num_blocks, cfg.block_size,
            self.num_blocks * kv_cache_bytes_per_block(self.kv_config, cfg.block_size, self.kv_cache_dtype) / _GIB,
            str(self.kv_cache_dtype).removeprefix("torch."),
            self.max_model_len, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.enable_prefix_caching,
        )

    def _start(self, loaded: LoadedModel, cfg: EngineConfig, kv_config: ModelConfig,
               tp_start: TensorParallelStart | None) -> None:
        """Size the KV cache (at tensor parallelism: once rank 0's shard is on its device,
        from the shard's KV heads), then build the block manager, scheduler and runner."""
        self.kv_config = kv_config  # the model's, or this rank's shard's
        self.num_blocks = kv_cache_num_blocks(loaded, cfg, None if tp_start is None else kv_config,
                                              1 if tp_start is None else tp_start.ranks_on_host)
        model_len = cfg.max_model_len or loaded.config.max_position_embeddings
        # One sequence alone always fits in the cache, so preemption always makes progress.
        self.max_model_len = min(model_len, self.num_blocks * cfg.block_size)
        self.block_manager = BlockManager(
            self.num_blocks, cfg.block_size, enable_prefix_caching=cfg.enable_prefix_caching
        )
        budget_ms = getattr(cfg, "step_time_budget_ms", None)
        self.drafter = None
        if getattr(cfg.speculative, "value", cfg.speculative) == "ngram":
            make = NgramDrafter.for_mixture if loaded.config.is_moe else NgramDrafter
            self.drafter = make(cfg.num_speculative_tokens, max_n=cfg.speculative_ngram_max,
                                min_n=cfg.speculative_ngram_min, max_seqs=cfg.speculative_max_seqs)
            log.info("speculative decoding: ngram, up to %d draft tokens (n-grams of %d..%d), while at most %d "
                     "sequences decode%s", cfg.num_speculative_tokens, cfg.speculative_ngram_max,
                     cfg.speculative_ngram_min, cfg.speculative_max_seqs,
                     "; a mixture of experts: first drafts of one token, growing by what is kept"
                     if loaded.config.is_moe else "")
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            step_time_budget=budget_ms / 1000 if budget_ms else None,
            drafter=self.drafter,
            max_draft_step_rows=None if loaded.model is None else exact_step_rows(loaded.model),
        )
        spec = RunnerSpec(num_blocks=self.num_blocks, block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                          max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=self.max_model_len,
                          pack_cpu_weights=cfg.cpu_pack_weights, native_decode=cfg.cpu_native_decode,
                          kv_cache_dtype=self.kv_cache_dtype)
        self.runner: ModelRunner
        if tp_start is None:
            assert loaded.model is not None
            self.runner = ModelRunner(loaded.model, **asdict(spec))
        else:
            self.runner = tp_start.runner(spec)

    # -- requests -------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        params: SamplingParams | None = None,
        *,
        deadline: float | None = None,
        prewarm: bool = False,
    ) -> None:
        """Queue a request; raises ValueError (nothing queued) when it cannot be served.

        deadline: a time.monotonic() value; past it the request ends with finish reason
        DEADLINE. prewarm: prefill only (no token sampled), then publish the blocks.
        """
        params = params or SamplingParams()
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in flight")
        params.validate()
        if params.top_k >= self.vocab_size:
            # A top_k as large as the vocabulary keeps every token: off, as vLLM clips it. Left
            # as is, a huge value (>= 2**31) overflows the sampler's int32 column and sends the
            # whole batch to the row-by-row fallback, and any value >= V costs a sort for nothing.
            params = replace(params, top_k=0)
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size})")
        limit = self.max_model_len if prewarm else self.max_model_len - 1
        if len(prompt) > limit:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the context length is {self.max_model_len} "
                "(prompt plus at least one output token)"
            )
        room = self.max_model_len - len(prompt)
        budget = None
        if params.think_budget is not None and not prewarm:
            params.think_budget.validate(self.vocab_size)
            budget = BudgetState(params.think_budget)
        grammar = None
        if params.grammar is not None and not prewarm:
            # Compiling a large schema takes a while (llguidance releases the GIL meanwhile).
            grammar = GrammarState(params.grammar, ll_tokenizer(self.tokenizer, self.vocab_size))
            if self.masks is not None:
                self.masks.start([grammar])  # the first mask fills while the prompt prefills
        seq = Sequence(
            request_id,
            prompt,
            params,
            seed=params.seed if params.seed is not None else random.getrandbits(63),
            max_tokens=min(params.max_tokens or room, room),
            text=None if prewarm else TextStream(self.tokenizer, params.stop, skip_special_tokens=params.skip_special_tokens),
            prewarm=prewarm,
            deadline=deadline,
            stop_ids=frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids),
            budget=budget,
            grammar=grammar,
        )
        self.seqs[request_id] = seq
        if deadline is not None:
            self._num_deadlines += 1
        if grammar is not None:
            self._num_grammars += 1
        self.scheduler.add(seq)

    def abort_request(self, request_id: str, reason: EngineFinish = EngineFinish.ABORT, error: str | None = None) -> bool:
        """End a request now, running or waiting, and free its blocks. Its final output
        comes with the next step(). False if it is unknown or already finished."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return False
        self._done.append(self._finish(seq, reason, error=error))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.seqs) or bool(self._done)

    def pause(self) -> float:
        """How long the caller of step() may sleep before calling it again (woken earlier by
        `on_wake`): 0 with work to do, inf with nothing in flight, a short poll while every
        sequence waits on its grammar mask (deadlines and mask timeouts still count)."""
        if self._done:
            return 0.0
        if not self.seqs:
            return float("inf")
        return 0.05 if self.stalled else 0.0

    def _wake(self) -> None:
        callback = self.on_wake
        if callback is not None:
            callback()

    # -- the step -------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs, self._done = self._done, []
        if self._num_deadlines:
            now = time.monotonic()
            for seq in [s for s in self.seqs.values() if s.deadline is not None and s.deadline <= now]:
                outputs.append(self._finish(seq, EngineFinish.DEADLINE))
        if self._num_grammars:
            now = time.monotonic()
            for seq in [s for s in self.seqs.values() if s.grammar is not None and overdue(s.grammar, now)]:
                outputs.append(self._finish(seq, EngineFinish.ERROR, error=(
                    f"the output grammar took more than {MASK_TIMEOUT_S:g} s to compute the next token's mask")))
        batch = self.scheduler.schedule()
        self.stalled = not batch.seqs and bool(self.seqs)
        if not batch.seqs:
            return outputs
        started = time.perf_counter()
        try:
            result = self.runner.execute(batch)
        except FatalRunnerError:
            raise  # no request alone caused it: the engine cannot go on
        except Exception as exc:
            result = self._execute_alone(batch, exc)
        else:
            self.scheduler.observe(time.perf_counter() - started, batch)
        self.num_steps += 1
        self._postprocess(batch, result, outputs)
        self.heap.computed(sum(batch.num_new_tokens))
        if not self.seqs:
            self.heap.idle()  # a long prompt's activations back to the OS, not kept by malloc
        return outputs

    def _execute_alone(self, batch: ScheduledBatch, exc: Exception) -> StepResult:
        """The batched forward raised: run each sequence of the step alone, so that one
        request's fault (a bad input, a kernel failing on its shape) fails that request
        only; the others go on. Rewriting their KV slots is harmless: the same tokens at
        the same positions write the same rows."""
        n = len(batch.seqs)
        if n == 1:
            log.exception("forward failed for request %s", batch.seqs[0].request_id, exc_info=exc)
            return StepResult([None], [None], {0: f"engine step failed: {exc!r}"})
        log.warning("forward of %d requests failed (%r); running them one by one", n, exc)
        tokens: list[int | None] = [None] * n
        logprobs: list[float | None] = [None] * n
        tops: list[TopLogprobs | None] = [None] * n
        errors: dict[int, str] = {}
        deferred: set[int] = set()
        drafted: dict[int, list[tuple[int, float | None, TopLogprobs | None]]] = {}
        for i, (seq, num) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            try:
                one = self.runner.execute(ScheduledBatch([seq], [num], drafts=[batch.draft(i)]))
            except FatalRunnerError:
                raise
            except Exception as alone:  # noqa: BLE001 - this request alone fails
                log.exception("forward failed for request %s", seq.request_id, exc_info=alone)
                errors[i] = f"engine step failed: {alone!r}"
                continue
            tokens[i], logprobs[i] = one.tokens[0], one.logprobs[0]
            if one.top_logprobs is not None:
                tops[i] = one.top_logprobs[0]
            if 0 in one.errors:
                errors[i] = one.errors[0]
            if 0 in one.deferred:
                deferred.add(i)
            if 0 in one.drafted:
                drafted[i] = one.drafted[0]
        return StepResult(tokens, logprobs, errors, tops, deferred, drafted)

    def _postprocess(self, batch: ScheduledBatch, result: StepResult, outputs: list[RequestOutput]) -> None:
        tokens, logprobs, errors = result.tokens, result.logprobs, result.errors
        tops = result.top_logprobs
        publish = self.block_manager.publish
        started: list[GrammarState] = []
        for i, seq in enumerate(batch.seqs):
            draft = batch.draft(i)
            if i in result.deferred:
                # Its grammar mask was not ready: nothing sampled. Its last token goes through
                # the model again with the next step that runs it (the same K/V rewritten; a
                # draft's K/V past it are never read: the next step writes over them).
                seq.num_computed_tokens += 0 if draft else batch.num_new_tokens[i] - 1
                continue
            # A row with a draft computed its last token for sure; each draft token counts
            # once it is kept (below).
            seq.num_computed_tokens += 1 if draft else batch.num_new_tokens[i]
            if i in errors:
                outputs.append(self._finish(seq, EngineFinish.ERROR, error=errors[i]))
                continue
            token = tokens[i]
            if token is None:
                publish(seq)
                if seq.prewarm and seq.num_computed_tokens == seq.num_tokens:
                    outputs.append(self._finish(seq, EngineFinish.PREWARM))
                continue
            sampled = [(token, logprobs[i], tops[i] if tops is not None else None), *result.drafted.get(i, [])]
            kept = 0
            done: RequestOutput | None = None
            for j, (tok, lp, top) in enumerate(sampled):
                # Position j was sampled after the draft's first j tokens: valid while each
                # of them was what sampling chose (kept); the first token that is not the
                # draft's is still the sample there, and ends the row's step.
                accepted = j < len(draft) and tok == draft[j]
                done = self._append(seq, tok, lp, top, started, computed=accepted)
                if done is not None or not accepted:
                    break
                kept += 1
            if draft:
                if self.drafter is not None:
                    self.drafter.observe(seq, len(draft), kept)
                seq.num_draft_tokens += len(draft)
                seq.num_accepted_tokens += kept
                self.num_draft_tokens += len(draft)
                self.num_accepted_draft_tokens += kept
            outputs.append(done if done is not None else self._delta(seq))
        if started and self.masks is not None:
            self.masks.start(started)

    def _append(self, seq: Sequence, token: int, logprob: float | None, top: TopLogprobs | None,
                started: list[GrammarState], *, computed: bool = False) -> RequestOutput | None:
        """One sampled token onto `seq` (its K/V already in the cache if `computed`: a kept
        draft token): the budget, grammar, logprobs, prefix cache and stop conditions.
        Returns the final output when the request ends with it, else None."""
        self.num_generated_tokens += 1
        seq.token_ids.append(token)
        seq.new_token_ids.append(token)
        if computed:
            seq.num_computed_tokens += 1
        if seq.budget is not None:
            seq.budget.advance(token)
            if seq.budget.done:
                seq.budget = None  # free from here on: no more work per step
        grammar_error = seq.grammar.advance(token) if seq.grammar is not None else None
        if seq.params.logprobs:
            seq.new_logprobs.append(logprob)
        if seq.params.top_logprobs:
            seq.new_top_logprobs.append(top or [])
        self.block_manager.publish(seq)
        if grammar_error is not None:
            return self._finish(seq, EngineFinish.ERROR, error=grammar_error)
        try:
            reason, stop_reason = self._check_stop(seq, token)
        except Exception as exc:
            log.exception("request %s failed after sampling", seq.request_id)
            return self._finish(seq, EngineFinish.ERROR, error=f"output processing failed: {exc!r}")
        error = None
        if seq.grammar is not None:
            if reason in (None, EngineFinish.LENGTH) and seq.grammar.finished:
                # The grammar allows nothing more: the output ends here, as complete (also
                # when this token reached max_tokens)...
                reason, stop_reason = EngineFinish.STOP, None
            if reason is EngineFinish.STOP and not seq.grammar.accepting:
                # ... but only an output the grammar accepts is complete.
                reason, stop_reason = EngineFinish.ERROR, None
                error = ("the output ended before it matched the output grammar"
                         + (f": {seq.grammar.error()}" if seq.grammar.error() else ""))
            elif reason is None and seq.grammar.late:
                started.append(seq.grammar)  # its next mask, now: it runs only once that is ready
        if reason is not None:
            return self._finish(seq, reason, stop_reason=stop_reason, error=error)
        return None

    @staticmethod
    def _check_stop(seq: Sequence, token: int) -> tuple[EngineFinish | None, str | int | None]:
        """Detokenize the new token and decide whether the request ends with it."""
        if token in seq.stop_ids:
            return EngineFinish.STOP, token  # the stop token's text is not part of the answer
        text = seq.text.add(token)  # type: ignore[union-attr]
        if text:
            seq.new_text.append(text)
        if seq.text.stop_string is not None:  # type: ignore[union-attr]
            return EngineFinish.STOP, seq.text.stop_string  # type: ignore[union-attr]
        if seq.num_output_tokens >= seq.max_tokens:
            return EngineFinish.LENGTH, None
        return None, None

    # -- finishing ------------------------------------------------------------------

    def _finish(
        self, seq: Sequence, reason: EngineFinish, *, stop_reason: str | int | None = None, error: str | None = None
    ) -> RequestOutput:
        self.scheduler.finish(seq)  # frees its blocks (publishing the computed ones)
        if seq.grammar is not None:
            self._num_grammars -= 1
        seq.grammar = None  # the matcher's memory goes now, not with the last reference
        del self.seqs[seq.request_id]
        if seq.deadline is not None:
            self._num_deadlines -= 1
        if seq.text is not None and reason is not EngineFinish.ERROR:
            try:
                tail = seq.text.flush()
            except Exception:
                log.exception("request %s: flushing its text failed", seq.request_id)
                tail = ""
            if tail:
                seq.new_text.append(tail)
        seq.finish_reason, seq.stop_reason, seq.error = reason, stop_reason, error
        out = self._delta(seq)
        out.finished = True
        out.finish_reason = reason
        out.stop_reason = stop_reason
        out.error = error
        out.usage = EngineUsage(
            prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_cached_tokens or 0,
            output_tokens=seq.num_output_tokens,
            rewound_tokens=seq.text.rewound if seq.text is not None else 0,
            draft_tokens=seq.num_draft_tokens,
            accepted_draft_tokens=seq.num_accepted_tokens,
        )
        return out

    @staticmethod
    def _delta(seq: Sequence) -> RequestOutput:
        out = RequestOutput(
            seq.request_id,
            token_ids=seq.new_token_ids,
            text="".join(seq.new_text),
            logprobs=seq.new_logprobs if seq.params.logprobs else None,
            top_logprobs=seq.new_top_logprobs if seq.params.top_logprobs else None,
        )
        seq.new_token_ids, seq.new_text, seq.new_logprobs, seq.new_top_logprobs = [], [], [], []
        return out

    # -- lifecycle --------------------------------------------------------------------

    def watch_failures(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (from another thread) if the runner fails between steps:
        a tensor-parallel worker that exits. Plain runners never do."""
        if hasattr(self.runner, "on_failure"):
            self.runner.on_failure = callback
            failure = getattr(self.runner, "failure", None)
            if failure is not None:
                callback(failure)

    def close(self) -> None:
        """Release the runner's processes (tensor parallelism: stop every worker)."""
        self.runner.close()

    # -- gauges and conveniences ----------------------------------------------------

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_free_blocks=bm.num_free_blocks,
            num_blocks=bm.num_blocks,
            block_size=bm.block_size,
            prefix_cache_hit_tokens=bm.hit_tokens,
            prefix_cache_query_tokens=bm.query_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self.num_steps,
            num_generated_tokens=self.num_generated_tokens,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_draft_tokens=self.num_accepted_draft_tokens,
        )

    def generate(
        self,
        prompts: Iterable[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        prewarm: bool = False,
    ) -> list[Completion]:
        """Run prompts to completion, all in flight together; results in prompt order."""
        prompts = [list(p) for p in prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        ids = [f"gen-{os.getpid()}-{id(self)}-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        collected: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
        for rid, prompt, p in zip(ids, prompts, params):
            self.add_request(rid, prompt, p, prewarm=prewarm)
        pending = set(ids)
        while pending:
            for out in self.step():
                if out.request_id in collected:
                    collected[out.request_id].append(out)
                    if out.finished:
                        pending.discard(out.request_id)
            if self.stalled and self.masks is not None:  # every sequence waits on its mask
                self.masks.wait_any([s.grammar for s in self.seqs.values() if s.grammar is not None], 0.05)
        return [Completion.fold(rid, collected[rid]) for rid in ids]


__all__ = ["EngineStats", "LLMEngine", "kv_cache_num_blocks"]
