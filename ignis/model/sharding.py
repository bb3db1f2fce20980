"""Megatron-style tensor-parallel shards of a Transformer, one per rank.

    plan = plan_shard(config, rank, world)            # raises ValueError when it cannot shard
    shard = build_shard(config, checkpoint_weights, rank, world, all_reduce, dtype=..., device=...)

- q|k|v and gate|up are column-parallel: each rank keeps its heads' rows (q heads split
  evenly; KV heads split when there are at least `world` of them, otherwise each rank keeps
  the one KV head its q heads read, so KV heads are replicated) and its slice of the
  intermediate rows.
- o_proj and down_proj are row-parallel: each rank keeps its input columns, and one
  all-reduce sums the partial outputs (their bias is kept on rank 0 only, zero elsewhere).
- The LM head is vocab-parallel: each rank keeps ceil(V / world) rows (the last padded with
  zeros); the engine gathers the logits where the sampler runs and trims the padding.
- Embedding and norms are replicated. Each shard is an ordinary Transformer over a config
  with fewer heads and a narrower MLP, so the kernels, the KV cache (sharded by heads) and
  the CPU weight packing run on it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
from torch import nn

from ignis.model.config import ModelConfig
from ignis.model.families import family
from ignis.model.layers import Linear
from ignis.model.transformer import Transformer, WeightCoverage

AllReduce = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over the ranks, in place


@dataclass(frozen=True)
class ShardPlan:
    """What rank `rank` of `world` keeps."""

    rank: int
    world: int
    q_heads: range  # its query heads
    kv_heads: range  # its KV heads (one shared head when KV heads are replicated)
    intermediate: range  # its MLP rows (gate and up), columns of down_proj
    vocab: range  # its LM-head rows, within the padded vocabulary
    padded_vocab: int  # world * len(vocab) >= the vocabulary

    def config(self, full: ModelConfig) -> ModelConfig:
        """The shard's architecture: fewer heads, a narrower MLP; vocabulary and hidden size
        as the full model's (the embedding is replicated). tie_word_embeddings only spares
        allocating a full head: build_shard gives the shard its slice of the head instead."""
        return replace(full, num_heads=len(self.q_heads), num_kv_heads=len(self.kv_heads),
                       intermediate_size=len(self.intermediate), tie_word_embeddings=True)


def plan_shard(config: ModelConfig, rank: int, world: int) -> ShardPlan:
    """Rank `rank`'s part of `config` over `world` ranks; ValueError (saying which sizes)
    when the heads or the MLP do not split, or the family has no plan."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} ranks")
    fam = family(config.family)
    if world > 1 and fam.tp_plan is None:
        raise ValueError(f"engine.tensor_parallel_size={world}: {fam.tp_refusal or f'no plan for {fam.name}'}")
    h, kv, inter = config.num_heads, config.num_kv_heads, config.intermediate_size
    problems = []
    if h % world:
        problems.append(f"attention heads ({h})")
    if kv % world and world % kv:
        problems.append(f"KV heads ({kv}; fewer than the ranks is fine when they divide the ranks)")
    if inter % world:
        problems.append(f"MLP intermediate size ({inter})")
    if problems:
        raise ValueError(
            f"engine.tensor_parallel_size={world} must divide the model's " + ", ".join(problems)
        )
    hq = h // world
    if kv >= world:
        kv_heads = range(rank * kv // world, (rank + 1) * kv // world)
    else:  # replicated: ranks r*kv//world share KV head ... (their q heads all read it)
        one = rank * kv // world
        kv_heads = range(one, one + 1)
    vocab = -(-config.vocab_size // world)
    ni = inter // world
    return ShardPlan(
        rank=rank,
        world=world,
        q_heads=range(rank * hq, (rank + 1) * hq),
        kv_heads=kv_heads,
        intermediate=range(rank * ni, (rank + 1) * ni),
        vocab=range(rank * vocab, (rank + 1) * vocab),
        padded_vocab=vocab * world,
    )


class RowParallelLinear(nn.Module):
    """A row-parallel projection: this rank's partial product, summed over the ranks."""

    def __init__(self, linear: Linear, all_reduce: AllReduce) -> None:
        super().__init__()
        self.linear = linear
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(self.linear(x))


def _rows(t: torch.Tensor, rows: range) -> torch.Tensor:
    return t[rows.start : rows.stop]


def _head_rows(t: torch.Tensor, heads: range, head_dim: int) -> torch.Tensor:
    return t[heads.start * head_dim : heads.stop * head_dim]


@torch.no_grad()
def build_shard(config: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]], rank: int, world: int,
                all_reduce: AllReduce, *, dtype: torch.dtype, device: torch.device | str) -> Transformer:
    """Rank `rank`'s shard, filled from a checkpoint's (name, tensor) pairs (transformers'
    unfused names, as Transformer.load_weights takes them). Only the shard is allocated on
    `device`: each tensor is cut on its own device (the loaders' CPU) and just the rank's
    slice is copied over. `all_reduce` joins the row-parallel projections."""
    plan = plan_shard(config, rank, world)
    shard = Transformer(plan.config(config), dtype=dtype, device=device)
    # The vocab-parallel head replaces the tied one the shard's config allocated (none).
    head = torch.zeros(len(plan.vocab), config.hidden_size, dtype=dtype, device=device)
    own = range(plan.vocab.start, min(plan.vocab.stop, config.vocab_size))
    targets = shard.weight_targets()
    coverage = WeightCoverage(shard)
    seen: set[str] = set()
    for name, tensor in weights:
        if name == "lm_head.weight" or (name == "embed_tokens.weight" and config.tie_word_embeddings):
            if not (name == "lm_head.weight" and config.tie_word_embeddings):  # tied: the embedding wins
                head[: len(own)].copy_(tensor[own.start : own.stop])
                seen.add("lm_head.weight")
            if name == "lm_head.weight":
                continue
        target = targets.get(name)
        if target is None:
            raise KeyError(f"unexpected weight {name!r} for a {config.family} model")
        piece = _slice(name, tensor, config, plan)
        if tuple(piece.shape) != tuple(target.shape):
            raise ValueError(f"{name}: expected shape {tuple(target.shape)} for rank {rank}, got {tuple(piece.shape)}")
        target.copy_(piece)
        seen.add(name)
        coverage.add(name, target)
    if "lm_head.weight" not in seen:
        raise KeyError("1 weights missing from the checkpoint, e.g. ['lm_head.weight']")
    coverage.check()
    shard.lm_head = nn.Parameter(head, requires_grad=False)
    for layer in shard.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, all_reduce)
        layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj, all_reduce)
    shard.tp_plan = plan  # type: ignore[attr-defined]
    return shard.eval()


_LAYER_PART = re.compile(r"^layers\.\d+\.(.+)\.(weight|bias)$")


def _slice(name: str, t: torch.Tensor, c: ModelConfig, plan: ShardPlan) -> torch.Tensor:
    """This rank's part of checkpoint tensor `name` by the family's tp_plan (a view; the
    whole tensor when replicated). The kinds:
      q_heads / kv_heads   column-parallel: the rank's heads' rows (weight and bias)
      mlp_rows             column-parallel: the rank's intermediate rows
      qkv_fused            a checkpoint's fused q|k|v: each part's rows, joined
      gate_up_fused        a checkpoint's fused gate|up: each half's rows, joined
      row_heads / row_mlp  row-parallel: the rank's input columns; the bias on rank 0 only
    anything else (embedding, norms) is replicated."""
    m = _LAYER_PART.match(name)
    kind = (family(c.family).tp_plan or {}).get(m.group(1)) if m else None
    if kind is None:
        return t
    d, is_bias = c.head_dim, m.group(2) == "bias"
    if kind == "q_heads":
        return _head_rows(t, plan.q_heads, d)
    if kind == "kv_heads":
        return _head_rows(t, plan.kv_heads, d)
    if kind == "mlp_rows":
        return _rows(t, plan.intermediate)
    if kind == "qkv_fused":
        q, k, v = t.split((c.q_size, c.kv_size, c.kv_size))
        return torch.cat((_head_rows(q, plan.q_heads, d), _head_rows(k, plan.kv_heads, d),
                          _head_rows(v, plan.kv_heads, d)))
    if kind == "gate_up_fused":
        gate, up = t.chunk(2)
        return torch.cat((_rows(gate, plan.intermediate), _rows(up, plan.intermediate)))
    if kind in ("row_heads", "row_mlp"):
        if is_bias:  # the all-reduce sums every rank's output: the bias is added once, by rank 0
            return t if plan.rank == 0 else torch.zeros_like(t)
        cols = range(plan.q_heads.start * d, plan.q_heads.stop * d) if kind == "row_heads" else plan.intermediate
        return t[:, cols.start : cols.stop]
    raise ValueError(f"unknown tensor-parallel kind {kind!r} for {name}")


def shard_parameter_bytes(config: ModelConfig, rank: int, world: int, dtype: torch.dtype) -> int:
    """Bytes of rank `rank`'s shard parameters (what build_shard allocates), from the plan alone."""
    plan = plan_shard(config, rank, world)
    local = plan.config(config)
    h, d = config.hidden_size, config.head_dim
    qkv = (local.num_heads + 2 * local.num_kv_heads) * d
    per_layer = (qkv * h + h * local.num_heads * d  # q|k|v rows, o_proj columns
                 + 3 * local.intermediate_size * h  # gate|up rows, down_proj columns
                 + 2 * h)  # the two norms
    if config.attention_bias:
        per_layer += qkv
    if config.o_proj_bias:
        per_layer += h
    if config.mlp_bias:
        per_layer += 2 * local.intermediate_size + h
    if config.qk_norm:
        per_layer += 2 * d
    total = config.num_layers * per_layer + config.vocab_size * h + len(plan.vocab) * h + h
    return total * torch.empty((), dtype=dtype).element_size()
__all__ = ["AllReduce", "RowParallelLinear", "ShardPlan", "build_shard", "plan_shard", "shard_parameter_bytes"]
