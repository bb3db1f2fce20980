"""`python -m ignis.serve --server-KEY VALUE`: aliases of the Hydra overrides, for every
server.* key; an unknown one is an error naming the closest key; no model named at all
means the embedded model's group (with its sampling defaults)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ignis.cli_flags import FlagError, default_model, expand_server_flags
from ignis.config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_server_key_has_a_flag():
    for f in dataclasses.fields(ServerConfig):
        flag = "--server-" + f.name.replace("_", "-")
        assert expand_server_flags([flag, "1"]) == [f"server.{f.name}=1"]
        assert expand_server_flags([f"{flag}=1"]) == [f"server.{f.name}=1"]


def test_flags_beside_hydra_overrides():
    argv = ["+model=hf", "model.path=/m", "--server-socket-idle-close", "5", "--server-stream-timeout=60",
            "server.port=9000", "--cfg", "job"]
    assert expand_server_flags(argv) == ["+model=hf", "model.path=/m", "server.socket_idle_close=5",
                                         "server.stream_timeout=60", "server.port=9000", "--cfg", "job"]


def test_unknown_or_valueless_flags():
    with pytest.raises(FlagError, match="did you mean --server-socket-idle-close"):
        expand_server_flags(["--server-socket-idle-clos", "5"])
    with pytest.raises(FlagError, match="needs a value"):
        expand_server_flags(["--server-port"])


def test_default_model():
    assert default_model([]) == ["+model=smollm2-135m"]
    assert default_model(["server.port=1"]) == ["+model=smollm2-135m", "server.port=1"]
    for named in (["+model=hf", "model.path=x"], ["model.path=x.gguf"], ["model=gguf"]):
        assert default_model(named) == named


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ignis.serve", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_command_line():
    job = _serve("--server-socket-idle-close", "5", "--server-stream-timeout=60", "--cfg", "job")
    assert job.returncode == 0, job.stderr
    assert "socket_idle_close: 5.0" in job.stdout and "stream_timeout: 60.0" in job.stdout
    assert "name: smollm2-135m" in job.stdout and "temperature: 0.2" in job.stdout  # the embedded group
    bad = _serve("--server-socket-idle-clos", "5")
    assert bad.returncode == 2 and "did you mean --server-socket-idle-close" in bad.stderr
