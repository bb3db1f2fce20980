"""A thinking budget: a think block holds at most so many tokens, then it is closed.

    SamplingParams(think_budget=ThinkBudget(tokens=256, end_id=END, start_id=START))

Responses' ``reasoning.effort`` and chat's ``thinking.budget_tokens`` become this. Per
request: with `starts_open` (the prompt ends inside a think block) the output is in the
block from its first token; otherwise the output may open one with its first tokens
(`header` then `start_id`: Hermes's ``<think>``, one token; harmony's
``<|channel|>analysis<|message|>``, three), and any other start means the answer came
without a block. Inside the block, once `tokens` tokens have been drawn the next one is
forced to be `end_id`; after the block nothing is forced. The tags count only as token ids.

A request with an output grammar (ignis/engine/grammar.py) carries its budget inside the
grammar instead (a ``max_tokens`` on the think rule), so the two never meet on one row.
The state depends only on the output tokens, so preemption by recompute leaves it as is.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BudgetState", "ThinkBudget"]


@dataclass(frozen=True)
class ThinkBudget:
    tokens: int  # the most tokens a think block may hold
    end_id: int  # the token that closes the block
    start_id: int | None = None  # the token that opens one (None: only `starts_open` counts)
    starts_open: bool = False  # the prompt ends inside a think block
    header: tuple[int, ...] = ()  # tokens before start_id in the opening (harmony's channel)

    @property
    def opening(self) -> tuple[int, ...]:
        return () if self.start_id is None else (*self.header, self.start_id)

    def validate(self, vocab_size: int | None = None) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or self.tokens < 0:
            raise ValueError(f"a thinking budget must be a non-negative int, got {self.tokens!r}")
        ids = [("end_id", self.end_id)] + ([("start_id", self.start_id)] if self.start_id is not None else [])
        for name, v in ids + [("header", v) for v in self.header]:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (vocab_size is not None and v >= vocab_size):
                raise ValueError(f"think_budget.{name} must be a token id in [0, {vocab_size or 'vocab'}), got {v!r}")


class BudgetState:
    """One sequence's progress through its think block; `advance` with each output token."""

    __slots__ = ("budget", "done", "inside", "matched", "used")

    def __init__(self, budget: ThinkBudget) -> None:
        self.budget = budget
        self.inside = budget.starts_open
        self.matched = 0  # tokens of the opening the output began with so far
        self.used = 0  # tokens inside the block so far
        self.done = False  # the block is closed, or the answer began without one: nothing more to do

    def forced(self) -> int | None:
        """The token this step must draw (the closing tag once the budget is spent), or None."""
        return self.budget.end_id if self.inside and self.used >= self.budget.tokens else None

    def advance(self, token: int) -> None:
        if self.done:
            return
        opening = self.budget.opening
        if self.inside:
            if token == self.budget.end_id:
                self.inside, self.done = False, True
            else:
                self.used += 1
        elif self.matched < len(opening) and token == opening[self.matched]:
            self.matched += 1
            self.inside = self.matched == len(opening)
        else:
            self.done = True
