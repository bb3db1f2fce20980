"""Speculative decoding with prompt-lookup drafts: which decode rows carry a draft, and how
long.

The scheduler asks the drafter for each decode row's draft (`NgramDrafter.__call__`); the
runner checks a row's last token and its k draft tokens as k + 1 one-token rows of the same
sequence at consecutive positions (each sees the K/V the rows before it wrote in the same
step), samples every one of them as plain decoding would sample that output position (the
same per-request seed stream), and the engine keeps the sampled tokens up to and including
the first that differs from the draft. Sampling one position at a time and keeping a draft
token only when the sample equals it is rejection sampling with the draft as a point mass,
so the output is exactly what decoding without speculation gives: the same tokens for
greedy and seeded requests, the same distribution for any other.

A row drafts only where that equivalence needs no more than the logits and the grammar: no
penalties (they read the output so far), no thinking budget (its forcing depends on the
tokens before), min_tokens already reached, not a prewarm. Under an output grammar the
draft is cut at its first token the grammar refuses, and each draft position samples under
the mask that follows the draft's tokens before it (ignis/engine/grammar.py: exactly the
mask plain decoding would have there, had it sampled those tokens); only grammars whose
masks come quickly draft (a slow one would hold the step for k masks). And only while few sequences
decode (`max_seqs`): a wide batch already keeps the machine busy, and checking drafts there
costs more rows than it saves steps.

A draft's rows are not free (on the CPU a step of 9 rows costs 3-5x one of 1, its GEMMs
compute-bound and attention paid per row: experiments/RESULTS.md, 2026-12-05), so each
sequence's draft length follows what it has kept: the next draft is one token longer than
the last one's kept part, up to `num_tokens`, and after a draft kept nothing the sequence
waits 1, 2, 4 ... (at most MAX_BACKOFF) steps before it drafts again (chat text, which
seldom repeats itself, then drafts rarely; a file being rewritten keeps long drafts). While
the tokens follow the copy the last draft came from (ignis/engine/ngram.py), the draft is
`num_tokens` long whatever the last one kept: the copy has just been seen to go on (SmolLM2's
agent edit, replayed: 63 -> 54 steps for its 256 tokens).

A mixture of experts pays more for a draft row: each row routes to experts of its own, so a
step of 1 + k rows reads up to k more experts' weights (on gpt-oss-20b's shape a failed draft
token cost about a whole step: RESULTS.md, 2026-12-03). There (`for_mixture`) a sequence's
first draft is one token, growing only by what it keeps, also while it follows a copy, and
its waits go up to MIXTURE_MAX_BACKOFF.
"""

from __future__ import annotations

from ignis.engine.ngram import NgramIndex
from ignis.engine.sequence import Sequence


# The most decode steps a sequence waits to draft again after drafts that kept nothing.
MAX_BACKOFF = 16
MIXTURE_MAX_BACKOFF = 64


class NgramDrafter:
    def __init__(self, num_tokens: int = 8, *, max_n: int = 4, min_n: int = 2, max_seqs: int = 4,
                 first_tokens: int | None = None, max_backoff: int = MAX_BACKOFF, whole_when_following: bool = True
                 ) -> None:
        """first_tokens: a sequence's first draft length (None: num_tokens); max_backoff: the
        longest wait after drafts that kept nothing; whole_when_following: num_tokens while the
        tokens follow the last draft's source."""
        if num_tokens < 1:
            raise ValueError(f"engine.num_speculative_tokens must be at least 1, got {num_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"engine.speculative_ngram_min ({min_n}) must lie in [1, speculative_ngram_max ({max_n})]")
        if max_seqs < 1:
            raise ValueError(f"engine.speculative_max_seqs must be at least 1, got {max_seqs}")
        self.num_tokens, self.max_n, self.min_n, self.max_seqs = num_tokens, max_n, min_n, max_seqs
        self.first_tokens = min(num_tokens, first_tokens or num_tokens)
        self.max_backoff = max_backoff
        self.whole_when_following = whole_when_following

    @classmethod
    def for_mixture(cls, num_tokens: int = 8, **kwargs: int) -> NgramDrafter:
        """The drafter for a mixture of experts (see the module's docstring)."""
        return cls(num_tokens, first_tokens=1, max_backoff=MIXTURE_MAX_BACKOFF, whole_when_following=False, **kwargs)

    @staticmethod
    def eligible(seq: Sequence) -> bool:
        p = seq.params
        g = seq.grammar
        return (not seq.prewarm and seq.text is not None and (g is None or (g.quick and not g.late and not g.slow_drafts))
                and seq.budget is None and not p.uses_penalties and seq.num_output_tokens >= p.min_tokens)

    def __call__(self, seq: Sequence, room: int, decode_rows: int) -> list[int]:
        """Draft tokens for `seq`'s next step (at most `room`, and never past its max_tokens:
        the step samples one token more than it drafts)."""
        if decode_rows > self.max_seqs or not self.eligible(seq):
            return []
        if seq.draft_wait > 0:
            seq.draft_wait -= 1
            return []
        if seq.ngram is None:
            seq.ngram = NgramIndex(self.max_n, self.min_n)
        length = seq.draft_len or self.first_tokens
        if self.whole_when_following and seq.ngram.following(seq.token_ids):
            length = self.num_tokens
        k = min(length, room, seq.max_tokens - seq.num_output_tokens - 1)
        if k <= 0:
            return []
        draft = seq.ngram.propose(seq.token_ids, k)
        if draft and seq.grammar is not None:
            draft = draft[: seq.grammar.valid_prefix(draft)]  # up to the first token it refuses
        return draft

    def observe(self, seq: Sequence, drafted: int, kept: int) -> None:
        """A draft of `drafted` tokens kept `kept`: the next one's length, or a wait."""
        seq.draft_len = min(self.num_tokens, kept + 1)
        if kept:
            seq.draft_backoff = 0
        else:
            seq.draft_backoff = min(self.max_backoff, 2 * seq.draft_backoff or 1)
            seq.draft_wait = seq.draft_backoff


__all__ = ["NgramDrafter"]
