"""Many-row Q4_K and Q6_K GEMMs through AMX's tiles (ignis_kernels/cpu/quant_gemm_amx.h) give the VNNI
body's outputs bit for bit: the same int32 sums per half super-block from the byte planes, the
same fp32 steps. Runs where the native op is built with AMX and Linux grants the tiles (a
Sapphire Rapids or later Xeon); elsewhere the body is not compiled and these skip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ignis.model.packed import Int4Linear, PackedLinear, Q6Linear
from ignis_kernels import cpu_native

pytestmark = pytest.mark.skipif(not cpu_native.amx(), reason="no AMX tiles here (CPU, build or kernel)")


def _q4_k(rng: np.random.Generator, n: int, k: int, extreme: bool = False) -> Int4Linear:
    """A Q4_K weight as the loader holds it: values, six-bit (sc, m) and per-256 (d, -dmin)."""
    q = np.full((n, k), 15, np.uint8) if extreme else rng.integers(0, 16, (n, k), dtype=np.uint8)
    sm = np.full((n, k // 32, 2), 63, np.uint8) if extreme else rng.integers(0, 64, (n, k // 32, 2), dtype=np.uint8)
    ds = np.abs(rng.normal(0, 1e-3, (n, k // 256, 2))).astype(np.float32)
    ds[..., 1] *= -1
    scale = sm[..., 0] * np.repeat(ds[..., 0], 8, axis=1)
    offset = sm[..., 1] * np.repeat(ds[..., 1], 8, axis=1)
    return Int4Linear(q, scale, offset, None, k_scales=(sm, ds))


def _q6_k(rng: np.random.Generator, n: int, k: int, extreme: bool = False) -> Q6Linear:
    """A Q6_K weight: six-bit values, int8 scales per 16, fp32 d per 256."""
    q = np.full((n, k), 0, np.uint8) if extreme else rng.integers(0, 64, (n, k), dtype=np.uint8)
    sc = np.full((n, k // 16), -128, np.int8) if extreme else rng.integers(-128, 128, (n, k // 16), dtype=np.int8)
    d = np.abs(rng.normal(0, 1e-4, (n, k // 256))).astype(np.float32)
    return Q6Linear(q, sc, d, None)


FORMATS = {"q4_k": _q4_k, "q6_k": _q6_k}


def _both(op: PackedLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        assert cpu_native.amx(True)
        tiles = op(x)
        assert not cpu_native.amx(False)
        vnni = op(x)
    finally:
        cpu_native.amx(True)
    return tiles, vnni


@pytest.mark.parametrize("form", sorted(FORMATS))
@pytest.mark.parametrize(("n", "k"), [(32, 256), (100, 768), (48, 8448)])
def test_tiles_give_the_vnni_bodys_outputs_bit_for_bit(form: str, n: int, k: int) -> None:
    """Whole sixteens of rows of x through the tiles, the rest (and a last block of eight
    weight rows, and a tail of N % 8) through VNNI: every row as VNNI alone gives it. K of
    8448: chunks of 32 rows of x (amx_chunk_rows)."""
    rng = np.random.default_rng(n + k)
    op = FORMATS[form](rng, n, k)
    assert op.many
    for rows in (16, 20, 37, 64, 100):
        x = torch.from_numpy(rng.normal(0, 1, (rows, k)).astype(np.float32)) * torch.linspace(0.1, 4, k)
        x[0, :256] = 0  # a super-block of zeros
        x[1, 32:64] *= 1e-3  # a group of small values beside large ones: x's power of two at its top
        x[2, :] = 1e4
        tiles, vnni = _both(op, x)
        assert torch.equal(tiles, vnni), (n, k, rows)
        assert torch.equal(tiles[-16:], op(x[-16:]))  # a row's outputs whatever its place in the step


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_the_sums_at_their_bound_wrap_back_exactly(form: str) -> None:
    """Q4_K: every nibble 15 and every scale 63; Q6_K: every value -32 and every scale -128;
    x at +-127 on the largest power of two: each half super-block's sum near 2^31
    (quant_gemm_many.h's bound), the planes' products and their shifted sum in int32 wrapping
    on the way, the result VNNI's."""
    rng = np.random.default_rng(5)
    op = FORMATS[form](rng, 32, 512, extreme=True)
    for sign in (1.0, -1.0):
        x = torch.full((32, 512), sign)
        x[1::2] *= -1
        x[3, 7] = 0.5 * sign  # below the others: rounds to 64 of 127
        tiles, vnni = _both(op, x)
        assert torch.equal(tiles, vnni)
        dense = op.widen(0, 32, torch.float32).double()
        # and near the product (fp32's rounding of d * sc * q and dmin * m, whose difference
        # each weight is: ~2e-5 of the sum of |w x| here)
        err = (tiles.double() - x.double() @ dense.T).abs()
        assert (err <= 1e-4 * (x.double().abs() @ dense.abs().T)).all()
