"""The grouped per-expert GEMM (Triton, interpreted) against its reference, and the MoE
block's routing and composition against a per-token loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ignis_kernels.moe import group_by_expert, grouped_gemm, moe, route
from ignis_kernels.moe_triton import grouped_gemm_triton
from ignis_kernels.moe_ref import grouped_gemm_ref


def _grouped(counts: list[int], n: int, k: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = sum(counts)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(len(counts), n, k, generator=g).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    return x, w, offsets


@pytest.mark.parametrize("counts, n, k, bias, dtype", [
    # empty experts first, last and between; a group longer than a row tile; ragged N and K
    ([0, 5, 0, 21, 3, 0], 24, 40, False, torch.float32),
    ([7, 0, 16, 1], 16, 16, True, torch.float32),
    ([3, 9], 20, 24, True, torch.bfloat16),
])
def test_triton_grouped_gemm_matches_reference(counts, n, k, bias, dtype) -> None:
    x, w, offsets = _grouped(counts, n, k, dtype)
    b = torch.randn(len(counts), n).to(dtype) if bias else None
    want = grouped_gemm_ref(x, w, offsets, b)
    got = grouped_gemm_triton(x, w, offsets, b, block_m=16, block_n=16, block_k=16)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.float(), want.float(), atol=tol * want.abs().max().item(), rtol=0)
    # Every expert's rows really used its own weight.
    for e in range(len(counts)):
        a, z = offsets[e].item(), offsets[e + 1].item()
        if z > a:
            ref = x[a:z].float() @ w[e].float().T + (0 if b is None else b[e].float())
            assert torch.allclose(got[a:z].float(), ref, atol=tol * ref.abs().max().item(), rtol=0)


def test_grouped_gemm_dispatch_and_empty() -> None:
    x, w, offsets = _grouped([0, 0], 16, 16, torch.float32)
    assert grouped_gemm(x, w, offsets, backend="triton").shape == (0, 16)
    x, w, offsets = _grouped([2, 3], 16, 16, torch.float32)
    assert torch.allclose(grouped_gemm(x, w, offsets, backend="torch"), grouped_gemm_ref(x, w, offsets))
    with pytest.raises(ValueError, match="expert_offsets"):
        grouped_gemm_triton(x, w, offsets[:2])


def test_route_softmax_then_topk_and_topk_then_softmax() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    w, ids = route(logits, 2, renormalize=False)
    p = torch.softmax(logits, -1)
    assert ids.tolist() == [[1, 2]] and torch.allclose(w, p[:, [1, 2]])
    w, _ = route(logits, 2, renormalize=True)
    assert torch.allclose(w.sum(-1), torch.ones(1))
    w, ids = route(logits, 2, softmax_first=False)
    assert torch.allclose(w, torch.softmax(torch.tensor([[3.0, 2.0]]), -1))


def test_group_by_expert_is_stable() -> None:
    ids = torch.tensor([[2, 0], [0, 2], [1, 0]])
    order, offsets = group_by_expert(ids, 4)
    assert offsets.tolist() == [0, 3, 4, 6, 6]
    assert order.tolist() == [1, 2, 5, 4, 0, 3]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_moe_matches_a_per_token_loop(backend: str) -> None:
    g = torch.Generator().manual_seed(1)
    T, H, I, E, k = 9, 16, 16, 4, 2
    x = torch.randn(T, H, generator=g)
    w_gate_up = torch.randn(E, 2 * I, H, generator=g) * 0.3
    w_down = torch.randn(E, H, I, generator=g) * 0.3
    weights, ids = route(torch.randn(T, E, generator=g), k)
    got = moe(x, weights, ids, w_gate_up, w_down, backend=backend)
    want = torch.zeros(T, H)
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            gate, up = (w_gate_up[e] @ x[t]).chunk(2)
            want[t] += weights[t, j] * (w_down[e] @ (F.silu(gate) * up))
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item())
