"""Decode steps of a packed CPU model through one native call (kernels/cpu/decode.cpp).

    native = NativeDecoder.build(model)          # None: this model or machine has no native path
    hidden = native(input_ids, positions, kv_caches, slots, block_tables, seq_lens)

A step whose rows each add one token to their own sequence (decode), in a model whose
projections are torch's int4 or int8 weight-only GEMMs (the `quantized` form; `mixed`,
whose steps of more than NARROW_ROWS rows go through its oneDNN bf16 GEMMs instead), runs
every layer in C++: same weights, same GEMMs, same fp32 arithmetic as the eager forward
(ignis/model/transformer.py) to float rounding, without its ~40 ATen calls and Python
frames per layer. Prefill chunks and other forms stay eager.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ignis.model.kv_cache import KVCaches
from ignis.model.layers import Linear, RMSNorm
from ignis.model.lm_head import NARROW_ROWS
from ignis.model.transformer import Transformer
from kernels import cpu_native

if TYPE_CHECKING:  # packed.py imports gguf, which an image without it never needs here
    from ignis.model.packed import PackedLinear

log = logging.getLogger(__name__)


# The wide GEMMs decode.cpp calls, by PackedLinear.form (its `wide_kind` argument).
_WIDE_KINDS = {"bf16": 0, "fp16": 1, "fp32": 2}


def _split(op: object) -> tuple[PackedLinear | None, PackedLinear | None]:
    """(the int4/int8 GEMM, the mixed form's wide GEMM for wider steps or None); (None, None)
    when the op is neither, or its wide GEMM is one the native op does not call."""
    from ignis.model.packed import Int4Linear, Int8Linear, MixedLinear

    if isinstance(op, MixedLinear):
        if op.wide.form not in _WIDE_KINDS or getattr(op.wide, "packed", None) is None:
            return None, None
        return _split(op.narrow)[0], op.wide
    if isinstance(op, Int4Linear) and not op.native:
        return None, None
    if isinstance(op, Int4Linear | Int8Linear):
        return op, None
    return None, None


class NativeDecoder:
    def __init__(self, model: Transformer, gemms: list[PackedLinear], wide: list[PackedLinear]) -> None:
        from ignis.model.gguf_quant import GROUP
        from ignis.model.packed import Int4Linear, Int8Linear

        c = model.config
        self.model = model
        # The mixed form's kept GEMMs for steps of more rows: oneDNN bf16, fbgemm fp16 or
        # oneDNN fp32 packed weights, one kind for the whole model.
        self.wide = [w.packed for w in wide]
        self.wide_kind = _WIDE_KINDS[wide[0].form] if wide else 0
        # Per projection: int4 (1) or int8 (0); Q4_K_M files, say, keep some at Q6_K (int8).
        self.int4 = [int(isinstance(g, Int4Linear)) for g in gemms]
        self.weights: list[torch.Tensor] = []
        self.biases: list[torch.Tensor | None] = []
        for g in gemms:
            if isinstance(g, Int4Linear):
                assert g.native, "an Int4Linear built without the native op (torch's int4 packing)"
                self.weights += [g.nibbles, g.scales_offsets]
            else:
                assert isinstance(g, Int8Linear)
                self.weights += [g.weight, g.scale]
        for layer in model.layers:
            for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                bias = lin.linear_op.bias  # the packed op adds the bias (lin.bias is None)
                self.biases.append(None if bias is None else bias.float().contiguous())
        self.norms = [n.weight for layer in model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        self.norms.append(model.norm.weight)
        self.qk_norms: list[torch.Tensor | None] = []
        if c.qk_norm:
            self.qk_norms = [n.weight for layer in model.layers for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)]
        self._caches: tuple[KVCaches, list[torch.Tensor], list[torch.Tensor]] | None = None
        self.windows = [layer.self_attn.sliding_window or 0 for layer in model.layers]
        self.args = (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, float(c.rms_norm_eps),
                     float(model.layers[0].self_attn.scale), self.int4, GROUP, NARROW_ROWS, self.wide_kind)

    @classmethod
    def build(cls, model: torch.nn.Module) -> NativeDecoder | None:
        """The native decoder of `model`, or None where it does not apply: not a packed CPU
        Transformer whose projections each have one int4 or int8 GEMM (beside a
        bf16 one in every projection, or in none), unusual norms, or no native op on this
        machine (kernels.cpu_native.load)."""
        if not isinstance(model, Transformer) or model.device.type != "cpu":
            return None
        if model.weight_form not in ("quantized", "mixed") or model.embed_op is None:
            return None
        gemms: list[PackedLinear] = []
        wide: list[PackedLinear] = []
        for layer in model.layers:
            for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                if type(lin) is not Linear:  # e.g. a tensor-parallel wrapper that all-reduces
                    return None
                g, w = _split(lin.linear_op)
                if g is None:
                    return None
                gemms.append(g)
                wide += [w] if w is not None else []
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            if any(type(n) is not RMSNorm or n.weight.dtype != torch.float32 for n in norms):
                return None
        if len(wide) not in (0, len(gemms)) or len({w.form for w in wide}) > 1:
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
        x = m.embed_op(input_ids).float().contiguous()
        cos, sin = m.rotary(positions)
        if self._caches is None or self._caches[0] is not kv_caches:
            self._caches = (kv_caches, [k for k, _ in kv_caches], [v for _, v in kv_caches])
        T = len(positions)
        return torch.ops.ignis_cpu.decode_layers(
            x, cos.reshape(T, -1).contiguous(), sin.reshape(T, -1).contiguous(),
            slots, block_tables.contiguous(), seq_lens, self._caches[1], self._caches[2],
            self.norms, self.weights, self.wide, self.biases, self.qk_norms, self.windows, *self.args,
        )
