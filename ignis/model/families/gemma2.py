"""Gemma 2: sandwich norms (before and after attention and MLP), GeGLU, embeddings scaled by
sqrt(hidden), RMSNorms scaling by (1 + w), attention scaled by query_pre_attn_scalar ** -0.5,
scores and final logits soft-capped, sliding-window layers alternating with full ones.

GGUF "gemma2" (llama.cpp): norms stored as 1 + w already, the head tied, every other layer
windowed (4096 unless the file says), the 27B's scale from hidden / heads.
"""

from __future__ import annotations

import math
from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    STANDARD_GGUF,
    Family,
    GGUFMeta,
    gguf_common,
    gguf_window,
    hf_common,
    hf_window,
    norm_plus_one,
)

# Where Gemma's four norms sit in GGUF.
GEMMA_GGUF = {
    **STANDARD_GGUF,
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def gemma_layer_types(cfg: dict[str, Any], num_layers: int, pattern: int) -> list[str]:
    """config.json's layer_types, or transformers 4's rule: the last of every `pattern` layers
    is full (Gemma 2: pattern 2, the even layers windowed)."""
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or pattern)
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = hf_common(cfg, generation, "gemma2")
    kwargs["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    window = hf_window({**cfg, "layer_types": gemma_layer_types(cfg, kwargs["num_layers"], 2)}, kwargs["num_layers"])
    return ModelConfig(
        **kwargs,
        **window,
        attention_bias=bool(cfg.get("attention_bias", False)),
        norm_layout="sandwich",
        attention_scale=float(cfg.get("query_pre_attn_scalar") or kwargs["head_dim"]) ** -0.5,
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
    )


def gemma_scale(kwargs: dict[str, Any], big: bool) -> float:
    """llama.cpp's attention scale: head_dim ** -0.5, or (hidden / heads) ** -0.5 for the 27B."""
    return (kwargs["hidden_size"] // kwargs["num_heads"] if big else kwargs["head_dim"]) ** -0.5


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = gguf_common(meta, "gemma2")
    kwargs["tie_word_embeddings"] = True
    if meta.arch_key("attention.sliding_window") is None:
        window = {"sliding_window": 4096, "layer_types": tuple(
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(kwargs["num_layers"]))}
    else:
        window = gguf_window(meta, kwargs["num_layers"], 2)
    return ModelConfig(
        **kwargs,
        **window,
        norm_layout="sandwich",
        hidden_act="gelu_tanh",
        attention_scale=gemma_scale(kwargs, big=kwargs["num_layers"] == 46),
        attn_logit_softcap=meta.arch_key("attn_logit_softcapping"),
        final_logit_softcap=meta.arch_key("final_logit_softcapping"),
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
    )


FAMILY = Family(
    name="gemma2",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors=GEMMA_GGUF,
    hf_transform=norm_plus_one,
    chat_template="gemma",
)
