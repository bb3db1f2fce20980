"""A process killed (SIGKILL) during the native op's first compile leaves nothing behind
(ignis_kernels/cpu_native.py): the compiler's whole process group dies with it, and the next
start removes the build folder it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ignis_kernels import cpu_native

ROOT = Path(__file__).resolve().parents[2]


def _group(pgid: int) -> list[str]:
    """The commands of the live (not zombie) processes in process group `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append((entry / "comm").read_text().strip())
        except (OSError, IndexError, ValueError):
            pass
    return out


@pytest.mark.skipif(sys.platform != "linux" or cpu_native._compiler() is None, reason="needs Linux and g++")
def test_sigkill_during_the_first_compile_leaves_no_compiler_and_no_folder(tmp_path: Path) -> None:
    env = dict(os.environ, IGNIS_CACHE_DIR=str(tmp_path))
    code = "from ignis_kernels import cpu_native\ncpu_native._build(cpu_native._compiler(), cpu_native.library_path())"
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    native = tmp_path / "native"
    end = time.monotonic() + 60
    while not (builds := list(native.glob("build-*"))) or not (builds[0] / "pgid").exists():
        assert owner.poll() is None and time.monotonic() < end, "the build did not start"
        time.sleep(0.05)
    pgid = int((builds[0] / "pgid").read_text())
    while "cc1plus" not in _group(pgid):  # the compiler proper is at work
        assert time.monotonic() < end, _group(pgid)
        time.sleep(0.05)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    end = time.monotonic() + 15
    while _group(pgid):
        assert time.monotonic() < end, f"the compiler outlived its owner: {_group(pgid)}"
        time.sleep(0.05)
    (native / "tmpoldstyle").mkdir()  # what the previous version's killed builds left
    old = time.time() - 7200
    os.utime(native / "tmpoldstyle", (old, old))
    (native / "tmpfresh").mkdir()  # possibly another process's build under way: kept
    cpu_native.sweep(native)  # what the next start does first
    assert sorted(p.name for p in native.iterdir()) == ["tmpfresh"]


def test_sweep_keeps_the_folders_of_live_builds(tmp_path: Path) -> None:
    live = tmp_path / f"build-{os.getpid()}-x"
    live.mkdir()
    (live / "pgid").write_text("1")
    cpu_native.sweep(tmp_path)
    assert live.exists()
