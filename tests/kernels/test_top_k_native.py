"""The native op's per-row top k (ignis_kernels/cpu/top_k.h, torch.ops.ignis_cpu.top_k_rows)
against torch.topk, and cpu_native's top_k_indices / argmax_rows, which the refined LM head
and the plain-greedy sampler take on the CPU."""

from __future__ import annotations

import pytest
import torch

from ignis_kernels import cpu_native


@pytest.fixture(scope="module", autouse=True)
def _native_op() -> None:
    if not cpu_native.load():
        pytest.skip("no native CPU decode op on this machine (no C++ compiler?)")


@pytest.mark.parametrize(("rows", "n", "k"),
                         [(64, 5000, 16), (3, 50, 8), (1, 16, 16), (2, 7, 3), (5, 33, 1), (4, 100, 0)])
def test_values_are_torch_topks(rows: int, n: int, k: int) -> None:
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n))
    vals, ids = torch.ops.ignis_cpu.top_k_rows(x, k)
    assert torch.equal(vals, x.topk(k, dim=1).values)  # the k largest, largest first
    assert torch.equal(x.gather(1, ids), vals)
    assert ids.dtype == torch.long and all(len(set(r)) == k for r in ids.tolist())


def test_ties_keep_the_earlier_index_and_masked_rows_work() -> None:
    x = torch.full((3, 40), float("-inf"))
    x[0, 5:25] = 2.0  # twenty equal: the first eight, in order
    x[1, [3, 30]] = 1.0  # two allowed tokens (a grammar's mask), then -inf in index order
    vals, ids = torch.ops.ignis_cpu.top_k_rows(x, 8)
    assert ids[0].tolist() == list(range(5, 13))
    assert ids[1].tolist() == [3, 30, 0, 1, 2, 4, 5, 6]
    assert ids[2].tolist() == list(range(8))  # all -inf: the first ones
    assert vals[1, 2:].eq(float("-inf")).all()


def test_nan_only_where_nothing_else_is_left() -> None:
    x = torch.full((2, 6), float("nan"))
    x[0, 4] = 1.0
    vals, ids = torch.ops.ignis_cpu.top_k_rows(x, 3)
    assert ids.tolist() == [[4, 0, 1], [0, 1, 2]]
    assert vals[0, 0] == 1.0 and vals[0, 1:].isnan().all()


def test_helpers_match_torch_and_fall_back() -> None:
    x = torch.randn(9, 1000, generator=torch.Generator().manual_seed(1))
    x[2, [10, 900]] = 50.0  # a tie at the top: the first index, as argmax
    assert torch.equal(cpu_native.argmax_rows(x), x.argmax(dim=-1))
    assert set(cpu_native.top_k_indices(x, 5)[4].tolist()) == set(x[4].topk(5).indices.tolist())
    t = x.t()  # not contiguous: torch's path, the same answers
    assert torch.equal(cpu_native.argmax_rows(t), t.argmax(dim=-1))
    assert set(cpu_native.top_k_indices(t, 3)[0].tolist()) == set(t[0].topk(3).indices.tolist())
    with pytest.raises(RuntimeError, match="k must be"):
        torch.ops.ignis_cpu.top_k_rows(x, 1001)
