"""Logits in, one token per row out: everything between the model's head and the sampled ids.

    sampled = Sampler().sample(logits, rows)   # rows: the step's sampling sequences, in order

A call, on the [R, V] fp32 logits of the rows that sample:

1. Grammar rows (an output grammar) get their matchers' next-token bitmasks, in place
   (ignis_kernels.token_mask; idempotent). A row nothing can continue, or whose matcher is in
   error, is reported in `errors`. The bitmasks depend only on the matchers, so the
   runner starts them before the forward (`prefetch_masks`): llguidance fills them on
   helper threads, the GIL released, while the model runs (ignis/engine/grammar_masks.py).
   A row whose mask is not ready within `mask_wait` seconds of the forward's end is
   `deferred`: it samples nothing this step, and no other row waits for it.
2. Rows still short of `min_tokens` get their stop ids at -inf (a copy).
3. Rows whose thinking budget is spent get every token but the closing tag at -inf (a
   copy).
4. Plain greedy batches take the argmax; anything else goes through `ignis_kernels.sample`
   (temperature, top-k, top-p, min-p, penalties, per-request seeds), with logprobs and
   top logprobs when a row asks.

If the batched call raises, the rows are sampled one by one, so one bad row fails alone.
The one host synchronisation is reading the results back. Masks 2 and 3 are copies so
the row-by-row retry starts from the same logits; 1 runs once, before the retry.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ignis.engine.grammar import GrammarState
from ignis.engine.grammar_masks import MaskFiller
from ignis.engine.sequence import Sequence
from ignis_kernels import cpu_native
from ignis_kernels.sampling import SamplingTensors, logprob_distribution, sample
from ignis_kernels.token_mask import apply_token_bitmask_

log = logging.getLogger(__name__)

__all__ = ["Sampled", "Sampler", "TopLogprobs"]

_NO_IDS = np.empty(0, dtype=np.int32)
# Allowed tokens the model itself gave -inf (the scripted model's one-hot logits) are
# raised to this, so that a masked row always samples an allowed token. Finite after
# any temperature >= GREEDY_EPS and any sane penalty.
_ALLOWED_FLOOR = -1e30
_NEG_INF = float("-inf")

# A row's most likely tokens: (token id, logprob), logprob descending.
TopLogprobs = list[tuple[int, float]]


@dataclass
class Sampled:
    """The sampler's answer for the rows of one call (lists indexed like the rows)."""

    tokens: list[int]
    logprobs: list[float] | None  # None: no row asked for logprobs
    top_logprobs: list[TopLogprobs | None] | None  # None: no row asked for top_logprobs
    # Row -> message, for rows that cannot go on (their token is meaningless).
    errors: dict[int, str] = field(default_factory=dict)
    # Rows whose grammar mask was not ready: they sampled nothing (their token is meaningless).
    deferred: set[int] = field(default_factory=set)


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


class Sampler:
    """The sampling state an engine keeps between steps: the grammar mask fills, a host
    buffer for the step's bitmasks and per-sequence penalty ids. `wake` is called (from
    another thread) whenever a mask fill ends."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self._grammar_masks = np.zeros((0, 0), dtype=np.int32)  # grown on demand
        self._penalty_ids: weakref.WeakKeyDictionary[Sequence, _PenaltyIds] = weakref.WeakKeyDictionary()
        self.masks = MaskFiller(wake)

    def prefetch_masks(self, rows: list[Sequence], drafts: list[list[int]] | None = None) -> None:
        """Start filling the grammar rows' bitmasks for this step's sampling `rows` (call it
        before the forward; `sample` picks up the ones for its rows). `drafts`: per row, its
        sequence's speculative draft ([] for none): the masks at its later positions too."""
        states = [s.grammar for s in rows if s.grammar is not None]
        if not states:
            return
        self.masks.start(states)
        pairs = {id(s): (s.grammar, d) for s, d in zip(rows, drafts or ()) if s.grammar is not None and d}
        if pairs:
            self.masks.start_drafts(list(pairs.values()))

    def sample(self, logits: torch.Tensor, rows: list[Sequence], mask_wait: float | None = None,
               offsets: list[int] | None = None) -> Sampled:
        """One token per row of `logits` [R, V] (fp32; grammar rows are masked in place).
        Every row at once; if that raises, row by row so one bad row fails alone. Grammar
        rows whose masks take longer than `mask_wait` seconds more (None: no limit) are
        deferred. `offsets`: per row, how many output positions past the sequence's next
        one it samples (a speculative draft's rows; None: all 0), for the seeds' stream."""
        failed, deferred = self._mask_grammar(logits, rows, mask_wait, offsets)  # in place, once (the retry reuses it)
        offsets = offsets or [0] * len(rows)
        try:
            out = self._sample_rows(logits, rows, offsets)
        except Exception as exc:  # noqa: BLE001 - isolate the offending rows below
            log.warning("batched sampling failed (%s); retrying row by row", exc)
            out = self._row_by_row(logits, rows, failed, offsets)
        else:
            out.errors = failed
        out.deferred = deferred
        return out

    def _row_by_row(self, logits: torch.Tensor, rows: list[Sequence], failed: dict[int, str],
                    offsets: list[int]) -> Sampled:
        out = Sampled([], None, None, dict(failed))
        lps: list[float] = []
        tops: list[TopLogprobs | None] = []
        for k, seq in enumerate(rows):
            try:
                one = self._sample_rows(logits[k : k + 1], [seq], offsets[k : k + 1])
                out.tokens.append(one.tokens[0])
                lps.append(one.logprobs[0] if one.logprobs is not None else float("nan"))
                tops.append(one.top_logprobs[0] if one.top_logprobs is not None else None)
            except Exception as exc:  # noqa: BLE001
                out.errors.setdefault(k, f"sampling failed: {exc}")
                out.tokens.append(-1)
                lps.append(float("nan"))
                tops.append(None)
        if any(s.params.logprobs for s in rows):
            out.logprobs = lps
        if any(t is not None for t in tops):
            out.top_logprobs = tops
        return out

    def _sample_rows(self, logits: torch.Tensor, rows: list[Sequence], offsets: list[int]) -> Sampled:
        logits = _ban_stops(logits, rows)
        # Forced rows sample from (and report logprobs of) the masked distribution.
        logits = _force_budget_ends(logits, rows)
        want_logprobs = any(s.params.logprobs for s in rows)  # top_logprobs implies logprobs
        penalties = any(s.params.uses_penalties for s in rows)
        if not want_logprobs and not penalties and all(s.params.is_greedy for s in rows):
            # Plain greedy: the sampler's greedy rule is the first index of the max (on the
            # CPU the native op's top 1: under 1 ms at 64 rows of a 128k vocabulary, argmax 3.4).
            return Sampled(cpu_native.argmax_rows(logits).tolist(), None, None)
        params = self._tensors(logits, rows, penalties, offsets)
        # Penalties go on a copy, never in place: a failed batched call is retried row by
        # row on these same logits, which must not be penalised twice.
        if not want_logprobs:
            return Sampled(sample(logits, params).tolist(), None, None)
        return _with_logprobs(logits, params, rows)

    def _tensors(self, logits: torch.Tensor, rows: list[Sequence], penalties: bool,
                 offsets: list[int]) -> SamplingTensors:
        p = [s.params for s in rows]
        return SamplingTensors.from_lists(
            [x.temperature for x in p],
            top_k=[x.top_k for x in p],
            top_p=[x.top_p for x in p],
            min_p=[x.min_p for x in p],
            repetition_penalty=[x.repetition_penalty for x in p],
            presence_penalty=[x.presence_penalty for x in p],
            frequency_penalty=[x.frequency_penalty for x in p],
            seed=[s.seed for s in rows],
            step=[s.num_output_tokens + off for s, off in zip(rows, offsets)],
            **(self._penalty_tokens(rows) if penalties else {}),
            device=logits.device,
        )

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

    # -- masks ----------------------------------------------------------------------

    def _mask_grammar(self, logits: torch.Tensor, rows: list[Sequence], wait: float | None,
                      offsets: list[int] | None = None) -> tuple[dict[int, str], set[int]]:
        """Mask the rows that have an output grammar by their matchers' next-token bitmasks,
        in place (ignis_kernels.token_mask: idempotent, so a retried step may see them again).

        Returns (the rows that cannot go on: their message, the rows deferred). Failed rows
        (nothing allowed, the matcher in error, the fill raised) sample from an all-allowed
        mask, harmlessly, and the engine fails them; deferred rows are not masked."""
        ks = [k for k, s in enumerate(rows) if s.grammar is not None]
        if not ks:
            return {}, set()
        states: list[GrammarState] = [rows[k].grammar for k in ks]  # type: ignore[misc]
        position = [offsets[k] if offsets else 0 for k in ks]  # 0, or a draft's j-th position after it
        ready = self.masks.ready(states, wait)
        # A draft's later positions: the masks after its tokens before them. A state whose
        # draft masks are not filled in time defers all its rows, as a late mask does.
        drafted: dict[int, np.ndarray | None] = {}
        for state, j, ok in zip(states, position, ready):
            if ok and j > 0 and id(state) not in drafted:
                drafted[id(state)] = self.masks.draft_masks(state, wait)
                if drafted[id(state)] is None:
                    state.late = True
        late = {key for key, m in drafted.items() if m is None}
        ready = [ok and id(s) not in late for s, ok in zip(states, ready)]
        deferred = {k for k, ok in zip(ks, ready) if not ok}
        used = [(k, s, j) for k, s, j, ok in zip(ks, states, position, ready) if ok]
        failed: dict[int, str] = {}
        if not used:
            return failed, deferred
        masks = self._mask_buffer(len(used), max(s.mask_words for _, s, _ in used))
        for r, (k, state, j) in enumerate(used):
            try:
                masks[r] = state.fill.mask() if j == 0 else drafted[id(state)][j - 1]  # type: ignore[index]
            except Exception as exc:  # noqa: BLE001 - this row alone fails
                failed[k] = f"the output grammar's mask could not be computed: {exc!r}"[:400]
        _trim(masks, min(logits.shape[1], min(s.vocab_size for _, s, _ in used)))
        for r, (k, state, j) in enumerate(used):
            if j > 0:
                # A draft position the grammar allows nothing at (it ended within the draft):
                # its sample is never kept (the output ends at the draft token that ended the
                # grammar), so it samples freely rather than fail the request.
                if not masks[r].any():
                    masks[r] = -1
                continue
            if k in failed:
                pass
            elif state.matcher.is_error():  # (llguidance then allows EOS alone: not an end)
                failed[k] = _grammar_failure(state)
            elif not masks[r].any():
                failed[k] = _grammar_failure(state)
            if k in failed:
                masks[r] = -1
        dev = logits.device
        bitmask = torch.from_numpy(masks).to(dev)
        which = torch.tensor([k for k, _, _ in used], dtype=torch.int64).to(dev)
        apply_token_bitmask_(logits, bitmask, which, _ALLOWED_FLOOR)
        return failed, deferred

    def _mask_buffer(self, rows: int, words: int) -> np.ndarray:
        """Rows of the reused host buffer for a step's bitmasks [R, W] int32."""
        buf = self._grammar_masks
        if buf.shape[0] < rows or buf.shape[1] != words:
            buf = self._grammar_masks = np.zeros((max(rows, buf.shape[0]), words), dtype=np.int32)
        return buf[:rows]


def _trim(masks: np.ndarray, limit: int) -> None:
    """Clear every bit at or past token id `limit` (ids llguidance or the logits lack; see
    grammar.ll_tokenizer)."""
    words = masks.shape[1]
    if limit < words * 32:
        word, bit = divmod(limit, 32)
        masks[:, word] &= np.int32((1 << bit) - 1) if bit < 31 else np.int32(0x7FFFFFFF)
        masks[:, word + 1 :] = 0


def _grammar_failure(state: GrammarState) -> str:
    err = state.error()
    if err:
        return f"the output grammar allows no token here: {err}"
    return "the output grammar allows no token here (nothing in the vocabulary can continue it)"


def _force_budget_ends(logits: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
    """`logits` with every token but the closing tag at -inf in the rows whose thinking
    budget is spent (a copy: the caller's logits stay as they were, so the row-by-row
    retry of `sample` masks them afresh). The same tensor when no row is forced."""
    forced = [(k, t) for k, s in enumerate(rows) if s.budget is not None and (t := s.budget.forced()) is not None]
    if not forced:
        return logits
    at = torch.tensor(forced, dtype=torch.long).to(logits.device)  # one upload: rows and ids
    which, ids = at[:, 0], at[:, 1]
    kept = logits[which, ids].clamp(min=_ALLOWED_FLOOR)
    out = logits.index_fill(0, which, _NEG_INF)
    out[which, ids] = kept
    return out


def _ban_stops(logits: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
    """`logits` with the stop ids at -inf in the rows still short of their `min_tokens`
    (a copy, as `_force_budget_ends`; the same tensor when no row is)."""
    cells = [
        (k, t) for k, s in enumerate(rows)
        if s.num_output_tokens < s.params.min_tokens for t in s.stop_ids if t < logits.shape[1]
    ]
    if not cells:
        return logits
    at = torch.tensor(cells, dtype=torch.long).to(logits.device)
    return logits.index_put((at[:, 0], at[:, 1]), torch.tensor(_NEG_INF, device=logits.device))


# -- logprobs -----------------------------------------------------------------------


def _with_logprobs(logits: torch.Tensor, params: SamplingTensors, rows: list[Sequence]) -> Sampled:
    """Sample with each row's logprob and, for the rows that ask, its top logprobs."""
    ids, lps = sample(logits, params, return_logprobs=True)
    B = len(rows)
    asks = [k for k, s in enumerate(rows) if s.params.top_logprobs > 0]
    parts = [ids.to(torch.float64), lps.to(torch.float64)]
    n = 0  # alternatives computed per asking row: the most any of them wants
    if asks:
        n = min(max(rows[k].params.top_logprobs for k in asks), logits.shape[1])
        parts[1], top_ids, top_lps = _top_logprobs(logits, params, ids, parts[1], asks, n)
        parts += [top_ids.flatten().to(torch.float64), top_lps.flatten().to(torch.float64)]
    # One read-back (the step's one host sync): ids ride as float64, exact below 2**53.
    flat = torch.cat(parts).tolist()
    tokens = [int(t) for t in flat[:B]]
    logprobs = flat[B : 2 * B]
    if not asks:
        return Sampled(tokens, logprobs, None)
    R = len(asks)
    t_ids, t_lps = flat[2 * B : 2 * B + R * n], flat[2 * B + R * n :]
    tops: list[TopLogprobs | None] = [None] * B
    for r, k in enumerate(asks):  # per asking row, its own count of the n computed
        m = min(rows[k].params.top_logprobs, n)
        # A forced row may have fewer possible tokens than asked: the impossible (-inf)
        # ones are not alternatives (JSON has no -inf either).
        tops[k] = [
            (int(t), lp) for t, lp in zip(t_ids[r * n : r * n + m], t_lps[r * n : r * n + m]) if lp != _NEG_INF
        ]
    return Sampled(tokens, logprobs, tops)


def _top_logprobs(
    logits: torch.Tensor, params: SamplingTensors, ids: torch.Tensor, lps: torch.Tensor, asks: list[int], n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the logprobs `lps` [B] with the asking rows' re-read, their top ids [R, n], their
    top logprobs [R, n]), from the distribution the sampled logprob is read from
    (ignis_kernels.sampling_ref, definition 5): the penalised, tempered one, before
    top-k/top-p/min-p. topk sorts descending."""
    sel = None if len(asks) == len(ids) else torch.tensor(asks, device=logits.device)
    dist = logprob_distribution(
        logits if sel is None else logits.index_select(0, sel),
        params if sel is None else params.select(sel),
    )
    top_lps, top_ids = dist.topk(n, dim=1)
    # The sampled token's logprob read from these same numbers, so that it equals its
    # entry among the alternatives whatever backend sampled it.
    chosen = dist.gather(1, (ids if sel is None else ids.index_select(0, sel))[:, None])[:, 0].double()
    return (chosen if sel is None else lps.index_copy(0, sel, chosen)), top_ids, top_lps
