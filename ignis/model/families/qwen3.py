"""Qwen3: Qwen2's block without the biases, with an RMSNorm over each q and k head."""

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
    kwargs = hf_common(cfg, generation, "qwen3")
    window = hf_window(cfg, kwargs["num_layers"], enabled=bool(cfg.get("use_sliding_window", False)))
    bias = bool(cfg.get("attention_bias", False))  # on q, k, v and o alike
    return ModelConfig(**kwargs, **window, attention_bias=bias, o_proj_bias=bias, qk_norm=True)


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    return ModelConfig(**gguf_common(meta, "qwen3"))


FAMILY = Family(name="qwen3", hf_config=hf_config, gguf_config=gguf_config)
