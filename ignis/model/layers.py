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

import ignis_kernels
import ignis_kernels.moe as moe_ops
from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCache
from ignis.model.mxfp4 import dequantize_hf
from ignis.model.rope import Rope, apply_rotary
from ignis_kernels.moe_mxfp4 import moe_mxfp4


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


class MLP(nn.Module):
    """A gated MLP: down(glu(gate(x), up(x))), gate and up fused into one [2I, H] weight
    (SwiGLU with silu, GeGLU with gelu_tanh: ignis_kernels.moe.glu)."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, dtype: torch.dtype, device: torch.device | str,
        act: str = "silu",
    ) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.act_name = act
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, dtype, device)
        self.down_proj = Linear(intermediate, hidden, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(moe_ops.glu(gate, up, self.act_name))


class Experts(nn.Module):
    """The experts of a sparse MoE layer, stacked: gate|up [E, 2I, H] and down [E, H, I],
    with biases gate|up [E, 2I] and down [E, H] when `bias` (gpt-oss).

    With `mxfp4` the weights stay the checkpoint's MXFP4 (ignis/model/mxfp4.py): blocks
    [E, N, K/32, 16] and scales [E, N, K/32] uint8 for each, in place of the dense tensors.

    `expert_ops` (packed CPU forms, set at load) replaces the stacked tensors with one
    (gate|up, down) GEMM pair per expert; None = the tensors. The biases stay tensors."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, dtype: torch.dtype,
                 device: torch.device | str, bias: bool = False, mxfp4: bool = False) -> None:
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.mxfp4 = mxfp4
        if mxfp4:
            if hidden % 32 or intermediate % 32:
                raise ValueError(f"MXFP4 experts need widths that are multiples of 32, got {hidden} and {intermediate}")
            u8 = torch.uint8
            self.gate_up_proj_blocks = empty_param(num_experts, 2 * intermediate, hidden // 32, 16, dtype=u8, device=device)
            self.gate_up_proj_scales = empty_param(num_experts, 2 * intermediate, hidden // 32, dtype=u8, device=device)
            self.down_proj_blocks = empty_param(num_experts, hidden, intermediate // 32, 16, dtype=u8, device=device)
            self.down_proj_scales = empty_param(num_experts, hidden, intermediate // 32, dtype=u8, device=device)
            self.gate_up_proj = self.down_proj = None
        else:
            self.gate_up_proj = empty_param(num_experts, 2 * intermediate, hidden, dtype=dtype, device=device)
            self.down_proj = empty_param(num_experts, hidden, intermediate, dtype=dtype, device=device)
        self.gate_up_proj_bias = self.down_proj_bias = None
        if bias:
            self.gate_up_proj_bias = empty_param(num_experts, 2 * intermediate, dtype=dtype, device=device)
            self.down_proj_bias = empty_param(num_experts, hidden, dtype=dtype, device=device)
        self.expert_ops: list[tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] | None = None


class SparseMoE(nn.Module):
    """Top-k routed experts (Mixtral, Qwen3-MoE, gpt-oss): a router [E, H] (gpt-oss: with a
    bias), softmax over every expert, the top k renormalised (norm_topk_prob), or (gpt-oss)
    the top k logits softmaxed; each token's gated MLPs weighted and summed. On CUDA (or the triton backend) the grouped GEMM kernel runs all experts of a
    step in two launches (ignis_kernels.moe); on the CPU only the experts some token chose run,
    each over its own tokens (through its packed GEMMs when the form has them)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.top_k, self.renormalize = c.num_experts_per_tok, c.norm_topk_prob
        self.softmax_first = c.router_softmax_first
        self.act_name = c.hidden_act
        self.alpha, self.limit = c.swiglu_alpha, c.swiglu_limit
        self.gate = Linear(c.hidden_size, c.num_experts, c.router_bias, dtype, device)  # the router
        self.experts = Experts(c.num_experts, c.hidden_size, c.moe_intermediate_size, dtype, device, c.expert_bias,
                               c.experts_mxfp4)

    def glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return moe_ops.glu(gate, up, self.act_name, self.alpha, self.limit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_ops.route(self.gate(x), self.top_k, renormalize=self.renormalize,
                                     softmax_first=self.softmax_first)
        ex = self.experts
        if ex.expert_ops is None and (x.is_cuda or ignis_kernels.get_backend() == "triton"):
            extra = dict(gate_up_bias=ex.gate_up_proj_bias, down_bias=ex.down_proj_bias, alpha=self.alpha,
                         limit=self.limit)
            if ex.mxfp4:
                return moe_mxfp4(x, weights.to(x.dtype), ids, ex.gate_up_proj_blocks, ex.gate_up_proj_scales,
                                 ex.down_proj_blocks, ex.down_proj_scales, self.act_name, **extra)
            return moe_ops.moe(x, weights.to(x.dtype), ids, ex.gate_up_proj, ex.down_proj, self.act_name, **extra)
        return self._routed_experts(x, weights, ids)

    def _expert_weights(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert e's dense gate|up and down: the tensors, or its MXFP4 blocks dequantized
        (when no packed CPU op holds them: the native op is not built)."""
        ex = self.experts
        if not ex.mxfp4:
            return ex.gate_up_proj[e], ex.down_proj[e]
        return (dequantize_hf(ex.gate_up_proj_blocks[e], ex.gate_up_proj_scales[e], dtype),
                dequantize_hf(ex.down_proj_blocks[e], ex.down_proj_scales[e], dtype))

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
            gu_bias = None if ex.gate_up_proj_bias is None else ex.gate_up_proj_bias[e]
            down_bias = None if ex.down_proj_bias is None else ex.down_proj_bias[e]
            if ex.expert_ops is None:
                w_gate_up, w_down = self._expert_weights(e, x.dtype)
                h = F.linear(rows, w_gate_up, gu_bias)
                gate, up = h.split(ex.intermediate, dim=-1)
                y = F.linear(self.glu(gate, up), w_down, down_bias)
            else:
                gate_up, down = ex.expert_ops[e]
                h = gate_up(rows)
                gate, up = (h if gu_bias is None else h + gu_bias).split(ex.intermediate, dim=-1)
                y = down(self.glu(gate, up))
                if down_bias is not None:
                    y = y + down_bias
            out.index_add_(0, token[a:b], y * w[a:b, None])
        return out


class Attention(nn.Module):
    """Grouped-query attention over a paged KV cache, for a flat ragged batch [T, ...]:
    layer `layer` of a model of `config` (q/k/v and o biases, q/k norms per head or over
    the projection, the layer's sliding window, its scale, score soft-capping and gpt-oss's
    sinks: one learned logit per query head in the softmax's denominator, kept in fp32)."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5 if c.attention_scale is None else c.attention_scale
        self.sliding_window = c.layer_sliding_window(layer)
        self.softcap = c.attn_logit_softcap
        self.sinks = empty_param(c.num_heads, dtype=torch.float32, device=device) if c.attention_sinks else None
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
        (meta.write_kv_op or ignis_kernels.write_kv)(k, v, k_cache, v_cache, meta.slot_mapping)
        extra: dict[str, object] = {}
        if self.softcap is not None:
            extra["softcap"] = self.softcap
        if self.sinks is not None:
            extra["sinks"] = self.sinks
        o = (meta.attention_op or ignis_kernels.paged_attention)(
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


def exact_step_rows(model: nn.Module) -> int | None:
    """The most rows a step may hold for each row's projections to compute exactly what
    they compute in a one-row step (the least `exact_rows` of the model's packed ops:
    ignis/model/packed.py); None: no op bounds it. Speculative decoding's checks stay
    within it, so a draft never changes the tokens plain decoding gives. (The head is not
    counted: RefinedHead recomputes each row's top candidates exactly at any row count.)"""
    ops = [m.linear_op for m in model.modules() if isinstance(m, Linear) and m.linear_op is not None]
    ops += [op for m in model.modules() if isinstance(m, Experts) for pair in m.expert_ops or () for op in pair]
    bounds = [b for op in ops if (b := getattr(op, "exact_rows", None)) is not None]
    return min(bounds) if bounds else None
