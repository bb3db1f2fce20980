"""Qwen3-MoE: Qwen3's attention (q/k norms per head) with a sparse mixture of experts on the
layers that route (every decoder_sparse_step-th layer not in mlp_only_layers), a dense
SwiGLU MLP on the others. Softmax over all experts, the top k, renormalised when
norm_topk_prob.

GGUF "qwen3moe": the router as ffn_gate_inp, the experts stacked as ffn_{gate,up,down}_exps."""

from __future__ import annotations

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

MOE_TP_REFUSAL = "tensor parallelism is not planned for mixtures of experts yet"


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = hf_common(cfg, generation, "qwen3_moe")
    n = kwargs["num_layers"]
    step, dense = int(cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or ())
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts"))
    bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        **kwargs,
        **hf_window(cfg, n, enabled=bool(cfg.get("use_sliding_window", False))),
        attention_bias=bias,
        o_proj_bias=bias,
        qk_norm=True,
        num_experts=experts,
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n)),
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = gguf_common(meta, "qwen3_moe")
    n = kwargs["num_layers"]
    moe = gguf_moe(meta)
    return ModelConfig(
        **kwargs,
        **moe,
        moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in meta.tensors for i in range(n)),
    )


FAMILY = Family(
    name="qwen3_moe",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors={**STANDARD_GGUF, **MOE_GGUF},
    tp_plan=None,
    tp_refusal=MOE_TP_REFUSAL,
)
