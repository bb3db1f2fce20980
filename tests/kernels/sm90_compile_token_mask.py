"""Compile the grammar bitmask kernel (ignis_kernels.token_mask) for sm_90 without a GPU.

A companion of sm90_compile.py (whose compile helpers it reuses), kept apart so the
two lists can change independently. Run as a script with TRITON_INTERPRET unset:
one JSON line per configuration. tests/kernels/test_token_mask_sm90.py drives it.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from sm90_compile import _TY, _compile, _ptxas_stats  # noqa: E402 - a sibling script
from ignis_kernels.token_mask_triton import BLOCK_V, _token_bitmask_kernel


def compile_all() -> list[dict]:
    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        ptrs = {"logits_ptr": f"*{_TY[dtype]}", "mask_ptr": "*i32", "rows_ptr": "*i64"}
        k = _compile(_token_bitmask_kernel, ptrs, {"floor"}, dict(BLOCK=BLOCK_V, stride_lv=1), 4, 1)
        rows.append({"kernel": "token_bitmask", "dtype": _TY[dtype], "block": BLOCK_V,
                     "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"])})
    return rows


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles for sm_90")
    for row in compile_all():
        print(json.dumps(row))
