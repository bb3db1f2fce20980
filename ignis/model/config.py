"""The architecture description every loader produces and the forward consumes.

One flat dataclass covers every family (ignis/model/families/): a family's parser fills
the switches its architecture needs and leaves the rest at their Llama defaults. The
decoder layer each family builds reads them (ignis/model/decoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Where a layer's RMSNorms sit:
#   pre       x + attn(norm(x)); x + mlp(norm(x))                         (Llama, Qwen, Phi-3, Granite)
#   sandwich  x + norm(attn(norm(x))); x + norm(mlp(norm(x)))             (Gemma 2, Gemma 3)
#   post      x + norm(attn(x)); x + norm(mlp(x))                         (OLMo 2)
NormLayout = Literal["pre", "sandwich", "post"]
# Which q/k RMSNorm a layer has: none, over each head (Qwen3, Gemma 3) or over the whole
# projection before it is split into heads (OLMo 2).
QKNorm = Literal["none", "head", "projection"]
# swiglu_oai (gpt-oss's experts): (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")


def _family_names() -> tuple[str, ...]:
    from ignis.model.families import FAMILY_NAMES

    return FAMILY_NAMES


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint's architecture hyper-parameters. (The `model.*` configuration keys
    are ignis.config.ModelSettings.)"""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Normalised form: {"rope_type": "linear"|"dynamic"|"llama3"|"yarn"|"freq_factors", ...}
    # with the same keys transformers uses; None means plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2 always; Llama when attention_bias)
    o_proj_bias: bool = False  # Llama's attention_bias also puts a bias on o_proj
    mlp_bias: bool = False
    qk_norm: bool = False  # an RMSNorm on q and k before RoPE (qk_norm_scope says over what)
    qk_norm_scope: QKNorm = "head"
    sliding_window: int | None = None  # only set when the checkpoint enables it
    # Per-layer "full_attention" / "sliding_attention"; None = all layers alike.
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # -- family switches (defaults: Llama's) --
    hidden_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu_tanh (GeGLU)
    norm_layout: NormLayout = "pre"
    # Gemma's norms scale by (1 + w); the loaders add the 1 (as llama.cpp's converter does).
    norm_offset: float = 0.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    embedding_scale: float | None = None  # Gemma: sqrt(hidden); Granite: embedding_multiplier
    residual_scale: float = 1.0  # Granite: x + residual_multiplier * block(x)
    logits_divisor: float = 1.0  # Granite: logits / logits_scaling
    # Sliding-window layers with their own RoPE base (Gemma 3: 10k locally, 1M globally).
    local_rope_theta: float | None = None
    # Mixture of experts (0 experts: a dense MLP). moe_layers: which layers route (None: all).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the chosen experts' weights to sum to 1
    moe_layers: tuple[bool, ...] | None = None
    # gpt-oss: the router's and each expert's biases; its router takes the top k logits and
    # softmaxes just those (router_softmax_first False) instead of softmax, top k, renormalise.
    router_bias: bool = False
    expert_bias: bool = False
    router_softmax_first: bool = True
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    # The experts held as the checkpoint's MXFP4 blocks (gpt-oss's HF directories), never
    # widened: layers.Experts keeps *_blocks / *_scales in place of the dense tensors.
    experts_mxfp4: bool = False
    # gpt-oss: one learned logit per query head that joins every softmax's denominator.
    attention_sinks: bool = False

    def __post_init__(self) -> None:
        families = _family_names()
        if self.family not in families:
            raise ValueError(f"unsupported model family {self.family!r}; expected one of {families}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError("layer_types must list one entry per layer")
        if self.hidden_act not in ACTIVATIONS:
            raise NotImplementedError(f"activation {self.hidden_act!r} is not supported (supported: {ACTIVATIONS})")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.num_experts_per_tok}")
        if self.moe_layers is not None and len(self.moe_layers) != self.num_layers:
            raise ValueError("moe_layers must list one entry per layer")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        return self.is_moe and (self.moe_layers is None or self.moe_layers[layer])

    def layer_sliding_window(self, layer: int) -> int | None:
        """The attention window of one layer (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def layer_rope(self, layer: int) -> str:
        """Which RoPE table a layer reads: "local" (sliding layers with their own base) or "global"."""
        if self.local_rope_theta is not None and self.layer_sliding_window(layer) is not None:
            return "local"
        return "global"
