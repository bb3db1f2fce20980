"""PyTorch reference of the mixture-of-experts ops: the CPU path and the oracle of the kernel.

Layout (shared with ignis_kernels.moe_kernel):
  x               [M, K]      rows grouped by expert: rows offsets[e]:offsets[e+1] go to expert e
  w               [E, N, K]   one [N, K] weight per expert (y = x W^T, as F.linear)
  expert_offsets  [E + 1]     int32, non-decreasing, offsets[0] = 0, offsets[E] = M
  bias            [E, N]      optional, one bias row per expert

Routing (`route`) and the grouping of a batch's (token, expert) pairs (`group_by_expert`)
are plain torch ops on the device: no host synchronisation. `moe` chains them with two
grouped GEMMs; the grouped GEMM is the op the Triton kernel replaces.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

GroupedGemm = Callable[..., torch.Tensor]


def grouped_gemm_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    expert_offsets: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[offsets[e]:offsets[e+1]] = x[...] @ w[e]^T (+ bias[e]), for every expert e with rows."""
    if out is None:
        out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    bounds = expert_offsets.tolist()
    for e in range(w.shape[0]):
        a, b = bounds[e], bounds[e + 1]
        if b > a:
            out[a:b] = F.linear(x[a:b], w[e], None if bias is None else bias[e]).to(out.dtype)
    return out


def route(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True, softmax_first: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] fp32, expert ids [T, top_k] int64) of each token's top_k experts.

    softmax_first (Mixtral, Qwen3-MoE): softmax over every expert, take the top_k, and
    renormalise them to sum to 1 when `renormalize`. Otherwise (gpt-oss): the top_k
    logits, then a softmax over just those."""
    logits = router_logits.float()
    if softmax_first:
        probs = torch.softmax(logits, dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids
    top, ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top, dim=-1), ids


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [T * top_k]: the flattened (token, slot) pairs sorted by expert, stably;
    expert_offsets [E + 1] int32) for the grouped GEMMs. Pair p is token p // top_k."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """A gated MLP's hidden activations from its gate and up halves: silu (SwiGLU),
    gelu_tanh (GeGLU) or swiglu_oai (gpt-oss: the gate clamped above at `limit`, up clamped
    to +-limit and offset by 1, the gate's sigmoid sharpened by `alpha`)."""
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    if activation == "swiglu_oai":
        gate = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))
    raise ValueError(f"unknown MoE activation {activation!r}")


def moe_ref(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: str = "silu",
    grouped_gemm: GroupedGemm = grouped_gemm_ref,
    *,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:
    """sum_j weights[t, j] * down_e(glu(gate_e(x_t), up_e(x_t))) with e = ids[t, j]:
    x [T, H], w_gate_up [E, 2I, H] (gate rows first), w_down [E, H, I] -> [T, H]; optional
    biases gate_up_bias [E, 2I], down_bias [E, H]; alpha / limit: swiglu_oai's (see glu)."""
    return moe_compose(
        x, weights, ids, w_gate_up.shape[0], w_down.shape[1],
        lambda rows, offsets: grouped_gemm(rows, w_gate_up, offsets, gate_up_bias),
        lambda h, offsets: grouped_gemm(h, w_down, offsets, down_bias),
        activation, alpha, limit,
    )


def moe_compose(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int, hidden: int,
    gate_up: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    down: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    activation: str, alpha: float, limit: float,
) -> torch.Tensor:
    """The MoE block around two grouped GEMMs, whatever holds the weights: the (token,
    expert) pairs grouped by expert, gate_up(rows, offsets) [pairs, 2I] gate half first,
    glu, down(h, offsets) [pairs, hidden], each pair weighted and summed into its token."""
    num_tokens, top_k = ids.shape
    order, offsets = group_by_expert(ids, num_experts)
    token = order // top_k
    gate, up = gate_up(x.index_select(0, token), offsets).chunk(2, dim=-1)
    y = down(glu(gate, up, activation, alpha, limit), offsets)
    y = y * weights.reshape(-1)[order].to(y.dtype)[:, None]
    out = torch.zeros(num_tokens, hidden, dtype=y.dtype, device=x.device)
    return out.index_add_(0, token, y).to(x.dtype)
