"""ignis_kernels/cpu/quant_gemm.h's AVX-512 bodies, on any x86 CPU: qgemm_emulated.cpp runs them
through SIMDe's intrinsics (Debian's libsimde-dev, `make test` installs it), with and without
the AVX512-VNNI byte body, and the AVX2 bodies natively, each against a float64
product of each format's weights. On an AVX2 machine (CI's may be one) nothing else runs the
AVX-512 bodies; on an AVX-512 one the native op runs them for real (tests/model) and this
adds the body the host lacks."""

from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
SIMDE = Path("/usr/include/simde/x86/avx512.h")


pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 bodies"),
    pytest.mark.skipif(not SIMDE.exists(), reason="SIMDe's headers are not installed (apt-get install libsimde-dev)"),
    pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler"),
]
BUILDS = {"avx512-vnni": (1, 1), "avx512": (1, 0), "avx2": (0, 0)}


@cache
def _run(build: str) -> list[str]:
    """qgemm_emulated.cpp built as `build` (AVX-512 emulated, with or without the VNNI body, or
    the host's AVX2 bodies) and run: its lines."""
    avx512, vnni = BUILDS[build]
    torch_dir = Path(torch.__file__).parent
    exe = Path(tempfile.mkdtemp(prefix="qgemm-")) / "qgemm_emulated"
    cmd = ["g++", "-O1", "-std=c++20", "-march=x86-64-v3", "-fopenmp", "-w", f"-DIGNIS_QGEMM_AVX512={avx512}",
           f"-DIGNIS_QGEMM_VNNI={vnni}", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-I{torch_dir / 'include'}", str(HERE / "qgemm_emulated.cpp"), "-o", str(exe),
           f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"]
    try:
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr[-3000:]
        ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(exe.parent, ignore_errors=True)
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0, "\n".join(ln for ln in lines if not ln.startswith("ok"))[-3000:]
    assert lines[-1] == f"avx512 {avx512} vnni {vnni}: 0 failures"
    return lines


@pytest.mark.parametrize("build", list(BUILDS))
def test_bodies_match_the_formats(build: str) -> None:
    lines = _run(build)
    assert sum(ln.startswith("ok format 40 ") for ln in lines) == 72  # every mxfp4 case ran
    # and the K types' scales (Q4_K / Q5_K), each equal bit for bit to the pairs they stand for
    assert sum(ln.startswith(("ok format 4k ", "ok format 5k ")) for ln in lines) == 2 * 6 * 2 * 6 + 6 * 2 * 2
    assert sum(ln.startswith("ok format 6 ") for ln in lines) == 6 * 2 * 8  # Q6_K's blocks (20 and 37 rows too)


def test_avx2_and_vnni_byte_bodies_agree_bit_for_bit() -> None:
    """The VNNI byte bodies are the AVX2 ones' arithmetic (vpdpbusd for vpmaddubsw + vpmaddwd):
    the same outputs, bit for bit, in every case of every nibble format and of Q6_K, the
    many-row bodies' (quant_gemm_many.h) included where a single block of eight rows takes
    them. Pairs of blocks (N of 64 and 100) take many16_vnni on VNNI: the same integer sums
    added in another order before fp32, checked in each build against the float64 product of
    its own 8-bit x instead (the cases' "ok")."""

    def outputs(build: str) -> list[str]:
        nibbles = ("ok format 4 ", "ok format 4k ", "ok format 5 ", "ok format 5k ", "ok format 6 ", "ok format 40 ")
        return [ln.split(": ")[0] + ln.split(",")[-1] for ln in _run(build) if ln.startswith(nibbles)]

    def paired(line: str) -> bool:
        return (" T 20" in line or " T 37" in line) and int(line.split(" N ")[1].split()[0]) >= 16

    vnni = outputs("avx512-vnni")
    assert len(vnni) == 72 + 2 * 72 + 2 * 6 * 2 * 6 + 6 * 2 * 2 + 6 * 2 * 8
    avx2 = outputs("avx2")
    assert [ln for ln in vnni if not paired(ln)] == [ln for ln in avx2 if not paired(ln)]
    assert sum(paired(ln) for ln in vnni) == 2 * 2 * 2 * 2  # Q4_K and Q6_K, K of 256 and 512, N of 64 and 100, T of 20 and 37
