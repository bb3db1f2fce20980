"""The weight-only quantized matmul (ignis_kernels/wo_matmul.py) against its reference, in
Triton's interpreter (tiny shapes: every program-iteration costs ~4 ms), and its tile
configurations compiled for sm_90 without a GPU (a subprocess: this one interprets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from ignis_kernels.wo_matmul import WoTileConfig, wo_matmul, wo_matmul_triton
from ignis_kernels.wo_matmul_ref import (
    dequantize_weight,
    pack_int4,
    unpack_int4,
    wo_matmul_ref,
)

ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
SMEM_LIMIT = 227 * 1024


def _weights(n: int, k: int, bits: int, group: int, zeros: bool, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if bits == 4:
        q = pack_int4(torch.randint(0, 16, (n, k), generator=g))
    else:
        q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, k // group, generator=g) * 0.02 + 0.005).to(dtype)
    z = (torch.randn(n, k // group, generator=g) * 0.05).to(dtype) if zeros else None
    return q, s, z


def test_int4_packing_round_trips() -> None:
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    packed = pack_int4(q)
    assert packed.shape == (5, 32) and int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)


def test_reference_dequantizes_groupwise() -> None:
    q, s, z = _weights(3, 64, 4, 32, True, torch.float32)
    w = dequantize_weight(q, s, z, 4, 32)
    raw = unpack_int4(q).float()
    assert torch.allclose(w[1, 40], (raw[1, 40] - 8) * s[1, 1] + z[1, 1])
    x = torch.randn(2, 64)
    assert torch.allclose(wo_matmul_ref(x, q, s, z, bits=4, group_size=32), x @ w.t(), atol=1e-5)


@pytest.mark.parametrize(
    "bits, zeros, M, N, K, group, dtype",
    [
        (4, True, 1, 40, 64, 32, torch.bfloat16),  # decode row, ragged N (masked tile edge)
        (4, False, 3, 16, 96, 32, torch.float16),  # K not a multiple of BLOCK_K
        (8, False, 20, 24, 64, 32, torch.bfloat16),  # two M tiles
        (8, True, 2, 16, 128, 64, torch.float16),
    ],
)
def test_kernel_matches_reference(bits: int, zeros: bool, M: int, N: int, K: int, group: int, dtype) -> None:
    q, s, z = _weights(N, K, bits, group, zeros, dtype, seed=M + N)
    x = torch.randn(M, K).to(dtype)
    cfg = WoTileConfig(16, 16, 32, num_warps=4, num_stages=1)  # small tiles: few interpreted iterations
    got = wo_matmul_triton(x, q, s, z, bits=bits, group_size=group, config=cfg)
    want = wo_matmul_ref(x, q, s, z, bits=bits, group_size=group)
    assert got.dtype == dtype and got.shape == (M, N)
    scale = want.float().abs().max()
    assert ((got.float() - want.float()).abs().max() / scale).item() < 1e-2


def test_dispatch_and_argument_checks() -> None:
    q, s, z = _weights(16, 64, 8, 32, False, torch.float32)
    x = torch.randn(2, 64)
    assert torch.equal(wo_matmul(x, q, s, bits=8, group_size=32, backend="torch"), wo_matmul_ref(x, q, s, bits=8, group_size=32))
    with pytest.raises(ValueError):
        wo_matmul_triton(x, q, s, bits=4, group_size=32)  # 8-bit rows read as 4-bit: K mismatch
    with pytest.raises(ValueError):
        wo_matmul_triton(x, q, s[:, :1], bits=8, group_size=32)


@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_configs_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = Path(__file__).with_name("wo_matmul_sm90.py")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert len(rows) == 2 * 2 * 3  # bits x dtype x tile regimes
    for row in rows:
        assert row["shared"] <= SMEM_LIMIT, row
        assert (row["spill_bytes"] or 0) <= 64, row
