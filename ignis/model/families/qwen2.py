"""Qwen2: the Llama block with q/k/v biases always, and a window only when use_sliding_window
says so (on the layers from max_window_layers on)."""

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
    kwargs = hf_common(cfg, generation, "qwen2")
    window = hf_window(cfg, kwargs["num_layers"], enabled=bool(cfg.get("use_sliding_window", False)))
    return ModelConfig(**kwargs, **window, attention_bias=True)


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    return ModelConfig(**gguf_common(meta, "qwen2"))


FAMILY = Family(name="qwen2", hf_config=hf_config, gguf_config=gguf_config)
