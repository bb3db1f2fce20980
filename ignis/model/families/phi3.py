"""Phi-3: the Llama block with q|k|v and gate|up stored fused in the checkpoint
(self_attn.qkv_proj, mlp.gate_up_proj) and, in GGUF, as attn_qkv and ffn_up (gate rows
first); a sliding window over every layer when the config sets one. LongRoPE (the 128k
variants) is not supported."""

from __future__ import annotations

from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    STANDARD_GGUF,
    STANDARD_TP_PLAN,
    Family,
    GGUFMeta,
    gguf_common,
    gguf_window,
    hf_common,
)

PHI3_GGUF = {
    **{k: v for k, v in STANDARD_GGUF.items() if k not in ("ffn_gate", "ffn_up")},
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",
}


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type")) in ("longrope", "su"):
        raise NotImplementedError("Phi-3's LongRoPE scaling (the 128k-context variants) is not supported")
    window = cfg.get("sliding_window")
    return ModelConfig(**hf_common(cfg, generation, "phi3"), sliding_window=int(window) if window else None)


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    if "rope_factors_long.weight" in meta.tensors:
        raise NotImplementedError("Phi-3's LongRoPE scaling (the 128k-context variants) is not supported")
    kwargs = gguf_common(meta, "phi3")
    return ModelConfig(**kwargs, **gguf_window(meta, kwargs["num_layers"], None))


FAMILY = Family(
    name="phi3",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors=PHI3_GGUF,
    tp_plan={**STANDARD_TP_PLAN, "self_attn.qkv_proj": "qkv_fused", "mlp.gate_up_proj": "gate_up_fused"},
)
