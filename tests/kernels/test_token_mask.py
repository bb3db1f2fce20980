"""Packed token bitmasks: the Triton kernel (interpreter) and the CPU path against the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ignis_kernels.token_mask import apply_token_bitmask_
from ignis_kernels.token_mask_triton import BLOCK_V, apply_token_bitmask_triton_
from ignis_kernels.token_mask_ref import (
    apply_token_bitmask_cpu_,
    apply_token_bitmask_ref_,
    unpack_bits_ref,
)


def _case(B: int, V: int, words: int, rows: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g)
    logits[0, :3] = float("-inf")  # a one-hot model's -inf at allowed tokens
    mask = torch.randint(-(2**31), 2**31 - 1, (len(rows), words), dtype=torch.int32, generator=g)
    return logits, mask, torch.tensor(rows, dtype=torch.int64)


def test_reference_semantics() -> None:
    logits = torch.tensor([[1.0, float("-inf"), 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    mask = torch.tensor([[0b0110]], dtype=torch.int32)  # tokens 1 and 2 allowed
    apply_token_bitmask_ref_(logits, mask, torch.tensor([0]))
    assert logits[0].tolist() == [float("-inf"), torch.tensor(-1e30).item(), 3.0, float("-inf")]
    assert logits[1].tolist() == [5.0, 6.0, 7.0, 8.0]  # not a masked row


def test_unpack_bit_order_and_padding() -> None:
    mask = torch.tensor([[1 - 2**31]], dtype=torch.int32)  # tokens 0 and 31 (the sign bit)
    bits = unpack_bits_ref(mask, 40)
    assert bits[0].nonzero().flatten().tolist() == [0, 31]  # columns past 32 * W: never allowed


@pytest.mark.parametrize("B,V,words,rows", [(3, 70, 3, [2, 0]), (2, 64, 2, [0, 1]), (2, 50, 1, [1]), (1, 33, 2, [0])])
@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_matches_reference(B: int, V: int, words: int, rows: list[int], impl: str) -> None:
    logits, mask, idx = _case(B, V, words, rows, seed=B * 100 + V)
    want = logits.clone()
    apply_token_bitmask_ref_(want, mask, idx)
    got = logits.clone()
    (apply_token_bitmask_cpu_ if impl == "cpu" else apply_token_bitmask_triton_)(got, mask, idx)
    assert torch.equal(got, want)
    again = got.clone()  # idempotent: a retried sampling step may mask again
    apply_token_bitmask_(again, mask, idx, backend="torch")
    assert torch.equal(again, got)


def test_triton_two_blocks_and_strided_logits() -> None:
    """More than one program along the vocabulary, and a logits view with a row stride."""
    V = BLOCK_V + 40
    base = torch.randn(2, V + 8, generator=torch.Generator().manual_seed(7))
    logits = base[:, :V]
    m = np.zeros((1, 32 * ((V + 31) // 32)), dtype=bool)
    m[0, [0, 5, BLOCK_V - 1, BLOCK_V, V - 1]] = True
    mask = torch.from_numpy(np.packbits(m, axis=1, bitorder="little").view(np.int32).copy())
    want = logits.clone()
    apply_token_bitmask_ref_(want, mask, torch.tensor([1]))
    apply_token_bitmask_triton_(logits, mask, torch.tensor([1]))
    assert torch.equal(logits, want)
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [0, 5, BLOCK_V - 1, BLOCK_V, V - 1]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask_ref_(torch.zeros(1, 4), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([0]))
    with pytest.raises(ValueError, match="rows"):
        apply_token_bitmask_cpu_(torch.zeros(1, 4), torch.zeros(2, 1, dtype=torch.int32), torch.tensor([0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_cpu_path_other_dtypes_and_strided(dtype: torch.dtype) -> None:
    logits, mask, idx = _case(3, 70, 3, [2, 0], seed=11)
    logits = logits.to(dtype)
    want = logits.clone()
    apply_token_bitmask_ref_(want, mask, idx)
    got = logits.clone()
    apply_token_bitmask_cpu_(got, mask, idx)
    assert torch.equal(got, want)
    wide = torch.zeros(3, 80, dtype=dtype)
    wide[:, :70] = logits
    view = wide[:, :70]  # every row masked, through a strided view
    apply_token_bitmask_cpu_(view, torch.cat([mask, mask[:1]]), torch.tensor([0, 1, 2]))
    full = logits.clone()
    apply_token_bitmask_ref_(full, torch.cat([mask, mask[:1]]), torch.tensor([0, 1, 2]))
    assert torch.equal(wide[:, :70], full) and torch.equal(wide[:, 70:], torch.zeros(3, 10, dtype=dtype))
