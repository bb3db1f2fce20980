"""A mixture's stacked expert tensors in the packed CPU forms: each expert's rows cut from
the file's [E, N, K] blocks stay exactly the file's values (int4 blocks as int4 GEMMs),
and the routed-experts path through those GEMMs equals the dense reference."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ignis.model.packed import _build_linear, _Raw
from ignis.model.weight_plan import plan_weights
from tests.model.paged_utils import quant_gemm_rtol, rel_err


def _stacked(w: np.ndarray, qtype: Q) -> _Raw:
    """A GGUF tensor [E, N, K] of qtype as the reader hands it (shape reversed, raw blocks)."""
    data = gguf.quants.quantize(w.astype(np.float32), qtype)
    return _Raw(SimpleNamespace(tensor_type=qtype, shape=list(reversed(w.shape)), data=data), None)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_expert_rows_are_the_files_values(qtype: Q) -> None:
    rng = np.random.default_rng(0)
    E, N, K = 3, 32, 256
    raw = _stacked(rng.standard_normal((E, N, K)), qtype)
    whole = raw.dense()
    assert whole.shape == (E, N, K)
    plan = plan_weights("quantized", kind="gguf", device=torch.device("cpu"), max_num_seqs=1)
    for e in range(E):
        part = raw.rows(e * N, (e + 1) * N)
        assert np.array_equal(part.dense(), whole[e])
        op = _build_linear([part], None, plan)
        if qtype != Q.Q8_0 and plan.int4:
            assert op.form == "int4"
            assert torch.equal(op.widen(0, N, torch.float32), torch.from_numpy(whole[e]))  # the file's values
        else:
            assert rel_err(op.dense(), torch.from_numpy(whole[e])) < 1e-2


def test_routed_experts_through_packed_gemms_match_dense() -> None:
    from ignis.model.config import ModelConfig
    from ignis.model.layers import SparseMoE

    c = ModelConfig("qwen3_moe", 64, 64, 1, 4, 2, 16, 96, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32)
    moe = SparseMoE(c, torch.float32, "cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(11, 64, generator=g)
    want = moe(x)
    ex = moe.experts
    plan = plan_weights("quantized", kind="gguf", device=torch.device("cpu"), max_num_seqs=1)
    gate_up = _stacked(ex.gate_up_proj.detach().numpy(), Q.Q8_0)
    down = _stacked(ex.down_proj.detach().numpy(), Q.Q8_0)
    ex.expert_ops = [(_build_linear([gate_up.rows(e * 64, (e + 1) * 64)], None, plan),
                      _build_linear([down.rows(e * 64, (e + 1) * 64)], None, plan)) for e in range(4)]
    got = moe(x)
    assert rel_err(got, want) < 3e-2
    # Only the chosen experts run: an expert no token chose is never called.
    calls = []
    ops = ex.expert_ops
    ex.expert_ops = [(lambda t, e=e, f=f: (calls.append(e), f(t))[1], d) for e, (f, d) in enumerate(ops)]
    moe(x[:1])
    assert len(calls) == 2


@pytest.mark.parametrize("qtype, form", [(Q.Q5_0, "int5"), (Q.Q5_1, "int5"), (Q.Q8_0, "q8"), (Q.MXFP4, "mxfp4")])
def test_wide_int_blocks_are_held_exactly(qtype: Q, form: str) -> None:
    """Q5_0 / Q5_1 (and Q5_K, checked on raw blocks below) become int5 weights, Q8_0 int8
    values with their block scales, MXFP4 its e2m1 nibbles and exponent bytes, the file's
    values; the op's product equals the dequantized weight's."""
    from ignis_kernels import cpu_native

    if not cpu_native.load():
        pytest.skip("the native int4 GEMM is not built on this machine")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    raw = _Raw(SimpleNamespace(tensor_type=qtype, shape=[128, 48], data=gguf.quants.quantize(w, qtype)), None)
    plan = plan_weights("quantized", kind="gguf", device=torch.device("cpu"), max_num_seqs=1)
    op = _build_linear([raw], None, plan)
    exact = torch.from_numpy(gguf.quants.dequantize(raw.data, qtype).reshape(48, 128))
    assert op.form == form
    assert rel_err(op.widen(0, 48, torch.float32), exact) < 1e-6
    if qtype == Q.MXFP4:  # powers of two times small integers: bit for bit
        assert torch.equal(op.widen(0, 48, torch.float32), exact)
    x = torch.randn(3, 128)
    assert rel_err(op(x), x @ exact.T) < quant_gemm_rtol(8 if form == "q8" else 5)


def test_q5_k_decoder_matches_gguf() -> None:
    from ignis.model.gguf_quant import decode_wide_int

    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, (4, 2, 176), dtype=np.uint8)
    raw[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[..., 2:4] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    raw = raw.reshape(4, -1)
    q, s, o = decode_wide_int(raw, Q.Q5_K, 512)
    got = (q.reshape(4, -1, 32).astype(np.float32) * s[..., None] + o[..., None]).reshape(4, 512)
    assert np.array_equal(got, gguf.quants.dequantize(raw, Q.Q5_K).reshape(4, 512))


def test_mxfp4_blocks_decode_exactly_and_outside_fp16_fall_back() -> None:
    """MXFP4 (gpt-oss's experts): random raw blocks decode to ggml's values bit for bit; fused
    beside Q8_0 they take the q8 form (d fp16), and a block scale fp16 cannot hold (2^-30)
    sends the GEMM to another form, never a wrong one."""
    from ignis.model.gguf_quant import decode_mxfp4, mxfp4_fits_q8

    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (5, 4, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(110, 140, (5, 4))
    raw = raw.reshape(5, -1)
    q, d = decode_mxfp4(raw, 128)
    got = (q.reshape(5, -1, 32).astype(np.float32) * d[..., None]).reshape(5, 128)
    assert np.array_equal(got, gguf.quants.dequantize(raw, Q.MXFP4).reshape(5, 128))
    assert mxfp4_fits_q8(raw, 128)
    raw.reshape(5, 4, 17)[2, 1, 0] = 98  # 2^-30
    assert not mxfp4_fits_q8(raw, 128)
    plan = plan_weights("quantized", kind="gguf", device=torch.device("cpu"), max_num_seqs=1)
    q8 = _stacked(rng.standard_normal((1, 3, 128)), Q.Q8_0).rows(0, 3)
    mx = _Raw(SimpleNamespace(tensor_type=Q.MXFP4, shape=[128, 5], data=raw), None)
    op = _build_linear([mx, q8], None, plan)
    assert op.form != "q8"
    want = np.concatenate([mx.dense(), q8.dense()])
    assert rel_err(op.dense(), torch.from_numpy(want)) < 1e-2
