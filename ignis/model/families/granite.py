"""Granite: the Llama block with four multipliers: embeddings (embedding_multiplier), each
residual branch (residual_multiplier), the attention scale (attention_multiplier, instead
of head_dim ** -0.5) and the logits (divided by logits_scaling).

GGUF "granite": Q/K rows permuted as "llama"'s; the multipliers as embedding_scale,
residual_scale, attention.scale and logit_scale."""

from __future__ import annotations

from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import Family, GGUFMeta, gguf_common, hf_common


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **hf_common(cfg, generation, "granite"),
        attention_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        embedding_scale=float(cfg.get("embedding_multiplier", 1.0)),
        residual_scale=float(cfg.get("residual_multiplier", 1.0)),
        attention_scale=float(cfg.get("attention_multiplier", 1.0)),
        logits_divisor=float(cfg.get("logits_scaling", 1.0)),
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = gguf_common(meta, "granite")
    scale = meta.arch_key("attention.scale")
    return ModelConfig(
        **kwargs,
        embedding_scale=float(meta.arch_key("embedding_scale", 1.0)),
        residual_scale=float(meta.arch_key("residual_scale", 1.0)),
        attention_scale=float(scale) if scale else None,
        logits_divisor=float(meta.arch_key("logit_scale", 1.0)),
    )


FAMILY = Family(name="granite", hf_config=hf_config, gguf_config=gguf_config, gguf_rope_permuted=True)
