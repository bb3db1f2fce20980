"""The kernels compile for sm_90 (H100/H200) and fit its shared memory, checked without a GPU.

The interpreter cannot see compiler-only failures; see sm90_compile.py. Runs in a
subprocess because this process has TRITON_INTERPRET=1 (Triton reads it at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

SCRIPT = Path(__file__).with_name("sm90_compile.py")
ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
SMEM_LIMIT = 227 * 1024


def compile_rows(*flags: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def check_rows(rows: list[dict]) -> None:
    assert rows
    for row in rows:
        assert row["shared"] <= SMEM_LIMIT, row
        if row["dtype"] in ("bf16", "fp16"):
            assert (row["spill_bytes"] or 0) <= 64, row  # 16-bit paths must not spill


@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_compiles_for_sm90_common_configs():
    check_rows(compile_rows("--quick"))


@pytest.mark.slow
@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_compiles_for_sm90_all_configs():
    check_rows(compile_rows())
