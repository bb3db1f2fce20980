"""Llama (and Mistral, whose config.json says "mistral": the same block, optionally windowed).

HF: q/k/v/o biases with attention_bias, MLP biases with mlp_bias. GGUF "llama": Q/K rows
permuted by llama.cpp's converter for its interleaved RoPE (undone at load).
"""

from __future__ import annotations

from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    Family,
    GGUFMeta,
    gguf_common,
    hf_common,
    hf_window,
)


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = hf_common(cfg, generation, "llama")
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **kwargs,
        **hf_window(cfg, kwargs["num_layers"]),
        attention_bias=bias,
        o_proj_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    return ModelConfig(**gguf_common(meta, "llama"))


FAMILY = Family(
    name="llama",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_rope_permuted=True,
)
