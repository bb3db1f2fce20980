"""Packed CPU weight forms (ignis/model/packed.py): the GGUF block decoders, each GEMM op
against its dense weight, and whole tiny models against their float32 form.

Tolerance, documented: bfloat16 and quantized round each GEMM's input (and bf16 weights,
scales and outputs) to bf16, so logits differ from float32 by bf16 rounding through
every layer, not by the weights (4-bit blocks are kept exactly). On SmolLM2 the largest logit error is ~2% of the largest
logit with perplexity within 0.2% (experiments/perplexity.py, RESULTS.md 2026-12-01); the
tiny random models here stay under TOL_BF16 of the largest logit and agree on most argmaxes.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ignis.model.gguf_quant import decode_int4, decode_k_scales, decode_q6_k, decode_q8, decode_q8_0, decode_wide_int
from ignis.model.lm_head import NARROW_ROWS, Int8DynamicHead, RefinedHead
from ignis.model.loader import load_model
from ignis.model.packed import (
    Fp16Linear,
    Fp32Linear,
    Int4Linear,
    Int5Linear,
    Int8Linear,
    PackedLinear,
    Q8Linear,
    wide_linear,
)
from ignis.model.weight_plan import UnsupportedWeightForm, WeightPlan, plan_weights, wide_kind
from ignis_kernels import cpu_native, cpu_platform
from ignis_kernels.cpu_platform import CpuPlatform
from tests.model.paged_utils import assert_gemm_close, flat_forward_logits, quant_gemm_rtol, rel_err
from tests.model.tiny_models import build_tiny_gguf, build_tiny_model

TOL_BF16 = 5e-2
PROMPT = list(range(3, 40))
# The wide GEMM this machine (or IGNIS_CPU_CAPS) has: oneDNN bf16, else fbgemm fp16, else fp32.
WIDE = wide_kind(cpu_platform.current())


def _wide(w: torch.Tensor, bias: torch.Tensor | None = None):
    return wide_linear(w, WIDE, bias)


def _random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """Valid random raw blocks: random bytes with finite fp16 scales where the type has them."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    if qtype == Q.MXFP4:  # an e8m0 exponent byte per block: weights of order 2^-8 .. 2^-1
        raw[..., 0] = rng.integers(119, 127, raw.shape[:2])
        return raw.reshape(rows, -1)
    if qtype == Q.Q6_K:  # its fp16 d is the block's last two bytes
        raw[..., -2:] = rng.uniform(-0.01, 0.01, raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
        return raw.reshape(rows, -1)
    halves = {Q.Q4_0: 1, Q.Q4_1: 2, Q.Q8_0: 1, Q.Q4_K: 2, Q.Q5_0: 1, Q.Q5_1: 2, Q.Q5_K: 2}[qtype]
    scales = rng.uniform(-0.1, 0.1, (rows, cols // block, halves)).astype(np.float16)
    raw[..., : 2 * halves] = scales.view(np.uint8).reshape(rows, cols // block, 2 * halves)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_int4_decoder_matches_gguf(qtype: Q) -> None:
    raw = _random_blocks(np.random.default_rng(int(qtype)), 6, 512, qtype)
    want = gguf.quants.dequantize(raw, qtype).reshape(6, 512)
    q, s, o = decode_int4(raw, qtype, 512)
    assert q.min() >= 0 and q.max() <= 15
    got = q.astype(np.float32) * np.repeat(s, 32, axis=1) + np.repeat(o, 32, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_q8_decoder_matches_gguf() -> None:
    raw = _random_blocks(np.random.default_rng(1), 5, 256, Q.Q8_0)
    want = gguf.quants.dequantize(raw, Q.Q8_0).reshape(5, 256)
    q, s = decode_q8_0(raw, 256)
    np.testing.assert_array_equal(q.astype(np.float32) * np.repeat(s.astype(np.float32), 32, axis=1), want)


def test_gemm_ops_match_their_weights() -> None:
    rng = np.random.default_rng(2)
    raw = _random_blocks(rng, 96, 128, Q.Q4_1)
    q, s, o = decode_int4(raw, Q.Q4_1, 128)
    dense = torch.from_numpy(gguf.quants.dequantize(raw, Q.Q4_1).reshape(96, 128))
    bias = torch.randn(96)
    x = torch.randn(5, 128)
    want = x @ dense.t() + bias
    ops = [Int4Linear(q, s, o, bias), Int4Linear(q, s, o, bias, native=False), Int8Linear(dense, bias), _wide(dense, bias), Fp32Linear(dense, bias),
           Fp32Linear(dense, bias, onednn=False)]
    if cpu_platform.current().has_gemm("fp16") or not cpu_platform.current().has_gemm("bf16"):
        ops.append(Fp16Linear(dense, bias))
    for op in ops:
        got = op(x)
        assert got.shape == (5, 96) and got.dtype == torch.float32
        # bf16 input and output rounding (and int8's per-row requantization): ~1% of the
        # largest value; fp16 weights ~0.05%, fp32 exact up to summation order
        assert rel_err(got, want) < {"fp32": 1e-5, "fp16": 2e-3}.get(op.form, 2e-2), op.form
    # Int4 holds the file's values exactly: its dense form is the weight.
    assert rel_err(Int4Linear(q, s, o, None).dense(), dense) < 1e-6


@pytest.mark.parametrize("n", [192, 96])
@pytest.mark.parametrize("widen_to", [torch.bfloat16, torch.float32])
def test_wide_steps_widen_the_quantized_weight(n: int, widen_to: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """From WIDEN_ROWS rows, Int4Linear and Int8Linear multiply their weight widened for the
    step densely (bf16, or fp32 where there is no bf16 GEMM). Int4's widened weight is the
    file's values, and what its own GEMM multiplies by (read through the op on an identity),
    bit for bit; the same in slices of output rows as whole, for any row count."""
    import torch.nn.functional as F

    from ignis.model import packed

    rng = np.random.default_rng(4)
    raw = _random_blocks(rng, n, 128, Q.Q4_1)
    q, s, o = decode_int4(raw, Q.Q4_1, 128)
    dense = torch.from_numpy(gguf.quants.dequantize(raw, Q.Q4_1).reshape(n, 128))
    bias = torch.randn(n)
    i4, i8 = Int4Linear(q, s, o, bias, widen_to), Int8Linear(dense, bias, widen_to)
    x = torch.randn(packed.WIDEN_ROWS, 128)
    xd = x.to(widen_to)
    torch.testing.assert_close(i4.widen(0, n, torch.float32), dense, rtol=1e-6, atol=1e-7)  # the file's values
    if i4.native:
        eye = torch.eye(128)
        assert torch.equal(torch.ops.ignis_cpu.quant_gemm(eye, i4.nibbles, None, i4.scales.pairs, 4).t(),
                           i4.widen(0, n, torch.float32))
    want4 = F.linear(xd, i4.widen(0, n, widen_to)).float() + bias
    w8 = (i8.weight.float() * i8.scale.float()[:, None]).to(widen_to)
    want8 = F.linear(xd, w8).float() + bias
    # bf16: the same GEMM, bit for bit; fp32: oneDNN's GEMM where it runs (summation order)
    tol = {"rtol": 0, "atol": 0} if widen_to == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(i4(x), want4, **tol)
    torch.testing.assert_close(i8(x), want8, **tol)
    for op in (i4, i8):
        assert rel_err(op(x), x @ dense.t() + bias) < 2e-2
    whole4, whole8 = i4(x), i8(x)
    monkeypatch.setattr(packed, "_WIDEN_ELEMENTS", 64 * 128)  # one 64-row slice at a time
    torch.testing.assert_close(i4(x), whole4, rtol=0, atol=0)
    torch.testing.assert_close(i8(x), whole8, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 255])
def test_int4_gemm_is_the_file_weight_times_x(rows: int) -> None:
    """Steps under WIDEN_ROWS rows: the native int4 GEMM (fp32 activations, every weight row
    count and row block; on the AVX2 tier x as int16 per group of 32, quant_gemm.h: within
    2^-15 of each group's largest), and torch's int4 GEMM where the op is not built (bf16
    activations and scales: bf16's error)."""
    rtol = quant_gemm_rtol()
    rng = np.random.default_rng(rows)
    for n in (1, 7, 64, 100):
        raw = _random_blocks(rng, n, 96, Q.Q4_0)
        q, s, o = decode_int4(raw, Q.Q4_0, 96)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, Q.Q4_0).reshape(n, 96)).double()
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(n))
        want = (x.double() @ dense.t()).float()
        native = Int4Linear(q, s, o, None)
        if native.native:
            got = native(x)
            assert_gemm_close(got, x, dense, rtol)
            assert torch.equal(got[-1:], native(x[-1:]))  # independent of the step's other rows
        if n % 16 == 0:  # torch's packing takes row counts that 16 divides
            assert rel_err(Int4Linear(q, s, o, None, native=False)(x), want) < 2e-2


@pytest.mark.skipif(not cpu_native.load(), reason="the native op is not built here")
@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q8_0, Q.Q4_0])
def test_int5_and_q8_gemms_are_the_file_weight_times_x(qtype: Q) -> None:
    """The int5 form (Q5_x) and the q8 form (Q8_0, Q4_0 as d * signed byte) hold the file's
    values bit for bit (widened, and read through their GEMM on identity rows), and multiply
    any row count within the tier's rounding (ignis_kernels/cpu/quant_gemm.h)."""
    rng = np.random.default_rng(int(qtype))
    rtol = quant_gemm_rtol(8 if qtype in (Q.Q8_0, Q.Q4_0) else 5)
    k = 256
    for n in (1, 7, 64, 100):
        raw = _random_blocks(rng, n, k, qtype)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k))
        if qtype in (Q.Q8_0, Q.Q4_0):
            q, d = decode_q8(raw, qtype, k)
            op: PackedLinear = Q8Linear(torch.from_numpy(q), torch.from_numpy(d), None)
        else:
            op = Int5Linear(*decode_wide_int(raw, qtype, k), None)
        torch.testing.assert_close(op.widen(0, n, torch.float32), dense, rtol=1e-6, atol=1e-7)
        eye = torch.eye(k)
        through = torch.cat([op(eye[:128]), op(eye[128:])]).t()  # under WIDEN_ROWS: the GEMM itself
        assert torch.equal(through, op.widen(0, n, torch.float32))
        for rows in (1, 2, 3, 4, 5, 9, 17):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            got = op(x)
            assert_gemm_close(got, x, dense, rtol)
            # Each row's result is the same whatever the step's other rows (drafts are checked
            # against plain decoding's one-row steps)
            assert torch.equal(got[-1:], op(x[-1:]))


def test_q6_k_and_k_scale_decoders_match_gguf() -> None:
    """Q6_K's values, sixteens' scales and d; Q4_K / Q5_K's six-bit scales and super-block
    pairs standing for exactly the fp32 (scale, offset) pairs the int decoders give."""
    rng = np.random.default_rng(6)
    raw = _random_blocks(rng, 5, 512, Q.Q6_K)
    q, sc, d = decode_q6_k(raw, Q.Q6_K, 512)
    assert q.max() <= 63 and sc.dtype == np.int8
    w = (np.repeat(d, 256, axis=1) * np.repeat(sc.astype(np.float32), 16, axis=1)) * (q.astype(np.float32) - 32)
    assert np.array_equal(w, gguf.quants.dequantize(raw, Q.Q6_K).reshape(5, 512))
    for qtype in (Q.Q4_K, Q.Q5_K):
        raw = _random_blocks(rng, 5, 512, qtype)
        _, scale, offset = (decode_int4 if qtype == Q.Q4_K else decode_wide_int)(raw, qtype, 512)
        sm, ds = decode_k_scales(raw, qtype, 512)
        assert np.array_equal(sm[..., 0] * np.repeat(ds[..., 0], 8, axis=1), scale)
        assert np.array_equal(sm[..., 1] * np.repeat(ds[..., 1], 8, axis=1), offset)


@pytest.mark.skipif(not cpu_native.load(), reason="the native op is not built here")
@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q4_K, Q.Q5_K])
def test_q6_and_k_scale_gemms_are_the_file_weight_times_x(qtype: Q) -> None:
    """The q6 form (Q6_K) and the K types' scales (Q4_K / Q5_K alone): the file's values bit
    for bit, widened and through the GEMM on identity rows, any row count within the tier's
    rounding, each row independent of the step's others; q6 at the file's 0.83 bytes a weight."""
    from ignis.model.packed import Q6Linear

    rng = np.random.default_rng(int(qtype))
    k = 512
    for n in (1, 7, 8, 64, 100):
        raw = _random_blocks(rng, n, k, qtype)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k))
        if qtype == Q.Q6_K:
            op: PackedLinear = Q6Linear(*decode_q6_k(raw, qtype, k), None)
            assert op.nbytes == n * k * 210 // 256 - 2 * n * k // 256 + 4 * n * k // 256  # the file's, d as fp32
            rtol = quant_gemm_rtol(8)  # x as bytes wherever AVX2 is
        elif qtype == Q.Q4_K:
            op = Int4Linear(*decode_int4(raw, qtype, k), None, k_scales=decode_k_scales(raw, qtype, k))
            rtol = quant_gemm_rtol(4)
        else:
            op = Int5Linear(*decode_wide_int(raw, qtype, k), None, k_scales=decode_k_scales(raw, qtype, k))
            rtol = quant_gemm_rtol(5)
        assert torch.equal(op.widen(0, n, torch.float32), dense)
        if qtype == Q.Q6_K:  # rows looked up (the op's q6_rows): the file's values, tail rows too
            ids = torch.tensor([n - 1, 0, n // 2, n - 1])
            assert torch.equal(op.rows(ids), dense[ids])
            with pytest.raises(RuntimeError, match="out of"):
                op.rows(torch.tensor([n]))
        eye = torch.eye(k)
        step = 8  # below the many-row body's rows (its 8-bit x rounds the identity's products)
        assert torch.equal(torch.cat([op(eye[i : i + step]) for i in range(0, k, step)]).t(), dense)
        if op.many:  # dense() through the exact body too
            assert torch.equal(op.dense(), dense)
        for rows in (1, 2, 3, 5, 9):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            got = op(x)
            assert_gemm_close(got, x, dense, rtol)
            assert torch.equal(got[-1:], op(x[-1:]))


@pytest.mark.skipif(not cpu_native.load(), reason="the native op is not built here")
def test_mxfp4_gemm_is_the_file_weight_times_x() -> None:
    """The mxfp4 form (gpt-oss's experts: e2m1 nibbles, an e8m0 exponent per 32) holds the
    file's values bit for bit, widened (bf16 too: powers of two times e2m1) and through its
    GEMM on identity rows, and multiplies any row count within the tier's rounding, each
    row's result independent of the step's other rows."""
    from ignis.model.gguf_quant import decode_mxfp4_codes, decode_mxfp4_nibbles
    from ignis.model.packed import Mx4Linear

    rng = np.random.default_rng(4)
    k = 256
    for n in (1, 7, 64, 100):
        raw = _random_blocks(rng, n, k, Q.MXFP4)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, Q.MXFP4).reshape(n, k))
        op = Mx4Linear(*decode_mxfp4_nibbles(raw, k), None)  # the loader's: byte for byte, no codes
        codes, exponents = decode_mxfp4_codes(raw, k)  # the codes in element order, paired here
        assert np.array_equal(decode_mxfp4_nibbles(raw, k)[0], codes[:, 0::2] | (codes[:, 1::2] << 4))
        assert np.array_equal(decode_mxfp4_nibbles(raw, k)[1], exponents)
        assert op.nbytes == n * k // 2 + n * k // 32
        assert torch.equal(op.widen(0, n, torch.float32), dense)
        assert torch.equal(op.widen(0, n, torch.bfloat16).float(), dense)
        eye = torch.eye(k)
        assert torch.equal(torch.cat([op(eye[:128]), op(eye[128:])]).t(), dense)
        for rows in (1, 2, 3, 4, 5, 9, 17):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            got = op(x)
            assert_gemm_close(got, x, dense, quant_gemm_rtol(4))
            assert torch.equal(got[-1:], op(x[-1:]))


@pytest.mark.skipif(not cpu_native.load(), reason="the native op is not built here")
def test_block_types_pick_the_narrowest_exact_form() -> None:
    """Per fused weight: all 4-bit blocks int4; 5-bit (with 4-bit) int5; Q8_0 with Q5_0 / Q4_0
    (Gemma's q|k|v) q8; Q8_0 beside Q4_K int4 pairs; MXFP4 its own, beside Q8_0 q8; Q6_K
    alone q6; beside others, a stack of each run's exact form (a Q4_K_M file's q|k|v with a
    Q6_K v). Q4_K / Q5_K alone keep their own scales."""
    from ignis.model.packed import _build_linear, _Raw

    rng = np.random.default_rng(9)

    def part(qtype: Q) -> _Raw:
        return _Raw(None, None, qtype=qtype, shape=(8, 256), data=_random_blocks(rng, 8, 256, qtype))

    plan = WeightPlan("quantized", int4=True)
    cases = {("Q4_K", "Q4_0"): "int4", ("Q5_0", "Q4_K"): "int5", ("Q5_K",): "int5", ("Q5_0", "Q8_0"): "q8",
             ("Q8_0",): "q8", ("Q8_0", "Q4_K"): "int4x2", ("MXFP4",): "mxfp4", ("MXFP4", "Q8_0"): "q8",
             ("Q4_K",): "int4", ("Q4_K", "Q4_K"): "int4", ("Q6_K",): "q6", ("Q6_K", "Q6_K"): "q6", ("Q4_K", "Q4_K", "Q6_K"): "int4+q6",
             ("Q6_K", "Q4_0"): "q6+int4"}
    for types, form in cases.items():
        parts = [part(Q[t]) for t in types]
        op = _build_linear(parts, None, plan)
        assert op.form == form, types
        if form in ("int4", "int5"):
            assert (op.scales.pairs is None) == (set(types) <= {"Q4_K", "Q5_K"}), types
        dense = torch.from_numpy(np.concatenate([p.dense() for p in parts]))
        if form != "int8":  # (requantized per row: not the file's values)
            torch.testing.assert_close(op.widen(0, dense.shape[0], torch.float32), dense, rtol=1e-6, atol=1e-7, msg=str(types))


def test_mixed_op_picks_its_gemm_by_rows() -> None:
    """The mixed form's op: the quantized GEMM for steps of at most NARROW_ROWS rows, the
    wide copy above, each with the bias once; both hold the same weight."""
    from ignis.model.lm_head import NARROW_ROWS
    from ignis.model.packed import MixedLinear

    rng = np.random.default_rng(3)
    raw = _random_blocks(rng, 96, 128, Q.Q4_1)
    q, s, o = decode_int4(raw, Q.Q4_1, 128)
    dense = torch.from_numpy(gguf.quants.dequantize(raw, Q.Q4_1).reshape(96, 128))
    bias = torch.randn(96)
    narrow, wide = Int4Linear(q, s, o, bias), _wide(dense, bias)
    mixed = MixedLinear(Int4Linear(q, s, o, None), _wide(dense), bias)
    assert mixed.form == f"int4+{WIDE}" and mixed.nbytes == narrow.nbytes + wide.nbytes
    for rows, same_as in ((1, narrow), (NARROW_ROWS, narrow), (NARROW_ROWS + 1, wide), (64, wide)):
        x = torch.randn(rows, 128)
        torch.testing.assert_close(mixed(x), same_as(x), rtol=0, atol=0)
        assert rel_err(mixed(x), x @ dense.t() + bias) < 2e-2


ZEN5 = CpuPlatform(level="avx512", flags=frozenset({"avx512f", "avx512_vnni", "avx512_bf16"}),
                   gemms=frozenset({"int4", "int8", "bf16", "fp32", "int8_dynamic"}))
ZEN3 = CpuPlatform(level="avx2", flags=frozenset({"avx2", "fma", "f16c"}),
                   gemms=frozenset({"int4", "int8", "fp16", "fp32", "int8_dynamic"}))
NO_INT = CpuPlatform(level="portable", gemms=frozenset({"fp32"}))


def test_plan_weights_per_machine() -> None:
    """One decision per machine: a Zen 5 (AVX-512, bf16, VNNI) keeps 4-bit blocks as int4
    and widens to bf16; a Zen 3 (AVX2, no bf16 GEMM, no VNNI) takes fp32 widening, fbgemm
    fp16 for wide steps and a 7-bit int8 head, and int8 GEMMs unless the native op (its int4
    GEMM) is built; without int GEMMs auto is float32."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def plan(form: str, p: CpuPlatform, seqs: int = 1, kind: str = "gguf", native: bool = False):
        return plan_weights(form, kind=kind, device=cpu, max_num_seqs=seqs, platform=p, native=native)

    assert plan("auto", ZEN5).form == "quantized" and plan("auto", ZEN5, 64).form == "mixed"
    z5 = plan("mixed", ZEN5)
    assert (z5.int4, z5.wide, z5.widen_to, z5.head_int8, z5.head_full_range) == (True, "bf16", "bf16", True, True)
    z3 = plan("mixed", ZEN3)
    assert (z3.int4, z3.wide, z3.widen_to, z3.head_int8, z3.head_full_range) == (False, "fp16", "fp32", True, False)
    assert plan("auto", ZEN3).form == "quantized" and plan("auto", ZEN3, 64).form == "mixed"
    assert "int8" in plan("auto", ZEN3).why and "avx2" in plan("auto", ZEN3).why
    # with the native op built, its int4 GEMM serves every tier
    assert plan("mixed", ZEN3, native=True).int4 and plan("quantized", ZEN3, native=True).int4
    assert plan("auto", NO_INT).form == "float32"
    assert plan("auto", ZEN3, kind="hf").form == "float32"
    assert plan_weights("auto", kind="gguf", device=cuda, max_num_seqs=1).form == "float32"
    # What a machine cannot run is one clear line naming the form and what is missing.
    with pytest.raises(UnsupportedWeightForm, match="bfloat16 needs oneDNN's bf16 GEMM.*avx2") as err:
        plan("bfloat16", ZEN3)
    assert "\n" not in str(err.value)
    with pytest.raises(UnsupportedWeightForm, match="quantized needs torch's int8"):
        plan("quantized", NO_INT)
    with pytest.raises(UnsupportedWeightForm, match="CPU form"):
        plan_weights("quantized", kind="gguf", device=cuda, max_num_seqs=1)
    with pytest.raises(UnsupportedWeightForm, match="GGUF"):
        plan("quantized", ZEN5, kind="hf")
    with pytest.raises(ValueError, match="unknown weight form"):
        plan("int3", ZEN5)


def test_auto_keeps_wide_copies_only_where_they_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """`auto` with many sequences takes `mixed` while the file and its wide copies fit in
    MIXED_MEMORY_SHARE of the memory available, else `quantized` (an 8B Q4_K_M's bf16 copies,
    16 GB beside its 4.9, on a 24 GB machine), saying why; an explicit form is kept as asked.
    The copies skip Q4_K / Q6_K where their many-row body replaces them (AVX2, AVX-512 VNNI;
    not on AVX-512 without VNNI, where there is none)."""
    from ignis.model import weight_plan

    cpu = torch.device("cpu")
    matrices = [("Q4_K", 7_000_000_000), ("Q6_K", 1_000_000_000), ("Q8_0", 100_000_000)]
    monkeypatch.setattr(weight_plan, "many_replaces_copy", lambda: False)
    copies = weight_plan.mixed_copy_bytes(matrices, ZEN5)
    assert copies == 2 * 8_100_000_000

    def auto(memory: int, form: str = "auto") -> WeightPlan:
        return plan_weights(form, kind="gguf", device=cpu, max_num_seqs=64, platform=ZEN5, native=True,
                            file_bytes=4_900_000_000, copy_bytes=copies, memory=memory)

    assert auto(64 << 30).form == "mixed"
    tight = auto(18 << 30)
    assert tight.form == "quantized" and "would not fit" in tight.why and "16.2 GB" in tight.why
    assert auto(18 << 30, "mixed").form == "mixed"
    monkeypatch.setattr(weight_plan, "many_replaces_copy", lambda: True)
    assert weight_plan.mixed_copy_bytes(matrices, ZEN3) == 2 * 100_000_000  # fbgemm fp16, Q8_0's alone
    assert weight_plan.mixed_copy_bytes(matrices, ZEN5) == 2 * 100_000_000  # bf16, Q8_0's alone
    assert weight_plan.available_memory() is None or weight_plan.available_memory() > 0


@pytest.mark.parametrize(
    "family, kwargs, qtypes",
    [
        # permuted Q/K rows in 4-bit blocks, Q5_0 MLP (-> int8), Q8_0 embedding, bf16 head
        ("llama", dict(num_heads=4, num_kv_heads=2), {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q5_0, "output": Q.BF16}),
        # q/k/v biases on a 4-bit GEMM, tied head over an F16 embedding
        ("qwen2", dict(num_heads=4, num_kv_heads=1, tie_word_embeddings=True), {"embd": Q.F16, "attn": Q.Q4_0, "ffn": Q.Q8_0}),
    ],
)
def test_packed_forms_match_float32(tmp_path: Path, family: str, kwargs: dict, qtypes: dict) -> None:
    model_dir = build_tiny_model(tmp_path / family, family, intermediate_size=128, **kwargs)
    path = str(build_tiny_gguf(model_dir, tmp_path / f"{family}.gguf", qtypes))
    ref = load_model(path, progress=False, weight_form="float32")
    want = flat_forward_logits(ref.model, [[PROMPT]])[0]
    for form in ("bfloat16", "quantized", "mixed"):
        if form == "bfloat16" and not cpu_platform.current().has_gemm("bf16"):
            with pytest.raises(UnsupportedWeightForm):
                load_model(path, progress=False, weight_form=form)
            continue
        loaded = load_model(path, progress=False, weight_form=form)
        assert loaded.model.weight_form == form and loaded.model.dtype == torch.float32
        # chunked prefill then decode rows, through the same paged path the engine uses
        got = flat_forward_logits(loaded.model, [[PROMPT[:20], PROMPT[20:30]] + [[t] for t in PROMPT[30:]]])[0]
        assert got.shape == want.shape
        assert rel_err(got, want) < TOL_BF16, form
        # random tiny models have near-ties among their logits: most, not all, argmaxes agree
        assert (got.argmax(-1) == want.argmax(-1)).double().mean() >= 0.8, form


def _q8_table(seed: int, rows: int, cols: int):
    from ignis.model.packed import Q8Embedding

    q, s = decode_q8_0(_random_blocks(np.random.default_rng(seed), rows, cols, Q.Q8_0), cols)
    return Q8Embedding(q, s, torch.float32)


def test_refined_head_is_exact_at_the_top() -> None:
    """The head's bf16 logits, with each row's top candidates recomputed in fp32 from the
    exact Q8_0 rows: those equal the fp32 logits (up to summation order)."""
    table = _q8_table(3, 300, 64)
    dense = table.dense()
    head = RefinedHead(table, wide=_wide(dense), wide_top=5)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    top = head.wide(x).topk(5, dim=-1).indices  # the candidates bf16 ranks first
    got = head(x)
    want = x @ dense.t()
    assert torch.allclose(got.gather(1, top), want.gather(1, top), rtol=1e-5, atol=1e-5)
    if WIDE != "fp32":  # a rounded GEMM is not exact there by itself
        assert not torch.allclose(head.wide(x).gather(1, top), want.gather(1, top), rtol=1e-5, atol=1e-5)
    assert rel_err(got, want) < 2e-2  # the rest: bf16's error


@pytest.mark.parametrize("full_range", [True, False])
def test_int8_dynamic_head_matches_its_weight(full_range: bool) -> None:
    """Int8 weights (one scale per row) times activations quantized to 8 bits (7 without
    VNNI): within 3% (6%) of the largest logit (each side rounds to 1/255 of its range;
    measured ~1.5% here, and ~4% of SmolLM2's largest logit over its outlier activation dims)."""
    if full_range and not cpu_platform.current().int8_dynamic_full_range:
        # fbgemm's full-range products saturate without VNNI (23% off, measured on a Zen 3):
        # the loader never asks for them there (cpu_platform.int8_dynamic_full_range)
        pytest.skip("full-range int8 products are exact only with AVX512-VNNI")
    dense = _q8_table(4, 500, 96).dense()
    head = Int8DynamicHead(dense, full_range)
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(1))
    got = head(x)
    assert got.dtype == torch.float32 and got.shape == (6, 500) and head.reduce_range == (not full_range)
    assert rel_err(got, x @ dense.t()) < (3e-2 if full_range else 6e-2)


def test_refined_head_picks_its_gemm_by_rows() -> None:
    """Few rows go through the int8 GEMM, more through bf16; each refines its own top, so
    both agree with fp32 on every row's best (the greedy choice) and on their candidates."""
    table = _q8_table(5, 400, 64)
    dense = table.dense()
    narrow, wide = Int8DynamicHead(dense), _wide(dense)
    head = RefinedHead(table, wide=wide, narrow=narrow)
    assert head.gemm_for(1)[0] is narrow and head.gemm_for(NARROW_ROWS)[0] is narrow
    assert head.gemm_for(NARROW_ROWS + 1)[0] is wide
    assert RefinedHead(table, narrow=narrow).gemm_for(64)[0] is narrow  # the only GEMM serves all
    for rows in (1, NARROW_ROWS + 3):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        gemm, top = head.gemm_for(rows)
        cand = gemm(x).topk(top, dim=-1).indices
        got, want = head(x), x @ dense.t()
        assert torch.allclose(got.gather(1, cand), want.gather(1, cand), rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    with pytest.raises(ValueError):
        RefinedHead(table)


def test_one_user_model_skips_the_wide_head(tmp_path: Path) -> None:
    """A model loaded for an engine of at most NARROW_ROWS sequences holds the int8 head
    only (no bf16 copy of the vocabulary); for more, both."""
    model_dir = build_tiny_model(tmp_path / "llama", "llama", intermediate_size=128, num_heads=4, num_kv_heads=2,
                                 tie_word_embeddings=True)
    path = str(build_tiny_gguf(model_dir, tmp_path / "llama.gguf", {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_1}))
    one = load_model(path, progress=False, weight_form="quantized", max_num_seqs=1).model.head_op
    many = load_model(path, progress=False, weight_form="quantized", max_num_seqs=64).model.head_op
    assert isinstance(one.narrow, Int8DynamicHead) and one.wide is None
    assert isinstance(many.narrow, Int8DynamicHead) and many.wide.form == WIDE


@pytest.mark.skipif(not cpu_native.load(), reason="the native op is not built here")
def test_large_q8_table_is_its_own_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied Q8_0 table of Q8_HEAD_MIN_BYTES or more is the few-row head itself (the q8 GEMM
    over the embedding's own tensors: no second copy), and its logits are the float32
    model's to fp32 rounding at the top (refined) and to the q8 GEMM's int16 rounding below."""
    from ignis.model import packed

    model_dir = build_tiny_model(tmp_path / "llama", "llama", intermediate_size=128, num_heads=4, num_kv_heads=2,
                                 tie_word_embeddings=True)
    path = str(build_tiny_gguf(model_dir, tmp_path / "llama.gguf", {"embd": Q.Q8_0, "attn": Q.Q4_1, "ffn": Q.Q4_1}))
    monkeypatch.setattr(packed, "Q8_HEAD_MIN_BYTES", 0)
    model = load_model(path, progress=False, weight_form="quantized", max_num_seqs=1).model
    head = model.head_op
    assert isinstance(head.narrow, Q8Linear) and head.wide is None
    assert head.narrow.q is model.embed_op.q and head.narrow.d is model.embed_op.scale  # shared, not copied
    x = torch.randn(3, head.narrow.in_features)
    exact = x.double() @ model.embed_op.dense().double().t()
    got = head(x)
    assert rel_err(got, exact) < quant_gemm_rtol(8)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))


def test_blocked_rows_come_back_in_order() -> None:
    """The nibble formats' blocks of eight rows (packed._blocked) read back row by row, for
    whole blocks (the widening's slices: a view) and any other range (a gather)."""
    from ignis.model.packed import _blocked, _unblocked

    for n in (1, 7, 8, 13, 64, 100):
        a = np.random.default_rng(n).random((n, 5, 2)).astype(np.float32)
        b = _blocked(a)
        for n0, n1 in ((0, n), (0, min(8, n)), (n // 8 * 8, n), (min(8, n), n), (1, n), (3, 4)):
            if n0 < n1 <= n:
                assert torch.equal(_unblocked(b, n0, n1, 5), torch.from_numpy(a[n0:n1])), (n, n0, n1)


@pytest.mark.skipif(not cpu_native.load() or cpu_native.many_rows() == 0, reason="no many-row body on this CPU")
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_many_row_steps_multiply_8_bit_x_by_the_file_values(qtype: Q) -> None:
    """From cpu_native.many_rows() rows, Q4_K and Q6_K multiply x rounded to 8 bits per 32
    on its 256's scale (quant_gemm_many.h) by the file's values: the float64 product of that rounded x within
    fp32 rounding, whole blocks of eight rows (a tail of N % 8 through the exact body), each
    row of x independent of the step's others there, and within 8-bit rounding of x @ W^T."""
    from ignis.model.packed import Q6Linear

    many = cpu_native.many_rows()
    rng = np.random.default_rng(30 + int(qtype))
    k = 768
    for n in (8, 100):
        raw = _random_blocks(rng, n, k, qtype)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k))
        if qtype == Q.Q6_K:
            op: PackedLinear = Q6Linear(*decode_q6_k(raw, qtype, k), None)
        else:
            op = Int4Linear(*decode_int4(raw, qtype, k), None, k_scales=decode_k_scales(raw, qtype, k))
        assert op.many
        for rows in (many, many + 3, 64, 300):  # 300: past WIDEN_ROWS, no widened copy either
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * torch.linspace(0.1, 4, k)
            x[0, :256] = 0  # a super-block of zeros: d = 0
            x[1, 256:288] *= 1e-3  # a group of small values beside larger ones: scaled up by 2^shift
            x[1, 288:320] = 0
            got = op(x)
            n8 = n // 8 * 8
            assert_gemm_close(got[:, :n8], _rounded_8_bit(x, 5 if qtype == Q.Q6_K else 7), dense[:n8], 2e-6)
            if n8 < n:
                assert_gemm_close(got[:, n8:], x, dense[n8:], quant_gemm_rtol(8))
            assert_gemm_close(got, x, dense, 1e-2)
            assert torch.equal(got[-many:], op(x[-many:]))
    x = torch.randn(many - 1, k)
    assert_gemm_close(op(x), x, dense, quant_gemm_rtol(8))  # fewer rows: the exact body


def _rounded_8_bit(x: torch.Tensor, shift: int) -> torch.Tensor:
    """x as the many-row body reads it (quant_gemm_many.h's Split8): per 256, m = max |x|;
    per 32, e = the largest in [0, shift] with the group's max |x| * 2^e <= m, q = round(x *
    2^e * 127 / m) (half to even, as vcvtps2dq), x = q * 2^-e * m / 127, in fp32 as the kernel's."""
    t, k = x.shape
    v = x.view(t, k // 256, 8, 32)
    top = v.abs().amax(dim=(-2, -1), keepdim=True)
    group = v.abs().amax(dim=-1, keepdim=True)
    e = sum(((group * 2.0**i) <= top).int() for i in range(1, shift + 1))
    inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    q = torch.round(v * (inv * torch.exp2(e.float())))
    return (q * torch.exp2(-e.float()) * (top / 127.0)).view(t, k)
