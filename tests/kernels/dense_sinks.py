"""An independent dense oracle of attention with learned sinks (gpt-oss), for the attention
tests: transformers' eager formula, in float64. Each query row's scores get one more
logit column, the head's sink; the row is softmaxed and that column dropped, so the sink
only enlarges the denominator. Reads the paged caches by its own indexing (not
ignis_kernels.attention_ref's gather), so it shares no code with the implementations it checks."""

from __future__ import annotations

import torch


def dense_sink_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None,
    sliding_window: int | None,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """[num_tokens, heads, dim] float64; rows outside query_start_loc's range are 0."""
    num_tokens, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    scale = dim**-0.5 if scale is None else scale
    kv_of_head = torch.arange(heads) // (heads // kv_heads)
    out = torch.zeros(num_tokens, heads, dim, dtype=torch.float64)
    qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, n in enumerate(lens):
        a, b = qsl[i], qsl[i + 1]
        if a == b:
            continue
        pos = torch.arange(n)
        blocks = block_tables[i].cpu().long()[pos // block_size]
        k = k_cache.cpu()[blocks, pos % block_size].double()[:, kv_of_head]  # [n, heads, dim]
        v = v_cache.cpu()[blocks, pos % block_size].double()[:, kv_of_head]
        qi = q[a:b].cpu().double()
        scores = torch.einsum("lhd,nhd->hln", qi, k) * scale
        q_pos = torch.arange(n - (b - a), n)[:, None]
        allowed = pos[None, :] <= q_pos
        if sliding_window is not None:
            allowed &= q_pos - pos[None, :] < sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        sink_col = sinks.cpu().double()[:, None, None].expand(heads, b - a, 1)
        p = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
        out[a:b] = torch.einsum("hln,nhd->lhd", p, v)
    return out


def random_sinks(heads: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 [heads] sinks spread so each matters: about the log of a few to a few hundred
    keys' mass, with one head's sink far above its scores (output near 0) when heads > 1."""
    sinks = torch.empty(heads).uniform_(-1.0, 5.0, generator=generator)
    if heads > 1:
        sinks[-1] = 12.0
    return sinks
