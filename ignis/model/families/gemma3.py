"""Gemma 3 (text): Gemma 2's block without soft-capping, with an RMSNorm over each q and k
head, 5 sliding-window layers to each full one, and the windowed layers on their own RoPE
base (10k; the full ones 1M, optionally scaled).

GGUF "gemma3" (llama.cpp): norms stored as 1 + w, a window period of 6 unless the file
lists the layers, rope.freq_base_swa (default 10k) for the windowed ones.
"""

from __future__ import annotations

import math
from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    Family,
    GGUFMeta,
    gguf_common,
    gguf_window,
    hf_common,
    hf_rope,
    hf_window,
    norm_plus_one,
)
from ignis.model.families.gemma2 import GEMMA_GGUF, gemma_layer_types, gemma_scale


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = hf_common({**cfg, "rope_parameters": None, "rope_scaling": None}, generation, "gemma3")
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one set per layer type
        theta, scaling = hf_rope(cfg, params["full_attention"])
        local_theta, _ = hf_rope(cfg, params.get("sliding_attention") or {"rope_theta": 10000.0})
    else:  # transformers 4: rope_theta + rope_scaling for the full layers, rope_local_base_freq
        theta, scaling = hf_rope(cfg, cfg.get("rope_scaling") or {"rope_theta": cfg.get("rope_theta", 1e6)})
        local_theta = float(cfg.get("rope_local_base_freq", 10000.0))
    kwargs.update(rope_theta=theta, rope_scaling=scaling, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)))
    window = hf_window({**cfg, "layer_types": gemma_layer_types(cfg, kwargs["num_layers"], 6)}, kwargs["num_layers"])
    return ModelConfig(
        **kwargs,
        **window,
        attention_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=True,
        norm_layout="sandwich",
        attention_scale=float(cfg.get("query_pre_attn_scalar") or kwargs["head_dim"]) ** -0.5,
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
        local_rope_theta=local_theta,
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = gguf_common(meta, "gemma3")
    return ModelConfig(
        **kwargs,
        **gguf_window(meta, kwargs["num_layers"], 6),
        norm_layout="sandwich",
        hidden_act="gelu_tanh",
        attention_scale=gemma_scale(kwargs, big=kwargs["num_layers"] == 62),
        final_logit_softcap=meta.arch_key("final_logit_softcapping"),
        embedding_scale=math.sqrt(kwargs["hidden_size"]),
        local_rope_theta=float(meta.arch_key("rope.freq_base_swa", 10000.0)),
    )


FAMILY = Family(
    name="gemma3",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors=GEMMA_GGUF,
    hf_transform=norm_plus_one,
    chat_template="gemma",
)
