"""Compact CPU weight forms, built once at load from a GGUF file's blocks.

Which form, and which GEMMs each is built from on this machine, is decided by
ignis/model/weight_plan.py (from ignis_kernels.cpu_platform). The ops here:
  Int4Linear   4-bit weights, one (scale, zero) per 32 inputs: a 4-bit block file's values
               exactly (Q4_0, Q4_1, Q4_K), in a layout of ours, through the native op's
               GEMM (ignis_kernels/cpu/quant_gemm.h), or torch's int4 one where the op cannot be built.
  Int5Linear   5-bit blocks (Q5_0, Q5_1, Q5_K, and 4-bit ones fused beside them) exactly:
               the same nibbles plus a word of fifth bits per 32, 0.875 bytes a weight.
  Q8Linear     Q8_0 exactly (and Q5_0 / Q4_0 fused beside it): int8 values and the file's
               fp16 block scales, 1.06 bytes a weight; a large tied head multiplies by the
               embedding table's own.
  Q6Linear     Q6_K exactly (its 6-bit values, int8 scales per 16 and d per 256), 0.83 bytes a weight.
  StackedLinear  a fused weight whose parts need different forms (Q4_K q|k beside a Q6_K v):
               one exact op per run of parts, outputs side by side.
  Int4PairLinear  5- to 8-bit blocks exactly as two int4 weights (q = 16 hi + lo), 1.5 bytes
               a weight: only Q8_0 fused beside blocks with offsets (Q4_K, Q5_K, ...).
  Int8Linear   torch's int8 weight-only GEMM, one scale per output row (other types:
               F16/BF16/F32, stacks whose parts have no exact form; and 4-bit blocks where the
               native op cannot be built: requantized, a small loss).
  Bf16Linear / Fp16Linear / Fp32Linear   kept wide copies: oneDNN bf16, fbgemm fp16 weights
               with fp32 activations, oneDNN fp32.
  MixedLinear  a narrow (int4/int5/q8/int8) and a wide op over one weight, chosen by the step's rows.
Steps of WIDEN_ROWS rows or more (prefill chunks) through a narrow op widen its weight
for the step (bf16, or fp32 without a bf16 GEMM) and multiply densely: faster there, no
copy kept. Where the native op has a many-row body for the op's blocks (`many`: Q4_K and
Q6_K on AVX2 CPUs and AVX-512 ones with VNNI; ignis_kernels/cpu/quant_gemm_many.h, 8-bit
activations per 256 as llama.cpp's) every step of its rows or more goes through it instead,
and, as it is as fast as a kept wide copy (weight_plan.many_replaces_copy),
`mixed` keeps no copy of it. Activations stay fp32 between GEMMs (torch's small bf16 CPU ops are slower than
fp32 at decode sizes): each op casts its input to what its kernel takes. The LM head is
ignis/model/lm_head.py's.
The embedding table keeps the file's form (Q8_0: int8 values with their block scales;
other block types: the file's blocks; exact either way) and is dequantized row by row as
tokens are looked up. A tied head multiplies by a large Q8_0 table itself; otherwise it is
the only tensor held twice (the table for lookups, the head's GEMMs).

What each GEMM costs per shape and row count: experiments/bench_cpu_linear.py, and
experiments/RESULTS.md for the figures.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from ignis.model.config import ModelConfig
from ignis.model.families import family
from ignis.model.gguf_loader import ignis_name, rope_heads, unpermute_rope_rows
from ignis.model.huge_pages import hold
from ignis.model.gguf_quant import (
    GROUP,
    INT4_TYPES,
    INT5_TYPES,
    Q8_TYPES,
    decode_mxfp4_nibbles,
    mxfp4_fits_q8,
    WIDE_INT_TYPES,
    K_SCALE_TYPES,
    decode_int4,
    decode_k_scales,
    decode_q6_k,
    decode_q8,
    decode_q8_0,
    decode_wide_int,
)
from ignis.model.layers import Experts, Linear
from ignis.model.mxfp4 import E2M1
from ignis.model.lm_head import NARROW_ROWS, Int8DynamicHead, RefinedHead, int8_dynamic_head
from ignis.model.transformer import Transformer
from ignis.model.weight_plan import WeightPlan, many_replaces_copy
from ignis_kernels import cpu_native, cpu_platform

log = logging.getLogger(__name__)

# oneDNN's blocked layout is chosen for this many rows; see cpu_weights.BATCH_HINT.
_BATCH_HINT = 64
# From this many rows (prefill chunks), the quantized forms widen their weight (bf16 for
# oneDNN's bf16 GEMM, fp32 where there is none) for the step and multiply densely:
# SmolLM2's projections at 2048 rows 2.0-2.6x faster than torch's int4 / int8 GEMMs on
# AVX-512, the widening (~1 ms per million weights) included; even at ~200 rows. No copy
# is kept (the mixed form keeps one).
WIDEN_ROWS = 256
# The widening goes this many weight elements at a time (a bounded temporary).
_WIDEN_ELEMENTS = 1 << 22
# A Q8_0 head table from this size is multiplied as it is (Q8Linear) for few rows: there the
# head is bound by memory, and the table's own GEMM keeps pace with an int8 copy's without
# holding one (Gemma 3's 262k x 640, 178 MB: 4.0 ms a row either way on Zen 5, 2 threads).
# Smaller ones sit in the caches, where fbgemm's int8 dot products are faster (SmolLM2's
# 49k x 576: 0.36 ms a row against 0.46; 0.45 against 1.1 at four rows).
Q8_HEAD_MIN_BYTES = 64 << 20


# -- GEMM ops ---------------------------------------------------------------------------


class PackedLinear:
    """y = x W^T (+ b) over a packed W: x [T, K], y [T, N], both fp32; each GEMM casts its
    input to the dtype its kernel takes (`_mm`)."""

    form = ""
    nbytes = 0
    bias: torch.Tensor | None = None
    in_features = 0
    # Whether the native op multiplies steps of many rows, prefill chunks included, by this
    # weight's own values (quant_gemm_many.h: Q4_K and Q6_K on AVX2 and AVX-512 VNNI CPUs),
    # faster than a dense GEMM over the weight widened for the step.
    many = False

    @property
    def replaces_copy(self) -> bool:
        """Whether the many-row body is as fast as a kept wide copy (weight_plan.many_replaces_copy):
        then `mixed` keeps none."""
        return self.many and many_replaces_copy()

    @property
    def exact_rows(self) -> int | None:
        """The most rows a step may hold for every row to be computed by the body a one-row
        step takes, bit for bit (a many-row op's 8-bit body from many_rows() rows, the
        widened GEMM from WIDEN_ROWS); None: any (one dense GEMM)."""
        return cpu_native.many_rows() - 1 if self.many else WIDEN_ROWS - 1

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._mm(x.float())
        return y if self.bias is None else y + self.bias

    def dense(self) -> torch.Tensor:
        """W as fp32 [N, K] (tests and accuracy checks; computed through the op itself, its
        exact GEMM: a many-row op's identity goes in steps of fewer rows than its 8-bit body takes)."""
        eye = torch.eye(self.in_features)
        step = max(1, cpu_native.many_rows() - 1) if self.many else self.in_features
        bias, self.bias = self.bias, None
        try:
            return torch.cat([self(eye[i : i + step]) for i in range(0, self.in_features, step)]).t().contiguous()
        finally:
            self.bias = bias


def _widened_mm(x: torch.Tensor, n: int, widen: Callable[[int, int, torch.dtype], torch.Tensor],
                dtype: torch.dtype) -> torch.Tensor:
    """x [T, K] fp32 @ W^T, W [n, K] widened to `dtype` by `widen(n0, n1, dtype)` a slice of
    output rows at a time (a bounded temporary); fp32 out."""
    xd = x.to(dtype)
    mm = _fp32_mm if dtype == torch.float32 and cpu_platform.current().has_gemm("fp32") else F.linear
    step = max(64, _WIDEN_ELEMENTS // x.shape[1] // 64 * 64)
    if step >= n:
        return mm(xd, widen(0, n, dtype)).float()
    y = torch.empty(x.shape[0], n, dtype=dtype)
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        y[:, n0:n1] = mm(xd, widen(n0, n1, dtype))
    return y.float()


def _fp32_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T through oneDNN's fp32 GEMM on a plain weight: ~10% faster than MKL's sgemm on
    AVX2 at prefill sizes (SmolLM2's projections, 1024 rows, measured on the avx2 tier)."""
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _blocked(a: np.ndarray) -> torch.Tensor:
    """Per-group data [N, G, ...] in the nibble formats' row order (ignis_kernels/cpu/quant_gemm.h,
    Weights::unit): blocks of eight rows, group-major within a block (block b's group g holds
    its eight rows' in turn), the last N % 8 rows row by row after them. Same shape; a weight's
    tensor, so held in huge pages where it is large (huge_pages.hold)."""
    n, g = a.shape[:2]
    n8 = n // 8 * 8
    head = a[:n8].reshape(n8 // 8, 8, g, *a.shape[2:]).swapaxes(1, 2)
    return hold(np.concatenate((head.reshape(n8, g, *a.shape[2:]), a[n8:])))


def _unblocked(t: torch.Tensor, n0: int, n1: int, groups: int) -> torch.Tensor:
    """Rows [n0, n1) of a _blocked tensor [N, ...] (its groups-by-units view), in row order:
    [n1 - n0, groups, unit...]. Whole blocks are a transposed view (the widening's slices
    start on them); other ranges gather."""
    n = t.shape[0]
    n8 = n // 8 * 8
    units = t.reshape(n * groups, -1)
    if n0 % 8 == 0 and (n1 % 8 == 0 or n1 == n):
        b1 = max(n0, min(n1, n8))
        u = units.shape[1]
        head = units[n0 * groups : b1 * groups].view((b1 - n0) // 8, groups, 8, u).transpose(1, 2)
        head = head.reshape(b1 - n0, groups, u)
        if n1 <= n8:
            return head
        tail = max(n0, n8)
        return torch.cat((head, units[tail * groups : n1 * groups].view(n1 - tail, groups, u)))
    return _gathered(t, torch.arange(n0, n1), groups)


def _gathered(t: torch.Tensor, rows: torch.Tensor, groups: int) -> torch.Tensor:
    """Rows `rows` (any, in their order) of a _blocked tensor [N, ...]: [len(rows), groups, unit...]."""
    return t.reshape(t.shape[0] * groups, -1)[_gather_index(t.shape[0], rows, groups)]


def _gather_index(n: int, rows: torch.Tensor, groups: int) -> torch.Tensor:
    """Where rows `rows`' units lie in a _blocked tensor of n rows' `groups` units: [len(rows), groups]."""
    n8 = n // 8 * 8
    row = rows.long()[:, None]
    g = torch.arange(groups)[None, :]
    return torch.where(row < n8, (row // 8 * groups + g) * 8 + row % 8, row * groups + g)


class _Scales:
    """A nibble format's (scale, offset) per 32 inputs, _blocked: fp32 pairs [N, K/32, 2], or
    for Q4_K / Q5_K the file's own scales (quant_gemm.h's K types' scales): uint8 (sc, m)
    [N, K/32, 2] and fp32 (d, -dmin) [N, K/256, 2] per super-block, scale = sc * d and
    offset = m * -dmin, the same values exactly in 0.09 bytes a weight against 0.25."""

    def __init__(self, scale: np.ndarray, offset: np.ndarray, k_scales: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.pairs = self.sm = self.ds = None
        if k_scales is None:
            self.pairs = _blocked(np.stack((scale, offset), axis=-1).astype(np.float32))
        else:
            self.sm, self.ds = (_blocked(a) for a in k_scales)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """What the native op takes, in order (decode.cpp's kInt4 / kInt4K tensors after the nibbles)."""
        return [self.pairs] if self.pairs is not None else [self.sm, self.ds]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def gemm(self, x: torch.Tensor, nibbles: torch.Tensor, fifth: torch.Tensor | None, bits: int) -> torch.Tensor:
        if self.pairs is not None:
            return torch.ops.ignis_cpu.quant_gemm(x.contiguous(), nibbles, fifth, self.pairs, bits)
        return torch.ops.ignis_cpu.quant_gemm(x.contiguous(), nibbles, fifth, self.sm, bits, self.ds)

    def rows(self, n0: int, n1: int, groups: int) -> torch.Tensor:
        """Rows [n0, n1)'s pairs in row order, [n, groups, 2] fp32."""
        if self.pairs is not None:
            return _unblocked(self.pairs, n0, n1, groups)
        sm = _unblocked(self.sm, n0, n1, groups).float()
        return sm * _unblocked(self.ds, n0, n1, groups // 8).repeat_interleave(8, dim=1)


def _nibbles(q: np.ndarray) -> torch.Tensor:
    """q's low four bits two a byte (element 2i of a row low, 2i + 1 high) [N, K/2], _blocked."""
    n, k = q.shape
    nibbles = ((q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)).astype(np.uint8).reshape(n, k // GROUP, 16)
    return _blocked(nibbles).reshape(n, k // 2)


def _low_bits_and_pairs(op: Int4Linear | Int5Linear, n0: int, n1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [n0, n1) of a nibble format in row order: the low four bits [n, G, 32] uint8 and
    the (scale, offset) pairs [n, G, 2]."""
    groups = op.in_features // GROUP
    b = _unblocked(op.nibbles, n0, n1, groups)
    return torch.stack((b & 15, b >> 4), dim=-1).view(n1 - n0, groups, GROUP), op.scales.rows(n0, n1, groups)


class Int4Linear(PackedLinear):
    """4-bit weights with one (scale, offset) per 32 inputs, w = q * scale + offset, held in a
    layout of ours: two values a byte (element 2i of a row in the low nibble of byte i, 2i + 1
    in the high one) and fp32 (scale, offset) pairs [N, K/32, 2] (a 4-bit block file's values
    exactly), rows in blocks of eight group by group (_blocked). Steps of fewer than
    WIDEN_ROWS rows go through the native op's GEMM over exactly these
    (ignis_kernels/cpu/quant_gemm.h, fp32 activations) where it is built; elsewhere
    through torch's int4 weight-only GEMM over a packing of its own, made only then (bf16
    activations and scales; its layout is private and differs between CPUs, so it is never
    read back). From WIDEN_ROWS rows the weight is widened and multiplied densely."""

    form = "int4"

    def __init__(self, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16, native: bool | None = None,
                 k_scales: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.in_features = q.shape[1]
        self.native = cpu_native.load() if native is None else native
        self.nibbles = _nibbles(q)
        self.scales = _Scales(scale, offset, k_scales if self.native else None)
        self.packed: torch.Tensor | None = None
        self.torch_scales_zeros: torch.Tensor | None = None
        if not self.native:  # torch's op: int32 values in [0, 16), (q - 8) * s + z with [K/32, N, 2] bf16 (s, z)
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q.astype(np.int32)), 1)
            so = torch.from_numpy(np.ascontiguousarray(np.stack((scale, offset), axis=-1), dtype=np.float32))
            sz = torch.stack((so[..., 0], so[..., 1] + 8 * so[..., 0]), dim=-1)
            self.torch_scales_zeros = sz.transpose(0, 1).contiguous().to(torch.bfloat16)
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.nibbles.numel() + self.scales.nbytes + (
            0 if self.packed is None else self.packed.numel() + self.torch_scales_zeros.numel() * 2)
        self.many = self.native and self.scales.sm is not None and self.in_features % 256 == 0 and cpu_native.many_rows() > 0

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS and not self.many:
            return _widened_mm(x, self.nibbles.shape[0], self.widen, self.widen_to)
        if self.packed is None:
            return self.scales.gemm(x, self.nibbles, None, 4)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP,
                                                          self.torch_scales_zeros).float()

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype`: q * scale + offset in fp32, then rounded."""
        q, so = _low_bits_and_pairs(self, n0, n1)
        w = q.float() * so[..., :1] + so[..., 1:]
        return w.view(n1 - n0, self.in_features).to(dtype)


class Int5Linear(PackedLinear):
    """5-bit block weights (Q5_0, Q5_1, Q5_K, and 4-bit blocks fused beside them) exactly:
    w = q * scale + offset, q in [0, 32), one (scale, offset) per 32 inputs. Int4Linear's
    nibbles and pairs plus each group's fifth bits as one 32-bit word (bit i: element 2i's,
    bit 16 + i: element 2i + 1's), 0.875 bytes a weight, through the native op's GEMM
    (ignis_kernels/cpu/quant_gemm.h); widened and multiplied densely from WIDEN_ROWS rows."""

    form = "int5"

    def __init__(self, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16, k_scales: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        n, k = q.shape
        self.in_features = k
        self.nibbles, self.scales = _nibbles(q), _Scales(scale, offset, k_scales)
        fifth = ((q >> 4) & 1).astype(np.uint32).reshape(n, k // GROUP, GROUP)
        shifts = np.arange(16, dtype=np.uint32)
        words = (fifth[..., 0::2] << shifts).sum(axis=-1) | (fifth[..., 1::2] << (shifts + 16)).sum(axis=-1)
        self.fifth_bits = _blocked(words.astype(np.uint32).view(np.int32))
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.nibbles.numel() + 4 * self.fifth_bits.numel() + self.scales.nbytes

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS:
            return _widened_mm(x, self.nibbles.shape[0], self.widen, self.widen_to)
        return self.scales.gemm(x, self.nibbles, self.fifth_bits, 5)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype`: q * scale + offset in fp32, then rounded."""
        low, so = _low_bits_and_pairs(self, n0, n1)
        words = _unblocked(self.fifth_bits, n0, n1, self.in_features // GROUP)  # [n, G, 1]
        bit = torch.arange(32, dtype=torch.int32).view(2, 16).t().reshape(32)  # element j's bit in the word
        fifth = ((words >> bit) & 1).to(torch.uint8)  # [n, G, 32] in element order
        w = (low | (fifth << 4)).float() * so[..., :1] + so[..., 1:]
        return w.view(n1 - n0, self.in_features).to(dtype)


class Q6Linear(PackedLinear):
    """Q6_K exactly, 0.83 bytes a weight as in the file: w = d * sc * (q - 32), q in [0, 64),
    an int8 scale sc per 16 inputs and an fp32 d per 256. Int4Linear's nibbles hold q's low
    four bits; the high two go eight bytes a group (byte j: elements 2j + 1, 2j + 17, 2j,
    2j + 16, two bits each), the scales [N, K/32, 2] and d [N, K/256] beside them, all
    _blocked (ignis_kernels/cpu/quant_gemm.h's kQ6: multiplied into x as bytes, the bias + 32 taken
    out per four products and sc applied in the integer sums). Widened and multiplied densely
    from WIDEN_ROWS rows."""

    form = "q6"

    def __init__(self, q: np.ndarray, sc: np.ndarray, d: np.ndarray, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16) -> None:
        n, k = q.shape
        self.in_features = k
        groups = k // GROUP
        self.nibbles = _nibbles(q)
        h = ((q >> 4) & 3).reshape(n, groups, GROUP)
        high = h[..., 1:16:2] | (h[..., 17:32:2] << 2) | (h[..., 0:16:2] << 4) | (h[..., 16:32:2] << 6)
        self.high_bits = _blocked(high.astype(np.uint8))
        self.sixteens = _blocked(np.ascontiguousarray(sc, dtype=np.int8).reshape(n, groups, 2))
        self.supers = _blocked(np.ascontiguousarray(d, dtype=np.float32).reshape(n, groups // 8))
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.nibbles.numel() + self.high_bits.numel() + self.sixteens.numel() + 4 * self.supers.numel()
        self.many = cpu_native.many_rows() > 0

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS and not self.many:
            return _widened_mm(x, self.nibbles.shape[0], self.widen, self.widen_to)
        return torch.ops.ignis_cpu.quant_gemm(x.contiguous(), self.nibbles, self.high_bits, self.sixteens, 6, self.supers)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype`: (d * sc) * (q - 32) in fp32 (exact: 23 bits), then rounded."""
        return self._values(n1 - n0, lambda t, groups: _unblocked(t, n0, n1, groups)).to(dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W, fp32 (an embedding's lookups, the head's refined candidates): one
        gather index per granularity, reused for the four tensors."""
        n, groups = self.nibbles.shape[0], self.in_features // GROUP
        ids = ids.reshape(-1)
        native = cpu_native.q6_rows(self.nibbles, self.high_bits, self.sixteens, self.supers, ids)
        if native is not None:  # the same values, in one pass
            return native
        index = {g: _gather_index(n, ids, g) for g in (groups, groups // 8)}
        return self._values(ids.numel(), lambda t, g: t.reshape(n * g, -1)[index[g]])

    def _values(self, n: int, take: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
        groups = self.in_features // GROUP
        b = take(self.nibbles, groups)  # [n, G, 16]: elements 2i (low nibble) and 2i + 1
        hb = take(self.high_bits, groups)  # [n, G, 8]: byte j's bits: 2j + 1, 2j + 17, 2j, 2j + 16
        pairs = torch.stack([(hb >> s) & 3 for s in (4, 0, 6, 2)], dim=-1).reshape(n, groups, 8, 2, 2)
        high = pairs.permute(0, 1, 3, 2, 4).reshape(n, groups, GROUP)  # (half, j, odd): element order
        q = (torch.stack((b & 15, b >> 4), dim=-1).reshape(n, groups, GROUP) | (high << 4)).float() - 32
        sc = take(self.sixteens, groups).float().reshape(n, groups // 8, 8, 2, 1)
        d = take(self.supers, groups // 8).reshape(n, groups // 8, 1, 1, 1)
        return ((d * sc) * q.reshape(n, groups // 8, 8, 2, 16)).reshape(n, self.in_features)


class StackedLinear(PackedLinear):
    """A fused weight (q|k|v) whose parts no one exact form holds together (a Q4_K_M file's
    Q4_K q and k beside a Q6_K v): each run of parts of one block type through its own exact
    op, the outputs side by side (the native decode op writes each part's columns in place),
    instead of the whole stack requantized to int8. Widened per part from WIDEN_ROWS rows."""

    form = "stack"

    def __init__(self, ops: list[PackedLinear], rows: list[int], bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16) -> None:
        self.ops, self.rows = ops, rows
        self.in_features = ops[0].in_features
        self.form = "+".join(op.form for op in ops)
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = sum(op.nbytes for op in ops)
        self.many = all(op.many for op in ops)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS and not self.many:
            return _widened_mm(x, sum(self.rows), self.widen, self.widen_to)
        return torch.cat([op._mm(x) for op in self.ops], dim=1)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype`, from the parts they fall in."""
        out, r0 = [], 0
        for op, rows in zip(self.ops, self.rows):
            a, b = max(n0, r0), min(n1, r0 + rows)
            if a < b:
                out.append(op.widen(a - r0, b - r0, dtype))
            r0 += rows
        return torch.cat(out)


class Q8Linear(PackedLinear):
    """Q8_0's values as the file holds them, w = q * d with q int8 and one fp16 d per 32
    inputs (and Q5_0 / Q4_0 blocks fused beside them: d * (q - 16), d * (q - 8)), 1.06
    bytes a weight, through the native op's GEMM (ignis_kernels/cpu/quant_gemm.h). It takes the
    tensors as given: a tied head multiplies by the embedding table's own (Q8Embedding)."""

    form = "q8"

    def __init__(self, q: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16) -> None:
        self.in_features = q.shape[1]
        self.q, self.d = q, d
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = q.numel() + 2 * d.numel()

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS:
            return _widened_mm(x, self.q.shape[0], self.widen, self.widen_to)
        return torch.ops.ignis_cpu.quant_gemm(x.contiguous(), self.q, None, self.d, 8)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype` (q * d in fp32, then rounded)."""
        q = self.q[n0:n1].view(n1 - n0, -1, GROUP).float()
        return (q * self.d[n0:n1, :, None].float()).view(n1 - n0, -1).to(dtype)


class Mx4Linear(PackedLinear):
    """MXFP4 weights (gpt-oss's experts) as the file holds them: e2m1 codes two a byte (as
    Int4Linear's nibbles: element 2i low, 2i + 1 high) and one e8m0 exponent byte per 32
    inputs, w = e2m1(code) * 2^(e - 127), 0.53 bytes a weight, rows in blocks of eight group
    by group (_blocked), through the native op's GEMM (ignis_kernels/cpu/quant_gemm.h, kMX4);
    widened and multiplied densely from WIDEN_ROWS rows."""

    form = "mxfp4"

    def __init__(self, nibbles: np.ndarray, exponents: np.ndarray, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16) -> None:
        """nibbles [N, K/2] uint8 (an HF checkpoint's blocks, flattened), exponents [N, K/32]."""
        n, k = nibbles.shape[0], 2 * nibbles.shape[1]
        self.in_features = k
        self.nibbles = _blocked(np.ascontiguousarray(nibbles).reshape(n, k // GROUP, 16)).reshape(n, k // 2)
        self.exponents = _blocked(exponents.astype(np.uint8))
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.nibbles.numel() + self.exponents.numel()

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS:
            return _widened_mm(x, self.nibbles.shape[0], self.widen, self.widen_to)
        return torch.ops.ignis_cpu.quant_gemm(x.contiguous(), self.nibbles, None, self.exponents, 4)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype` (exact in fp32 and bf16: powers of two times e2m1)."""
        groups = self.in_features // GROUP
        b = _unblocked(self.nibbles, n0, n1, groups)
        codes = torch.stack((b & 15, b >> 4), dim=-1).view(n1 - n0, groups, GROUP)
        e = _unblocked(self.exponents.unsqueeze(-1), n0, n1, groups).to(torch.int32) - 127  # [n, G, 1]
        return torch.ldexp(E2M1[codes.long()], e.float()).view(n1 - n0, self.in_features).to(dtype)


class Int4PairLinear(PackedLinear):
    """5- to 8-bit block weights (Q5_0, Q5_1, Q5_K, Q8_0: w = q * scale + offset per 32
    inputs, q < 256) exactly, as two int4 weights over the same input: q = 16 hi + lo, so
    w = (lo * scale + offset) + hi * (16 scale). Two native int4 GEMMs at small steps (1.5
    bytes a weight with the scales, against int8's 1 and its per-row requantization); one
    widened GEMM over their sum from WIDEN_ROWS rows."""

    form = "int4x2"

    def __init__(self, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, bias: torch.Tensor | None,
                 widen_to: torch.dtype = torch.bfloat16) -> None:
        self.in_features = q.shape[1]
        self.lo = Int4Linear(q & 15, scale, offset, None, widen_to, native=True)
        self.hi = Int4Linear(q >> 4, 16 * scale, np.zeros_like(offset), None, widen_to, native=True)
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.lo.nbytes + self.hi.nbytes

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= WIDEN_ROWS:
            return _widened_mm(x, self.lo.nibbles.shape[0], self.widen, self.widen_to)
        return self.lo._mm(x) + self.hi._mm(x)

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype`: the two halves' fp32 values summed, then rounded."""
        return (self.lo.widen(n0, n1, torch.float32) + self.hi.widen(n0, n1, torch.float32)).to(dtype)


class Int8Linear(PackedLinear):
    """torch's CPU int8 weight-only GEMM (bf16 activations), one scale per output row
    (absmax / 127). From WIDEN_ROWS rows the weight is widened to `widen_to` instead."""

    form = "int8"

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None, widen_to: torch.dtype = torch.bfloat16) -> None:
        w = w.float()
        self.in_features = w.shape[1]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.weight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.scale = scale.to(torch.bfloat16)
        self.widen_to = widen_to
        self.bias = bias
        self.nbytes = self.weight.numel() + self.scale.numel() * 2

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        # torch's kernel reads K in blocks of 16: any other K gives wrong sums or a crash
        # (measured, torch 2.13: K = 24, 40, 72). Such shapes (tiny test models) widen.
        if x.shape[0] >= WIDEN_ROWS or self.in_features % 16:
            return _widened_mm(x, self.weight.shape[0], self.widen, self.widen_to)
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.scale).float()

    def widen(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Rows [n0, n1) of W as `dtype` (q * scale in fp32, then rounded)."""
        return (self.weight[n0:n1].float() * self.scale[n0:n1, None].float()).to(dtype)


class Bf16Linear(PackedLinear):
    """oneDNN's bf16 GEMM over a weight reordered once into its blocked layout."""

    form = "bf16"
    exact_rows = None  # one dense GEMM at every row count

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.in_features = w.shape[1]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16).contiguous(), _BATCH_HINT)
        self.bias = bias
        self.nbytes = w.numel() * 2

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, None, "none", [], "").float()


class Fp16Linear(PackedLinear):
    """fbgemm's GEMM over fp16 weights with fp32 activations (AVX2 + F16C): the wide GEMM
    where oneDNN has no bf16. torch marks the op deprecated; it is there in the pinned torch."""

    form = "fp16"
    exact_rows = None  # one dense GEMM at every row count

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.in_features = w.shape[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.packed = torch.ops.aten.fbgemm_pack_gemm_matrix_fp16(w.float().contiguous())
        self.zeros = torch.zeros(w.shape[0])  # the op takes a bias; ours is added after
        self.bias = bias
        self.nbytes = w.numel() * 2

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.fbgemm_linear_fp16_weight(x.contiguous(), self.packed, self.zeros)


class Fp32Linear(PackedLinear):
    """fp32 weights: oneDNN's GEMM over a reordered copy where oneDNN runs, else F.linear."""

    form = "fp32"
    exact_rows = None  # one dense GEMM at every row count

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None, onednn: bool = True) -> None:
        w = w.float().contiguous()
        self.in_features = w.shape[1]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, _BATCH_HINT) if onednn else None
        self.weight = None if onednn else w
        self.bias = bias
        self.nbytes = w.numel() * 4

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")


def wide_linear(w: torch.Tensor, kind: str, bias: torch.Tensor | None = None) -> PackedLinear:
    """A kept wide GEMM of `kind` (WeightPlan.wide: bf16, fp16 or fp32) over W [N, K]."""
    if kind == "bf16":
        return Bf16Linear(w, bias)
    if kind == "fp16":
        return Fp16Linear(w, bias)
    if kind == "fp32":
        return Fp32Linear(w, bias, onednn=cpu_platform.current().has_gemm("fp32"))
    raise ValueError(f"unknown wide GEMM {kind!r}")


class MixedLinear(PackedLinear):
    """Two GEMMs over the same weight: `narrow` (the file's quantization) for steps of at
    most NARROW_ROWS rows, `wide` (a kept bf16, fp16 or fp32 copy) for more. The bias is
    added once, here."""

    def __init__(self, narrow: PackedLinear, wide: PackedLinear, bias: torch.Tensor | None) -> None:
        self.narrow, self.wide = narrow, wide
        self.in_features = wide.in_features
        self.form = f"{narrow.form}+{wide.form}"
        self.bias = bias
        self.nbytes = narrow.nbytes + wide.nbytes

    @property
    def exact_rows(self) -> int | None:
        return min(NARROW_ROWS, self.narrow.exact_rows or NARROW_ROWS)

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        return (self.narrow if x.shape[0] <= NARROW_ROWS else self.wide)._mm(x)


class Q8Embedding:
    """Token embedding from Q8_0 blocks: int8 values and one fp16 scale per 32, looked up
    then dequantized (the rows of a step only)."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, dtype: torch.dtype) -> None:
        self.q = hold(q)
        self.scale = hold(scale)
        self.dtype = dtype
        self.nbytes = self.q.numel() + self.scale.numel() * 2

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        q = self.q.index_select(0, ids)
        s = self.scale.index_select(0, ids).float()
        t, k = q.shape
        return (q.view(t, -1, GROUP).float() * s[..., None]).view(t, k).to(self.dtype)

    def dense(self) -> torch.Tensor:
        return (self.q.view(self.q.shape[0], -1, GROUP).float() * self.scale.float()[..., None]).view(self.q.shape)


class BlockEmbedding:
    """Token embedding held as the file's own blocks (Q4_K, Q6_K, ...: 4.5-6.6 bits a
    weight), the looked-up rows dequantized per step. A 128k x 2048 Q6_K table is 215 MB
    this way and 1,050 MB as fp32 rows."""

    def __init__(self, raw: _Raw, dtype: torch.dtype) -> None:
        self.qtype, self.cols = raw.qtype, raw.shape[-1]
        self.blocks = np.array(raw.data)  # a copy: not the file's memmap
        self.dtype = dtype
        self.nbytes = self.blocks.nbytes

    def _rows(self, data: np.ndarray) -> torch.Tensor:
        raw = _Raw(None, None, qtype=self.qtype, shape=(data.shape[0], self.cols), data=data)
        return torch.from_numpy(raw.dense())

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self._rows(self.blocks[ids.numpy()]).to(self.dtype)

    def dense(self) -> torch.Tensor:
        return self._rows(self.blocks)


class Q6Table:
    """A Q6_K table (the embedding, or an untied head's rows) held once as q6 (Q6Linear, 0.83
    bytes a weight): rows looked up exactly, and a large one multiplied as the few-row LM
    head itself, with no int8 copy beside it (Llama-3.2-1B's tied 128k x 2048 table: 217 MB
    in all, where the file's blocks and an int8 head were 479)."""

    def __init__(self, raw: _Raw, dtype: torch.dtype) -> None:
        self.op = Q6Linear(*decode_q6_k(np.asarray(raw.data).reshape(raw.shape[0], -1), QT.Q6_K, raw.shape[-1]), None)
        self.dtype = dtype
        self.nbytes = self.op.nbytes

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.op.rows(ids).view(*ids.shape, -1).to(self.dtype)

    def dense(self) -> torch.Tensor:
        return self.op.widen(0, self.op.nibbles.shape[0], torch.float32)


class DenseEmbedding:
    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.nbytes = table.numel() * table.element_size()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table).float()

    def dense(self) -> torch.Tensor:
        return self.table.float()


# -- loading ------------------------------------------------------------------------------


class _Raw:
    """One GGUF tensor as stored: raw block rows [N, row_bytes] (Q/K rows un-permuted); a
    stacked [E, N, K] tensor (a mixture's experts) as E * N rows."""

    def __init__(self, t: gguf.ReaderTensor | None, n_head: int | None, *, qtype: QT | None = None,
                 shape: tuple[int, ...] | None = None, data: np.ndarray | None = None) -> None:
        if t is None:  # a slice of another (see rows)
            self.qtype, self.shape, self.data = qtype, shape, data
            return
        self.qtype = t.tensor_type
        self.shape = tuple(int(d) for d in reversed(t.shape))
        data = np.asarray(t.data)
        if len(self.shape) >= 2:
            data = data.reshape(int(np.prod(self.shape[:-1])), -1)
            if n_head is not None:
                data = unpermute_rope_rows(data, n_head)
        self.data = data

    def rows(self, r0: int, r1: int) -> _Raw:
        """Rows [r0, r1) of the row-flattened tensor, as a 2-D tensor of its own."""
        return _Raw(None, None, qtype=self.qtype, shape=(r1 - r0, self.shape[-1]), data=self.data[r0:r1])

    def dense(self) -> np.ndarray:
        cols = self.shape[-1]
        if self.qtype == QT.F32:
            return np.array(self.data, dtype=np.float32).reshape(self.shape)  # a copy: not the memmap
        if self.qtype in INT4_TYPES:  # vectorised here: ~10x faster than the gguf package's
            q, s, o = decode_int4(self.data, self.qtype, cols)
            w = q.reshape(q.shape[0], -1, GROUP).astype(np.float32) * s[..., None] + o[..., None]
            return w.reshape(self.shape)
        if self.qtype == QT.Q8_0:
            q, s = decode_q8_0(self.data, cols)
            w = q.reshape(q.shape[0], -1, GROUP).astype(np.float32) * s.astype(np.float32)[..., None]
            return w.reshape(self.shape)
        w = gguf.quants.dequantize(self.data, self.qtype)
        return np.asarray(w, dtype=np.float32).reshape(self.shape)


def _iter_raw(reader: gguf.GGUFReader, config: ModelConfig) -> Iterator[tuple[str, _Raw]]:
    """(ignis name, raw tensor) by the family's map, Q/K rows un-permuted where its files
    permute them."""
    fam = family(config.family)
    for t in reader.tensors:
        name = ignis_name(t.name, fam)
        if name is None:
            continue
        heads = rope_heads(name, config) if fam.gguf_rope_permuted else None
        if heads is not None and name.endswith(".bias"):
            raise NotImplementedError("permuted Q/K biases")  # llama GGUFs carry none
        yield name, _Raw(t, heads)


def _build_linear(parts: list[_Raw], bias: torch.Tensor | None, plan: WeightPlan) -> PackedLinear:
    """One GEMM op over row-stacked parts (q|k|v, gate|up, or one weight): the narrowest
    form that holds every part's values exactly (MXFP4 0.53 bytes a weight, int4 0.75, int5
    0.875, q8 1.06 for Q8_0 (and MXFP4 beside it), int4 pairs 1.5 for Q8_0 beside other
    blocks), q6 0.83 for Q6_K, a stack of those for parts no one form holds (StackedLinear),
    else int8 requantized per row (float types: 1 byte, not the file's values)."""
    if plan.form == "mixed":
        narrow = _build_linear(parts, None, replace(plan, form="quantized"))
        if narrow.replaces_copy:  # its own GEMM is the fast one at every row count: no copy
            narrow.bias = bias
            return narrow
        return MixedLinear(narrow, wide_linear(_dense(parts), plan.wide), bias)
    widen_to = torch.bfloat16 if plan.widen_to == "bf16" else torch.float32
    rows = sum(p.shape[0] for p in parts)
    cols = parts[0].shape[-1]
    types = {p.qtype for p in parts}
    torch_int4 = rows % 16 == 0  # what torch's int4 packing takes, where the native op is not built
    native = plan.form == "quantized" and plan.int4 and cpu_native.load()

    def k_scales() -> tuple[np.ndarray, ...] | None:
        """Q4_K / Q5_K alone keep the file's six-bit scales (the native op's; torch's int4 takes pairs)."""
        return tuple(_stacked(parts, decode_k_scales)) if native and types <= K_SCALE_TYPES and cols % 256 == 0 else None

    if plan.form == "quantized" and plan.int4 and types <= INT4_TYPES and (torch_int4 or native):
        return Int4Linear(*_stacked(parts, decode_int4), bias, widen_to, k_scales=k_scales())
    if native and types <= INT4_TYPES | INT5_TYPES:
        return Int5Linear(*_stacked(parts, _decode_int), bias, widen_to, k_scales=k_scales())
    if native and types == {QT.MXFP4}:
        return Mx4Linear(*_stacked(parts, lambda raw, _, c: decode_mxfp4_nibbles(raw, c)), bias, widen_to)
    if native and types <= Q8_TYPES and all(p.qtype != QT.MXFP4 or mxfp4_fits_q8(p.data, cols) for p in parts):
        q, d = _stacked(parts, decode_q8)
        return Q8Linear(hold(q), hold(d), bias, widen_to)
    if native and types <= INT4_TYPES | WIDE_INT_TYPES:
        return Int4PairLinear(*_stacked(parts, _decode_int), bias, widen_to)
    if native and types == {QT.Q6_K}:
        return Q6Linear(*_stacked(parts, decode_q6_k), bias, widen_to)
    if native and len(types) > 1:  # each run of one block type exactly, where every run has an exact form
        runs = [list(g) for _, g in itertools.groupby(parts, key=lambda p: p.qtype)]
        ops = [_build_linear(run, None, plan) for run in runs]
        if not any(isinstance(op, Int8Linear) for op in ops):  # (a run of one type is never a stack or a pair)
            return StackedLinear(ops, [sum(p.shape[0] for p in run) for run in runs], bias, widen_to)
    if plan.form == "quantized":
        return Int8Linear(_dense(parts), bias, widen_to)
    return wide_linear(_dense(parts), plan.wide, bias)


def _decode_int(raw: np.ndarray, qtype: QT, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, scale, offset) of 4- to 8-bit blocks, w = q * scale + offset per 32 inputs."""
    return (decode_int4 if qtype in INT4_TYPES else decode_wide_int)(raw, qtype, cols)


def _stacked(parts: list[_Raw], decode: Callable[[np.ndarray, QT, int], tuple[np.ndarray, ...]]) -> list[np.ndarray]:
    """Each part decoded by `decode`, its arrays stacked over the parts' rows."""
    decoded = [decode(p.data, p.qtype, p.shape[-1]) for p in parts]
    return [np.concatenate([d[i] for d in decoded]) for i in range(len(decoded[0]))]


def _dense(parts: list[_Raw]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([p.dense() for p in parts]))


def _table(raw: _Raw, dtype: torch.dtype) -> Q8Embedding | Q6Table | DenseEmbedding | BlockEmbedding:
    """Row lookups in the file's form, exact: Q8_0 as int8 + block scales, Q6_K as q6 where
    the native op is built, other block types as the file's blocks, float types as fp32 rows
    (bf16 ones as bf16)."""
    if raw.qtype == QT.Q8_0:
        q, s = decode_q8_0(raw.data, raw.shape[-1])
        return Q8Embedding(q, s, dtype)
    if raw.qtype == QT.Q6_K and raw.shape[-1] % 256 == 0 and cpu_native.load():
        return Q6Table(raw, dtype)
    if raw.qtype not in (QT.F32, QT.F16, QT.BF16):
        return BlockEmbedding(raw, dtype)
    w = torch.from_numpy(raw.dense())
    return DenseEmbedding(w.to(torch.bfloat16) if raw.qtype == QT.BF16 else w)


def _meta_param(p: torch.nn.Parameter) -> torch.nn.Parameter:
    """Shape-only stand-in for a weight held by a packed op (parameter counts stay right)."""
    return torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)


class _FusedWeights:
    """A model's GEMMs, each built as a packed op of `form` as soon as its parts (and biases)
    have come out of the file: every Linear but a mixture's router (kept fp32: small, and
    it decides which experts run), fused ones (the family's packed_modules: q|k|v, gate|up)
    from their parts or whole when the file stores them fused (Phi-3), and each MoE layer's
    experts, one (gate|up, down) pair of GEMMs per expert from the file's stacked tensors."""

    def __init__(self, model: Transformer, plan: WeightPlan, dtype: torch.dtype) -> None:
        self.plan, self.dtype = plan, dtype
        # The experts see few rows each: their narrow GEMMs only (a mixed form's wide copy
        # of every expert would double a mixture's memory for steps they rarely get).
        self.expert_plan = replace(plan, form="quantized") if plan.form == "mixed" else plan
        fused = model.fused_linears()
        # Each GEMM and the parts that fill it, in order.
        self.targets: dict[str, tuple[Linear, list[str]]] = {}
        for name, module in model.named_modules():
            if isinstance(module, Linear) and not name.endswith(".mlp.gate"):
                parts = [p for p, _, _ in fused[name][1]] if name in fused else [name]
                self.targets[name] = (module, parts)
        self.part_of = {part: key for key, (_, parts) in self.targets.items() for part in parts}
        self.part_of.update({key: key for key in self.targets})  # a fused GEMM stored whole
        self.experts = {name: m for name, m in model.named_modules() if isinstance(m, Experts)}
        self.pending: dict[str, dict[str, _Raw]] = {}
        self.biases: dict[str, torch.Tensor] = {}
        self.expert_biases: dict[str, set[str]] = {}  # which of an MoE layer's stacked biases arrived
        self.counts: dict[str, int] = {}  # ops built per form
        for lin, _ in self.targets.values():
            lin.weight = _meta_param(lin.weight)

    def owned(self) -> set[str]:
        """The parameter names these GEMMs replace."""
        names = {f"{k}.{w}" for k in self.targets for w in ("weight", "bias")}
        return names | {f"{k}.{w}" for k in self.experts
                        for w in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")}

    def _ready(self, key: str) -> list[str] | None:
        """The parts `key` is built from once they are all here (itself, stored whole), else None."""
        lin, parts = self.targets[key]
        have = self.pending.get(key, {})
        for choice in ([key], parts):
            if all(p in have for p in choice) and (lin.bias is None or all(f"{p}.bias" in self.biases for p in choice)):
                return choice
        return None

    def take(self, name: str, raw: _Raw) -> bool:
        """Keep `name` when it is part of a GEMM (False: it is not)."""
        base, _, kind = name.rpartition(".")
        owner, _, proj = base.rpartition(".")
        if owner in self.experts and kind == "weight":
            self.pending.setdefault(owner, {})[proj] = raw
            if len(self.pending[owner]) == 3:
                self._build_experts(owner)
            return True
        if owner in self.experts and kind == "bias":  # gpt-oss: the stacked biases stay fp32 tensors
            self._expert_bias(owner, proj, raw)
            return True
        key = self.part_of.get(base)
        if key is None:
            return False
        if kind == "bias":
            self.biases[name] = torch.from_numpy(raw.dense())
        else:
            self.pending.setdefault(key, {})[base] = raw
        if self._ready(key) is not None:
            self._build(key)
        return True

    def finish(self) -> list[str]:
        """The GEMMs missing from the file (what waited for biases is built by now)."""
        missing = [k for k, (lin, _) in self.targets.items() if lin.linear_op is None]
        missing += [f"{k}.{p}.bias" for k, m in self.experts.items() if m.down_proj_bias is not None
                    for p in ("gate_proj", "up_proj", "down_proj") if p not in self.expert_biases.get(k, ())]
        return missing + [k for k, m in self.experts.items() if m.expert_ops is None]

    def _expert_bias(self, owner: str, proj: str, raw: _Raw) -> None:
        ex = self.experts[owner]
        if ex.gate_up_proj_bias is None or ex.down_proj_bias is None:
            raise KeyError(f"unexpected weight {owner}.{proj}.bias: this family's experts have no biases")
        inter = ex.intermediate
        target = {"gate_proj": ex.gate_up_proj_bias[:, :inter], "up_proj": ex.gate_up_proj_bias[:, inter:],
                  "down_proj": ex.down_proj_bias}[proj]
        target.copy_(torch.from_numpy(raw.dense()).reshape(target.shape))
        self.expert_biases.setdefault(owner, set()).add(proj)

    def _count(self, op: PackedLinear) -> None:
        self.counts[op.form] = self.counts.get(op.form, 0) + 1

    def _build(self, key: str) -> None:
        lin, _ = self.targets[key]
        parts = self._ready(key)
        assert parts is not None
        bias = None
        if lin.bias is not None:
            bias = torch.cat([self.biases.pop(f"{p}.bias") for p in parts]).to(self.dtype)
            lin.bias = None  # the op adds it
        done = self.pending.pop(key)
        op = _build_linear([done[p] for p in parts], bias, self.plan)
        lin.linear_op = op
        self._count(op)

    def _build_experts(self, key: str) -> None:
        ex = self.experts[key]
        raw = self.pending.pop(key)
        gate, up, down = raw["gate_proj"], raw["up_proj"], raw["down_proj"]
        inter, hidden = ex.intermediate, down.shape[1]
        ops = []
        for e in range(ex.num_experts):
            gate_up = _build_linear([gate.rows(e * inter, (e + 1) * inter), up.rows(e * inter, (e + 1) * inter)],
                                    None, self.expert_plan)
            proj = _build_linear([down.rows(e * hidden, (e + 1) * hidden)], None, self.expert_plan)
            ops.append((gate_up, proj))
            self._count(gate_up)
            self._count(proj)
        ex.expert_ops = ops
        ex.gate_up_proj = _meta_param(ex.gate_up_proj)
        ex.down_proj = _meta_param(ex.down_proj)


def pack_mxfp4_experts(model: Transformer) -> int:
    """The MXFP4 experts of a model loaded from an HF directory (ModelConfig.experts_mxfp4)
    as one pair of mxfp4 GEMMs per expert (Mx4Linear: the checkpoint's nibbles and exponents,
    re-laid in blocks of eight rows), the blocks then dropped; the number of layers packed.
    Without the native op the blocks stay, dequantized per step (layers.SparseMoE)."""
    if not cpu_native.load():
        log.warning("the native CPU op is not built: MXFP4 experts are dequantized at every step (slow)")
        return 0
    packed = 0
    for module in model.modules():
        if not isinstance(module, Experts) or not module.mxfp4 or module.gate_up_proj_blocks.device.type != "cpu":
            continue
        ex = module
        ops = []
        for e in range(ex.num_experts):
            pair = []
            for blocks, scales in ((ex.gate_up_proj_blocks[e], ex.gate_up_proj_scales[e]),
                                   (ex.down_proj_blocks[e], ex.down_proj_scales[e])):
                pair.append(Mx4Linear(blocks.reshape(blocks.shape[0], -1).numpy(), scales.numpy(), None))
            ops.append((pair[0], pair[1]))
        ex.expert_ops = ops
        for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"):
            setattr(ex, name, _meta_param(getattr(ex, name)))
        packed += 1
    return packed


def load_packed_gguf(
    reader: gguf.GGUFReader, config: ModelConfig, plan: WeightPlan, progress: Callable[[Iterator], Iterator] | None = None,
    max_num_seqs: int | None = None,
) -> Transformer:
    """The model with every projection as a packed op of `plan.form` ("bfloat16", "quantized"
    or "mixed", with the GEMMs the plan names: ignis/model/weight_plan.py), built straight
    from the file's blocks, one fused weight at a time; activations fp32. `max_num_seqs`
    (the engine's batch, None = unknown) decides which heads are built."""
    form = plan.form
    if form not in ("bfloat16", "quantized", "mixed"):
        raise ValueError(f"load_packed_gguf builds bfloat16, quantized or mixed weights, not {form!r}")
    dtype = torch.float32
    model = Transformer(config, dtype=dtype, device="cpu")
    params = dict(model.named_parameters())
    fused = _FusedWeights(model, plan, dtype)
    owned = fused.owned()
    small = {n: p for n, p in params.items() if n not in owned and n not in ("embed_tokens", "lm_head")}
    embed: _Raw | None = None
    head: _Raw | None = None
    items: Iterator = _iter_raw(reader, config)
    if progress is not None:
        items = progress(items)
    seen: set[str] = set()
    with torch.no_grad():
        for name, raw in items:
            seen.add(name)
            if name == "embed_tokens.weight":
                embed = raw
            elif name == "lm_head.weight":
                head = None if config.tie_word_embeddings else raw
            elif not fused.take(name, raw):
                target = small.get(name)
                if target is None:
                    raise KeyError(f"unexpected weight {name!r} for a {config.family} model")
                target.copy_(torch.from_numpy(raw.dense()).reshape(target.shape))
    missing = fused.finish() + sorted(set(small) - seen)
    if embed is None or missing:
        raise KeyError(f"weights missing from the checkpoint, e.g. {(missing or ['embed_tokens.weight'])[:6]}")
    _set_tables(model, embed, head, dtype, max_num_seqs, plan)
    model.weight_form = form
    total = sum(m.linear_op.nbytes for m in model.modules() if isinstance(m, Linear) and m.linear_op is not None)
    total += sum(a.nbytes + b.nbytes for m in model.modules() if isinstance(m, Experts) for a, b in m.expert_ops or ())
    log.info(
        "weights packed as %s: %s; projections %.1f MB, head %.1f MB, embedding %.1f MB",
        plan.why or form, ", ".join(f"{n} {k}" for k, n in sorted(fused.counts.items())),
        total / 1e6, model.head_op.nbytes / 1e6, model.embed_op.nbytes / 1e6,
    )
    return model.eval()


def _set_tables(
    model: Transformer, embed: _Raw, head: _Raw | None, dtype: torch.dtype, max_num_seqs: int | None, plan: WeightPlan,
) -> None:
    """The embedding lookup in the file's form, and the head (ignis/model/lm_head.py): a
    narrow GEMM for steps of few sampling rows, the wide one (bf16 oneDNN) for more (not
    built when the engine never has more: max_num_seqs <= NARROW_ROWS), each row's top
    candidates refined in fp32 from the exact rows: the embedding table when tied, else a
    table of the head's own (the file's form again: Q8_0 stays 1 byte per weight). The
    narrow GEMM is the q8 form over that Q8_0 table itself, or the q6 one over a Q6_K table
    (Q6Table), where the table is too large for the caches (no second copy), else int8 with
    dynamic-quantized activations. A q6 table whose many-row body beats a wide copy serves
    every row count (no wide copy: 525 MB for Llama-3.2-1B's fp16 one)."""
    model.embed_op = _table(embed, dtype)
    rows = model.embed_op if head is None else _table(head, dtype)
    few_rows_only = max_num_seqs is not None and max_num_seqs <= NARROW_ROWS
    narrow: PackedLinear | Int8DynamicHead | None = None
    head_w: torch.Tensor | None = None
    if isinstance(rows, Q8Embedding) and rows.nbytes >= Q8_HEAD_MIN_BYTES and plan.int4 and cpu_native.load():
        narrow = Q8Linear(rows.q, rows.scale, None)
    elif isinstance(rows, Q6Table) and rows.nbytes >= Q8_HEAD_MIN_BYTES and plan.int4:
        narrow = rows.op
    elif plan.head_int8:
        head_w = torch.from_numpy((head or embed).dense())
        narrow = int8_dynamic_head(head_w, full_range=plan.head_full_range)
    wide = None
    if narrow is None or not (few_rows_only or getattr(narrow, "replaces_copy", False)):
        wide = wide_linear(head_w if head_w is not None else torch.from_numpy((head or embed).dense()), plan.wide)
    model.head_op = RefinedHead(rows, wide=wide, narrow=narrow)
    del head_w
    model.embed_tokens = _meta_param(model.embed_tokens)
    model.lm_head = model.embed_tokens if model.config.tie_word_embeddings else _meta_param(model.lm_head)
