"""One step on the device: flat batch in, one sampled token per sampling row out.

The batch is every scheduled sequence's new tokens concatenated (decode rows first):
token ids, positions, slot mapping (where each new K/V row goes), block tables, query
start locations and context lengths. It is built with numpy on the host and copied
once (through pinned staging buffers on CUDA). The forward runs the model through the
kernels ops; logits are computed only at the rows that sample, and the sampler runs
only when some row is not plain greedy. The one host synchronisation of a step is
reading the sampled ids back.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import numpy as np
import torch

import kernels
from ignis.engine.constraint import TokenIndex
from ignis.engine.cpu_weights import pack_linear_weights, unpack_linear_weights
from ignis.engine.scheduler import ScheduledBatch
from ignis.engine.sequence import Sequence
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import allocate_kv_caches
from ignis.model.transformer import Transformer
from kernels.sampling import SamplingTensors, logprob_distribution, sample

log = logging.getLogger(__name__)


_NO_IDS = np.empty(0, dtype=np.int32)
# Allowed tokens the model itself gave -inf (the scripted model's one-hot logits) are
# raised to this, so that a masked row always samples an allowed token. Finite after
# any temperature >= GREEDY_EPS and any sane penalty.
_ALLOWED_FLOOR = -1e30
_NEG_INF = float("-inf")


class _PenaltyIds:
    """One sequence's token ids as int32 arrays for the penalties: the prompt, copied once,
    and the output, appended to as it grows (capacity doubles)."""

    __slots__ = ("n", "output", "prompt")

    def __init__(self, seq: Sequence) -> None:
        self.prompt = np.asarray(seq.token_ids[: seq.num_prompt_tokens], dtype=np.int32)
        self.output = np.empty(64, dtype=np.int32)
        self.n = 0

    def sync(self, seq: Sequence) -> tuple[np.ndarray, np.ndarray]:
        total = seq.num_output_tokens
        if total < self.n:  # never happens today (outputs only grow): start over
            self.n = 0
        if total > self.n:
            if total > len(self.output):
                grown = np.empty(max(total, 2 * len(self.output)), dtype=np.int32)
                grown[: self.n] = self.output[: self.n]
                self.output = grown
            self.output[self.n : total] = seq.token_ids[seq.num_prompt_tokens + self.n :]
            self.n = total
        return self.prompt, self.output[: self.n]


# A row's most likely tokens: (token id, logprob), logprob descending.
TopLogprobs = list[tuple[int, float]]


@dataclass
class StepResult:
    # Per batch.seqs entry: the sampled token (None: this row did not sample, or failed).
    tokens: list[int | None]
    logprobs: list[float | None]
    errors: dict[int, str]  # batch index -> message, for rows whose sampling failed
    # Per batch.seqs entry, for rows whose params ask for top_logprobs (None otherwise).
    top_logprobs: list[TopLogprobs | None] | None = None


@dataclass
class Sampled:
    """The sampler's answer for the rows of one call (lists indexed like the rows)."""

    tokens: list[int]
    logprobs: list[float] | None  # None: no row asked for logprobs
    top_logprobs: list[TopLogprobs | None] | None  # None: no row asked for top_logprobs


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
    ) -> None:
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype=model.dtype, device=self.device)
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.on_cuda = self.device.type == "cuda"
        # CPU: GEMMs over oneDNN-packed weights (see cpu_weights.py); the head's op is ours.
        # (Packing belongs to the model, shared by every engine over it: the last engine
        # built decides.)
        self.head_op = pack_linear_weights(model) if pack_cpu_weights else None
        if not pack_cpu_weights:
            unpack_linear_weights(model)
        # Batched decode attention on the CPU (kernels.attention_cpu) when the model
        # takes a per-step attention op.
        self.use_cpu_attention = (
            self.device.type == "cpu"
            and kernels.get_backend() != "triton"  # explicit Triton (the interpreter) stays Triton
            and "attention_op" in AttentionMetadata.__dataclass_fields__
        )
        self._copied: torch.cuda.Event | None = None
        self._penalty_ids: weakref.WeakKeyDictionary[Sequence, _PenaltyIds] = weakref.WeakKeyDictionary()
        # Per token index (one per tokenizer): its ids in byte order, on the device.
        self._orders: weakref.WeakKeyDictionary[TokenIndex, torch.Tensor] = weakref.WeakKeyDictionary()
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
        seqs, num_new = batch.seqs, batch.num_new_tokens
        # Decode rows (one new token) first: the CPU attention batches them.
        order = sorted(range(len(seqs)), key=lambda i: num_new[i] != 1)
        bs = self.block_size
        S = len(order)
        q_lens = np.fromiter((num_new[i] for i in order), dtype=np.int64, count=S)
        starts = np.fromiter((seqs[i].num_computed_tokens for i in order), dtype=np.int64, count=S)
        seq_lens = starts + q_lens
        qsl = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(q_lens, out=qsl[1:])
        T = int(qsl[-1])
        width = max(len(seqs[i].block_table) for i in order)
        tables = np.full((S, width), -1, dtype=np.int32)
        ids: list[int] = []
        for row, i in enumerate(order):
            seq = seqs[i]
            tables[row, : len(seq.block_table)] = seq.block_table
            start = seq.num_computed_tokens
            if num_new[i] == 1:
                ids.append(seq.token_ids[start])
            else:
                ids.extend(seq.token_ids[start : start + num_new[i]])
        # positions: start of each row's sequence plus the offset inside its chunk.
        row_of = np.repeat(np.arange(S), q_lens)
        positions = np.arange(T, dtype=np.int64) - qsl[:-1][row_of] + starts[row_of]
        slots = tables[row_of, positions // bs].astype(np.int64) * bs + positions % bs

        # Rows that sample: a non-prewarm sequence whose last known token is in this step.
        sampling = [
            row for row, i in enumerate(order)
            if not seqs[i].prewarm and seq_lens[row] == seqs[i].num_tokens
        ]
        result = StepResult([None] * S, [None] * S, {})
        input_ids = self._tensor("input_ids", np.asarray(ids, dtype=np.int64))
        pos_t = self._tensor("positions", positions)
        meta = AttentionMetadata(
            slot_mapping=self._tensor("slot_mapping", slots),
            block_tables=self._tensor("block_tables", tables),
            query_start_loc=self._tensor("query_start_loc", qsl.astype(np.int32)),
            seq_lens=self._tensor("seq_lens", seq_lens.astype(np.int32)),
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq_lens.max()),
        )
        if self.use_cpu_attention:
            num_decodes = int(np.count_nonzero(q_lens == 1))
            meta.attention_op = kernels.BatchedCpuAttention(
                meta.block_tables, meta.query_start_loc, meta.seq_lens,
                num_decodes=num_decodes,
                decode_max_seq_len=int(seq_lens[:num_decodes].max()) if num_decodes else 0,
                block_size=bs,
            )
        sample_idx = None
        if sampling and len(sampling) != T:  # only the rows that sample go through the head
            idx = np.asarray([qsl[row + 1] - 1 for row in sampling], dtype=np.int64)
            sample_idx = self._tensor("sample_idx", idx)
        self._copies_enqueued()
        hidden = self.model(input_ids, pos_t, self.kv_caches, meta)
        if not sampling:
            return result
        if sample_idx is not None:
            hidden = hidden.index_select(0, sample_idx)
        logits = self.model.compute_logits(hidden) if self.head_op is None else self.head_op(hidden).float()
        rows = [seqs[order[row]] for row in sampling]
        sampled, errors = self._sample(logits, rows)
        if sampled.top_logprobs is not None:
            result.top_logprobs = [None] * S
        for k, row in enumerate(sampling):
            i = order[row]
            if k in errors:
                result.errors[i] = errors[k]
            else:
                result.tokens[i] = sampled.tokens[k]
                result.logprobs[i] = sampled.logprobs[k] if sampled.logprobs is not None else None
                if result.top_logprobs is not None and sampled.top_logprobs is not None:
                    result.top_logprobs[i] = sampled.top_logprobs[k]
        return result

    def _sample(self, logits: torch.Tensor, rows: list[Sequence]) -> tuple[Sampled, dict[int, str]]:
        """Sample every row at once; if that raises, row by row so one bad row fails alone."""
        try:
            return self._sample_rows(logits, rows), {}
        except Exception as exc:  # noqa: BLE001 - isolate the offending rows below
            log.warning("batched sampling failed (%s); retrying row by row", exc)
        out = Sampled([], None, None)
        lps: list[float] = []
        tops: list[TopLogprobs | None] = []
        errors: dict[int, str] = {}
        for k, seq in enumerate(rows):
            try:
                one = self._sample_rows(logits[k : k + 1], [seq])
                out.tokens.append(one.tokens[0])
                lps.append(one.logprobs[0] if one.logprobs is not None else float("nan"))
                tops.append(one.top_logprobs[0] if one.top_logprobs is not None else None)
            except Exception as exc:  # noqa: BLE001
                errors[k] = f"sampling failed: {exc}"
                out.tokens.append(-1)
                lps.append(float("nan"))
                tops.append(None)
        if any(s.params.logprobs for s in rows):
            out.logprobs = lps
        if any(t is not None for t in tops):
            out.top_logprobs = tops
        return out, errors

    def _penalty_tokens(self, rows: list[Sequence]) -> dict[str, torch.Tensor]:
        """The rows' prompt and output ids for the penalties, [B, S] int32 padded with -1
        (empty for rows without penalties), from per-sequence numpy copies that grow by the
        new tokens only: no Python list of the whole context is converted each step."""
        arrays = []
        for s in rows:
            if not s.params.uses_penalties:
                arrays.append(None)
                continue
            ids = self._penalty_ids.get(s)
            if ids is None:
                ids = self._penalty_ids[s] = _PenaltyIds(s)
            arrays.append(ids.sync(s))
        out = {}
        for k, name in enumerate(("prompt_tokens", "output_tokens")):
            parts = [a[k] if a is not None else _NO_IDS for a in arrays]
            padded = np.full((len(parts), max(len(p) for p in parts)), -1, dtype=np.int32)
            for row, p in enumerate(parts):
                padded[row, : len(p)] = p
            out[name] = torch.from_numpy(padded)
        return out

    def _mask_forced(self, logits: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
        """`logits` with every token a forcing constraint disallows at -inf, for the rows
        whose constraint is forcing (a copy: the caller's logits stay as they were, so the
        row-by-row retry of `_sample` masks them once, afresh). The same tensor when no
        row is forced.

        Each row's allowed set is a few ids plus ranges of its index's byte-ordered ids
        (kept on the device): one host->device copy of the ids, rows and range bounds."""
        forced = []
        for k, s in enumerate(rows):
            c = s.constraint
            if c is not None and (allowed := c.allowed()) is not None:
                forced.append((k, c.index, allowed))
        if not forced:
            return logits
        dev = logits.device
        small_ids: list[int] = []
        small_rows: list[int] = []
        pieces: list[torch.Tensor] = []
        piece_rows: list[int] = []
        counts: list[int] = []
        for r, (_, index, allowed) in enumerate(forced):
            small_ids.extend(allowed.ids)
            small_rows.extend([r] * len(allowed.ids))
            if allowed.ranges:
                order = self._orders.get(index)
                if order is None:
                    order = self._orders[index] = torch.from_numpy(index.order).to(dev)
                for lo, hi in allowed.ranges:
                    pieces.append(order[lo:hi])  # a view: nothing copied
                    piece_rows.append(r)
                    counts.append(hi - lo)
        n_small, n_pieces = len(small_ids), len(piece_rows)
        host = np.asarray([k for k, _, _ in forced] + small_ids + small_rows + piece_rows + counts, dtype=np.int64)
        packed = torch.from_numpy(host).to(dev)  # the one upload
        R = len(forced)
        which = packed[:R]
        cols = [packed[R : R + n_small], *pieces]
        at = R + n_small
        row_idx = [packed[at : at + n_small]]
        at += n_small
        if n_pieces:
            row_idx.append(torch.repeat_interleave(packed[at : at + n_pieces], packed[at + n_pieces :],
                                                   output_size=sum(counts)))
        allowed_mask = torch.zeros((R, logits.shape[1]), dtype=torch.bool, device=dev)
        allowed_mask[torch.cat(row_idx), torch.cat(cols)] = True
        sub = logits.index_select(0, which) if R != logits.shape[0] else logits
        sub = torch.where(allowed_mask, sub.clamp(min=_ALLOWED_FLOOR), _NEG_INF)
        if R == logits.shape[0]:
            return sub
        return logits.index_copy(0, which, sub)

    @staticmethod
    def _ban_stops(logits: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
        """`logits` with the stop ids at -inf in the rows still short of their
        `min_tokens` (a copy, as `_mask_forced`; the same tensor when no row is)."""
        cells = [
            (k, t) for k, s in enumerate(rows)
            if s.num_output_tokens < s.params.min_tokens for t in s.stop_ids if t < logits.shape[1]
        ]
        if not cells:
            return logits
        at = torch.tensor(cells, dtype=torch.long).to(logits.device)
        return logits.index_put((at[:, 0], at[:, 1]), torch.tensor(_NEG_INF, device=logits.device))

    def _sample_rows(self, logits: torch.Tensor, rows: list[Sequence]) -> Sampled:
        logits = self._ban_stops(logits, rows)
        # Forced rows sample from (and report logprobs of) the masked distribution.
        logits = self._mask_forced(logits, rows)
        want_logprobs = any(s.params.logprobs for s in rows)  # top_logprobs implies logprobs
        penalties = any(s.params.uses_penalties for s in rows)
        if not want_logprobs and not penalties and all(s.params.is_greedy for s in rows):
            # Plain greedy: the sampler's greedy rule is the first index of the max.
            return Sampled(logits.argmax(dim=-1).tolist(), None, None)
        p = [s.params for s in rows]
        params = SamplingTensors.from_lists(
            [x.temperature for x in p],
            top_k=[x.top_k for x in p],
            top_p=[x.top_p for x in p],
            min_p=[x.min_p for x in p],
            repetition_penalty=[x.repetition_penalty for x in p],
            presence_penalty=[x.presence_penalty for x in p],
            frequency_penalty=[x.frequency_penalty for x in p],
            seed=[s.seed for s in rows],
            step=[s.num_output_tokens for s in rows],
            **(self._penalty_tokens(rows) if penalties else {}),
            device=logits.device,
        )
        # Penalties go on a copy, never in place: a failed batched call is retried row by
        # row on these same logits, which must not be penalised twice.
        if not want_logprobs:
            return Sampled(sample(logits, params).tolist(), None, None)
        ids, lps = sample(logits, params, return_logprobs=True)
        B = len(rows)
        top_rows = [k for k, x in enumerate(p) if x.top_logprobs > 0]
        parts = [ids.to(torch.float64), lps.to(torch.float64)]
        n = 0  # alternatives computed per asking row: the most any of them wants
        if top_rows:
            # The rows that ask, from the distribution the sampled logprob is read from
            # (kernels.sampling_ref, definition 5): the penalised, tempered one, before
            # top-k/top-p/min-p. topk sorts descending.
            n = min(max(p[k].top_logprobs for k in top_rows), logits.shape[1])
            sel = None if len(top_rows) == B else torch.tensor(top_rows, device=logits.device)
            dist = logprob_distribution(
                logits if sel is None else logits.index_select(0, sel),
                params if sel is None else params.select(sel),
            )
            top_lps, top_ids = dist.topk(n, dim=1)
            # The sampled token's logprob read from these same numbers, so that it equals
            # its entry among the alternatives whatever backend sampled it.
            chosen = dist.gather(1, (ids if sel is None else ids.index_select(0, sel))[:, None])[:, 0]
            parts[1] = chosen.double() if sel is None else parts[1].index_copy(0, sel, chosen.double())
            parts += [top_ids.flatten().to(torch.float64), top_lps.flatten().to(torch.float64)]
        flat = torch.cat(parts).tolist()  # the one host sync (ids < 2**53 are exact)
        tokens = [int(t) for t in flat[:B]]
        logprobs = flat[B : 2 * B]
        if not top_rows:
            return Sampled(tokens, logprobs, None)
        R = len(top_rows)
        t_ids, t_lps = flat[2 * B : 2 * B + R * n], flat[2 * B + R * n :]
        tops: list[TopLogprobs | None] = [None] * B
        for r, k in enumerate(top_rows):  # per asking row, its own count of the n computed
            m = min(p[k].top_logprobs, n)
            # A forced row may have fewer possible tokens than asked: the impossible (-inf)
            # ones are not alternatives (JSON has no -inf either).
            tops[k] = [
                (int(t), lp) for t, lp in zip(t_ids[r * n : r * n + m], t_lps[r * n : r * n + m]) if lp != _NEG_INF
            ]
        return Sampled(tokens, logprobs, tops)
