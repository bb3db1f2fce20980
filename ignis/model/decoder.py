"""The decoder layer every family builds from the shared blocks (ignis/model/layers.py).

Where the norms sit is ModelConfig.norm_layout; the MLP is dense (gated, the family's
activation) or a sparse mixture of experts on the layers that route. Parameter names are
transformers' (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
post_feedforward_layernorm, self_attn.*, mlp.*), so the name maps stay short.
"""

from __future__ import annotations

import torch
from torch import nn

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCache
from ignis.model.layers import MLP, Attention, RMSNorm, SparseMoE
from ignis.model.rope import Rope


def build_mlp(config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    c = config
    if c.layer_is_moe(layer):
        return SparseMoE(c, dtype, device)
    return MLP(c.hidden_size, c.intermediate_size, c.mlp_bias, dtype, device, act=c.hidden_act)


class DecoderLayer(nn.Module):
    """One block: attention then MLP, each with its residual, norms as the layout says:

        pre       x += r * attn(in_norm(x));            x += r * mlp(post_attn_norm(x))
        sandwich  x += post_attn_norm(attn(in_norm(x))); x += post_ffn_norm(mlp(pre_ffn_norm(x)))
        post      x += post_attn_norm(attn(x));          x += post_ffn_norm(mlp(x))

    (r: Granite's residual multiplier, 1 elsewhere.)"""

    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.layout = c.norm_layout
        self.residual_scale = c.residual_scale
        self.rope = c.layer_rope(layer)

        def norm() -> RMSNorm:
            return RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)

        if self.layout in ("pre", "sandwich"):
            self.input_layernorm = norm()
        self.self_attn = Attention(c, layer, dtype, device)
        self.post_attention_layernorm = norm()
        if self.layout == "sandwich":
            self.pre_feedforward_layernorm = norm()
        if self.layout in ("sandwich", "post"):
            self.post_feedforward_layernorm = norm()
        self.mlp = build_mlp(c, layer, dtype, device)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        if self.layout == "pre":
            if self.residual_scale == 1.0:
                x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
                return x + self.mlp(self.post_attention_layernorm(x))
            r = self.residual_scale
            x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta) * r
            return x + self.mlp(self.post_attention_layernorm(x)) * r
        if self.layout == "sandwich":
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, kv_cache, meta))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.post_attention_layernorm(self.self_attn(x, rope, kv_cache, meta))
        return x + self.post_feedforward_layernorm(self.mlp(x))
