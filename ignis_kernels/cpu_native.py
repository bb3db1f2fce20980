"""The native CPU decode op (ignis_kernels/cpu/decode.cpp), compiled once per machine and loaded.

    if cpu_native.load():
        hidden = torch.ops.ignis_cpu.decode_layers(...)   # see decode.cpp for the arguments

The source is compiled with the system's C++ compiler against the installed torch's
headers (only the per-operator ones: ~7 s on 2 cores) for the tier ignis_kernels/cpu_platform.py
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
# -fno-trapping-math: nothing here unmasks floating-point exceptions, and with them assumed
# possible gcc leaves a clamp before a float -> int conversion as a branch, which keeps loops
# over exp_approx (SiLU, softmax) scalar. Values are unchanged (no reassociation).
FLAGS = ["-O3", "-fopenmp", "-fno-trapping-math", "-std=c++20", "-shared", "-fPIC", "-w"]


def flags() -> list[str]:
    """The compiler flags for this machine's tier (cpu_platform.current().native_flags)."""
    from ignis_kernels import cpu_platform

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
    tmp = Path(tempfile.mkdtemp(prefix=f"{_BUILD_PREFIX}{os.getpid()}-", dir=target.parent))
    try:  # built aside, then renamed: atomic
        out = tmp / target.name
        cmd[cmd.index("OUT")] = str(out)
        code, err = _run_compiler(cmd, tmp)
        if code != 0:
            raise RuntimeError(f"{cxx} failed ({code}): {err.strip()[-2000:]}")
        os.replace(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the compiler's process: nothing outlives the server -------------------------------
#
# The compiler runs in a process group of its own, led by a small shell that watches a
# pipe this process holds open: when this process dies (even by SIGKILL) the pipe
# closes and the shell kills the whole group (g++ and its cc1plus, as, ld). The build
# folder, build-<pid>-*, records the group; the next start (sweep) kills any group of a
# dead owner still running and removes its folder (and folders of the older tmp* kind).
_BUILD_PREFIX = "build-"
_WATCH = ('exec 3<&0; "$@" </dev/null & c=$!; (read -r _ <&3; kill -9 -$$) & w=$!; '
          'wait "$c"; s=$?; kill "$w" 2>/dev/null; exit "$s"')


def _run_compiler(cmd: list[str], folder: Path) -> tuple[int, str]:
    """Run `cmd` as described above; (its exit code, its stderr)."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", _WATCH, "sh", *cmd], stdin=read_end, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        os.close(read_end)
    try:
        (folder / "pgid").write_text(str(proc.pid))  # the group's id is its leader's pid
        _, err = proc.communicate(timeout=600)
        return proc.returncode, err
    except BaseException:  # a timeout, an interrupt, the server stopping: the group goes too
        _kill_group(proc.pid)
        proc.wait()
        raise
    finally:
        os.close(write_end)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: Path | None = None) -> None:
    """Kill the compiler groups of builds whose owner died, and remove their folders (and
    stale tmp* folders from older versions, past an hour)."""
    import time

    root = folder or cache_dir()
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if not entry.is_dir():
            continue
        if entry.name.startswith(_BUILD_PREFIX):
            owner = entry.name[len(_BUILD_PREFIX):].split("-", 1)[0]
            if not owner.isdigit() or _alive(int(owner)):
                continue
            try:
                pgid = int((entry / "pgid").read_text())
                leader = Path(f"/proc/{pgid}/cmdline").read_bytes()
            except (OSError, ValueError):
                pgid, leader = 0, b""
            if pgid and str(entry).encode() in leader:  # (that pid was not reused by another program)
                _kill_group(pgid)
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith("tmp"):
            try:
                old = time.time() - entry.stat().st_mtime > 3600
            except OSError:
                continue
            if old:
                shutil.rmtree(entry, ignore_errors=True)


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
    sweep(path.parent)  # what a killed build left behind
    if not path.exists():
        log.info("compiling the native CPU decode op (once per machine, ~10 s) into %s", path.parent)
        _build(cxx, path)
    torch.ops.load_library(str(path))
    return hasattr(torch.ops.ignis_cpu, "decode_layers")


def _usable(x: torch.Tensor) -> bool:
    """Whether the op is loaded already (never built here) and takes x: contiguous 2-D fp32
    on the CPU."""
    return (bool(_state.get("ok")) and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2
            and x.is_contiguous())


def top_k_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k largest entries' indices (the op's largest first) of a 2-D tensor: the op's
    top_k_rows (one compare a logit: 8x torch.topk over a 128k vocabulary at 64 rows) where
    _usable(x), else torch.topk."""
    if _usable(x):
        return torch.ops.ignis_cpu.top_k_rows(x, k)[1]
    return x.topk(k, dim=-1, sorted=False).indices


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row's first index of its largest entry: the op's top_k_rows(x, 1) under
    top_k_indices' conditions (a row with NaN: its largest other entry), else x.argmax."""
    if _usable(x):
        return torch.ops.ignis_cpu.top_k_rows(x, 1)[1][:, 0]
    return x.argmax(dim=-1)


def q6_rows(nibbles: torch.Tensor, high_bits: torch.Tensor, sixteens: torch.Tensor, supers: torch.Tensor,
            ids: torch.Tensor) -> torch.Tensor | None:
    """Rows `ids` of a Q6_K weight in the op's layout as fp32 [len(ids), K] (the op's q6_rows:
    1,024 rows of a 128k x 2k head 5.4 -> 1.0 ms), or None where the op is not loaded (never
    built here): the caller then takes torch's ops."""
    if not _state.get("ok"):
        return None
    return torch.ops.ignis_cpu.q6_rows(nibbles, high_bits, sixteens, supers, ids.reshape(-1).long())


def many_rows() -> int:
    """The fewest rows from which the op's Q4_K / Q6_K GEMMs take their many-row body
    (ignis_kernels/cpu/quant_gemm_many.h: 8-bit activations; AVX2, and AVX-512 with VNNI), or 0
    where the op is not built or has none (AVX-512 without VNNI, non-x86)."""
    return int(torch.ops.ignis_cpu.quant_gemm_many_rows()) if load() else 0


def amx(enable: bool | None = None) -> bool:
    """Whether the op's many-row Q4_K / Q6_K GEMMs take AMX's tiles (ignis_kernels/cpu/quant_gemm_amx.h):
    built where the compiler targets AMX-INT8 (the host's own tier), used where Linux grants the
    tiles and IGNIS_AMX is not 0. `enable` turns them off or back on for this process (the outputs
    are the same bit for bit either way: for comparisons). False where the op is not built."""
    if not load():
        return False
    return bool(torch.ops.ignis_cpu.quant_gemm_amx(-1 if enable is None else int(enable)))
