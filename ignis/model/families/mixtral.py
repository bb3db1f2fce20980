"""Mixtral: the Llama (Mistral) attention with a sparse mixture of experts in every layer:
softmax over the experts, the top k renormalised. HF names the block block_sparse_moe and
each expert's projections w1 (gate), w3 (up), w2 (down); GGUF writes it as "llama" with
ffn_gate_inp and the stacked ffn_*_exps (Q/K rows permuted as llama's)."""

from __future__ import annotations

import re
from typing import Any

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    MOE_GGUF,
    STANDARD_GGUF,
    Family,
    GGUFMeta,
    gguf_common,
    gguf_moe,
    hf_common,
    hf_window,
)
from ignis.model.families.qwen3_moe import MOE_TP_REFUSAL

_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w([123])\.")
_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}


def hf_rename(name: str) -> str:
    name = _EXPERT.sub(lambda m: f".mlp.experts.{m.group(1)}.{_PROJ[m.group(2)]}.", name)
    return name.replace(".block_sparse_moe.gate.", ".mlp.gate.")


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = hf_common(cfg, generation, "mixtral")
    return ModelConfig(
        **kwargs,
        **hf_window(cfg, kwargs["num_layers"]),
        num_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=kwargs["intermediate_size"],
        norm_topk_prob=True,
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = gguf_common(meta, "mixtral")
    moe = gguf_moe(meta)
    kwargs["intermediate_size"] = kwargs["intermediate_size"] or moe["moe_intermediate_size"]
    return ModelConfig(**kwargs, **moe)


FAMILY = Family(
    name="mixtral",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors={**STANDARD_GGUF, **MOE_GGUF},
    gguf_rope_permuted=True,
    hf_rename=hf_rename,
    tp_plan=None,
    tp_refusal=MOE_TP_REFUSAL,
)
