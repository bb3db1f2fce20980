"""The building blocks every family's decoder layer is made of: RMSNorm, the gated MLP
(SwiGLU / GeGLU), the sparse mixture of experts, and paged attention (GQA, sliding
window, q/k norms, soft-capping, its own scale).

Weights are plain tensors registered as parameters without gradients; projections that
read the same input are fused at load (q|k|v, gate|up) so one GEMM serves them (each
family's `packed_modules` names the parts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import kernels
import kernels.moe as moe_ops
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCache
from ignis.model.rope import Rope, apply_rotary


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    """Uninitialised, gradient-free storage: the loader fills every parameter."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.weight = empty_param(size, dtype=dtype, device=device)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 == self.weight.dtype:
            # The same arithmetic in one fused op (half the time of the five below at one row).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 and cast back before the weight, exactly as transformers does.
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Linear(nn.Module):
    """y = x W^T (+ b); no init, the loader fills the weight."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.weight = empty_param(out_features, in_features, dtype=dtype, device=device)
        self.bias = empty_param(out_features, dtype=dtype, device=device) if bias else None
        # A stand-in for F.linear(x, weight, bias) installed by the engine's runner (on the
        # CPU: a GEMM over a oneDNN-packed copy of the weight); None = F.linear.
        self.linear_op: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear_op is not None:
            return self.linear_op(x)
        return F.linear(x, self.weight, self.bias)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gated MLP's activation by ModelConfig.hidden_act."""
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":  # transformers' gelu_pytorch_tanh
        return lambda x: F.gelu(x, approximate="tanh")
    raise NotImplementedError(f"activation {name!r}")


class MLP(nn.Module):
    """A gated MLP: down(act(gate(x)) * up(x)), gate and up fused into one [2I, H] weight
    (SwiGLU with silu, GeGLU with gelu_tanh)."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, dtype: torch.dtype, device: torch.device | str,
        act: str = "silu",
    ) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.act_name = act
        self.act = activation(act)
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, dtype, device)
        self.down_proj = Linear(intermediate, hidden, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Experts(nn.Module):
    """The experts of a sparse MoE layer, stacked: gate|up [E, 2I, H] and down [E, H, I].

    `expert_ops` (packed CPU forms, set at load) replaces the stacked tensors with one
    (gate|up, down) GEMM pair per expert; None = the tensors."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.gate_up_proj = empty_param(num_experts, 2 * intermediate, hidden, dtype=dtype, device=device)
        self.down_proj = empty_param(num_experts, hidden, intermediate, dtype=dtype, device=device)
        self.expert_ops: list[tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] | None = None


class SparseMoE(nn.Module):
    """Top-k routed experts (Mixtral, Qwen3-MoE): a router [E, H], softmax over every
    expert, the top k renormalised (norm_topk_prob), each token's gated MLPs weighted and
    summed. On CUDA (or the triton backend) the grouped GEMM kernel runs all experts of a
    step in two launches (kernels.moe); on the CPU only the experts some token chose run,
    each over its own tokens (through its packed GEMMs when the form has them)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.top_k, self.renormalize = c.num_experts_per_tok, c.norm_topk_prob
        self.act_name = c.hidden_act
        self.act = activation(c.hidden_act)
        self.gate = Linear(c.hidden_size, c.num_experts, False, dtype, device)  # the router
        self.experts = Experts(c.num_experts, c.hidden_size, c.moe_intermediate_size, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_ops.route(self.gate(x), self.top_k, renormalize=self.renormalize)
        ex = self.experts
        if ex.expert_ops is None and (x.is_cuda or kernels.get_backend() == "triton"):
            return moe_ops.moe(x, weights.to(x.dtype), ids, ex.gate_up_proj, ex.down_proj, self.act_name)
        return self._routed_experts(x, weights, ids)

    def _routed_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The CPU path: tokens grouped by expert once, then each chosen expert's MLP over
        its rows (a host loop over the experts that have any)."""
        ex = self.experts
        order, offsets = moe_ops.group_by_expert(ids, ex.num_experts)
        token = order // self.top_k
        w = weights.reshape(-1)[order].to(x.dtype)
        out = torch.zeros_like(x)
        bounds = offsets.tolist()
        for e in range(ex.num_experts):
            a, b = bounds[e], bounds[e + 1]
            if b == a:
                continue
            rows = x.index_select(0, token[a:b])
            if ex.expert_ops is None:
                h = F.linear(rows, ex.gate_up_proj[e])
                gate, up = h.split(ex.intermediate, dim=-1)
                y = F.linear(self.act(gate) * up, ex.down_proj[e])
            else:
                gate_up, down = ex.expert_ops[e]
                gate, up = gate_up(rows).split(ex.intermediate, dim=-1)
                y = down(self.act(gate) * up)
            out.index_add_(0, token[a:b], y * w[a:b, None])
        return out


class Attention(nn.Module):
    """Grouped-query attention over a paged KV cache, for a flat ragged batch [T, ...]:
    layer `layer` of a model of `config` (q/k/v and o biases, q/k norms per head or over
    the projection, the layer's sliding window, its scale and score soft-capping)."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5 if c.attention_scale is None else c.attention_scale
        self.sliding_window = c.layer_sliding_window(layer)
        self.softcap = c.attn_logit_softcap
        self.qkv_proj = Linear(c.hidden_size, self.q_size + 2 * self.kv_size, c.attention_bias, dtype, device)
        self.o_proj = Linear(self.q_size, c.hidden_size, c.o_proj_bias, dtype, device)
        self.q_norm = self.k_norm = None
        # "head": one norm over each head's head_dim (Qwen3, Gemma 3); "projection": over
        # all of q and all of k before the split into heads (OLMo 2).
        self.qk_norm_scope = c.qk_norm_scope if c.qk_norm else "none"
        if self.qk_norm_scope == "head":
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)
        elif self.qk_norm_scope == "projection":
            self.q_norm = RMSNorm(self.q_size, c.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(self.kv_size, c.rms_norm_eps, dtype, device)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden]; rope = (cos, sin) of each token's position, from RotaryEmbedding."""
        T, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        if self.qk_norm_scope == "projection":  # OLMo 2: over the whole q and k rows
            qkv = torch.cat((self.q_norm(qkv[:, : self.q_size]), self.k_norm(qkv[:, self.q_size : qk_size]),
                             qkv[:, qk_size:]), dim=1)
        # Views, no copies: q and k heads side by side [T, Hq + Hkv, D], v after them.
        qk = qkv[:, :qk_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
        v = qkv[:, qk_size:].view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm_scope == "head":  # per-head RMSNorm, separate weights for q and k
            qk = torch.cat((self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), dim=1)
        qk = apply_rotary(qk, *rope)  # q and k rotated together: one set of elementwise ops
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        k_cache, v_cache = kv_cache
        (meta.write_kv_op or kernels.write_kv)(k, v, k_cache, v_cache, meta.slot_mapping)
        extra = {} if self.softcap is None else {"softcap": self.softcap}
        o = (meta.attention_op or kernels.paged_attention)(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale=self.scale,
            sliding_window=self.sliding_window,
            # Host-side bounds so the kernel sizes its grid without reading device tensors.
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            **extra,
        )
        return self.o_proj(o.reshape(T, self.q_size))
