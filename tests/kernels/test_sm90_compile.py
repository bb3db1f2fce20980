"""The kernels compile for sm_90 (H100/H200) and fit its shared memory, checked without a GPU.

The interpreter cannot see compiler-only failures; see sm90_compile.py. Runs in a
subprocess because this process has TRITON_INTERPRET=1 (Triton reads it at import).

The GPU machine's image has Triton 3.6.0, not our 3.7.1: with IGNIS_TRITON36_PYTHON set
to the python of a throwaway environment holding triton==3.6.0 (and torch, for the
dtypes), the slow test below compiles every configuration with it too (DEVELOPERS.md
says how to make one); it skips where that is not set.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.kernels.sm90_rows import PTXAS, TRITON36, check_rows, compile_rows


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
