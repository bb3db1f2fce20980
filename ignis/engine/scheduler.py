"""Which sequences run in the next step, and how many tokens each.

One token budget per step (max_num_batched_tokens) is spent first on the running
sequences, in admission order (a decode costs 1, an unfinished prefill its next
chunk), then on admitting waiting ones, FIFO, while fewer than max_num_seqs run. So
chunked prefill and decodes share a step, and a long prompt never stalls decoding.

Out of blocks: the most recently admitted running sequence is preempted (its blocks
freed, its computed full blocks published first, so a recompute usually hits the
prefix cache) and goes back to the head of the waiting queue. Nothing is admitted in
a step that had to preempt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ignis.engine.block_manager import BlockManager
from ignis.engine.grammar_masks import blocked
from ignis.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.grammar is not None and blocked(seq.grammar):
                i += 1  # waits for its grammar mask (ignis/engine/grammar_masks.py)
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.grow(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()  # the latest admitted
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            i += 1
        if batch.preempted:
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = self.blocks.admit(seq, budget)
            if n is None:
                break  # FIFO: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

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
