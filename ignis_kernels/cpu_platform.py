"""What this CPU and this torch build can run: decided once per process, asked everywhere.

    from ignis_kernels import cpu_platform
    p = cpu_platform.current()
    p.level                  # "avx512", "avx2" or "portable": the instruction tier ignis uses
    p.has_gemm("bf16")       # oneDNN's bf16 GEMM runs here (probed)
    p.native_flags           # what the native op (ignis_kernels/cpu/decode.cpp) is compiled with

Every CPU choice reads this one object: the weight forms and their GEMMs
(ignis/model/weight_plan.py), the LM head, the KV cache's dtype and the native op's
build. Tests build a CpuPlatform by hand to check those choices for machines they do
not run on.

The tier comes from /proc/cpuinfo (x86: "avx512" needs AVX-512 F/BW/VL/DQ, "avx2" needs
AVX2, FMA and F16C; anything else, Arm included, is "portable": plain loops the compiler
vectorizes for the host). Which GEMMs work is asked of torch by one tiny call each,
checked against the dense product: torch has no query for them, and its bf16 oneDNN
path, say, exists only on some CPUs (AVX512-BW/VL/DQ or AVX-NE-CONVERT).

IGNIS_CPU_CAPS (avx512, avx2 or portable) caps the tier below the hardware's, so that
one machine runs every other machine's paths. It must be in the environment before
torch runs its first op: importing `ignis_kernels` applies it to torch's own kernels
(ATEN_CPU_CAPABILITY), oneDNN's (ONEDNN_MAX_CPU_ISA) and MKL's (MKL_ENABLE_INSTRUCTIONS),
and child processes inherit them. fbgemm (int8 dynamic and fp16 GEMMs) has no such switch and keeps the host's
instructions; the cap only changes which of its paths ignis asks for.
"""

from __future__ import annotations

import logging
import os
import platform as _platform
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "IGNIS_CPU_CAPS"
LEVELS = ("portable", "avx2", "avx512")
# The GEMMs a CPU weight form can be built from (see probe_gemms).
GEMMS = ("int4", "int8", "bf16", "fp16", "fp32", "int8_dynamic")

_AVX2 = frozenset({"avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
# What torch and oneDNN are told under a cap (None: leave them their own choice).
_ATEN_CAPABILITY = {"avx2": "avx2", "portable": "default"}
_ONEDNN_ISA = {"avx2": "AVX2", "portable": "SSE41"}
_MKL_ISA = {"avx2": "AVX2", "portable": "SSE4_2"}
# torch.backends.cpu.get_cpu_capability() per tier: what a cap must bring torch down to.
_TORCH_RANK = {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}
# Compiler targets of a capped tier (the host's own tier compiles with -march=native).
_MARCH = {"avx512": ["-march=x86-64-v4", "-mtune=native"], "avx2": ["-march=x86-64-v3", "-mtune=native"],
          "portable": ["-march=x86-64", "-mtune=generic"]}


def _host_flags() -> tuple[str, frozenset[str]]:
    """(the CPU's model name, its feature flags) from /proc/cpuinfo (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return _platform.processor() or _platform.machine(), frozenset()
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key in ("flags", "Features"):  # x86, aarch64
            flags.update(value.split())
    return name or _platform.machine(), frozenset(flags)


def tier_of(flags: frozenset[str], machine: str) -> str:
    """The highest tier `flags` (a CPU's feature flags) fully support."""
    if machine not in ("x86_64", "AMD64"):
        return "portable"
    if _AVX512 <= flags:
        return "avx512"
    return "avx2" if _AVX2 <= flags else "portable"


def capped_flags(flags: frozenset[str], level: str) -> frozenset[str]:
    """The flags a machine of `level` would show: under avx2 nothing of AVX-512, AMX or
    AVX-VNNI (no AVX2 machine is assumed to have more than AVX2, FMA, F16C); under
    portable no AVX at all."""
    if level == "avx512":
        return flags
    drop = ("avx512", "amx", "avx_vnni", "avxvnni", "avx10")
    if level == "portable":
        drop += ("avx", "fma", "f16c", "vaes", "vpclmulqdq", "gfni")
    return frozenset(f for f in flags if not f.startswith(drop))


def requested_cap() -> str | None:
    """IGNIS_CPU_CAPS, checked (None when unset)."""
    value = os.environ.get(ENV, "").strip().lower()
    if not value:
        return None
    if value not in LEVELS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(reversed(LEVELS))}")
    return value


def apply_cap() -> None:
    """Tell torch's, oneDNN's and MKL's kernel dispatch about IGNIS_CPU_CAPS (before their
    first op; `ignis_kernels` calls this on import). When set, it decides their variables (a
    process started under another cap may have left them); unset, they are left alone."""
    cap = requested_cap()
    if cap is None:
        return
    _, flags = _host_flags()
    host = tier_of(flags, _platform.machine())
    capped = LEVELS.index(cap) < LEVELS.index(host)
    for var, values in (("ATEN_CPU_CAPABILITY", _ATEN_CAPABILITY), ("ONEDNN_MAX_CPU_ISA", _ONEDNN_ISA),
                        ("MKL_ENABLE_INSTRUCTIONS", _MKL_ISA)):
        if capped:
            os.environ[var] = values[cap]
        else:
            os.environ.pop(var, None)


# -- GEMM probes --------------------------------------------------------------------------


def _close(got, want) -> bool:
    return tuple(got.shape) == tuple(want.shape) and bool(
        ((got.float() - want).abs().max() <= 0.02 * want.abs().max() + 1e-3).item()
    )


def _probe_int4() -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    n, k = 64, 64
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    sz = torch.stack([torch.rand(k // 32, n, generator=g) + 0.5, torch.rand(k // 32, n, generator=g)], -1)
    sz = sz.to(torch.bfloat16)
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
    s = sz.float()[..., 0].t().repeat_interleave(32, dim=1)
    z = sz.float()[..., 1].t().repeat_interleave(32, dim=1)
    return _close(got, x.float() @ ((q.float() - 8) * s + z).t())


def _probe_int8() -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (64, 64), dtype=torch.int8, generator=g)
    s = (torch.rand(64, generator=g) + 0.5).to(torch.bfloat16)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    got = torch.ops.aten._weight_int8pack_mm(x, w, s)
    return _close(got, x.float() @ (w.float() * s.float()[:, None]).t())


def _probe_onednn(dtype_name: str) -> bool:
    import torch

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g).to(dtype)
    x = torch.randn(3, 64, generator=g).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)
    got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return _close(got, x.float() @ w.float().t())


def _probe_fp16() -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    x = torch.randn(3, 64, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packed = torch.ops.aten.fbgemm_pack_gemm_matrix_fp16(w)
        got = torch.ops.aten.fbgemm_linear_fp16_weight(x, packed, torch.zeros(64))
    return _close(got, x @ w.half().float().t())


def _probe_int8_dynamic() -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    x = torch.randn(3, 64, generator=g)
    scale = w.abs().amax(dim=1) / 127.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(w, scale.double(), torch.zeros(64, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, None)
        got = torch.ops.quantized.linear_dynamic(x, packed, True)
    return _close(got, x @ w.t())


_PROBES = {
    "int4": _probe_int4, "int8": _probe_int8, "bf16": lambda: _probe_onednn("bfloat16"),
    "fp16": _probe_fp16, "fp32": lambda: _probe_onednn("float32"), "int8_dynamic": _probe_int8_dynamic,
}


def probe_gemms() -> frozenset[str]:
    """The GEMMs of GEMMS that run, and agree with the dense product, in this process.
    fp16 (fbgemm's, which torch marks deprecated and warns about once) is only asked
    for where bf16 is missing: it is the wide GEMM of CPUs without oneDNN bf16."""
    import torch

    ok = set()
    with torch.inference_mode():
        for name, probe in _PROBES.items():
            if name == "fp16" and "bf16" in ok:
                continue
            try:
                if probe():
                    ok.add(name)
                else:
                    log.warning("the %s GEMM disagrees with the dense product here: not used", name)
            except (RuntimeError, AttributeError, NotImplementedError) as exc:
                log.debug("no %s GEMM here: %s", name, exc)
    return frozenset(ok)


# -- the platform -------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuPlatform:
    """What one machine runs. `level` is the tier ignis uses (host_level capped by
    IGNIS_CPU_CAPS); `flags` are the CPU's feature flags as that tier sees them."""

    level: str
    host_level: str = ""
    flags: frozenset[str] = frozenset()
    gemms: frozenset[str] = frozenset(GEMMS)
    machine: str = "x86_64"
    model_name: str = ""
    torch_capability: str = ""
    cap: str | None = None
    notes: tuple[str, ...] = field(default=())
    # The tier -march=native compiles for ("" = host_level; "unknown" where /proc/cpuinfo and
    # the CPU disagree, as under an emulator: then never -march=native).
    native_host: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"unknown CPU level {self.level!r}; expected one of {LEVELS}")
        if not self.host_level:
            object.__setattr__(self, "host_level", self.level)

    def has_gemm(self, name: str) -> bool:
        return name in self.gemms

    @property
    def int8_dynamic_full_range(self) -> bool:
        """fbgemm's u8 x s8 products are exact at the full 8-bit range only with VNNI;
        without it they pass through a saturating 16-bit add (vpmaddubsw), and torch's
        `reduce_range` (7-bit activations) is what keeps them exact."""
        return self.level == "avx512" and "avx512_vnni" in self.flags

    @property
    def native_flags(self) -> list[str]:
        """Compiler target for the native op: the host's own (-march=native) at its own
        tier, the tier's baseline below it (never an instruction the tier lacks)."""
        if self.machine not in ("x86_64", "AMD64"):
            return ["-march=native"]
        if self.level == (self.native_host or self.host_level):
            return ["-march=native"]
        return list(_MARCH[self.level])

    def describe(self) -> str:
        cap = f", capped from {self.host_level} by {ENV}={self.cap}" if self.level != self.host_level else ""
        return (
            f"CPU {self.model_name or self.machine}: tier {self.level}{cap}; torch kernels "
            f"{self.torch_capability or '?'}; GEMMs {', '.join(g for g in GEMMS if g in self.gemms) or 'none'}"
            + ("" if self.int8_dynamic_full_range else " (int8 dynamic at 7-bit activations: no VNNI)")
        )


def detect() -> CpuPlatform:
    """Read the CPU, apply IGNIS_CPU_CAPS, probe torch's GEMMs. A cap that came after torch
    chose its kernels is an error, not a silent uncapped run."""
    import torch

    apply_cap()
    name, flags = _host_flags()
    machine = _platform.machine()
    listed = tier_of(flags, machine)
    capability = torch.backends.cpu.get_cpu_capability()
    torch_tier = LEVELS[min(_TORCH_RANK.get(capability, 0), len(LEVELS) - 1)]
    host = listed
    if "ATEN_CPU_CAPABILITY" not in os.environ and machine in ("x86_64", "AMD64"):
        # torch asked the CPU itself (CPUID): below what /proc/cpuinfo lists, it is the truth
        # (an emulator, or a hypervisor that lists more than it runs).
        host = min(listed, torch_tier, key=LEVELS.index)
    cap = requested_cap()
    notes: list[str] = []
    level = min(host, torch_tier, key=LEVELS.index) if machine in ("x86_64", "AMD64") else host
    if cap is not None:
        if LEVELS.index(cap) > LEVELS.index(host):
            notes.append(f"{ENV}={cap} asks for more than this CPU has ({host}): using {host}")
        else:
            level = cap
        if LEVELS.index(torch_tier) > LEVELS.index(level):
            raise RuntimeError(
                f"{ENV}={cap} was set after torch had chosen its {capability} kernels: set it in the "
                "environment before Python starts"
            )
    gemms = probe_gemms()
    if level != host and "bf16" in gemms and level != "avx512":
        raise RuntimeError(f"{ENV}={cap} was set after oneDNN started: set it before Python starts")
    # -march=native only where /proc/cpuinfo, the CPU itself and the tier all agree.
    native_host = host if listed == host else "unknown"
    return CpuPlatform(level=level, host_level=host, flags=capped_flags(flags, level), gemms=gemms, machine=machine,
                       model_name=name, torch_capability=capability, cap=cap, notes=tuple(notes),
                       native_host=native_host)


@cache
def current() -> CpuPlatform:
    """This process's platform (detected once, logged once)."""
    p = detect()
    for note in p.notes:
        log.warning(note)
    log.info(p.describe())
    return p


def tier_below(level: str) -> str:
    """The next tier down (portable stays portable): what a test run caps to."""
    return LEVELS[max(0, LEVELS.index(level) - 1)]
