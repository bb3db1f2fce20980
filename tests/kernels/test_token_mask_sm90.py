"""The grammar bitmask kernel compiles for sm_90, checked without a GPU (see sm90_compile.py)."""

from __future__ import annotations

import pytest

from tests.kernels.sm90_rows import PTXAS, SCRIPT, check_rows, compile_rows

pytestmark = pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")


def test_token_mask_compiles_for_sm90() -> None:
    rows = compile_rows(script=SCRIPT.with_name("sm90_compile_token_mask.py"))
    assert {r["dtype"] for r in rows} == {"bf16", "fp16", "fp32"}
    check_rows(rows)
    assert all((r["spill_bytes"] or 0) == 0 for r in rows), rows
