"""PyTorch reference of paged attention: the CPU path and the oracle of the Triton kernel.

Layout (shared with the kernel):
  q             [num_tokens, num_q_heads, head_dim], the new tokens of every sequence, flat
  k/v_cache     [num_blocks, block_size, num_kv_heads, head_dim], any strides
  block_tables  [num_seqs, max_blocks] int32, padded with -1
  query_start_loc [num_seqs + 1] int32: sequence i owns q rows qsl[i]:qsl[i+1]
  seq_lens      [num_seqs] int32: context length of sequence i *including* its new
                tokens, which are its last (qsl[i+1] - qsl[i]) positions.
A query at position p sees keys j <= p (and p - j < sliding_window when set).
softcap (Gemma 2): each score s = scale * q.k becomes softcap * tanh(s / softcap).
sinks (gpt-oss) [num_q_heads] fp32: a value-less logit per head in each row's softmax.
Decode is the case q_len == 1; prefill over a cached prefix is q_len < seq_len.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first seq_len rows of one sequence's paged cache, densely: [seq_len, kv_heads, dim]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len)
        v = gather_kv(v_cache, block_tables[i], seq_len)
        # [heads, len, dim] in fp32: the oracle must not inherit low-precision error.
        qi = q[q_start:q_end].transpose(0, 1).float()
        ki = k.transpose(0, 1).float().repeat_interleave(group, dim=0)
        vi = v.transpose(0, 1).float().repeat_interleave(group, dim=0)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if sliding_window is not None:
            allowed &= (q_pos - k_pos) < sliding_window
        if softcap is None and sinks is None:
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=allowed, scale=scale)
        else:  # SDPA has neither soft-capping nor sinks: the scores by hand
            s = (qi @ ki.transpose(1, 2)) * scale
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            s = s.masked_fill(~allowed, float("-inf"))
            if sinks is None:
                o = torch.softmax(s, dim=-1) @ vi
            else:  # the sink as one more logit column, softmaxed with the scores, then dropped
                sink = sinks.float().to(q.device)[:, None, None].expand(-1, q_len, 1)
                o = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1] @ vi
        out[q_start:q_end] = o.transpose(0, 1).to(out.dtype)
    return out
