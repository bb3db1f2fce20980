"""Which sequences run in the next step, and how many tokens each.

A step's token budget is max_num_batched_tokens, and with a step-time budget
(engine.step_time_budget_ms) no more tokens than the last prefill steps say fit in that
time (`observe` feeds the measured costs to ignis/engine/step_cost.py), unless steps
that small would spend most of their time on their fixed part: a long prompt's prefill
is cut into steps of bounded time where the machine allows, so nobody waits long for
the step under way. The budget is spent in this order:

1. Decode rows: every running sequence with one token to compute (they are never
   starved by prefill). With speculative decoding (`drafter`, ignis/engine/speculation.py)
   a decode row also carries the draft tokens to check: 1 + k tokens in one step, the
   step's decode rows within max_draft_step_rows (where more rows would change the GEMMs'
   numerics, ignis/model/layers.py's exact_step_rows), shared out over them.
2. Running prefills (admission order), leaving room for the waiting prompts that fit
   in this step whole, FIFO: a short request that arrives during a long prompt's
   prefill is prefilled in the next step, beside a smaller chunk of the long one
   (which always gets at least MIN_PREFILL_CHUNK tokens). Where a chunk's step still
   ran past the time budget, the next step holds no chunk when there are decode rows
   or short prompts: theirs alone (cheap), so they wait one chunk at most.
3. Admitting waiting sequences, FIFO, while fewer than max_num_seqs run.

A sequence whose grammar mask is being filled late waits (ignis/engine/grammar_masks.py).
Out of blocks: the most recently admitted running sequence is preempted (its blocks
freed, its computed full blocks published first, so a recompute usually hits the
prefix cache) and goes back to the head of the waiting queue. Nothing is admitted in
a step that had to preempt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ignis.engine.block_manager import BlockManager
from ignis.engine.grammar_masks import blocked
from ignis.engine.sequence import Sequence, Status
from ignis.engine.step_cost import StepCost


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Per entry: the draft tokens it checks (speculative decoding; [] for none). A row with
    # a draft computes its last token and the draft, num_new_tokens = 1 + len(draft).
    drafts: list[list[int]] = field(default_factory=list)

    def draft(self, i: int) -> list[int]:
        return self.drafts[i] if self.drafts else []

    def __len__(self) -> int:
        return len(self.seqs)


# A running prefill's least chunk while short prompts go first (it always moves on).
MIN_PREFILL_CHUNK = 32
# The time budget never cuts a step below this many tokens, and what steps cost is
# measured on steps at least this large (on the CPU, steps of 256 rows or more run
# bf16 GEMMs: smaller ones are another cost curve). See ignis/engine/step_cost.py.
MIN_TIMED_TOKENS = 256


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 step_time_budget: float | None = None,
                 drafter: Callable[[Sequence, int, int], list[int]] | None = None,
                 max_draft_step_rows: int | None = None) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if step_time_budget is not None and step_time_budget <= 0:
            raise ValueError("step_time_budget must be positive (or None: no time budget)")
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.step_time_budget = step_time_budget  # seconds, or None
        # drafter(seq, room, decode_rows) -> draft tokens for a decode row (at most `room`),
        # given how many decode rows the step has; None: no speculation.
        self.drafter = drafter
        # The most decode rows (drafts included) a step with drafts may hold, or None: on
        # the CPU, steps of more rows run GEMMs of other numerics (8-bit activations), and a
        # draft would then change the tokens plain decoding gives.
        if max_draft_step_rows is not None and max_draft_step_rows < 1:
            raise ValueError("max_draft_step_rows must be >= 1 (or None: no limit)")
        self.max_draft_step_rows = max_draft_step_rows
        self.cost = StepCost(min(MIN_TIMED_TOKENS, max_num_batched_tokens), max_num_batched_tokens)
        self.over_budget = False  # the last step carried a prefill chunk and ran past the time budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def observe(self, seconds: float, batch: ScheduledBatch) -> None:
        """A step's measured time: what its tokens cost, for the time budget."""
        rows = [(s, n) for i, (s, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)) if n > 1 and not batch.draft(i)]
        prefill = sum(n for _, n in rows)
        if self.step_time_budget is not None and prefill >= MIN_TIMED_TOKENS:
            depth = sum(s.num_computed_tokens * n for s, n in rows) / prefill  # (before the step)
            self.cost.observe(sum(batch.num_new_tokens), seconds, depth)
            self.over_budget = seconds > self.step_time_budget

    def token_budget(self, depth: float = 0.0, others_wait: bool = True) -> int:
        """The most tokens the next step may compute, its prefill `depth` tokens into a
        prompt; `others_wait`: decode rows or other prompts wait on the step."""
        if self.step_time_budget is None:
            return self.max_num_batched_tokens
        return self.cost.tokens_for(self.step_time_budget, depth, others_wait=others_wait)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        hard = self.max_num_batched_tokens  # what one forward may hold
        prefills: list[Sequence] = []
        decodes = 0
        rows = 0  # decode rows' tokens (drafts included)
        num_decode_rows = (sum(s.num_tokens - s.num_computed_tokens == 1 for s in self.running)
                           if self.drafter is not None else 0)
        # Draft tokens the step may still take, shared out over the decode rows left to visit.
        draft_room = hard if self.max_draft_step_rows is None else self.max_draft_step_rows - num_decode_rows
        rows_left = num_decode_rows
        for seq in list(self.running):  # 1. decode rows (the time budget never cuts them)
            if seq.status is not Status.RUNNING:
                continue  # (preempted by one before it)
            if seq.grammar is not None and blocked(seq.grammar):
                continue  # waits for its grammar mask (ignis/engine/grammar_masks.py)
            if seq.num_tokens - seq.num_computed_tokens > 1:
                prefills.append(seq)
            elif rows < hard:
                draft: list[int] = []
                if self.drafter is not None:
                    room = min(hard - rows - 1, draft_room // max(rows_left, 1))
                    rows_left -= 1
                    draft = self.drafter(seq, room, num_decode_rows) if room > 0 else []
                    draft_room -= len(draft)
                if self._grow(seq, 1 + len(draft), batch, draft):
                    decodes += 1
                    rows += 1 + len(draft)
        # Prefill tokens: the time budget's (decode rows come on top), within the forward's.
        depth = prefills[0].num_computed_tokens if prefills else 0
        others_wait = decodes > 0 or len(prefills) + len(self.waiting) > 1
        budget = min(hard - rows, self.token_budget(depth, others_wait))
        want = self._waiting_fit(budget)  # short prompts waiting: prefilled whole this step
        cap = max(budget - want, min(MIN_PREFILL_CHUNK, budget)) if prefills else 0
        light = self.over_budget and (decodes > 0 or want > 0)
        self.over_budget = False
        if light:
            # The last chunk overran the budget (steps here cannot be both short and cheap):
            # this step is the decodes' and the short prompts' alone, then the chunks go on.
            cap, budget = 0, want
        for seq in prefills:  # 2. running prefills
            if seq.status is not Status.RUNNING or cap <= 0:
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, cap)
            if self._grow(seq, n, batch):
                budget -= n
                cap -= n
        if batch.preempted:
            return batch
        budget = min(max(budget, want), hard - sum(batch.num_new_tokens))
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:  # 3. admissions
            seq = self.waiting[0]
            n = self.blocks.admit(seq, budget)
            if n is None:
                break  # FIFO: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            batch.drafts.append([])
            budget -= n
        return batch

    def _waiting_fit(self, budget: int) -> int:
        """Tokens of the waiting prompts, FIFO, that fit this step whole (prefix-cache hits
        not counted: an upper bound)."""
        want, room = 0, self.max_num_seqs - len(self.running)
        for seq in self.waiting:
            if room <= 0:
                break
            n = seq.num_tokens - seq.num_computed_tokens
            if want + n > budget:
                break
            want += n
            room -= 1
        return want

    def _grow(self, seq: Sequence, n: int, batch: ScheduledBatch, draft: list[int] | None = None) -> bool:
        """Give `seq` blocks for `n` more tokens and put it in the batch, preempting the
        latest admitted running sequences not in the batch (it, last) when blocks run out.
        False when `seq` itself had to go."""
        while not self.blocks.grow(seq, seq.num_computed_tokens + n):
            victim = next((v for v in reversed(self.running) if v is seq or v not in batch.seqs), None)
            if victim is None:
                return False  # (never: seq itself is a candidate)
            self.running.remove(victim)
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        batch.seqs.append(seq)
        batch.num_new_tokens.append(n)
        batch.drafts.append(draft or [])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (finished, aborted, failed) and free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
            if seq.block_table:  # never true today: waiting sequences hold no blocks
                self.blocks.release(seq)
        seq.status = Status.FINISHED
