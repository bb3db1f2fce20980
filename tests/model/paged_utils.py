"""Test helpers: drive ignis's forward over the paged cache the way an engine would."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import allocate_kv_caches
from ignis.model.transformer import Transformer


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b|: the error relative to the reference's largest logit magnitude."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def quant_gemm_rtol(bits: int = 4) -> float:
    """How close the native quantized GEMMs come to the file's weight times x (relative to
    the largest output): fp32 activations, or int16 ones per group of 32 (within 2^-15 of
    each group's largest |x|, ignis_kernels/cpu/quant_gemm.h) on the AVX2 tier, for the 8-bit
    form wherever AVX2 is (AVX-512 too), and for every format where AVX512-VNNI is."""
    from ignis_kernels import cpu_platform

    p = cpu_platform.current()
    vnni = p.level == "avx512" and "avx512_vnni" in p.flags
    return 3e-4 if p.level == "avx2" or vnni or (bits == 8 and p.level != "portable") else 1e-5


def assert_gemm_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rtol: float) -> None:
    """got = x @ w^T within rtol of each output's scale, sum_k |x_k w_k| (what rounding x per
    group scales with: an output that cancels to near zero is held to its terms' size, not its
    own), the reference in float64."""
    want = x.double() @ w.double().t()
    scale = x.double().abs() @ w.double().abs().t()
    err = (got.double() - want).abs()
    assert bool((err <= rtol * scale.max() + 1e-12).all()), f"worst {float((err / scale.max()).max()):.3g} of the outputs' scale"


def block_tables_for(lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """Interleaved (not contiguous) block ids, so a wrong table lookup cannot go unnoticed."""
    counts = [-(-n // block_size) for n in lengths]
    tables: list[list[int]] = [[] for _ in lengths]
    next_block = 0
    while any(len(t) < c for t, c in zip(tables, counts)):
        for t, c in zip(tables, counts):
            if len(t) < c:
                t.append(next_block)
                next_block += 1
    return tables


@torch.inference_mode()
def flat_forward_logits(
    model: Transformer,
    chunks: Sequence[Sequence[Sequence[int]]],
    *,
    block_size: int = 4,
    hidden_only: bool = False,
) -> list[torch.Tensor]:
    """Run each sequence as a series of chunks, all sequences together in one flat forward
    per step (chunks[i][step] = the tokens sequence i adds at that step; all sequences have
    the same number of steps). Returns per sequence the logits at every fed position,
    [total_len_i, vocab], so prefill, chunked prefill and decode all compare the same way
    (the final hidden states [total_len_i, hidden] instead with hidden_only)."""
    totals = [sum(len(c) for c in seq) for seq in chunks]
    tables = block_tables_for(totals, block_size)
    num_blocks = max(b for t in tables for b in t) + 1
    caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype=model.dtype, device=model.device)
    done = [0] * len(chunks)
    out: list[list[torch.Tensor]] = [[] for _ in chunks]
    for step in range(len(chunks[0])):
        new = [seq[step] for seq in chunks]
        query_lens = [len(c) for c in new]
        seq_lens = [d + q for d, q in zip(done, query_lens)]
        meta, positions = AttentionMetadata.build(
            query_lens=query_lens, seq_lens=seq_lens, block_tables=tables, block_size=block_size,
            device=model.device,
        )
        ids = torch.tensor([t for c in new for t in c], dtype=torch.int64, device=model.device)
        hidden = model(ids, positions, caches, meta)
        rows = hidden if hidden_only else model.compute_logits(hidden, torch.arange(ids.shape[0], device=model.device))
        for i, piece in enumerate(rows.split(query_lens)):
            out[i].append(piece.cpu())
        done = seq_lens
    return [torch.cat(parts) for parts in out]


@torch.inference_mode()
def hf_logits(hf_model: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """transformers' logits at every position of one unpadded sequence, [len, vocab] fp32."""
    return hf_model(torch.tensor([list(ids)])).logits[0].float()
