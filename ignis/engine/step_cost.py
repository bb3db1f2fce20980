"""What a step costs, as measured, and how many tokens fit a step-time budget.

A step's time is about `fixed + per_token * tokens`: every step reads (on the CPU's
quantized forms, widens) every weight once, whatever its size, and each token costs its
share on top (more the deeper a prefill goes). Measured on the 2-core Zen 5 with SmolLM2
at `quantized` under load (RESULTS.md, 2026-12-01): a 256-token prefill chunk took ~21 s,
most of it the per-step widening, against ~40 s for 2048 tokens; cutting to 256-token
steps made a 5,156-token prefill 4x slower. So `tokens_for` cuts steps to the budget only
where that costs little: a step is never so small that its fixed part exceeds
`MAX_FIXED_SHARE` of it.

The fit is least squares over the last `SAMPLES` prefill steps; while their sizes are
all alike (nothing to tell the two parts apart) the last fit stands, and before any the
next step tries four times the size.
"""

from __future__ import annotations

from collections import deque

__all__ = ["MAX_FIXED_SHARE", "SAMPLES", "StepCost"]

SAMPLES = 8
MAX_FIXED_SHARE = 0.25


class StepCost:
    def __init__(self, least: int, most: int) -> None:
        self.least, self.most = least, most
        self.samples: deque[tuple[int, float]] = deque(maxlen=SAMPLES)
        self._model: tuple[float, float] | None = None  # the last fit

    def observe(self, tokens: int, seconds: float) -> None:
        self.samples.append((tokens, seconds))
        self._model = self._fit() or self._model

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token): the last samples' fit (the latest one that told
        the parts apart), or None before any did."""
        return self._model

    def _fit(self) -> tuple[float, float] | None:
        sizes = [n for n, _ in self.samples]
        if not sizes or max(sizes) < 2 * min(sizes):
            return None
        k = len(sizes)
        mean_n = sum(sizes) / k
        mean_t = sum(t for _, t in self.samples) / k
        var = sum((n - mean_n) ** 2 for n in sizes)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in self.samples) / var
        if slope <= 0:  # noise: call it all per-token cost
            return 0.0, mean_t / mean_n
        return max(0.0, mean_t - slope * mean_n), slope

    def tokens_for(self, budget: float) -> int:
        """Tokens for the next step under a `budget` of seconds."""
        if not self.samples:
            return self.least
        model = self.fit()
        if model is None:  # one size so far: learn the slope with a larger step
            return min(self.most, max(self.least, 4 * max(n for n, _ in self.samples)))
        fixed, per_token = model
        fits = (budget - fixed) / per_token
        cheap = fixed * (1 - MAX_FIXED_SHARE) / MAX_FIXED_SHARE / per_token  # fixed <= its share
        return int(min(self.most, max(self.least, fits, cheap)))
