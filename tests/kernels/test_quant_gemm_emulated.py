"""kernels/cpu/quant_gemm.h's AVX-512 bodies, on any x86 CPU: qgemm_emulated.cpp runs them
through SIMDe's intrinsics (Debian's libsimde-dev, `make test` installs it), with and without
the AVX512-VNNI body of the mxfp4 form, against a float64 product of each format's weights.
On an AVX2 machine (CI's may be one) nothing else runs these bodies; on an AVX-512 one the
native op runs them for real (tests/model) and this adds the body the host lacks."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
SIMDE = Path("/usr/include/simde/x86/avx512.h")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 bodies")
@pytest.mark.skipif(not SIMDE.exists(), reason="SIMDe's headers are not installed (apt-get install libsimde-dev)")
@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("vnni", [0, 1])
def test_avx512_bodies_match_the_formats(vnni: int, tmp_path: Path) -> None:
    torch_dir = Path(torch.__file__).parent
    exe = tmp_path / "qgemm_emulated"
    cmd = ["g++", "-O1", "-std=c++20", "-march=x86-64-v3", "-fopenmp", "-w", f"-DIGNIS_QGEMM_MX4_VNNI={vnni}",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-I{torch_dir / 'include'}",
           str(HERE / "qgemm_emulated.cpp"), "-o", str(exe), f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10",
           f"-Wl,-rpath,{torch_dir / 'lib'}"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0, "\n".join(ln for ln in lines if not ln.startswith("ok"))[-3000:]
    assert lines[-1] == f"vnni {vnni}: 0 failures"
    assert sum(ln.startswith("ok format 40 ") for ln in lines) == 72  # every mxfp4 case ran
