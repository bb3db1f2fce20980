"""One request inside the engine: its tokens, where its KV lives, and its progress.

Progress is one number, num_computed_tokens (tokens whose K/V are in the cache). The
scheduler gives each running sequence `len(token_ids) - num_computed_tokens` more
tokens (capped by the step's budget): a prompt chunk, a whole prompt, or the one
token sampled last step. So prefill, chunked prefill, decode and recompute after a
preemption are the same thing to every part of the engine.
"""

from __future__ import annotations

import enum

from ignis.engine.grammar import GrammarState
from ignis.engine.ngram import NgramIndex
from ignis.engine.outputs import EngineFinish
from ignis.engine.sampling_params import SamplingParams
from ignis.engine.stop import TextStream
from ignis.engine.thinking import BudgetState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        seed: int,
        max_tokens: int,
        stop_ids: frozenset[int] = frozenset(),
        text: TextStream | None,
        prewarm: bool = False,
        deadline: float | None = None,
        budget: BudgetState | None = None,
        grammar: GrammarState | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)  # prompt, then every sampled token
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.seed = seed
        self.max_tokens = max_tokens  # already clipped to the context length
        self.stop_ids = stop_ids  # EOS ids (unless ignore_eos) and params.stop_token_ids
        self.text = text  # None: no detokenization (prewarm)
        self.prewarm = prewarm
        self.deadline = deadline  # time.monotonic() value, or None
        # A thinking budget still in play (None once its block is closed, or without one).
        # It depends only on the output tokens, so a preempted sequence keeps it as it is.
        self.budget = budget
        # The output grammar's matcher (None: unconstrained, or finished). Like the
        # budget it depends only on the output tokens, which a preemption keeps.
        self.grammar = grammar
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hash chain of the full blocks seen so far
        self.num_published_blocks = 0  # leading blocks registered in the prefix cache
        self.num_cached_tokens: int | None = None  # prefix hit at first admission
        # Speculative decoding (ignis/engine/speculation.py): the prompt-lookup index, built
        # on the first draft, and the draft tokens proposed and accepted so far.
        self.ngram: NgramIndex | None = None
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.draft_len = 0  # the next draft's length (0: the drafter's most)
        self.draft_backoff = 0  # the last wait after a draft that kept nothing (doubles)
        self.draft_wait = 0  # decode steps left before the next draft
        self.finish_reason: EngineFinish | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        # Not yet reported to the caller.
        self.new_token_ids: list[int] = []
        self.new_text: list[str] = []
        self.new_logprobs: list[float] = []
        self.new_top_logprobs: list[list[tuple[int, float]]] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
