"""The native CPU decode op (kernels/cpu/decode.cpp), compiled once per machine and loaded.

    if cpu_native.load():
        hidden = torch.ops.ignis_cpu.decode_layers(...)   # see decode.cpp for the arguments

The source is compiled with the system's C++ compiler against the installed torch's
headers (only the per-operator ones: ~7 s on 2 cores) for the tier kernels/cpu_platform.py
chose (-march=native at the host's own tier, the tier's baseline under IGNIS_CPU_CAPS),
into a cache directory keyed by the source, torch's version, the CPU and the flags, so
later starts just load it. Where there is no compiler, or the build fails, load() returns False and logs
why once; callers then keep the eager PyTorch path. IGNIS_NATIVE_CPU=0 turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu") / "decode.cpp"
FLAGS = ["-O3", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-w"]


def flags() -> list[str]:
    """The compiler flags for this machine's tier (cpu_platform.current().native_flags)."""
    from kernels import cpu_platform

    return [*FLAGS, *cpu_platform.current().native_flags]

_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built libraries live: $IGNIS_CACHE_DIR, else $XDG_CACHE_HOME/ignis, else ~/.cache/ignis."""
    root = os.environ.get("IGNIS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ignis"
    )
    return Path(root) / "native"


def _cpu_id() -> str:
    """What the build depends on besides its flags: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    # x86: "model name", "flags"; aarch64: "CPU implementer", "CPU part", "Features".
    keys = ("model name", "flags", "CPU implementer", "CPU part", "Features")
    lines = [ln for ln in text.splitlines() if ln.startswith(keys)]
    return "\n".join(sorted(set(lines)))


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build(cxx: str, target: Path, extra_flags: tuple[str, ...] = ()) -> None:
    torch_dir = Path(torch.__file__).parent
    include = torch_dir / "include"
    lib = torch_dir / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cmd = [
        cxx, *flags(), *extra_flags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}", f"-I{include / 'torch/csrc/api/include'}",
        str(SOURCE), "-o", "OUT", f"-L{lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}",
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # built aside, then renamed: atomic
        out = Path(tmp) / target.name
        cmd[cmd.index("OUT")] = str(out)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(out, target)


def library_path() -> Path:
    """The built library's path for this source, torch and CPU (it may not exist yet)."""
    key = hashlib.sha256()
    sources = b"".join(f.read_bytes() for f in sorted(SOURCE.parent.glob("*.[ch]*")))  # decode.cpp and its headers
    for part in (sources, torch.__version__.encode(), _cpu_id().encode(), " ".join(flags()).encode(),
                 (_compiler() or "").encode(), sys.platform.encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"decode-{key.hexdigest()[:16]}.so"


def load() -> bool:
    """Build (once per machine) and load the op; True when torch.ops.ignis_cpu.decode_layers
    is callable. Thread-safe; a failure is logged once and remembered for the process."""
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        ok = False
        try:
            ok = _load()
        except Exception as exc:  # any build or load failure leaves the eager path
            log.warning("native CPU decode unavailable, using the PyTorch path: %s", exc)
        _state["ok"] = ok
        return ok


def _load() -> bool:
    if os.environ.get("IGNIS_NATIVE_CPU", "1") == "0":
        log.info("native CPU decode off (IGNIS_NATIVE_CPU=0)")
        return False
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        log.info("native CPU decode is built on Linux only; using the PyTorch path")
        return False
    cxx = _compiler()
    if cxx is None:
        log.warning("no C++ compiler (g++) found: native CPU decode off, using the PyTorch path")
        return False
    path = library_path()
    if not path.exists():
        log.info("compiling the native CPU decode op (once per machine, ~10 s) into %s", path.parent)
        _build(cxx, path)
    torch.ops.load_library(str(path))
    return hasattr(torch.ops.ignis_cpu, "decode_layers")
