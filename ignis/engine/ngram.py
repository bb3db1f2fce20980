"""Draft tokens by prompt lookup: the tokens that followed the latest earlier occurrence of
the sequence's last n tokens (n from `max_n` down to `min_n`), in its prompt or its output.

Agents' edits copy long spans of what they read (a file in the prompt, rewritten by
`apply_patch`), so such drafts are often right, and checking k of them costs one forward
of k + 1 rows where decoding them costs k + 1 forwards. Which drafts are kept is decided
by sampling (ignis/engine/engine.py): the output is exactly what decoding one token at a
time gives.

    index = NgramIndex(max_n=4, min_n=2)
    index.extend(seq.token_ids)      # the tokens so far (only the new ones are read)
    draft = index.propose(seq.token_ids, k=8)

The index keeps, per n, the end position of the latest occurrence of every n-gram seen,
and the one before it for the sequence's own last n-gram, so a lookup is a dict probe
per n and feeding a token is one dict write per n: no scan of the context per step.

A copy goes on where it was: when the tokens since the last proposal followed its source
(the last max_n tokens equal the ones before the source's next position), the next one
continues from there, not from the latest occurrence of the last n tokens, which in a
file being rewritten is often another line that shares them (SmolLM2's agent edit: 73 ->
63 steps for its 256 tokens, replayed by experiments/speculation_bound.py's policy).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    __slots__ = ("_last", "_prev", "_source", "max_n", "min_n", "n_seen")

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]  # per n: gram -> end
        self._prev: list[int | None] = [None] * (max_n + 1)  # per n: the last gram's earlier end
        self._source: tuple[int, int] | None = None  # (where the last proposal copied from, len(tokens) then)
        self.n_seen = 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Index the tokens past the ones already seen (tokens is the whole sequence so far)."""
        for p in range(self.n_seen, len(tokens)):
            for n in range(self.min_n, min(self.max_n, p + 1) + 1):
                gram = tuple(tokens[p - n + 1 : p + 1])
                table = self._last[n]
                self._prev[n] = table.get(gram)
                table[gram] = p
            for n in range(p + 2, self.max_n + 1):  # grams longer than the sequence
                self._prev[n] = None
        self.n_seen = max(self.n_seen, len(tokens))

    def propose(self, tokens: Sequence[int], k: int, follow: bool = True) -> list[int]:
        """Up to k tokens: where the last proposal's source goes on (follow, when the tokens
        since have matched it), else what followed the last n tokens' latest earlier
        occurrence, the longest n that has one; [] when none does."""
        self.extend(tokens)
        if k <= 0:
            return []
        start = self._continued(tokens) if follow else None
        if start is None:
            start = self._latest()
        if start is None:
            return []
        self._source = (start, len(tokens))
        return list(tokens[start : start + k])

    def _latest(self) -> int | None:
        """Where the tokens after the last n tokens' latest earlier occurrence start, the
        longest n that has one."""
        for n in range(self.max_n, self.min_n - 1, -1):
            end = self._prev[n]
            if end is not None:
                return end + 1
        return None

    def following(self, tokens: Sequence[int]) -> bool:
        """Whether the next proposal continues the last one's source (the copy goes on)."""
        self.extend(tokens)
        return self._continued(tokens) is not None

    def _continued(self, tokens: Sequence[int]) -> int | None:
        """The last proposal's source position moved on by the tokens added since, if the
        last max_n tokens equal the max_n before it (and it lies before the end)."""
        if self._source is None:
            return None
        start = self._source[0] + len(tokens) - self._source[1]
        n = self.max_n
        if start < n or start >= len(tokens):
            return None
        return start if list(tokens[start - n : start]) == list(tokens[len(tokens) - n :]) else None


__all__ = ["NgramIndex"]
