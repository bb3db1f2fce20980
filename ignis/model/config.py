"""The architecture description every loader produces and the forward consumes.

One flat dataclass covers the three supported families; they differ only in a few
switches (Qwen2: q/k/v bias, Qwen3: per-head q/k RMSNorm, optional sliding windows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["llama", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """A checkpoint's architecture hyper-parameters. (The `model.*` configuration keys
    are ignis.config.ModelSettings.)"""

    family: Family
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
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim of q and k, before RoPE
    sliding_window: int | None = None  # only set when the checkpoint enables it
    # Per-layer "full_attention" / "sliding_attention"; None = all layers alike.
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unsupported model family {self.family!r}; expected one of {FAMILIES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError("layer_types must list one entry per layer")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_sliding_window(self, layer: int) -> int | None:
        """The attention window of one layer (None: full causal attention)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
