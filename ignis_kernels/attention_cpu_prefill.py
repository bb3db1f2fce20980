"""Prefill attention on the CPU without a materialised mask: torch's flash kernel twice.

The reference (ignis_kernels.attention_ref) hands SDPA a boolean [q_len, seq_len] mask, which
sends torch's CPU SDPA down its unfused path: scores for every (query, key) pair are
materialised per head. Measured on the 2-core Zen 5 machine, one layer of a 2048-token
chunk: 1.43 s with no cached prefix and 2.89 s over a 4096-token prefix, against 0.15 s
and 0.60 s here (RESULTS.md 2026-12-01). A chunk's queries are its sequence's last
q_len positions, so its keys split into two parts that need no mask:

  the cached prefix (positions < seq_len - q_len): every query sees every key;
  the chunk itself: causal, aligned at the top-left as torch's is_causal is.

Each part runs torch's fused flash kernel (`_scaled_dot_product_flash_attention_for_cpu`,
which also returns the log-sum-exp of each row), and the two partial softmaxes merge
exactly: out = (o1 e^{l1} + o2 e^{l2}) / (e^{l1} + e^{l2}), computed relative to the max.
Attention sinks (gpt-oss) join that merge as a third term with no value, e^sink.
Sliding windows and soft-capped scores go to the reference. Same contract as ignis_kernels.paged_attention_ref.
The flash kernel runs in q's dtype: a bf16 cache (engine.kv_cache_dtype) under fp32
activations has each sequence's gathered keys and values widened to fp32 once.
"""

from __future__ import annotations

import torch

from ignis_kernels.attention_cpu import BatchedCpuAttention, sink_scaled
from ignis_kernels.attention_ref import gather_kv, paged_attention_ref

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [q_len, Hq, D] over k/v [seq_len, Hkv, D] (the queries are the last q_len positions);
    sinks [Hq] fp32 or None."""
    q_len, num_heads, _ = q.shape
    seq_len, kv_heads, _ = k.shape
    group = num_heads // kv_heads
    dtype = q.dtype
    qh = q.transpose(0, 1)[None]  # [1, Hq, q_len, D]
    # The flash kernel wants equal head counts: each kv head serves `group` query heads.
    # (It also wants one dtype: a bf16 cache's rows are widened to fp32 q's here.)
    kh = k.transpose(0, 1).to(dtype)
    vh = v.transpose(0, 1).to(dtype)
    if group > 1:
        kh = kh.repeat_interleave(group, dim=0)
        vh = vh.repeat_interleave(group, dim=0)
    kh, vh = kh[None], vh[None]
    prefix = seq_len - q_len
    o_new, l_new = _flash(qh, kh[:, :, prefix:], vh[:, :, prefix:], is_causal=True, scale=scale)
    if prefix == 0:
        if sinks is None:
            return o_new[0].transpose(0, 1)
        # [1, Hq, q_len, D] with lse [1, Hq, q_len]: heads next to last, as sink_scaled wants.
        o = sink_scaled(o_new.float().transpose(1, 2), l_new.transpose(1, 2), sinks)
        return o[0].to(dtype)
    o_pre, l_pre = _flash(qh, kh[:, :, :prefix], vh[:, :, :prefix], is_causal=False, scale=scale)
    m = torch.maximum(l_pre, l_new)
    if sinks is not None:
        sink = sinks.float()[None, :, None]  # [1, Hq, 1]
        m = torch.maximum(m, sink)
    w_pre = torch.exp(l_pre - m)[..., None]
    w_new = torch.exp(l_new - m)[..., None]
    total = w_pre + w_new
    if sinks is not None:
        total = total + torch.exp(sink - m)[..., None]
    o = (o_pre.float() * w_pre + o_new.float() * w_new) / total
    return o[0].transpose(0, 1).to(dtype)


def prefill_attention_cpu(
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
    """paged_attention_ref's contract, one sequence at a time through the flash kernel."""
    if sliding_window is not None or softcap is not None or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                                   sliding_window, out, softcap, sinks)
    scale = q.shape[2] ** -0.5 if scale is None else scale
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        if b == a:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len)
        v = gather_kv(v_cache, block_tables[i], seq_len)
        out[a:b] = _one_sequence(q[a:b], k, v, scale, sinks).to(out.dtype)
    return out


def prefill_rows(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_decodes: int, scale: float | None,
    sliding_window: int | None, out: torch.Tensor, sinks: torch.Tensor | None = None,
) -> None:
    """A step's rows after its num_decodes decode rows (its prefill chunks) into
    out[num_decodes:], through prefill_attention_cpu; the step's own metadata."""
    d = num_decodes
    prefill_attention_cpu(q[d:], k_cache, v_cache, block_tables[d:], query_start_loc[d:] - d, seq_lens[d:], scale,
                          sliding_window, out[d:], sinks=sinks)


class CpuAttention(BatchedCpuAttention):
    """BatchedCpuAttention (decode rows in one SDPA per layer) with its prefill rows through
    prefill_attention_cpu instead of the reference. Same constructor and call."""

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float | None = None,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
        backend: object = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        **hints: object,
    ) -> torch.Tensor:
        if softcap is not None:
            return paged_attention_ref(q, k_cache, v_cache, self.block_tables, self.query_start_loc, self.seq_lens,
                                       scale, sliding_window, out, softcap, sinks)
        d = self.num_decodes
        if d == q.shape[0] == 1 and out is None:
            return super().__call__(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, sliding_window,
                                    sinks=sinks)
        if out is None:
            out = torch.empty_like(q)
        if d:
            super().__call__(q[:d], k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                             sliding_window, out[:d], sinks=sinks)
        if q.shape[0] > d:
            prefill_rows(q, k_cache, v_cache, self.block_tables, self.query_start_loc, self.seq_lens, d, scale,
                         sliding_window, out, sinks)
        return out
