"""The kernels compile for sm_90 (H100/H200) and fit its shared memory, checked without a GPU.

The interpreter cannot see compiler-only failures; see sm90_compile.py. Runs in a
subprocess because this process has TRITON_INTERPRET=1 (Triton reads it at import).

The GPU machine's image has Triton 3.6.0, not our 3.7.1: with IGNIS_TRITON36_PYTHON set
to the python of a throwaway environment holding triton==3.6.0 (and torch, for the
dtypes), the slow test below compiles every configuration with it too (DEVELOPERS.md
says how to make one); it skips where that is not set.
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


TRITON36 = os.environ.get("IGNIS_TRITON36_PYTHON", "")


def compile_rows(*flags: str, python: str = sys.executable) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([python, str(SCRIPT), *flags], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def check_rows(rows: list[dict]) -> None:
    assert rows
    for row in rows:
        assert row["shared"] <= SMEM_LIMIT, row
        if row["dtype"] in ("bf16", "fp16"):
            assert (row["spill_bytes"] or 0) <= 64, row  # 16-bit paths must not spill
        if row["kernel"] == "paged_attention" and row["max_query_len"] == 1 and row["num_stages"] >= 3:
            # The table entries load a tile ahead: K and V are multi-buffered, and the loop
            # never waits for every copy in flight.
            assert row["buffers"].get("k", 0) >= 2 and row["buffers"].get("v", 0) >= 2, row
            assert row["max_async_wait"] >= 2, row
        if row["kernel"] == "sample":
            # One reduction per pass, after its loop; only the compacting pass scans per chunk.
            assert row["loop_reduces"] <= 2, row
            assert row["wide_loads"] > 0, row  # a vocabulary divisible by 16: 16-byte loads
            assert row["regs"] <= 128, row  # two 8-warp programs per SM


@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_compiles_for_sm90_common_configs():
    check_rows(compile_rows("--quick"))


@pytest.mark.slow
@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_compiles_for_sm90_all_configs():
    check_rows(compile_rows())


@pytest.mark.slow
@pytest.mark.skipif(not TRITON36 or not Path(TRITON36).exists(), reason="IGNIS_TRITON36_PYTHON is not set")
def test_compiles_for_sm90_with_the_gpu_images_triton():
    version = subprocess.run([TRITON36, "-c", "import triton; print(triton.__version__)"], capture_output=True,
                             text=True, timeout=120).stdout.strip()
    assert version == "3.6.0", version
    check_rows(compile_rows(python=TRITON36))
