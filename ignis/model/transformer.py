"""The decoder-only transformer (Llama / Qwen2 / Qwen3) over a flat ragged batch.

    hidden = model(input_ids [T], positions [T], kv_caches, meta)   # [T, hidden], final-normed
    logits = model.compute_logits(hidden, indices)                   # [N, vocab] fp32

Every sequence of the step is concatenated along T; `meta` says where each one starts
and where its keys/values live in the paged cache. No Python loop over tokens or
sequences and no host synchronisation here (the kernels own that).

Parameter names follow transformers' (minus the "model." prefix) except the fused
projections `self_attn.qkv_proj` and `mlp.gate_up_proj`; `load_weights` takes the
unfused names and copies each tensor into its slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCache, KVCaches
from ignis.model.layers import MLP, Attention, RMSNorm, empty_param
from ignis.model.rope import Rope, RotaryEmbedding


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.self_attn = Attention(c, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype, device)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, c.mlp_bias, dtype, device)

    def forward(self, x: torch.Tensor, rope: Rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(
        self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.rotary = RotaryEmbedding(config, dtype, device)
        self.embed_tokens = empty_param(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, device) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        # A tied head is the embedding tensor itself, not a copy.
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else empty_param(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        )
        # Packed weight forms (ignis/model/packed.py) replace the embedding lookup and the
        # head's GEMM with ops over their own compact tensors; None = the plain tensors.
        self.embed_op: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.head_op: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.weight_form = "float32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device  # the embedding may be shape-only (packed forms)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: KVCaches, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens) if self.embed_op is None else self.embed_op(input_ids)
        rope = self.rotary(positions)  # one table lookup shared by every layer
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, kv_cache, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [N, vocab] at rows `indices` of `hidden` (all rows when None)."""
        if indices is not None:
            hidden = hidden[indices]
        if self.head_op is not None:
            return self.head_op(hidden).float()
        return F.linear(hidden, self.lm_head).float()

    # -- loading -----------------------------------------------------------------

    def weight_targets(self) -> dict[str, torch.Tensor]:
        """Checkpoint name (transformers' unfused names, no "model." prefix) -> the parameter,
        or the row slice of a fused parameter, that the checkpoint tensor fills."""
        c = self.config
        targets: dict[str, torch.Tensor] = {"embed_tokens.weight": self.embed_tokens}
        if not c.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head
        for name, param in self.named_parameters():
            if name not in ("embed_tokens", "lm_head") and ".qkv_proj." not in name and ".gate_up_proj." not in name:
                targets[name] = param
        qkv = (("q_proj", 0, c.q_size), ("k_proj", c.q_size, c.kv_size), ("v_proj", c.q_size + c.kv_size, c.kv_size))
        gate_up = (("gate_proj", 0, c.intermediate_size), ("up_proj", c.intermediate_size, c.intermediate_size))
        for i, layer in enumerate(self.layers):
            for fused, parts, prefix in (
                (layer.self_attn.qkv_proj, qkv, f"layers.{i}.self_attn"),
                (layer.mlp.gate_up_proj, gate_up, f"layers.{i}.mlp"),
            ):
                for part, offset, rows in parts:
                    targets[f"{prefix}.{part}.weight"] = fused.weight[offset : offset + rows]
                    if fused.bias is not None:
                        targets[f"{prefix}.{part}.bias"] = fused.bias[offset : offset + rows]
        return targets

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, tensor) pairs into the parameters (see weight_targets), converting
        dtype and device on the way. Raises on an unknown name, a shape mismatch, or a
        parameter the checkpoint left unset."""
        targets = self.weight_targets()
        seen: set[str] = set()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still store the head; the embedding wins
            target = targets.get(name)
            if target is None:
                raise KeyError(f"unexpected weight {name!r} for a {self.config.family} model")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"{name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            target.copy_(tensor)
            seen.add(name)
        missing = sorted(set(targets) - seen)
        if missing:
            raise KeyError(f"{len(missing)} weights missing from the checkpoint, e.g. {missing[:6]}")
