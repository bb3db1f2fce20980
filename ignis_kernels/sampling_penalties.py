"""Repetition / presence / frequency penalties, as vLLM and OpenAI define them.

For each row, with c_t = how often token t occurs in the OUTPUT tokens and seen_t =
t occurs in the prompt OR the output:

  x_t <- (x_t / r if x_t > 0 else x_t * r)   if seen_t        (repetition, r = 1 off)
  x_t <- x_t - frequency * c_t - presence * (c_t > 0)          (0 = off)

evaluated in float32 in exactly this order, so both versions below give bit-identical
logits. `apply_penalties_dense` is the reference (B x V counts, clear); the fast path
`apply_penalties_` works in place over the [B, S] token lists only (no B x V pass).
Token ids outside [0, V) count as padding.
"""

from __future__ import annotations

import torch

from ignis_kernels.sampling_tensors import SamplingTensors


def penalize(x: torch.Tensor, count: torch.Tensor, rep: torch.Tensor, pres: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """Penalised value of seen tokens with logit x and output count `count` (float)."""
    x = torch.where(x > 0, x / rep, x * rep)
    return x - freq * count - pres * (count > 0).to(x.dtype)


def _token_lists(params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor] | None:
    """All penalty token ids [B, Sp + So] (int64) and whether each is an output token."""
    ids, is_out = [], []
    for tokens, out in ((params.prompt_tokens, False), (params.output_tokens, True)):
        if tokens is not None and tokens.shape[1] > 0:
            ids.append(tokens.long())
            is_out.append(torch.full(tokens.shape, out, dtype=torch.bool, device=tokens.device))
    if not ids:
        return None
    return torch.cat(ids, 1), torch.cat(is_out, 1)


def apply_penalties_dense(x: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """Out of place on float32 x [B, V]: the oracle, via dense per-token counts."""
    lists = _token_lists(params)
    if lists is None:
        return x
    ids, is_out = lists
    B, V = x.shape
    valid = (ids >= 0) & (ids < V)
    slot = torch.where(valid, ids, V)  # column V collects the padding
    counts = torch.zeros(B, V + 1, dtype=torch.float32, device=x.device)
    counts.scatter_add_(1, slot, (valid & is_out).float())
    seen = torch.zeros(B, V + 1, dtype=torch.bool, device=x.device)
    seen.scatter_(1, slot, valid)
    counts, seen = counts[:, :V], seen[:, :V]
    rep = params.repetition_penalty.float()[:, None]
    pres = params.presence_penalty.float()[:, None]
    freq = params.frequency_penalty.float()[:, None]
    return torch.where(seen, penalize(x, counts, rep, pres, freq), x)


def apply_penalties_(x: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """In place on float32 x [B, V]; touches only the listed tokens. No host sync.

    Counts come from x itself: zero the listed entries, scatter-add 1.0 per output
    occurrence (exact in float32), read them back, then scatter the penalised values.
    Duplicate ids all write the same value, so the result does not depend on which of
    them wins a scatter. Padding entries are pointed at the row's first valid id (same
    value written) or, in a row with none, at a token whose original value goes back.
    """
    lists = _token_lists(params)
    if lists is None:
        return x
    ids, is_out = lists
    V = x.shape[1]
    valid = (ids >= 0) & (ids < V)
    row_any = valid.any(1, keepdim=True)
    first = valid.to(torch.int32).argmax(1, keepdim=True)
    fill = ids.gather(1, first).clamp(0, V - 1)
    idx = torch.where(valid, ids, fill)
    orig = x.gather(1, idx)
    x.scatter_(1, idx, 0.0)
    x.scatter_add_(1, idx, (valid & is_out).to(x.dtype))
    count = x.gather(1, idx)
    rep = params.repetition_penalty.float()[:, None]
    pres = params.presence_penalty.float()[:, None]
    freq = params.frequency_penalty.float()[:, None]
    value = torch.where(row_any, penalize(orig, count, rep, pres, freq), orig)
    x.scatter_(1, idx, value)
    return x
