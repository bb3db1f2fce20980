"""gpt-oss (OpenAI's open-weight models): GQA attention with q/k/v/o biases and a learned
sink logit per query head, sliding-window (128) layers alternating with full ones (layer
0 windowed), YaRN RoPE (not truncated), and a mixture of experts in every layer: a router
with a bias, the top k logits softmaxed, experts with biases and a clamped SwiGLU
(ModelConfig.swiglu_alpha / swiglu_limit).

HF names the router mlp.router and stacks the experts as transformers' parameters:
gate_up_proj [E, H, 2I] with gate and up columns interleaved (x @ W), down_proj [E, I, H];
they are turned into ignis's [E, 2I, H] (gate rows first) and [E, H, I] here. The released
checkpoints hold them as MXFP4 (*_blocks [E, N, K/32, 16], *_scales [E, N, K/32], rows
already [E, N, K]): kept so (ModelConfig.experts_mxfp4), the gate|up rows de-interleaved.
GGUF "gpt-oss" (llama.cpp): post_attention_norm, attn_sinks, ffn_gate_inp (+ bias), the
experts already split and stacked as ffn_{gate,up,down}_exps (+ biases); a window period
of 2 unless the file lists the layers.
"""

from __future__ import annotations

from typing import Any

import torch

from ignis.model.config import ModelConfig
from ignis.model.families.base import (
    MOE_GGUF,
    STANDARD_GGUF,
    Family,
    GGUFMeta,
    gguf_common,
    gguf_window,
    hf_common,
    hf_window,
)
from ignis.model.families.qwen3_moe import MOE_TP_REFUSAL

GPT_OSS_GGUF = {
    **{k: v for k, v in STANDARD_GGUF.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",
    **MOE_GGUF,
}
# The model card's clamped SwiGLU (transformers' GptOssConfig defaults; llama.cpp hard-codes them).
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """gate, up, gate, up, ... along dim 1 -> all gates, then all ups."""
    return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1).contiguous()


def hf_rename(name: str) -> str:
    return name.replace(".mlp.router.", ".mlp.gate.")


def hf_transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name.endswith("mlp.experts.gate_up_proj"):  # [E, H, 2I] interleaved -> [E, 2I, H]
        return _deinterleave(tensor.transpose(1, 2))
    if name.endswith(("mlp.experts.gate_up_proj_bias", "mlp.experts.gate_up_proj_blocks",
                      "mlp.experts.gate_up_proj_scales")):  # [E, 2I, ...] rows interleaved
        return _deinterleave(tensor)
    if name.endswith("mlp.experts.down_proj"):  # [E, I, H] -> [E, H, I]
        return tensor.transpose(1, 2).contiguous()
    return tensor


def _arch() -> dict[str, Any]:
    """What every gpt-oss has, whichever file it comes from."""
    return dict(
        attention_bias=True,
        o_proj_bias=True,
        attention_sinks=True,
        hidden_act="swiglu_oai",
        router_bias=True,
        expert_bias=True,
        router_softmax_first=False,
        moe_layers=None,
    )


def hf_config(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    kwargs = {**hf_common(cfg, generation, "gpt_oss"), **_arch()}
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, "mxfp4"):
        raise NotImplementedError(f"gpt-oss quantized as {quant!r} is not supported (its own MXFP4, or dense)")
    n = kwargs["num_layers"]
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts"))
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token"))
    return ModelConfig(
        **kwargs,
        **hf_window(cfg, n),
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=kwargs["intermediate_size"],
        swiglu_alpha=float(cfg.get("swiglu_alpha", SWIGLU_ALPHA)),
        swiglu_limit=float(cfg.get("swiglu_limit", SWIGLU_LIMIT)),
        experts_mxfp4=quant == "mxfp4",
    )


def gguf_config(meta: GGUFMeta) -> ModelConfig:
    kwargs = {**gguf_common(meta, "gpt_oss"), **_arch()}
    n = kwargs["num_layers"]
    scaling = kwargs["rope_scaling"]
    if scaling is not None and scaling["rope_type"] == "yarn":
        # The model card's YaRN: transformers' defaults for the betas, the ramp not truncated.
        scaling = {**scaling, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    inter = int(meta.arch_key("expert_feed_forward_length") or meta.tensors["blk.0.ffn_gate_exps.weight"].shape[1])
    kwargs.update(rope_scaling=scaling, intermediate_size=kwargs["intermediate_size"] or inter)
    return ModelConfig(
        **kwargs,
        **gguf_window(meta, n, 2),
        num_experts=meta.uniform("expert_count"),
        num_experts_per_tok=meta.uniform("expert_used_count"),
        moe_intermediate_size=inter,
    )


FAMILY = Family(
    name="gpt_oss",
    hf_config=hf_config,
    gguf_config=gguf_config,
    gguf_tensors=GPT_OSS_GGUF,
    gguf_params=frozenset({"attn_sinks"}),
    hf_rename=hf_rename,
    hf_transform=hf_transform,
    tp_plan=None,
    tp_refusal=MOE_TP_REFUSAL,
    chat_template="harmony",
)
