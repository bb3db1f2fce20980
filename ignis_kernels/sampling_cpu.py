"""The CPU path of `ignis_kernels.sample`: the reference's draw, without sorting the vocabulary.

ignis_kernels.sampling_ref defines the draw and is the oracle; its top-k / top-p rule sorts
each row (a 49k-token row: ~7 ms of a ~20 ms batch-1 step on the 2-core machine, for
every request with top_p or top_k set, as many models' generation_config does). Every
filter of the definition keeps an upper set of the row (finite, min_p, top_k and top_p
are each monotone in x), so a row's kept set lies among its C largest logits whenever
the C-th largest is not kept. Here, per row with a rank or mass filter:

1. the C largest logits (`torch.topk`, a partial selection), in descending order;
2. the reference's rules on them: top_k counts the candidates strictly above (every
   token above a candidate is one); top_p's mass above a candidate sums the kept
   candidates strictly above it, against the total mass of the row's survivors of
   min_p and top_k (over the whole row, or over the candidates when top_k already cut
   inside them), in float64 as the reference;
3. if the C-th candidate is kept, the set may reach past the candidates: the row is
   drawn by the reference instead (the fallback, with its sort);
4. the race over the kept candidates with the same counter-based noise (it depends only
   on (seed, step, token id)), ties to the lowest token id.

Rows without rank or mass filters, greedy rows and fallbacks go through the reference
unchanged. The draws equal the reference's; only float64 summation order differs in
top_p (a boundary decided by the last bits of a float64 sum: never seen in the tests).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ignis_kernels.sampling_penalties import apply_penalties_dense
from ignis_kernels.sampling_ref import gumbel, inverse_temperature, row_keys, sample_ref
from ignis_kernels.sampling_tensors import GREEDY_EPS, SamplingTensors

__all__ = ["CANDIDATES", "sample_cpu"]

# Candidates per row: a kept set rarely holds more (top_p 0.95 over a chat model's
# next-token distribution: tens of tokens); wider rows fall back to the sort.
CANDIDATES = 256


def _candidate_keep(x: torch.Tensor, params: SamplingTensors, c: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(candidate ids [B, c], their keep mask [B, c], covered [B]) for rows of x [B, V]."""
    B, V = x.shape
    vals, ids = x.topk(c, dim=1)  # descending
    t = params.temperature.float()
    inv_t = inverse_temperature(t)[:, None]
    m = vals[:, :1]
    min_p = params.min_p.float()
    off = torch.where(min_p > 0, t * torch.log(torch.where(min_p > 0, min_p, 1.0)), float("-inf"))[:, None]
    base = (vals > float("-inf")) & (vals >= m + off)
    # Tokens strictly above candidate i: the candidates before its run of ties (the
    # first index of its value among the descending values).
    pos = torch.arange(c, device=x.device).expand(B, c)
    run_start = torch.cat([torch.ones_like(vals[:, :1], dtype=torch.bool), vals[:, 1:] != vals[:, :-1]], 1)
    above = torch.where(run_start, pos, -1).cummax(1).values
    k = params.top_k.long()[:, None]
    ranked = (k > 0) & (k < V)
    keep = base & (~ranked | (above < k))
    # The survivors' total mass. With top_k, over the candidates, and known only when the
    # C-th candidate is already out (then so is every token at or below it: the rules
    # are monotone); otherwise over the whole row's min_p survivors.
    q = torch.where(keep, torch.exp((vals - m) * inv_t).double(), 0.0)
    row_base = (x > float("-inf")) & (x >= m + off)
    whole = torch.where(row_base, torch.exp((x - m) * inv_t).double(), 0.0).sum(1, keepdim=True)
    total = torch.where(ranked, q.sum(1, keepdim=True), whole)
    known = ~ranked[:, 0] | ~keep[:, -1]
    prefix = torch.cat([torch.zeros_like(q[:, :1]), q.cumsum(1)[:, :-1]], 1)  # mass strictly before i
    mass_above = prefix.gather(1, above)
    top_p = params.top_p.double()[:, None]
    keep &= (top_p >= 1) | (mass_above < top_p * total) | (vals == m)
    covered = known & ~keep[:, -1] if c < V else torch.ones(B, dtype=torch.bool, device=x.device)
    return ids, keep, covered


def _race(x: torch.Tensor, params: SamplingTensors, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The reference's race over the kept candidates: token ids [B]."""
    k0, k1 = row_keys(params.seed, params.step)
    inv_t = inverse_temperature(params.temperature)[:, None]
    key = torch.where(keep, x.gather(1, ids) * inv_t + gumbel(k0[:, None], k1[:, None], ids), float("-inf"))
    best = key.max(1, keepdim=True).values
    return torch.where(key == best, ids, x.shape[1]).min(1).values  # ties: the lowest id


def sample_cpu(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    return_logprobs: bool = False,
    inplace_penalties: bool = False,
    candidates: int = CANDIDATES,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """sample_ref's contract (token ids [B], and their logprobs), sort-free where it can."""
    B, V = logits.shape
    k, top_p = params.top_k, params.top_p
    filtered = (((k > 0) & (k < V)) | (top_p < 1)) & (params.temperature.float() >= GREEDY_EPS)
    if not bool(filtered.any()):  # the reference sorts nothing for these rows
        return sample_ref(logits, params, return_logprobs=return_logprobs, inplace_penalties=inplace_penalties)
    x = logits.float()
    if params.has_penalty_tokens:
        x = apply_penalties_dense(x, params)
    rows = filtered.nonzero()[:, 0]
    xr, sub = (x, params) if len(rows) == B else (x.index_select(0, rows), params.select(rows))
    ids, keep, covered = _candidate_keep(xr, sub, min(candidates, V))
    drawn = _race(xr, sub, ids, keep)
    # Everything else (greedy and unfiltered rows, rows whose kept set reaches past the
    # candidates) by the reference, on the penalised logits and without penalties again.
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    rest = torch.ones(B, dtype=torch.bool, device=logits.device)
    rest[rows[covered]] = False
    tokens[rows[covered]] = drawn[covered]
    if bool(rest.any()):
        others = rest.nonzero()[:, 0]
        plain = replace(params.select(others), prompt_tokens=None, output_tokens=None)  # x is penalised
        tokens[others] = sample_ref(x.index_select(0, others), plain)
    if not return_logprobs:
        return tokens
    logprobs = torch.log_softmax(x * inverse_temperature(params.temperature)[:, None], 1).gather(1, tokens[:, None])
    return tokens, logprobs[:, 0]
