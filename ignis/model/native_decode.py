"""Decode steps of a packed CPU model through one native call (ignis_kernels/cpu/decode.cpp).

    native = NativeDecoder.build(model)          # None: this model or machine has no native path
    hidden = native(input_ids, positions, kv_caches, slots, block_tables, seq_lens)

A step whose rows each add one token to their own sequence (decode), in a model whose
projections are int4, int5, q8, int4-pair, int8 or mxfp4 GEMMs (the `quantized` form; `mixed`, whose steps
of more than NARROW_ROWS rows go through its oneDNN bf16 GEMMs instead), runs every layer
in C++: same weights, same GEMMs, same fp32 arithmetic as the eager forward
(ignis/model/transformer.py) to float rounding, without its ~40 ATen calls and Python
frames per layer. The op computes the layers of ignis/model/decoder.py with pre or
sandwich norms, SwiGLU or GeGLU, per-head q/k norms, windows with their own RoPE table, a
residual multiplier (Llama, Mistral, Qwen 2/3, Gemma 3, Phi-3, Granite) and mixtures of
experts: the fp32 router (and its bias), top-k routing, each chosen expert's packed GEMMs
(and biases) over its rows, attention sinks and gpt-oss's clamped SwiGLU (Mixtral,
Qwen3-MoE, gpt-oss). `unsupported` says why another model stays eager (soft-capped
scores, post norms, q/k norms over the whole projection). Prefill chunks and other forms
stay eager.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ignis.model.config import ModelConfig
from ignis.model.kv_cache import KVCaches
from ignis.model.layers import MLP, Linear, RMSNorm, SparseMoE
from ignis.model.lm_head import NARROW_ROWS
from ignis.model.transformer import Transformer
from ignis_kernels import cpu_native

if TYPE_CHECKING:  # packed.py imports gguf, which an image without it never needs here
    from ignis.model.packed import PackedLinear

log = logging.getLogger(__name__)


# The wide GEMMs decode.cpp calls, by PackedLinear.form (its `wide_kind` argument).
_WIDE_KINDS = {"bf16": 0, "fp16": 1, "fp32": 2}
# decode.cpp's NarrowKind, Act and Layout.
_INT8, _INT4, _INT4_PAIR, _INT5, _Q8, _MX4, _INT4_K, _INT5_K, _Q6, _STACK = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
_ACTS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}
_LAYOUTS = {"pre": 0, "sandwich": 1}
_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _routing(moe: SparseMoE) -> int:
    """decode.cpp's Routing: softmax then the top k renormalised (0) or not (1); top k then softmax (2)."""
    if not moe.softmax_first:
        return 2
    return 0 if moe.renormalize else 1


def unsupported(c: ModelConfig) -> str | None:
    """Why the native op does not compute this model's layers (None: it does)."""
    if c.norm_layout not in _LAYOUTS:
        return f"{c.norm_layout} norms"
    if c.hidden_act not in _ACTS:
        return f"the {c.hidden_act} activation"
    if c.attn_logit_softcap:
        return "soft-capped attention scores"
    if c.qk_norm and c.qk_norm_scope != "head":
        return "q/k norms over the whole projection"
    if c.residual_scale != 1.0 and c.norm_layout != "pre":
        return "a residual multiplier beside sandwich norms"
    return None


def _split(op: object) -> tuple[PackedLinear | None, PackedLinear | None]:
    """(the int4/int8 GEMM, the mixed form's wide GEMM for wider steps or None); (None, None)
    when the op is neither, or its wide GEMM is one the native op does not call."""
    from ignis.model.packed import (
        Int4Linear, Int4PairLinear, Int5Linear, Int8Linear, MixedLinear, Mx4Linear, Q6Linear, Q8Linear, StackedLinear,
    )

    if isinstance(op, MixedLinear):
        if op.wide.form not in _WIDE_KINDS or getattr(op.wide, "packed", None) is None:
            return None, None
        return _split(op.narrow)[0], op.wide
    if isinstance(op, Int4Linear) and not op.native:
        return None, None
    if isinstance(op, Int4Linear | Int5Linear | Q6Linear | Q8Linear | Int8Linear | Int4PairLinear | Mx4Linear
                  | StackedLinear):
        return op, None
    return None, None


def _kind_and_tensors(g: PackedLinear) -> tuple[int, list[torch.Tensor]]:
    """decode.cpp's NarrowKind of one projection's GEMM and its tensors in the order it reads them."""
    from ignis.model.packed import (
        Int4Linear, Int4PairLinear, Int5Linear, Int8Linear, Mx4Linear, Q6Linear, Q8Linear, StackedLinear,
    )

    if isinstance(g, StackedLinear):  # (kind, rows) per part, then the parts' tensors
        parts = [_kind_and_tensors(op) for op in g.ops]
        meta = torch.tensor([[kind, rows] for (kind, _), rows in zip(parts, g.rows)], dtype=torch.int64)
        return _STACK, [meta] + [t for _, tensors in parts for t in tensors]
    if isinstance(g, Int4PairLinear):
        return _INT4_PAIR, [g.lo.nibbles, *g.lo.scales.tensors, g.hi.nibbles, *g.hi.scales.tensors]
    if isinstance(g, Int5Linear):  # (Q5_K alone: the file's scales, _INT5_K)
        return (_INT5 if g.scales.pairs is not None else _INT5_K), [g.nibbles, g.fifth_bits, *g.scales.tensors]
    if isinstance(g, Q6Linear):
        return _Q6, [g.nibbles, g.high_bits, g.sixteens, g.supers]
    if isinstance(g, Q8Linear):
        return _Q8, [g.q, g.d]
    if isinstance(g, Mx4Linear):
        return _MX4, [g.nibbles, g.exponents]
    if isinstance(g, Int4Linear):
        assert g.native, "an Int4Linear built without the native op (torch's int4 packing)"
        return (_INT4 if g.scales.pairs is not None else _INT4_K), [g.nibbles, *g.scales.tensors]
    assert isinstance(g, Int8Linear)
    return _INT8, [g.weight, g.scale]


class NativeDecoder:
    def __init__(self, model: Transformer, gemms: list[PackedLinear], wide: list[PackedLinear | None]) -> None:
        """gemms: every projection in decode.cpp's order (a dense layer's qkv, o, gate_up,
        down; a mixture's qkv, o, then each expert's gate_up and down); wide: the mixed
        form's kept copies of the dense projections (None for one that keeps none: its
        narrow GEMM has a many-row body), or empty."""
        from ignis.model.gguf_quant import GROUP

        c = model.config
        self.model = model
        # The mixed form's kept GEMMs for steps of more rows: oneDNN bf16, fbgemm fp16 or
        # oneDNN fp32 packed weights, one kind for the whole model.
        # (None: this projection keeps no copy, an empty tensor for the op.)
        self.wide = [_EMPTY if w is None else w.packed for w in wide]
        kinds = {w.form for w in wide if w is not None}
        self.wide_kind = _WIDE_KINDS[kinds.pop()] if kinds else 0
        # Per projection: int4, int5, q6, q8, an int4 pair (5- to 8-bit blocks beside others),
        # mxfp4, a stack of these or torch's int8; a file mixes them (Q4_K_M keeps some tensors at Q6_K, Gemma's
        # files Q5_0 and Q8_0, gpt-oss's MXFP4 experts beside Q8_0).
        self.kinds: list[int] = []
        self.weights: list[torch.Tensor] = []
        for g in gemms:
            kind, tensors = _kind_and_tensors(g)
            self.kinds.append(kind)
            self.weights += tensors
        self.biases: list[torch.Tensor | None] = []
        self.routers: list[torch.Tensor | None] = []
        self.router_biases: list[torch.Tensor | None] = []
        for layer in model.layers:
            self.biases += [_fp32(lin.linear_op.bias) for lin in _linears(layer)]  # the op adds it (lin.bias is None)
            moe = layer.mlp if isinstance(layer.mlp, SparseMoE) else None
            self.routers.append(None if moe is None else _fp32(moe.gate.weight))
            self.router_biases.append(None if moe is None else _fp32(moe.gate.bias))
            if moe is not None:
                ex = moe.experts
                for e in range(ex.num_experts):
                    self.biases += [None if b is None else _fp32(b[e]) for b in (ex.gate_up_proj_bias, ex.down_proj_bias)]
        assert len(self.biases) == len(self.kinds)
        # (empty lists: a model with no mixture, or no sinks)
        self.routers, self.router_biases = _or_empty(self.routers), _or_empty(self.router_biases)
        self.sinks = _or_empty([_fp32(layer.self_attn.sinks) for layer in model.layers])
        self.norms = [n.weight for layer in model.layers for n in _norms(layer)]
        self.norms.append(model.norm.weight)
        self.qk_norms: list[torch.Tensor | None] = []
        if c.qk_norm:
            self.qk_norms = [n.weight for layer in model.layers for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)]
        self._caches: tuple[KVCaches, list[torch.Tensor], list[torch.Tensor]] | None = None
        self.windows = [layer.self_attn.sliding_window or 0 for layer in model.layers]
        self.rope_local = [int(layer.rope == "local") for layer in model.layers]
        # The mixture's routing and activation as its layers hold them (one for all layers).
        mixtures = [layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoE)]
        moe = (1, 0, 0, 1.702, 7.0)
        if mixtures:
            m = mixtures[0]
            moe = (m.top_k, _routing(m), m.experts.intermediate, float(m.alpha), float(m.limit))
        self.args = (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, float(c.rms_norm_eps),
                     float(model.layers[0].self_attn.scale), self.kinds, GROUP, NARROW_ROWS, self.wide_kind,
                     _LAYOUTS[c.norm_layout], _ACTS[c.hidden_act], float(c.residual_scale))
        self.moe_args = (self.sinks, self.routers, self.router_biases, *moe)

    @classmethod
    def build(cls, model: torch.nn.Module) -> NativeDecoder | None:
        """The native decoder of `model`, or None where it does not apply: not a packed CPU
        Transformer whose projections (and experts) each have one int4, int5, q8, int4-pair,
        mxfp4 or int8 GEMM (beside a bf16 one in every dense projection, or in none), layers
        the op does not compute (`unsupported`), unusual norms, or no native op on this
        machine (ignis_kernels.cpu_native.load)."""
        if not isinstance(model, Transformer) or model.device.type != "cpu":
            return None
        if model.weight_form not in ("quantized", "mixed") or model.embed_op is None:
            return None
        if unsupported(model.config) is not None or len({layer.self_attn.scale for layer in model.layers}) != 1:
            return None
        gemms: list[PackedLinear] = []
        wide: list[PackedLinear | None] = []  # per dense projection its kept copy, or None
        for layer in model.layers:
            moe = type(layer.mlp) is SparseMoE
            if not moe and type(layer.mlp) is not MLP:
                return None
            linears = _linears(layer)
            for lin in linears:
                if type(lin) is not Linear:  # e.g. a tensor-parallel wrapper that all-reduces
                    return None
                g, w = _split(lin.linear_op)
                if g is None:
                    return None
                gemms.append(g)
                wide.append(w)
            if moe:
                router = layer.mlp.gate
                if type(router) is not Linear or router.linear_op is not None or layer.mlp.experts.expert_ops is None:
                    return None  # a packed router, or experts without their packed GEMMs
                for pair in layer.mlp.experts.expert_ops:
                    for op in pair:
                        g, w = _split(op)
                        if g is None or w is not None:
                            return None
                        gemms.append(g)
            qk = [layer.self_attn.q_norm, layer.self_attn.k_norm] if model.config.qk_norm else []
            if any(type(n) is not RMSNorm or n.weight.dtype != torch.float32 for n in _norms(layer) + qk):
                return None
        if len({w.form for w in wide if w is not None}) > 1:
            return None
        if all(w is None for w in wide):  # the quantized form, or no projection keeps a copy
            wide = []
        mixtures = {(m.top_k, _routing(m), m.experts.intermediate, m.alpha, m.limit, m.act_name)
                    for m in model.modules() if isinstance(m, SparseMoE)}
        if len(mixtures) > 1:  # the op takes one routing and width for every layer
            return None
        if not cpu_native.load():
            return None
        return cls(model, gemms, wide)

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: KVCaches, slots: torch.Tensor,
        block_tables: torch.Tensor, seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        """Final-normed hidden rows [T, hidden] for T decode rows: row t is the new token
        input_ids[t] at positions[t] of the sequence whose blocks are block_tables[t] and
        whose length with it is seq_lens[t]; its K/V go to slot slots[t]."""
        m = self.model
        x = m.embed(input_ids).float().contiguous()
        T = len(positions)
        cos, sin = (t.reshape(T, -1).contiguous() for t in m.rotary(positions))
        cos_local = sin_local = _EMPTY
        if m.local_rotary is not None and any(self.rope_local):
            cos_local, sin_local = (t.reshape(T, -1).contiguous() for t in m.local_rotary(positions))
        if self._caches is None or self._caches[0] is not kv_caches:
            self._caches = (kv_caches, [k for k, _ in kv_caches], [v for _, v in kv_caches])
        return torch.ops.ignis_cpu.decode_layers(
            x, cos, sin, cos_local, sin_local, slots, block_tables.contiguous(), seq_lens, self._caches[1],
            self._caches[2], self.norms, self.weights, self.wide, self.biases, self.qk_norms, self.windows,
            self.rope_local, *self.args, *self.moe_args,
        )


_EMPTY = torch.empty(0)


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _or_empty(tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The per-layer list, or [] where every entry is None (decode.cpp's "none of these")."""
    return tensors if any(t is not None for t in tensors) else []


def _linears(layer: torch.nn.Module) -> list[Linear]:
    """A layer's projections in decode.cpp's order: four, or a mixture's layer's attention
    two (its experts' GEMMs are Experts.expert_ops)."""
    names = _PROJECTIONS[:2] if isinstance(layer.mlp, SparseMoE) else _PROJECTIONS
    return [layer.get_submodule(name) for name in names]


def _norms(layer: torch.nn.Module) -> list[RMSNorm]:
    """A layer's norms, in decode.cpp's order for its layout."""
    names = ["input_layernorm", "post_attention_layernorm"]
    if layer.layout == "sandwich":
        names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    return [getattr(layer, n) for n in names]
