"""The grouped per-expert GEMM over MXFP4 weights (Triton, interpreted) against its reference,
the reference against a dense dequantization written here from the format's bit rules, and
the MoE block over MXFP4 against ignis_kernels.moe_ref.moe_ref on the dequantized weights."""

from __future__ import annotations

import pytest
import torch

from ignis_kernels.moe_mxfp4 import grouped_gemm_mxfp4, moe_mxfp4
from ignis_kernels.moe_mxfp4_triton import grouped_gemm_mxfp4_triton, tile_m
from ignis_kernels.moe_mxfp4_ref import dequantize_mxfp4, grouped_gemm_mxfp4_ref
from ignis_kernels.moe_ref import moe_ref, route


def _dense(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """W [E, N, K] in fp32 by the rules: byte j of a row holds elements 2j (low nibble) and
    2j + 1 (high); a nibble is sign bit 3, exponent bits 1-2, mantissa bit 0; group g's
    scale is 2^(scales[g] - 127)."""
    *lead, G, _ = blocks.shape
    b = blocks.reshape(*lead, G * 16).to(torch.int64)

    def value(n: torch.Tensor) -> torch.Tensor:
        sign = torch.where((n >> 3) & 1 == 1, -1.0, 1.0).double()
        ex, m = ((n >> 1) & 3).double(), (n & 1).double()
        return sign * torch.where(ex == 0, 0.5 * m, (1 + 0.5 * m) * 2.0 ** (ex - 1))

    w = torch.empty(*lead, G * 32, dtype=torch.float64)
    w[..., 0::2] = value(b & 0xF)
    w[..., 1::2] = value(b >> 4)
    scale = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    return (w * scale).float()


def _mxfp4(e: int, n: int, k: int, seed: int, lo: int = 124, hi: int = 130) -> tuple[torch.Tensor, torch.Tensor]:
    """Random blocks and scales near 2^0, so the weights stay moderate."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(lo, hi, (e, n, k // 32), dtype=torch.uint8, generator=g)
    return blocks, scales


def _offsets(counts: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)


def test_dequantize_matches_the_bit_rules_exactly() -> None:
    # Every byte value, and scales from the e8m0 extremes (0 is 2^-127, an fp32 subnormal).
    blocks = torch.arange(256, dtype=torch.uint8).reshape(1, 2, 8, 16)
    scales = torch.tensor([[[0, 1, 60, 126, 127, 128, 200, 254], [127] * 8]], dtype=torch.uint8)
    got = dequantize_mxfp4(blocks, scales)
    assert got.shape == (1, 2, 256) and torch.equal(got, _dense(blocks, scales))
    blocks, scales = _mxfp4(3, 5, 96, seed=1, lo=0, hi=255)
    assert torch.equal(dequantize_mxfp4(blocks, scales), _dense(blocks, scales))
    assert dequantize_mxfp4(blocks, scales, torch.bfloat16).dtype == torch.bfloat16


def test_dequantize_agrees_with_the_model_loaders() -> None:
    mxfp4 = pytest.importorskip("ignis.model.mxfp4")
    blocks, scales = _mxfp4(2, 7, 64, seed=2, lo=100, hi=150)
    assert torch.equal(dequantize_mxfp4(blocks, scales), mxfp4.dequantize_hf(blocks, scales))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_gemm_bit_for_bit(dtype: torch.dtype) -> None:
    # fp32: x small integers times 2^-2, weights 2-bit mantissas times 2^-3..2^2: every
    # partial sum is a multiple of 2^-5 below 2^12, exact in any order. bf16: the
    # interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so each x row is
    # one +-2^j at one column: every output is one weight, exact in bf16 with no rounding.
    # Either way the kernel, the reference and a dense fp64 product agree bit for bit.
    counts, n, k = [3, 0, 18], 20, 64
    blocks, scales = _mxfp4(len(counts), n, k, seed=3, lo=125, hi=130)
    g = torch.Generator().manual_seed(4)
    m = sum(counts)
    if dtype == torch.float32:
        x = torch.randint(-4, 5, (m, k), generator=g) * 0.25
    else:
        x = torch.zeros(m, k)
        x[torch.arange(m), torch.randint(0, k, (m,), generator=g)] = torch.randint(-2, 3, (m,), generator=g).exp2()
        x[::2] = -x[::2]
    x = x.to(dtype)
    offsets = _offsets(counts)
    dense = _dense(blocks, scales).double()
    want = torch.cat([x[a:b].double() @ dense[e].T for e, (a, b) in enumerate(zip(offsets[:-1], offsets[1:]))])
    want = want.float().to(dtype)
    ref = grouped_gemm_mxfp4_ref(x, blocks, scales, offsets)
    got = grouped_gemm_mxfp4_triton(x, blocks, scales, offsets, block_m=16, block_n=16, block_k=32)
    assert torch.equal(ref, want) and torch.equal(got, want)


@pytest.mark.parametrize("counts, n, k, bias, dtype, tiles", [
    # empty experts first, last and between; a group longer than a row tile; N not a
    # multiple of BLOCK_N; K a multiple of 32 but not of BLOCK_K (a masked last K tile)
    ([0, 5, 0, 21, 3, 0], 24, 64, False, torch.float32, (16, 16, 32)),
    ([7, 0, 17, 1], 40, 96, True, torch.float32, (16, 32, 64)),
    ([3, 0, 19], 24, 96, True, torch.bfloat16, (16, 16, 64)),
    ([2, 9], 20, 32, False, torch.bfloat16, (None, 64, 64)),  # the launcher's tiles (tile_m: 16)
])
def test_triton_matches_reference(counts, n, k, bias, dtype, tiles) -> None:
    blocks, scales = _mxfp4(len(counts), n, k, seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(sum(counts), k, generator=g).to(dtype)
    b = torch.randn(len(counts), n, generator=g).to(dtype) if bias else None
    offsets = _offsets(counts)
    want = grouped_gemm_mxfp4_ref(x, blocks, scales, offsets, b)
    block_m, block_n, block_k = tiles
    got = grouped_gemm_mxfp4_triton(x, blocks, scales, offsets, b, block_m=block_m, block_n=block_n, block_k=block_k)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got.float(), want.float(), atol=tol * want.abs().max().item(), rtol=0)
    # Every expert's rows used its own weight and bias (the reference checked against dense).
    w = _dense(blocks, scales)
    for e in range(len(counts)):
        a, z = offsets[e].item(), offsets[e + 1].item()
        if z > a:
            ref = x[a:z].float() @ w[e].T + (0 if b is None else b[e].float())
            assert torch.allclose(got[a:z].float(), ref, atol=tol * ref.abs().max().item(), rtol=0)


def test_out_strides_dispatch_and_validation() -> None:
    counts, n, k = [4, 0, 3], 16, 32
    blocks, scales = _mxfp4(len(counts), n, k, seed=7)
    offsets = _offsets(counts)
    x = torch.randn(sum(counts), 2 * k)[:, ::2]  # a strided x
    want = grouped_gemm_mxfp4_ref(x, blocks, scales, offsets)
    out = torch.full((sum(counts), 2 * n), 7.0)[:, :n]  # a strided out, written in place
    assert grouped_gemm_mxfp4(x, blocks, scales, offsets, out=out, backend="triton") is out
    assert torch.allclose(out, want, atol=1e-5 * want.abs().max().item(), rtol=0)
    assert torch.equal(grouped_gemm_mxfp4(x, blocks, scales, offsets, backend="torch"), want)
    empty = grouped_gemm_mxfp4(x[:0], blocks, scales, torch.zeros(4, dtype=torch.int32), backend="triton")
    assert empty.shape == (0, n)
    with pytest.raises(ValueError, match="expert_offsets"):
        grouped_gemm_mxfp4_triton(x, blocks, scales, offsets[:2])
    with pytest.raises(ValueError, match="does not take"):
        grouped_gemm_mxfp4_triton(x[:, :16], blocks, scales, offsets)
    with pytest.raises(ValueError, match="do not pair"):
        grouped_gemm_mxfp4_ref(x, blocks, scales[:, :, :0], offsets)
    with pytest.raises(ValueError, match="multiple of 32"):
        grouped_gemm_mxfp4_triton(x, blocks, scales, offsets, block_k=48)


def test_tile_m_follows_rows_per_expert() -> None:
    assert tile_m(4, 32) == 16 and tile_m(0, 32) == 16  # decode: a row or two per expert
    assert tile_m(32 * 30, 32) == 32 and tile_m(32 * 200, 32) == 64


@pytest.mark.parametrize("backend, dtype, activation", [
    ("torch", torch.float32, "silu"),
    ("triton", torch.float32, "swiglu_oai"),
    ("triton", torch.bfloat16, "swiglu_oai"),
])
def test_moe_mxfp4_matches_moe_ref_on_dequantized_weights(backend: str, dtype: torch.dtype, activation: str) -> None:
    T, H, I, E, top_k = 7, 32, 32, 4, 2
    gu_blocks, gu_scales = _mxfp4(E, 2 * I, H, seed=8, lo=122, hi=126)  # weights up to 6/8
    down_blocks, down_scales = _mxfp4(E, H, I, seed=9, lo=122, hi=126)
    g = torch.Generator().manual_seed(10)
    x = torch.randn(T, H, generator=g).to(dtype)
    weights, ids = route(torch.randn(T, E, generator=g), top_k, softmax_first=False)
    biases = dict(gate_up_bias=(torch.randn(E, 2 * I, generator=g) * 0.1).to(dtype),
                  down_bias=(torch.randn(E, H, generator=g) * 0.1).to(dtype))
    got = moe_mxfp4(x, weights, ids, gu_blocks, gu_scales, down_blocks, down_scales, activation, backend, **biases)
    w_gate_up, w_down = _dense(gu_blocks, gu_scales).to(dtype), _dense(down_blocks, down_scales).to(dtype)
    want = moe_ref(x, weights, ids, w_gate_up, w_down, activation, **biases)
    assert got.shape == (T, H) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.float(), want.float(), atol=tol * want.abs().max().item(), rtol=0)
