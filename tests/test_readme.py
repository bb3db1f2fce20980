"""The README and the docs' getting-started and connect pages, followed literally: every
shell and Python block of the README's set-up and connect sections, of
docs/getting-started.md and of docs/connect.md runs here as written. The only changes are
the port (a free one instead of 8000: `make serve` takes `ARGS` from the environment, the
other blocks get the port replaced) and HOME (a temporary folder, so `~/.codex-ignis` is
the test's). A block the README and a page share runs once.

- Set up, against the embedded SmolLM2 (the blocks need a model's answer): `make serve`
  serves it; the first-request block, with no sampling fields, answers "Paris" and
  `completed`, and so do 20 more such requests, each under the model's output cap; the
  page's offline `ignis.generate` block answers "Paris" too. `make test` is the command
  CI runs (`.ci/run`); the suite cannot run itself.
- Connect, against the scripted model served under the name `smollm2-135m` with the key
  `sk-local` (the blocks print model text, and a fixed reply lets the test count it):
  `make clients` first (what `make test` already did: nothing to do then), then Codex CLI
  (exec, then resume, its catalog read from the server), the OpenAI SDK (the README's
  create; the page's create, stream and socket), the Agents SDK (the README's HTTP run;
  the page's HTTP and socket runs), and curl with server-sent events.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.server.server_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
CONNECT = (ROOT / "docs" / "connect.md").read_text(encoding="utf-8")
SCRIPT = ROOT / "tests" / "clients" / "script.yaml"
SCRIPTED_DEFAULT = "I have no scripted answer for that."


def section(title: str, text: str = README) -> str:
    """The text under the heading `title` (any level), to the next heading of the same or a
    higher level."""
    m = re.search(rf"^(#+) {re.escape(title)}.*$", text, re.M)
    assert m, f"no section {title!r}"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end(): end.start() if end else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def with_port(block: str, port: int) -> str:
    return block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


class Process:
    """A command started in its own process group, stopped with SIGINT (the server's
    graceful drain), its output kept."""

    def __init__(self, args: list[str] | str, env: dict[str, str], port: int, *, shell: bool = False) -> None:
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, shell=shell, start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.base_url = f"http://127.0.0.1:{port}"
        self.output = ""

    def wait_healthy(self, timeout: float = 600) -> None:
        end = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.stop()
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < end, "the server did not come up"
            time.sleep(0.5)

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.output, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.output, _ = self.proc.communicate()
        return self.output


def bash(block: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"{block}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out


def base_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, HOME=str(tmp_path), NO_COLOR="1")
    for var in ("TRITON_INTERPRET", "IGNIS_API_KEY", "ARGS", "MAKEFLAGS", "MAKELEVEL"):
        env.pop(var, None)
    return env


def test_set_up_is_the_two_commands_and_ci_runs_the_second():
    setup = blocks(section("Set up (two commands, fresh machine)"), "sh")
    commands = [line.split("#")[0].strip() for line in setup[0].splitlines()]
    assert commands == ["make serve", "make test"]
    # The getting-started page gives the same two commands and the same first request.
    assert blocks(GETTING_STARTED, "sh")[:2] == setup[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


@pytest.mark.slow
def test_quick_start_as_written(tmp_path: Path):
    setup = section("Set up (two commands, fresh machine)")
    first_request = blocks(setup, "sh")[1]
    page = blocks(GETTING_STARTED, "sh")
    assert len(page) == 3 and page[1] == first_request, "update this test with the page's blocks"
    generate = page[2]
    port = free_port()
    env = base_env(tmp_path)
    env["ARGS"] = f"server.port={port}"  # make takes ARGS from the environment
    server = Process(["make", "serve"], env, port)
    try:
        server.wait_healthy()
        answer = json.loads(bash(with_port(first_request, port), env).stdout)
        assert answer["status"] == "completed", answer
        assert "Paris" in answer["output"][0]["content"][0]["text"], answer["output"]
        assert (answer["temperature"], answer["top_p"], answer["max_output_tokens"]) == (0.0, 1.0, 512)

        # Twenty more plain requests (no sampling fields): each completes under the cap.
        body = json.loads(re.search(r"-d '(\{.*\})'", first_request).group(1))

        def ask(_: int) -> dict:
            return httpx.post(server.base_url + "/v1/responses", json=body, timeout=300).json()

        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(ask, range(20)))
        ended = [(r["status"], r["usage"]["output_tokens"]) for r in replies]
        assert all(status == "completed" and n < 512 for status, n in ended), ended
    finally:
        log = server.stop()
    offline = bash(generate, env, timeout=600)  # after the server: one model in memory at a time
    assert "Paris" in offline.stdout, offline.stdout + offline.stderr
    defaults = next(line for line in log.splitlines() if "sampling defaults:" in line)
    for part in ("temperature=0 (model.sampling)", "top_p=1 (OpenAI)", "max_output_tokens=512 (model.sampling)"):
        assert part in defaults, defaults
    assert body["input"] not in log  # no prompt text in the logs


def connect_blocks() -> tuple[list[str], list[tuple[str, int]]]:
    """The shell blocks (install, Codex, curl) and the Python blocks with the number of
    answers each prints, of the README's connect section and then the connect page's; a
    block both hold once."""
    readme = section("Connect a client")
    assert readme.lstrip().startswith("```sh\nmake clients")
    shell, python = [], []
    # README: SDK create; Agents over HTTP. The page: SDK create, stream, socket; Agents
    # over HTTP and the socket.
    for text, runs in ((readme, (1, 1)), (CONNECT, (3, 2))):
        sh, py = blocks(text, "sh"), blocks(text, "python")
        assert len(sh) == 3 and len(py) == 2, "update this test with the blocks"
        assert sh[0].split("#")[0].strip() == "make clients"
        shell += [b for b in sh if b not in shell]
        python += [(b, n) for b, n in zip(py, runs) if b not in [have for have, _ in python]]
    return shell, python


@pytest.mark.slow
def test_connect_blocks_as_written(tmp_path: Path):
    shell, python = connect_blocks()
    install = shell[0]
    codex = [b for b in shell if "codex exec" in b]
    curl = [b for b in shell if b.lstrip().startswith("curl")]
    assert len(codex) == 1 and len(curl) == 1 and len(shell) == 3, "the README and the page differ: update this test"
    port = free_port()
    env = base_env(tmp_path)
    env["IGNIS_BASE_URL"] = f"http://127.0.0.1:{port}"
    server = Process([sys.executable, "-m", "ignis.serve", "+model=scripted", f"model.script={SCRIPT}",
                      "model.name=smollm2-135m", "server.api_key=sk-local", f"server.port={port}"], env, port)
    try:
        bash(install, env, timeout=1800)
        server.wait_healthy()
        out = bash(with_port(codex[0], port), env)
        assert out.stdout.count(SCRIPTED_DEFAULT) == 2, out.stdout + out.stderr  # exec, then resume --last
        config = (tmp_path / ".codex-ignis" / "config.toml").read_text()
        assert "model_catalog_url" in config and "model_catalog_json" not in config  # no catalog file
        for block, runs in python:
            got = subprocess.run([sys.executable, "-c", with_port(block, port)], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, block + got.stderr
            assert got.stdout.count(SCRIPTED_DEFAULT) == runs, block + got.stdout
        sse = bash(with_port(curl[0], port), env).stdout
        assert "event: response.completed" in sse and SCRIPTED_DEFAULT.split()[0] in sse
    finally:
        log = server.stop()
    assert "sk-local" not in log
    assert "GET /v1/models" in log  # Codex read the model's metadata from the server
