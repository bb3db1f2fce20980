"""What a family declares (`Family`), and the config parsing every family shares.

A family's module builds its FAMILY from these pieces: `hf_common` / `gguf_common` read
the keys all decoder-only checkpoints have, and the family adds its own. Names:

  checkpoint names   transformers' (minus "model."); a family renames its own oddities
                     (`hf_rename`, e.g. Mixtral's block_sparse_moe.experts.N.w1 ->
                     mlp.experts.N.gate_proj) and may transform a tensor (`hf_transform`,
                     e.g. Gemma's norms +1, as llama.cpp's converter stores them)
  GGUF names         blk.N.<short>.{weight,bias} -> layers.N.<gguf_tensors[short]>
  fused projections  `packed_modules`: a fused parameter of the model and the checkpoint
                     parts it is cut into (q|k|v, gate|up); the loaders, the packed CPU
                     forms and the sharding walk this map
  tensor parallelism `tp_plan`: how each part is cut across ranks (None: not supported,
                     `tp_refusal` says why)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ignis.model.config import ModelConfig

_ROPE_TYPES = {"default", "linear", "dynamic", "llama3", "yarn"}

# The fused parameters of the standard block and the checkpoint parts of each.
STANDARD_PACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
# Megatron's plan for the standard block (see ignis/model/sharding.py for the kinds).
STANDARD_TP_PLAN = {
    "self_attn.q_proj": "q_heads",
    "self_attn.k_proj": "kv_heads",
    "self_attn.v_proj": "kv_heads",
    "self_attn.o_proj": "row_heads",
    "mlp.gate_proj": "mlp_rows",
    "mlp.up_proj": "mlp_rows",
    "mlp.down_proj": "row_mlp",
}
# GGUF block tensors of the standard (pre-norm) block.
STANDARD_GGUF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# A mixture of experts in GGUF: the router and each projection stacked over the experts.
MOE_GGUF = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


@dataclass(frozen=True)
class Family:
    name: str
    hf_config: Callable[[dict[str, Any], dict[str, Any] | None], ModelConfig]
    gguf_config: Callable[[Any], ModelConfig]
    gguf_tensors: dict[str, str] = field(default_factory=lambda: dict(STANDARD_GGUF))
    # GGUF block tensors that are a bare parameter, named without the ".weight" suffix
    # (gpt-oss's attn_sinks -> layers.N.self_attn.sinks).
    gguf_params: frozenset[str] = frozenset()
    # llama.cpp permutes Q/K rows for its interleaved RoPE in these files (see gguf_loader).
    gguf_rope_permuted: bool = False
    hf_rename: Callable[[str], str] | None = None
    hf_transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None
    packed_modules: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(STANDARD_PACKED))
    tp_plan: dict[str, str] | None = field(default_factory=lambda: dict(STANDARD_TP_PLAN))
    tp_refusal: str = ""
    # The chat template this family stands for, used when a checkpoint ships none
    # (ignis/model/chat_template.py FAMILY_TEMPLATES); None: ChatML.
    chat_template: str | None = None


# -- shared parsing ------------------------------------------------------------------------


def ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def hf_rope(cfg: dict[str, Any], params: dict[str, Any] | None = None) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, normalised rope_scaling or None) from either config.json generation
    (transformers 4: rope_theta + rope_scaling; 5: rope_parameters); `params` overrides
    where they come from (Gemma 3's per-layer-type parameters)."""
    if params is None:
        params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    params = dict(params)
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in _ROPE_TYPES:
        raise NotImplementedError(f"rope type {kind!r} is not supported (supported: {sorted(_ROPE_TYPES)})")
    if params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1 is not supported")
    params.pop("partial_rotary_factor", None)
    if kind == "default":
        return theta, None
    if kind in ("llama3", "yarn"):
        # transformers falls back to the model's max_position_embeddings here.
        params.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings")),
        )
    return theta, {"rope_type": kind, **params}


def hf_common(cfg: dict[str, Any], generation: dict[str, Any] | None, family: str) -> dict[str, Any]:
    """ModelConfig keyword arguments every family's config.json gives the same way."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)
    num_heads = cfg["num_attention_heads"]
    theta, scaling = hf_rope(cfg)
    generation = generation or {}
    return dict(
        family=family,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=act,
        bos_token_id=generation.get("bos_token_id", cfg.get("bos_token_id")),
        eos_token_ids=ids(generation.get("eos_token_id")) or ids(cfg.get("eos_token_id")),
    )


def hf_window(cfg: dict[str, Any], num_layers: int, *, enabled: bool = True) -> dict[str, Any]:
    """sliding_window and layer_types (None unless the checkpoint enables a window)."""
    window = cfg.get("sliding_window") if enabled else None
    layer_types = cfg.get("layer_types")
    if window is not None and layer_types is None and "max_window_layers" in cfg:
        layer_types = ["sliding_attention" if i >= cfg["max_window_layers"] else "full_attention"
                       for i in range(num_layers)]
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return {"sliding_window": None, "layer_types": None}
    return {"sliding_window": int(window), "layer_types": tuple(layer_types) if layer_types else None}


class GGUFMeta:
    """A GGUF file's metadata under the architecture's key prefix, and its tensor names."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.arch = self.get("general.architecture")
        self.tensors = {t.name: t for t in reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        f = self.reader.get_field(key)
        return default if f is None else f.contents()

    def arch_key(self, key: str, default: Any = None) -> Any:
        return self.get(f"{self.arch}.{key}", default)

    def uniform(self, key: str, default: Any = None) -> int:
        """An integer key that some converters write per layer; ignis needs it uniform."""
        value = self.arch_key(key, default)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise NotImplementedError(f"per-layer values of {self.arch}.{key} {value} are not supported")
            value = value[0]
        if value is None:
            raise KeyError(f"GGUF metadata {self.arch}.{key} is missing")
        return int(value)

    def has_block_tensor(self, short: str) -> bool:
        return f"blk.0.{short}.weight" in self.tensors or f"blk.0.{short}.bias" in self.tensors


def gguf_common(meta: GGUFMeta, family: str) -> dict[str, Any]:
    """ModelConfig keyword arguments every family's GGUF gives the same way."""
    import gguf
    import numpy as np

    hidden = meta.uniform("embedding_length")
    num_heads = meta.uniform("attention.head_count")
    num_kv_heads = meta.uniform("attention.head_count_kv", num_heads)
    head_dim = meta.uniform("attention.key_length", hidden // num_heads)
    vocab = meta.arch_key("vocab_size")
    if vocab is None:  # older files: the embedding's row count (GGUF shapes are reversed)
        vocab = int(meta.tensors["token_embd.weight"].shape[-1])

    scaling: dict[str, Any] | None = None
    kind = meta.arch_key("rope.scaling.type", "none")
    factor = meta.arch_key("rope.scaling.factor")
    original = meta.arch_key("rope.scaling.original_context_length")
    if kind == "linear" and factor:
        scaling = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn" and factor:
        scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    elif kind not in ("none", "linear", "yarn"):
        raise NotImplementedError(f"GGUF rope scaling {kind!r} is not supported")
    if "rope_freqs.weight" in meta.tensors:  # llama3-style scaling baked into per-frequency divisors
        t = meta.tensors["rope_freqs.weight"]
        factors = gguf.quants.dequantize(t.data, t.tensor_type)
        scaling = {"rope_type": "freq_factors", "factors": [float(x) for x in np.asarray(factors).ravel()]}

    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return dict(
        family=family,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=meta.uniform("block_count"),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=meta.uniform("feed_forward_length", 0),
        rms_norm_eps=float(meta.arch_key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.arch_key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=meta.uniform("context_length", 2048),
        tie_word_embeddings="output.weight" not in meta.tensors,
        attention_bias="blk.0.attn_q.bias" in meta.tensors,
        o_proj_bias="blk.0.attn_output.bias" in meta.tensors,
        mlp_bias="blk.0.ffn_up.bias" in meta.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in meta.tensors,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=tuple(eos),
    )


def gguf_window(meta: GGUFMeta, num_layers: int, pattern: int | None) -> dict[str, Any]:
    """A GGUF's sliding window and which layers use it, as llama.cpp reads them: an explicit
    per-layer `attention.sliding_window_pattern` array, else a period (the key's integer or
    the family's `pattern`: the last layer of each period is full), else every layer."""
    window = meta.arch_key("attention.sliding_window")
    if not window:
        return {"sliding_window": None, "layer_types": None}
    value = meta.arch_key("attention.sliding_window_pattern", pattern)
    if isinstance(value, list):
        swa = [bool(v) for v in value][:num_layers]
    elif value:
        swa = [i % int(value) < int(value) - 1 for i in range(num_layers)]
    else:
        swa = [True] * num_layers
    return {"sliding_window": int(window),
            "layer_types": tuple("sliding_attention" if s else "full_attention" for s in swa)}


def gguf_moe(meta: GGUFMeta, *, renormalize_default: bool = True) -> dict[str, Any]:
    """Mixture-of-experts keys (none when the file has no expert tensors)."""
    if "blk.0.ffn_gate_exps.weight" not in meta.tensors:
        return {}
    experts = meta.uniform("expert_count")
    inter = meta.arch_key("expert_feed_forward_length")
    if inter is None:  # Mixtral in the llama architecture: the experts are the MLP's width
        inter = int(meta.tensors["blk.0.ffn_gate_exps.weight"].shape[1])
    return dict(
        num_experts=experts,
        num_experts_per_tok=meta.uniform("expert_used_count"),
        moe_intermediate_size=int(inter),
        norm_topk_prob=bool(meta.arch_key("expert_weights_norm", renormalize_default)),
    )


def norm_plus_one(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm scales by (1 + w): stored here as w + 1, as llama.cpp's converter does."""
    return tensor + 1.0 if name.endswith("norm.weight") else tensor

