"""A batched paged-attention path for the CPU, built once per step by the engine's runner.

ignis_kernels.paged_attention on a CPU tensor runs the PyTorch reference, which loops over
sequences in Python (about 20 small ops per sequence per layer: half of a 64-way
decode step). Here the decode rows (one new token each) go through one gather and one
SDPA call per layer instead; whatever per-step work does not depend on the layer (the
gather index, the mask) is done once, in the constructor. Rows with more than one new
token (prefill chunks) still go through the reference, one sequence at a time.

A lone decode row (one user's step) skips the mask too: its keys are sliced to exactly its
context (or window), and the query heads that share a kv head become that head's query
rows, so SDPA runs unmasked with no GQA expansion (experiments/RESULTS.md: 20.6 vs 22.6 us
per layer at 80 keys, 289 vs 355 at 2000, one thread).

SDPA runs in fp32 whatever the cache holds: a bf16 cache (engine.kv_cache_dtype) has its
gathered keys and values widened once per call, since torch's CPU SDPA in bf16 is 5-9x
slower than in fp32 at decode sizes.

The runner puts the decode rows first in the batch, so they are q[:num_decodes].
Same contract and signature as ignis_kernels.paged_attention (the hints are ignored).
Soft-capped scores (Gemma 2) go to the reference, which computes them by hand.
Attention sinks (gpt-oss): decode rows run torch's CPU flash kernel instead of SDPA (as
fast, measured), whose per-row log-sum-exp lse gives the sink's share exactly:
out * sigmoid(lse - sink) = out * e^lse / (e^lse + e^sink).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ignis_kernels.attention_ref import paged_attention_ref

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def sink_scaled(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention output o [..., heads, dim] over the keys, with log-sum-exp lse [..., heads] of
    its scores, renormalised as if the per-head sink logits joined the softmax."""
    return o * torch.sigmoid(lse - sinks.float())[..., None]


class BatchedCpuAttention:
    def __init__(
        self,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        *,
        num_decodes: int,
        decode_max_seq_len: int,
        block_size: int,
    ) -> None:
        self.num_decodes = d = num_decodes
        self.block_tables, self.query_start_loc, self.seq_lens = block_tables, query_start_loc, seq_lens
        if d:
            nb = -(-decode_max_seq_len // block_size)
            # Padding (-1) entries point at block 0: finite data, masked out below.
            self.index = block_tables[:d, :nb].clamp(min=0).reshape(-1).long()
            # Blocks that happen to be consecutive (a lone sequence in a fresh cache, often)
            # are read in place: a slice instead of a gather.
            first = int(self.index[0])
            consecutive = bool((self.index == torch.arange(first, first + self.index.numel())).all())
            self.span = slice(first, first + self.index.numel()) if consecutive else None
            self.ctx = nb * block_size
            if d == 1:  # the lone row: its exact length (a host int from the runner), no mask
                self.one_len = decode_max_seq_len
                return
            self.key_pos = torch.arange(self.ctx)
            self.decode_lens = seq_lens[:d].long()
            self.mask = (self.key_pos < self.decode_lens[:, None])[:, None, None, :]  # [d, 1, 1, ctx]
            self.window_masks: dict[int, torch.Tensor] = {}
            self.additive_masks: dict[int | None, torch.Tensor] = {}

    def _decode_mask(self, sliding_window: int | None) -> torch.Tensor:
        if sliding_window is None:
            return self.mask
        m = self.window_masks.get(sliding_window)
        if m is None:  # the query at position len-1 sees keys j with (len-1) - j < window
            m = self.mask & (self.key_pos >= self.decode_lens[:, None] - sliding_window)[:, None, None, :]
            self.window_masks[sliding_window] = m
        return m

    def _additive_mask(self, sliding_window: int | None) -> torch.Tensor:
        """_decode_mask as 0 / -inf fp32 (the flash kernel takes no boolean mask)."""
        m = self.additive_masks.get(sliding_window)
        if m is None:
            allowed = self._decode_mask(sliding_window)
            m = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
            self.additive_masks[sliding_window] = m
        return m

    def _one_row(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float | None,
        sliding_window: int | None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Row 0's attention [1, heads, dim] over exactly the keys it sees, unmasked."""
        num_blocks, _, kv_heads, head_dim = k_cache.shape
        num_heads = q.shape[1]
        n = self.one_len
        lo = 0 if sliding_window is None else max(0, n - sliding_window)
        if self.span is not None:
            k, v = k_cache[self.span], v_cache[self.span]
        else:
            k = k_cache.reshape(num_blocks, -1).index_select(0, self.index)
            v = v_cache.reshape(num_blocks, -1).index_select(0, self.index)
        # Only the keys it sees are widened (an fp32 cache: no copy).
        k = k.view(-1, kv_heads, head_dim)[lo:n].float().transpose(0, 1)[None]  # [1, kv_heads, keys, dim]
        v = v.view(-1, kv_heads, head_dim)[lo:n].float().transpose(0, 1)[None]
        # Query head h reads kv head h // group: a kv head's group of query heads are rows.
        qg = q[:1].reshape(1, kv_heads, num_heads // kv_heads, head_dim).float()
        if sinks is None:
            o = F.scaled_dot_product_attention(qg, k, v, scale=scale)
            return o.view(1, num_heads, head_dim)
        o, lse = _flash(qg, k, v, scale=scale)
        return sink_scaled(o.reshape(1, num_heads, head_dim), lse.reshape(1, num_heads), sinks)

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
        num_tokens, num_heads, head_dim = q.shape
        if d == num_tokens == 1 and out is None:  # one user's step: no buffer to fill
            return self._one_row(q, k_cache, v_cache, scale, sliding_window, sinks).to(q.dtype)
        if out is None:
            out = torch.empty_like(q)
        if d == 1:
            out[:1] = self._one_row(q, k_cache, v_cache, scale, sliding_window, sinks).to(out.dtype)
        elif d:
            num_blocks, _, kv_heads, _ = k_cache.shape
            # One gather per cache: [d * nb, block] rows, viewed as [d, kv_heads, ctx, dim].
            if self.span is not None:
                k, v = k_cache[self.span], v_cache[self.span]
            else:
                k = k_cache.reshape(num_blocks, -1).index_select(0, self.index)
                v = v_cache.reshape(num_blocks, -1).index_select(0, self.index)
            k = k.view(d, self.ctx, kv_heads, head_dim).float().transpose(1, 2)
            v = v.view(d, self.ctx, kv_heads, head_dim).float().transpose(1, 2)
            if sinks is not None:  # a kv head's query heads as its rows, as in _one_row
                qg = q[:d].reshape(d, kv_heads, num_heads // kv_heads, head_dim).float()
                o, lse = _flash(qg, k, v, attn_mask=self._additive_mask(sliding_window), scale=scale)
                o = sink_scaled(o.reshape(d, num_heads, head_dim), lse.reshape(d, num_heads), sinks)
                out[:d] = o.to(out.dtype)
            else:
                o = F.scaled_dot_product_attention(
                    q[:d].view(d, num_heads, 1, head_dim).float(),
                    k,
                    v,
                    attn_mask=self._decode_mask(sliding_window),
                    scale=scale,
                    enable_gqa=num_heads != kv_heads,
                )
                out[:d] = o.view(d, num_heads, head_dim).to(out.dtype)
        if num_tokens > d:
            qsl = self.query_start_loc[d:] - d
            paged_attention_ref(
                q[d:], k_cache, v_cache, self.block_tables[d:], qsl, self.seq_lens[d:],
                scale, sliding_window, out[d:], sinks=sinks,
            )
        return out
