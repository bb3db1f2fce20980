"""Compiling kernels for sm_90 in a subprocess (TRITON_INTERPRET unset) and the checks on
its rows, shared by test_sm90_compile.py and test_token_mask_sm90.py. The compiling
scripts are sm90_compile.py and sm90_compile_token_mask.py beside this file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import triton

SCRIPT = Path(__file__).with_name("sm90_compile.py")
ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
SMEM_LIMIT = 227 * 1024


TRITON36 = os.environ.get("IGNIS_TRITON36_PYTHON", "")


def compile_rows(*flags: str, script: Path = SCRIPT, python: str = sys.executable) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([python, str(script), *flags], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
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
