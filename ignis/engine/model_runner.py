"""One step on the device: flat batch in, one sampled token per sampling row out.

The batch is every scheduled sequence's new tokens concatenated (decode rows first):
token ids, positions, slot mapping (where each new K/V row goes), block tables, query
start locations and context lengths. It is built with numpy on the host and copied
once (through pinned staging buffers on CUDA). The forward runs the model through the
kernels ops; logits are computed only at the rows that sample, and the sampler
(ignis/engine/sampler.py) turns them into tokens. The one host synchronisation of a
step is reading the sampled ids back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import ignis_kernels
from ignis.engine.cpu_weights import pack_linear_weights, unpack_linear_weights
from ignis.engine.sampler import Sampled, Sampler, TopLogprobs
from ignis.engine.scheduler import ScheduledBatch
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import allocate_kv_caches
from ignis.model.native_decode import NativeDecoder
from ignis.model.transformer import Transformer
from ignis_kernels import cpu_native
from ignis_kernels.attention_cpu_native import NativeCpuAttention
from ignis_kernels.attention_cpu_prefill import CpuAttention

log = logging.getLogger(__name__)

# A step waits for its grammar masks at least this long after the forward (and at most
# as long as the forward took, when that is longer): a slow mask defers its row only.
MASK_WAIT_MIN_S = 0.005


class _CpuKvWriter:
    """ignis_kernels.write_kv for the CPU runner: the runner's slots are all valid (it never
    pads), so each layer's write is one index_copy_ per cache over the flat rows, instead
    of the reference's mask, split and two-index scatter per layer."""

    __slots__ = ("slots",)

    def __init__(self, slot_mapping: torch.Tensor) -> None:
        self.slots = slot_mapping

    def __call__(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor, backend: object = None,
    ) -> None:
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            ignis_kernels.write_kv_ref(key, value, k_cache, v_cache, slot_mapping)
            return
        rows = k_cache.shape[0] * k_cache.shape[1]
        k_cache.view(rows, *k_cache.shape[2:]).index_copy_(0, self.slots, key.to(k_cache.dtype))
        v_cache.view(rows, *v_cache.shape[2:]).index_copy_(0, self.slots, value.to(v_cache.dtype))


class FatalRunnerError(RuntimeError):
    """The runner cannot go on, whatever the batch (a tensor-parallel rank is gone, or the
    ranks are out of step): the engine stops rather than retrying requests one by one."""


@dataclass
class StepResult:
    # Per batch.seqs entry: the sampled token (None: this row did not sample, or failed).
    tokens: list[int | None]
    logprobs: list[float | None]
    errors: dict[int, str]  # batch index -> message, for rows whose sampling failed
    # Per batch.seqs entry, for rows whose params ask for top_logprobs (None otherwise).
    top_logprobs: list[TopLogprobs | None] | None = None
    # Batch indices of rows that sampled nothing: their grammar mask was not ready.
    deferred: set[int] = field(default_factory=set)
    # Batch index of a row with a draft -> (token, logprob, top logprobs) sampled at each
    # draft position after the first (the first is in tokens/logprobs/top_logprobs).
    drafted: dict[int, list[tuple[int, float | None, TopLogprobs | None]]] = field(default_factory=dict)

    def fill(self, sampled: Sampled, batch_index: list[int]) -> None:
        """Put the sampler's answer for its rows at their batch indices (a batch index seen
        again is a draft position of the same row: into `drafted`)."""
        if sampled.top_logprobs is not None:
            self.top_logprobs = [None] * len(self.tokens)
        seen: set[int] = set()
        for k, i in enumerate(batch_index):
            again = i in seen
            seen.add(i)
            if k in sampled.deferred and k not in sampled.errors:
                self.deferred.add(i)
                continue
            if k in sampled.errors:
                self.errors[i] = sampled.errors[k]
                continue
            lp = sampled.logprobs[k] if sampled.logprobs is not None else None
            top = sampled.top_logprobs[k] if sampled.top_logprobs is not None else None
            if again:
                self.drafted.setdefault(i, []).append((sampled.tokens[k], lp, top))
                continue
            self.tokens[i] = sampled.tokens[k]
            self.logprobs[i] = lp
            if self.top_logprobs is not None:
                self.top_logprobs[i] = top


@dataclass
class HostStep:
    """One step's flat inputs on the host, rows in run order (decode rows first)."""

    order: list[int]  # row -> index into the scheduled batch
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    block_tables: np.ndarray  # [S, width] int32, padded with -1
    query_start_loc: np.ndarray  # [S + 1] int64
    query_lens: np.ndarray  # [S] int64
    seq_lens: np.ndarray  # [S] int64
    sampling: list[int]  # the rows that sample
    sample_idx: np.ndarray | None  # [len(sampling)] int64: their last token's index (None: every token)


@dataclass
class DeviceBatch:
    """One step's inputs on the device, rows in run order (decode rows first)."""

    order: list[int]  # row -> index into the scheduled batch
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sampling: list[int]  # the rows that sample: the sequence's last known token is in this step
    sample_idx: torch.Tensor | None  # their last token's index in [T] (None: every token samples)


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        pack_cpu_weights: bool = True,
        native_decode: bool = True,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.device = model.device
        self.block_size = block_size
        # The engine resolves the dtype (engine.kv_cache_dtype); None = the model's.
        self.kv_caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype=kv_cache_dtype or model.dtype,
                                            device=self.device)
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.on_cuda = self.device.type == "cuda"
        # CPU: GEMMs over oneDNN-packed weights (see cpu_weights.py); the head's op is ours.
        # (Packing belongs to the model, shared by every engine over it: the last engine
        # built decides.)
        self.head_op = pack_linear_weights(model) if pack_cpu_weights else None
        if not pack_cpu_weights:
            unpack_linear_weights(model)
        # Batched decode attention on the CPU (ignis_kernels.attention_cpu); an explicit Triton
        # backend (the interpreter) stays Triton.
        self.use_cpu_attention = self.device.type == "cpu" and ignis_kernels.get_backend() != "triton"
        # Decode steps of int4/int8 CPU models: every layer in one native call; decode rows
        # of the steps left eager (other forms, wider batches): the native attention.
        native = native_decode and self.use_cpu_attention and cpu_native.load()
        # (Layers the op does not compute stay eager: ignis/model/native_decode.py unsupported.)
        self.native = NativeDecoder.build(model) if native else None
        self.cpu_attention = NativeCpuAttention if native else CpuAttention
        if self.native is not None:
            log.info("decode steps run natively (ignis_kernels/cpu/decode.cpp)")
        self.sampler = Sampler()
        self._copied: torch.cuda.Event | None = None
        if self.on_cuda:  # pinned host buffers: one non-blocking copy each per step
            pin = {"pin_memory": True}
            self._host = {
                "input_ids": torch.empty(max_num_batched_tokens, dtype=torch.int64, **pin),
                "positions": torch.empty(max_num_batched_tokens, dtype=torch.int64, **pin),
                "slot_mapping": torch.empty(max_num_batched_tokens, dtype=torch.int64, **pin),
                "query_start_loc": torch.empty(max_num_seqs + 1, dtype=torch.int32, **pin),
                "seq_lens": torch.empty(max_num_seqs, dtype=torch.int32, **pin),
                "block_tables": torch.empty(max_num_seqs * self.max_blocks_per_seq, dtype=torch.int32, **pin),
                "sample_idx": torch.empty(max_num_seqs, dtype=torch.int64, **pin),
            }

    def _tensor(self, name: str, array: np.ndarray) -> torch.Tensor:
        if not self.on_cuda:
            return torch.from_numpy(array)  # zero-copy
        if self._copied is not None:  # last step's copies out of these buffers must be done
            self._copied.synchronize()
            self._copied = None
        buf = self._host[name][: array.size]
        buf.numpy()[:] = array.reshape(-1)
        return buf.to(self.device, non_blocking=True).view(array.shape)

    def _copies_enqueued(self) -> None:
        if self.on_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepResult:
        return self.run(batch, self.prepare(batch))

    def prepare(self, batch: ScheduledBatch) -> DeviceBatch:
        """The step's inputs and attention metadata, built on the host and copied over."""
        return self.device_batch(self.host_inputs(batch))

    def host_inputs(self, batch: ScheduledBatch) -> HostStep:
        """The step's flat arrays on the host (what tensor parallelism broadcasts). A row with
        a draft becomes 1 + k one-token rows of its sequence at consecutive positions, each
        with its own length: every kernel's KV write precedes its attention, so each sees
        the rows before it, as a prefill chunk's tokens do, and every one of them samples."""
        seqs, num_new = batch.seqs, batch.num_new_tokens
        # Decode rows (one new token, or a draft's one-token rows) first: the CPU attention
        # batches them.
        by_kind = sorted(range(len(seqs)), key=lambda i: num_new[i] != 1 and not batch.draft(i))
        order: list[int] = []  # row -> batch index
        q_list: list[int] = []
        start_list: list[int] = []
        ids: list[int] = []
        drafted: list[int] = []  # the rows of drafts
        for i in by_kind:
            seq, start, draft = seqs[i], seqs[i].num_computed_tokens, batch.draft(i)
            if draft:
                drafted.extend(range(len(order), len(order) + 1 + len(draft)))
                ids.append(seq.token_ids[start])
                ids.extend(draft)
                order.extend([i] * (1 + len(draft)))
                q_list.extend([1] * (1 + len(draft)))
                start_list.extend(range(start, start + 1 + len(draft)))
                continue
            order.append(i)
            q_list.append(num_new[i])
            start_list.append(start)
            if num_new[i] == 1:
                ids.append(seq.token_ids[start])
            else:
                ids.extend(seq.token_ids[start : start + num_new[i]])
        S = len(order)
        q_lens = np.asarray(q_list, dtype=np.int64)
        starts = np.asarray(start_list, dtype=np.int64)
        seq_lens = starts + q_lens
        qsl = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(q_lens, out=qsl[1:])
        tables = np.full((S, max(len(seqs[i].block_table) for i in order)), -1, dtype=np.int32)
        for row, i in enumerate(order):
            table = seqs[i].block_table
            tables[row, : len(table)] = table
        # positions: start of each row's sequence plus the offset inside its chunk.
        row_of = np.repeat(np.arange(S), q_lens)
        positions = np.arange(int(qsl[-1]), dtype=np.int64) - qsl[:-1][row_of] + starts[row_of]
        bs = self.block_size
        slots = tables[row_of, positions // bs].astype(np.int64) * bs + positions % bs
        draft_rows = set(drafted)
        sampling = [
            row for row, i in enumerate(order)
            if row in draft_rows or (not seqs[i].prewarm and seq_lens[row] == seqs[i].num_tokens)
        ]
        sample_idx = None
        if sampling and len(sampling) != len(ids):  # only the rows that sample go through the head
            sample_idx = qsl[np.asarray(sampling, dtype=np.int64) + 1] - 1
        return HostStep(order, np.asarray(ids, dtype=np.int64), positions, slots, tables, qsl, q_lens, seq_lens,
                        sampling, sample_idx)

    def device_batch(self, host: HostStep) -> DeviceBatch:
        """Copy a step's host arrays to the device, with the attention metadata."""
        input_ids = self._tensor("input_ids", host.input_ids)
        pos_t = self._tensor("positions", host.positions)
        meta = self._metadata(host.slot_mapping, host.block_tables, host.query_start_loc, host.query_lens,
                              host.seq_lens)
        sample_idx = None if host.sample_idx is None else self._tensor("sample_idx", host.sample_idx)
        self._copies_enqueued()
        return DeviceBatch(host.order, input_ids, pos_t, meta, host.sampling, sample_idx)

    def _metadata(
        self, slots: np.ndarray, tables: np.ndarray, qsl: np.ndarray, q_lens: np.ndarray, seq_lens: np.ndarray
    ) -> AttentionMetadata:
        meta = AttentionMetadata(
            slot_mapping=self._tensor("slot_mapping", slots),
            block_tables=self._tensor("block_tables", tables),
            query_start_loc=self._tensor("query_start_loc", qsl.astype(np.int32)),
            seq_lens=self._tensor("seq_lens", seq_lens.astype(np.int32)),
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq_lens.max()),
        )
        if self.use_cpu_attention:
            meta.write_kv_op = _CpuKvWriter(meta.slot_mapping)
            num_decodes = int(np.count_nonzero(q_lens == 1))
            meta.attention_op = self.cpu_attention(
                meta.block_tables, meta.query_start_loc, meta.seq_lens,
                num_decodes=num_decodes,
                decode_max_seq_len=int(seq_lens[:num_decodes].max()) if num_decodes else 0,
                block_size=self.block_size,
            )
        return meta

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, inputs: DeviceBatch) -> StepResult:
        """The forward, then the head and the sampler at the rows that sample."""
        S = len(inputs.order)
        result = StepResult([None] * S, [None] * S, {})
        batch_index = [inputs.order[row] for row in inputs.sampling]
        rows = [batch.seqs[i] for i in batch_index]
        # A draft's k + 1 rows sample output positions n, n + 1, ... of their sequence.
        offsets: list[int] | None = None
        if len(set(batch_index)) != len(batch_index):
            count: dict[int, int] = {}
            offsets = []
            for i in batch_index:
                offsets.append(count.get(i, 0))
                count[i] = offsets[-1] + 1
        drafts = [batch.draft(i) for i in batch_index] if offsets is not None else None
        self.sampler.prefetch_masks(rows, drafts)  # grammar bitmasks fill while the model runs
        started = time.perf_counter()
        logits = self.forward(inputs)
        if logits is None:
            return result
        wait = max(MASK_WAIT_MIN_S, time.perf_counter() - started)
        result.fill(self.sampler.sample(logits, rows, mask_wait=wait, offsets=offsets), batch_index)
        return result

    def forward(self, inputs: DeviceBatch) -> torch.Tensor | None:
        """The model over the step, then the head at the sampling rows (None: no row samples)."""
        meta = inputs.meta
        if self.native is not None and meta.max_query_len == 1:
            hidden = self.native(inputs.input_ids, inputs.positions, self.kv_caches, meta.slot_mapping,
                                 meta.block_tables, meta.seq_lens)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, meta)
        if not inputs.sampling:
            return None
        if inputs.sample_idx is not None:
            hidden = hidden.index_select(0, inputs.sample_idx)
        return self.compute_logits(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [N, vocab] of final hidden rows (tensor parallelism gathers them here)."""
        if self.head_op is None:
            return self.model.compute_logits(hidden)
        return self.model.finish_logits(self.head_op(hidden).float())

    def close(self) -> None:
        """Release what the runner holds beyond memory (tensor parallelism: its workers)."""
