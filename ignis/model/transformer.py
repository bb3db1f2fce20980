"""The decoder-only transformer of every family over a flat ragged batch.

    hidden = model(input_ids [T], positions [T], kv_caches, meta)   # [T, hidden], final-normed
    logits = model.compute_logits(hidden, indices)                   # [N, vocab] fp32

Every sequence of the step is concatenated along T; `meta` says where each one starts
and where its keys/values live in the paged cache. No Python loop over tokens or
sequences and no host synchronisation here (the kernels own that; a mixture of experts
on the CPU loops over the experts some token chose).

Parameter names follow transformers' (minus the "model." prefix) except the fused
projections (the family's `packed_modules`: self_attn.qkv_proj, mlp.gate_up_proj) and
the stacked experts (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
[E, H, I]); `load_weights` takes the checkpoint's names (fused or not, per expert or
stacked) and copies each tensor into its slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.config import ModelConfig
from ignis.model.decoder import DecoderLayer
from ignis.model.families import family
from ignis.model.families.base import Family
from ignis.model.kv_cache import KVCaches
from ignis.model.layers import Experts, Linear, RMSNorm, empty_param
from ignis.model.rope import RotaryEmbedding

__all__ = ["DecoderLayer", "Transformer", "WeightCoverage"]


class Transformer(nn.Module):
    def __init__(
        self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.config = config
        self.family: Family = family(config.family)
        self.dtype = dtype
        self.rotary = RotaryEmbedding(config, dtype, device)  # the full-attention layers' table
        # Sliding-window layers with a RoPE base of their own (Gemma 3) read a second table.
        self.local_rotary = (
            RotaryEmbedding(replace(config, rope_theta=config.local_rope_theta, rope_scaling=None), dtype, device)
            if config.local_rope_theta is not None else None
        )
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

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed_tokens) if self.embed_op is None else self.embed_op(input_ids)
        if self.config.embedding_scale is not None:  # Gemma: sqrt(hidden); Granite: its multiplier
            x = x * self.config.embedding_scale
        return x

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: KVCaches, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        # One table lookup per RoPE table, shared by every layer that reads it.
        ropes = {"global": self.rotary(positions)}
        if self.local_rotary is not None:
            ropes["local"] = self.local_rotary(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, ropes[layer.rope], kv_cache, meta)
        return self.norm(x)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's last step on the head's fp32 output: Granite's divisor, Gemma 2's cap."""
        c = self.config
        if c.logits_divisor != 1.0:
            logits = logits / c.logits_divisor
        if c.final_logit_softcap is not None:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return logits

    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [N, vocab] at rows `indices` of `hidden` (all rows when None)."""
        if indices is not None:
            hidden = hidden[indices]
        if self.head_op is not None:
            return self.finish_logits(self.head_op(hidden).float())
        return self.finish_logits(F.linear(hidden, self.lm_head).float())

    # -- loading -----------------------------------------------------------------

    def fused_linears(self) -> dict[str, tuple[Linear, tuple[tuple[str, int, int], ...]]]:
        """Each fused projection (its name without ".weight") -> (the Linear, its parts as
        (checkpoint name without ".weight", first row, rows)), from the family's
        packed_modules."""
        c = self.config
        sizes = {"self_attn.q_proj": c.q_size, "self_attn.k_proj": c.kv_size, "self_attn.v_proj": c.kv_size,
                 "mlp.gate_proj": c.intermediate_size, "mlp.up_proj": c.intermediate_size}
        modules = dict(self.named_modules())
        fused: dict[str, tuple[Linear, tuple[tuple[str, int, int], ...]]] = {}
        for i in range(c.num_layers):
            for name, parts in self.family.packed_modules.items():
                lin = modules.get(f"layers.{i}.{name}")
                if not isinstance(lin, Linear):
                    continue  # e.g. a mixture-of-experts layer has no gate_up_proj
                spans, row = [], 0
                for part in parts:
                    spans.append((f"layers.{i}.{part}", row, sizes[part]))
                    row += sizes[part]
                fused[f"layers.{i}.{name}"] = (lin, tuple(spans))
        return fused

    def weight_targets(self) -> dict[str, torch.Tensor]:
        """Checkpoint name (no "model." prefix) -> the parameter, or the slice of one, that
        the checkpoint tensor fills. A fused projection is reachable whole and by its
        parts; an MoE layer's experts one by one (mlp.experts.N.gate_proj.weight, HF) and
        stacked (mlp.experts.gate_proj.weight [E, I, H], GGUF)."""
        c = self.config
        targets: dict[str, torch.Tensor] = {"embed_tokens.weight": self.embed_tokens}
        if not c.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head
        for name, param in self.named_parameters():
            if name not in ("embed_tokens", "lm_head"):
                targets[name] = param
        for lin, parts in self.fused_linears().values():
            for part, offset, rows in parts:
                targets[f"{part}.weight"] = lin.weight[offset : offset + rows]
                if lin.bias is not None:
                    targets[f"{part}.bias"] = lin.bias[offset : offset + rows]
        for name, module in self.named_modules():
            if isinstance(module, Experts) and not module.mxfp4:  # (MXFP4 blocks: their own names)
                inter = module.intermediate
                gate_up, down = module.gate_up_proj, module.down_proj
                targets[f"{name}.gate_proj.weight"] = gate_up[:, :inter]
                targets[f"{name}.up_proj.weight"] = gate_up[:, inter:]
                targets[f"{name}.down_proj.weight"] = down
                if module.gate_up_proj_bias is not None:  # GGUF's stacked biases (gpt-oss)
                    targets[f"{name}.gate_proj.bias"] = module.gate_up_proj_bias[:, :inter]
                    targets[f"{name}.up_proj.bias"] = module.gate_up_proj_bias[:, inter:]
                    targets[f"{name}.down_proj.bias"] = module.down_proj_bias
                for e in range(module.num_experts):
                    targets[f"{name}.{e}.gate_proj.weight"] = gate_up[e, :inter]
                    targets[f"{name}.{e}.up_proj.weight"] = gate_up[e, inter:]
                    targets[f"{name}.{e}.down_proj.weight"] = down[e]
        return targets

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, tensor) pairs into the parameters (see weight_targets), converting
        dtype and device on the way. Raises on an unknown name, a shape mismatch, or a
        parameter the checkpoint left (partly) unset."""
        targets = self.weight_targets()
        coverage = WeightCoverage(self)
        seen: set[str] = set()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still store the head; the embedding wins
            target = targets.get(name)
            if target is None:
                raise KeyError(f"unexpected weight {name!r} for a {self.config.family} model")
            if name in seen:
                raise ValueError(f"the checkpoint holds {name!r} twice")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"{name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            target.copy_(tensor)
            seen.add(name)
            coverage.add(name, target)
        coverage.check()


class WeightCoverage:
    """Which parameters a checkpoint has filled, element by element: a fused projection is
    filled whole or by its parts, experts one by one or stacked, so what counts is that
    every parameter was written all over (weight_targets' views say where)."""

    def __init__(self, model: nn.Module) -> None:
        self.owner = {id(p): n for n, p in model.named_parameters()}
        self.sizes = {n: p.numel() for n, p in model.named_parameters()}
        self.written: dict[str, int] = {}

    def add(self, name: str, target: torch.Tensor) -> None:
        base = target._base if target._base is not None else target
        key = self.owner.get(id(base), name)
        self.written[key] = self.written.get(key, 0) + target.numel()

    def check(self, skip: Iterable[str] = ()) -> None:
        """KeyError naming the parameters left (partly) unset; `skip`: parameters filled otherwise."""
        skipped = set(skip)
        missing = sorted(n for n, size in self.sizes.items() if n not in skipped and self.written.get(n, 0) < size)
        if missing:
            raise KeyError(f"{len(missing)} weights missing from the checkpoint, e.g. {missing[:6]}")
