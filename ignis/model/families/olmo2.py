"""OLMo 2: norms after attention and after the MLP only (none before), and an RMSNorm over
the whole q and k projections before they are split into heads.

Tensor parallelism would cut those q/k norms across ranks (their mean spans every head):
not supported."""

from __future__ import annotations

from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    STANDARD_GGUF,
    Family,
    GGUFMeta,
    gguf_common,
    hf_common,
)

OLMO2_GGUF = {
    **{k: v for k, v in STANDARD_GGUF.items() if k not in ("attn_norm", "ffn_norm")},
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    if cfg.get("sliding_window") and any(t == "sliding_attention" for t in cfg.get("layer_types") or ()):
        raise NotImplementedError("OLMo sliding-window layers (OLMo 3) are not supported")
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **hf_common(cfg, generation, "olmo2"),
        attention_bias=bias,
        o_proj_bias=bias,
        qk_norm=True,
        qk_norm_scope="projection",
        norm_layout="post",
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    return ModelConfig(**gguf_common(meta, "olmo2"), qk_norm_scope="projection", norm_layout="post")


FAMILY = Family(
    name="olmo2",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors=OLMO2_GGUF,
    tp_plan=None,
    tp_refusal="OLMo 2 normalises q and k over all heads at once, which tensor parallelism would split",
)
