"""What a prefill step costs, as measured, and how many tokens fit a step-time budget.

A step of `n` prefill tokens starting `depth` tokens into its prompt takes about

    fixed + n * (per_token + per_depth * (depth + n / 2))

`fixed`: what every step pays whatever its size (on the CPU's quantized forms every weight
is widened once a step); `per_token`: the GEMMs' share of a token; `per_depth`: attention,
each token reading the cache before it. Measured on the quiet 2-core Zen 5 with SmolLM2 at
`quantized` (RESULTS.md, 2026-12-02): ~0 s fixed, 1.0 ms a token plus 0.55 ms per thousand
tokens of depth, so a 5,156-token prompt's last steps cost 3.5x its first per token. A fit
without the depth term read that growth as a fixed part of ~0.6 s, and steps sized from it
ran 1-2.4 s against a 0.25 s budget. Under load the fixed part is real (a 256-token chunk
~18 s, most of it the widening): `tokens_for` cuts steps to the budget only where that
costs little, never so small that the fixed part exceeds `MAX_FIXED_SHARE` of the step.

The fit is least squares over the last `SAMPLES` prefill steps, each term kept only where
the samples tell it apart and it comes out non-negative; while their sizes are all alike
the last fit stands, and before any the next step tries twice the size, never while
others wait on it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["MAX_FIXED_SHARE", "SAMPLES", "StepCost"]

SAMPLES = 8
MAX_FIXED_SHARE = 0.25


class StepCost:
    def __init__(self, least: int, most: int) -> None:
        self.least, self.most = least, most
        self.samples: deque[tuple[int, float, float]] = deque(maxlen=SAMPLES)  # (tokens, depth, seconds)
        self._model: tuple[float, float, float] | None = None  # the last fit

    def observe(self, tokens: int, seconds: float, depth: float = 0.0) -> None:
        self.samples.append((tokens, depth, seconds))
        self._model = self._fit() or self._model

    def fit(self) -> tuple[float, float, float] | None:
        """(fixed s, s per token, s per token per token of depth): the latest fit that told
        the parts apart, or None before any did."""
        return self._model

    def _fit(self) -> tuple[float, float, float] | None:
        n = np.array([s[0] for s in self.samples], dtype=float)
        d = np.array([s[1] for s in self.samples], dtype=float)
        t = np.array([s[2] for s in self.samples], dtype=float)
        if len(n) < 2:
            return None
        if n.max() < 2 * n.min():  # sizes alike: nothing tells a fixed part from per-token
            return None
        terms = {"fixed": np.ones_like(n), "token": n, "depth": n * (d + n / 2)}
        for name in ("depth", "fixed"):  # no more terms than samples
            if len(terms) > len(n) and name in terms:
                del terms[name]
        while terms:
            names = list(terms)
            a = np.stack([terms[k] for k in names], axis=1)
            a = a / np.linalg.norm(a, axis=0)
            if len(names) > 1 and np.linalg.cond(a) > 1e4:  # two terms move together
                del terms["depth" if "depth" in terms else "fixed"]
                continue
            coef, *_ = np.linalg.lstsq(a, t, rcond=None)
            coef = coef / np.linalg.norm(np.stack([terms[k] for k in names], axis=1), axis=0)
            if (coef >= 0).all():
                got = dict(zip(names, coef.tolist()))
                if got.get("token", 0.0) <= 0 and got.get("depth", 0.0) <= 0:
                    return None
                return got.get("fixed", 0.0), got.get("token", 0.0), got.get("depth", 0.0)
            del terms[names[int(np.argmin(coef))]]
        return None

    def seconds(self, tokens: int, depth: float) -> float | None:
        """The fit's time for a step of `tokens` at `depth` (None before a fit)."""
        if self._model is None:
            return None
        fixed, per_token, per_depth = self._model
        return fixed + tokens * (per_token + per_depth * (depth + tokens / 2))

    def tokens_for(self, budget: float, depth: float = 0.0, *, others_wait: bool = True) -> int:
        """Tokens for the next step of a prefill `depth` tokens in, under `budget` seconds.
        `others_wait`: decode rows or waiting prompts share the step's wait; without them a
        step may grow to learn the cost of larger ones."""
        if not self.samples:
            return self.least
        if self._model is None:  # one size so far
            if others_wait:
                return self.least
            return min(self.most, max(self.least, 2 * max(s[0] for s in self.samples)))
        fixed, per_token, per_depth = self._model
        rate = per_token + per_depth * depth  # per token at this depth; the quadratic's linear part
        fits = _largest_within(per_depth / 2, rate, fixed - budget)
        # The fixed part at most MAX_FIXED_SHARE of the step: fixed <= share * seconds(n).
        cheap = _largest_within(per_depth / 2, rate, fixed - fixed / MAX_FIXED_SHARE)
        return int(min(self.most, max(self.least, fits, cheap)))


def _largest_within(a: float, b: float, c: float) -> float:
    """The positive root of a n^2 + b n + c = 0 (a, b >= 0, c < 0 or 0 returned): below it
    the quadratic is negative, above it positive."""
    if c >= 0:
        return 0.0
    if a <= 0:
        return -c / b if b > 0 else float("inf")
    return (-b + (b * b - 4 * a * c) ** 0.5) / (2 * a)
