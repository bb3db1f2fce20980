"""The building blocks of the decoder: RMSNorm, the SwiGLU MLP and paged attention.

Weights are plain tensors registered as parameters without gradients; projections that
read the same input are fused at load (q|k|v, gate|up) so one GEMM serves them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import kernels
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


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one [2I, H] weight."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, dtype, device)
        self.down_proj = Linear(intermediate, hidden, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """Grouped-query attention over a paged KV cache, for a flat ragged batch [T, ...]:
    layer `layer` of a model of `config` (q/k/v and o biases, Qwen3's q/k norms, the
    layer's sliding window)."""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.scale = c.head_dim**-0.5
        self.sliding_window = c.layer_sliding_window(layer)
        self.qkv_proj = Linear(c.hidden_size, self.q_size + 2 * self.kv_size, c.attention_bias, dtype, device)
        self.o_proj = Linear(self.q_size, c.hidden_size, c.o_proj_bias, dtype, device)
        self.q_norm = self.k_norm = None
        if c.qk_norm:  # Qwen3
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, device)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden]; rope = (cos, sin) of each token's position, from RotaryEmbedding."""
        T, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        # Views, no copies: q and k heads side by side [T, Hq + Hkv, D], v after them.
        qk = qkv[:, :qk_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
        v = qkv[:, qk_size:].view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm, separate weights for q and k
            qk = torch.cat((self.q_norm(qk[:, : self.num_heads]), self.k_norm(qk[:, self.num_heads :])), dim=1)
        qk = apply_rotary(qk, *rope)  # q and k rotated together: one set of elementwise ops
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        k_cache, v_cache = kv_cache
        (meta.write_kv_op or kernels.write_kv)(k, v, k_cache, v_cache, meta.slot_mapping)
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
        )
        return self.o_proj(o.reshape(T, self.q_size))
