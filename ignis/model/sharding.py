"""Megatron-style tensor-parallel shards of a Transformer, one per rank.

    plan = plan_shard(config, rank, world)            # raises ValueError when it cannot shard
    shard = shard_transformer(full, rank, world, all_reduce)

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

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from ignis.model.config import ModelConfig
from ignis.model.layers import Linear
from ignis.model.transformer import Transformer

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
        allocating a full head that shard_transformer replaces by its slice at once."""
        return replace(full, num_heads=len(self.q_heads), num_kv_heads=len(self.kv_heads),
                       intermediate_size=len(self.intermediate), tie_word_embeddings=True)


def plan_shard(config: ModelConfig, rank: int, world: int) -> ShardPlan:
    """Rank `rank`'s part of `config` over `world` ranks; ValueError (saying which sizes)
    when the heads or the MLP do not split."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world} ranks")
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
def shard_transformer(full: Transformer, rank: int, world: int, all_reduce: AllReduce) -> Transformer:
    """Rank `rank`'s shard of a loaded dense model (same dtype and device); `all_reduce`
    joins the row-parallel projections. The full model is left as it was."""
    if full.embed_op is not None or full.head_op is not None:
        raise ValueError("tensor parallelism needs dense weights: set model.weight_form=float32")
    c = full.config
    plan = plan_shard(c, rank, world)
    local = plan.config(c)
    device, d = full.device, c.head_dim
    shard = Transformer(local, dtype=full.dtype, device=device)
    shard.embed_tokens.copy_(full.embed_tokens)
    shard.norm.weight.copy_(full.norm.weight)
    head = torch.zeros(len(plan.vocab), c.hidden_size, dtype=full.dtype, device=device)
    own = range(plan.vocab.start, min(plan.vocab.stop, c.vocab_size))
    head[: len(own)] = _rows(full.lm_head, own)
    shard.lm_head = nn.Parameter(head, requires_grad=False)
    for src, dst in zip(full.layers, shard.layers, strict=True):
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
        a, b = src.self_attn, dst.self_attn
        if a.q_norm is not None:
            b.q_norm.weight.copy_(a.q_norm.weight)
            b.k_norm.weight.copy_(a.k_norm.weight)
        # Fused q|k|v rows: this rank's q heads, then its KV heads of k and of v.
        q, k, v = a.qkv_proj.weight.split((c.q_size, c.kv_size, c.kv_size))
        b.qkv_proj.weight.copy_(torch.cat((_head_rows(q, plan.q_heads, d), _head_rows(k, plan.kv_heads, d),
                                           _head_rows(v, plan.kv_heads, d))))
        if a.qkv_proj.bias is not None:
            qb, kb, vb = a.qkv_proj.bias.split((c.q_size, c.kv_size, c.kv_size))
            b.qkv_proj.bias.copy_(torch.cat((_head_rows(qb, plan.q_heads, d), _head_rows(kb, plan.kv_heads, d),
                                             _head_rows(vb, plan.kv_heads, d))))
        cols = slice(plan.q_heads.start * d, plan.q_heads.stop * d)
        b.o_proj.weight.copy_(a.o_proj.weight[:, cols])
        _copy_row_parallel_bias(b.o_proj, a.o_proj, rank)
        b.o_proj = RowParallelLinear(b.o_proj, all_reduce)
        m, n = src.mlp, dst.mlp
        gate, up = m.gate_up_proj.weight.split(c.intermediate_size)
        n.gate_up_proj.weight.copy_(torch.cat((_rows(gate, plan.intermediate), _rows(up, plan.intermediate))))
        if m.gate_up_proj.bias is not None:
            gb, ub = m.gate_up_proj.bias.split(c.intermediate_size)
            n.gate_up_proj.bias.copy_(torch.cat((_rows(gb, plan.intermediate), _rows(ub, plan.intermediate))))
        n.down_proj.weight.copy_(m.down_proj.weight[:, plan.intermediate.start : plan.intermediate.stop])
        _copy_row_parallel_bias(n.down_proj, m.down_proj, rank)
        n.down_proj = RowParallelLinear(n.down_proj, all_reduce)
    shard.tp_plan = plan  # type: ignore[attr-defined]
    return shard.eval()


def _copy_row_parallel_bias(dst: Linear, src: Linear, rank: int) -> None:
    # The all-reduce sums every rank's output: the bias is added once, by rank 0.
    if src.bias is not None:
        assert dst.bias is not None
        dst.bias.copy_(src.bias) if rank == 0 else dst.bias.zero_()


__all__ = ["AllReduce", "RowParallelLinear", "ShardPlan", "plan_shard", "shard_transformer"]
