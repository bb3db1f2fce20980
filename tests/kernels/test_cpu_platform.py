"""ignis_kernels.cpu_platform: one object says what this CPU and torch run; IGNIS_CPU_CAPS caps it.

Machines this suite does not run on are built by hand (a CpuPlatform, or /proc/cpuinfo's
flags); the cap itself is checked in fresh processes, since torch reads it once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ignis_kernels import cpu_platform
from ignis_kernels.cpu_platform import CpuPlatform, capped_flags, tier_of

ROOT = Path(__file__).resolve().parents[2]
ZEN5 = frozenset(["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile"])
ZEN3 = frozenset(["avx2", "fma", "f16c", "bmi2", "vaes"])


def test_tiers_from_flags() -> None:
    assert tier_of(ZEN5, "x86_64") == "avx512"
    assert tier_of(ZEN3, "x86_64") == "avx2"
    assert tier_of(frozenset({"avx2", "fma"}), "x86_64") == "portable"  # no F16C: not the avx2 tier
    assert tier_of(ZEN3 | {"avx512f"}, "x86_64") == "avx2"  # AVX-512 F alone (no BW/VL/DQ)
    assert tier_of(frozenset({"asimd", "sve"}), "aarch64") == "portable"


def test_a_cap_hides_what_the_lower_tier_lacks() -> None:
    avx2 = capped_flags(ZEN5, "avx2")
    assert tier_of(avx2, "x86_64") == "avx2"
    assert not any(f.startswith(("avx512", "amx", "avx_vnni")) for f in avx2) and {"avx2", "fma", "f16c"} <= avx2
    portable = capped_flags(ZEN5, "portable")
    assert not any(f.startswith(("avx", "fma", "f16c")) for f in portable)
    assert capped_flags(ZEN5, "avx512") == ZEN5


def test_native_flags_never_exceed_the_tier() -> None:
    assert CpuPlatform(level="avx512").native_flags == ["-march=native"]  # the host's own tier
    assert CpuPlatform(level="avx2", host_level="avx512").native_flags == ["-march=x86-64-v3", "-mtune=native"]
    assert CpuPlatform(level="portable", host_level="avx512").native_flags[0] == "-march=x86-64"
    # /proc/cpuinfo and the CPU disagree (an emulator): never -march=native
    assert CpuPlatform(level="avx2", native_host="unknown").native_flags[0] == "-march=x86-64-v3"
    assert CpuPlatform(level="portable", machine="aarch64").native_flags == ["-march=native"]


def test_full_range_int8_needs_vnni_at_the_avx512_tier() -> None:
    assert CpuPlatform(level="avx512", flags=ZEN5).int8_dynamic_full_range
    assert not CpuPlatform(level="avx2", flags=capped_flags(ZEN5, "avx2")).int8_dynamic_full_range
    assert not CpuPlatform(level="avx512", flags=ZEN5 - {"avx512_vnni"}).int8_dynamic_full_range


def test_a_bad_cap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IGNIS_CPU_CAPS", "sse9")
    with pytest.raises(ValueError, match="IGNIS_CPU_CAPS='sse9': expected one of avx512, avx2, portable"):
        cpu_platform.requested_cap()
    with pytest.raises(ValueError):
        CpuPlatform(level="sse9")


@pytest.mark.parametrize("host, cap, want", [
    (ZEN5, "avx2", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    (ZEN5, "portable", {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}),
    (ZEN3, "avx512", {}),  # at or above the hardware: the libraries choose for themselves
    (ZEN5, "avx512", {}),
])
def test_the_cap_reaches_torch_onednn_and_mkl(host, cap, want, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_platform, "_host_flags", lambda: ("test CPU", host))
    monkeypatch.setattr(cpu_platform._platform, "machine", lambda: "x86_64")
    for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.setenv(var, "left-by-a-parent")  # IGNIS_CPU_CAPS decides them when set
    monkeypatch.setenv("IGNIS_CPU_CAPS", cap)
    cpu_platform.apply_cap()
    for var in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        assert os.environ.get(var) == want.get(var)
    if "MKL_ENABLE_INSTRUCTIONS" in want:
        assert os.environ["MKL_ENABLE_INSTRUCTIONS"] == want["MKL_ENABLE_INSTRUCTIONS"]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                             "MKL_ENABLE_INSTRUCTIONS", "IGNIS_CPU_CAPS")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**full, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300, check=False)


def test_this_machine_and_every_cap_below_it() -> None:
    """In fresh processes: the cap takes torch's kernels and oneDNN's bf16 GEMM down with it."""
    host = cpu_platform.current().host_level
    code = ("import ignis_kernels, torch; from ignis_kernels import cpu_platform as c; p = c.current(); "
            "print(p.level, p.host_level, torch.backends.cpu.get_cpu_capability(), p.has_gemm('bf16'))")
    for cap in cpu_platform.LEVELS[: cpu_platform.LEVELS.index(host) + 1]:
        proc = _python(code, IGNIS_CPU_CAPS=cap)
        assert proc.returncode == 0, proc.stderr[-2000:]
        level, got_host, capability, bf16 = proc.stdout.split()
        assert (level, got_host) == (cap, host)
        assert capability == {"avx512": "AVX512", "avx2": "AVX2", "portable": "DEFAULT"}[cap]
        if cap != "avx512":
            assert bf16 == "False"  # the bf16 path needs AVX-512 BW/VL/DQ (or AVX-NE-CONVERT)
    # tier_below is what `make test` caps its second run to
    assert cpu_platform.tier_below("avx512") == "avx2" and cpu_platform.tier_below("portable") == "portable"


def test_a_cap_that_comes_too_late_is_an_error() -> None:
    """A cap set after torch ran its first op cannot take effect: an error, not a silent
    uncapped run."""
    if cpu_platform.current().host_level == "portable":
        pytest.skip("no tier below this CPU's")
    cap = cpu_platform.tier_below(cpu_platform.current().host_level)
    proc = _python(f"import os, torch; torch.ones(8).add_(1); os.environ['IGNIS_CPU_CAPS'] = {cap!r}; "
                   "import ignis_kernels; ignis_kernels.cpu_platform.current()")
    assert proc.returncode != 0 and "was set after torch had chosen its" in proc.stderr
