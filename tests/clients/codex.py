"""Codex CLI 0.171 (npm, installed into tests/clients by `make test`) run against ignis.

Also a command that writes a CODEX_HOME for your own use (see README):
    .venv/bin/python tests/clients/codex.py --home ~/.codex-ignis

`codex_home` writes the function-only setup of Codex's conformance recordings: a
custom provider pointing at the server, a model catalog file (so Codex sends function
tools only), web search disabled; with `served_catalog` the catalog is the one the
server carries on GET /v1/models (`model_catalog_url`, no file: what the command
writes). `run_codex` runs `codex exec --json` with goals and multi-agent disabled and
returns the exit code and Codex's JSON events.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CODEX = HERE / "node_modules" / ".bin" / "codex"
CATALOG = HERE / "codex-model-catalog.json"  # recorded with Codex 0.171 (model "fake-model")

CONFIG = """\
model = "{model}"
model_provider = "ignis"
check_for_update_on_startup = false
{catalog}web_search = "disabled"

[model_providers.ignis]
name = "ignis"
base_url = "{base_url}/v1"
{catalog_url}wire_api = "responses"
env_key = "IGNIS_API_KEY"
requires_openai_auth = false
supports_websockets = {websockets}
"""
# Tests fail fast instead of letting Codex retry a broken answer.
NO_RETRIES = "request_max_retries = 0\nstream_max_retries = 0\n"


def codex_home(path: Path, base_url: str, *, model: str = "fake-model", websockets: bool,
               instructions: str | None = None, context_window: int | None = None, retries: bool = False,
               freeform_apply_patch: bool = False, served_catalog: bool = False) -> Path:
    """A CODEX_HOME for `model` at base_url. `instructions` replace Codex's ~4k-token
    base instructions and `context_window` sets the model's window: what a small local
    model (SmolLM2: 8k tokens) needs to fit Codex's prompt. `freeform_apply_patch`: the
    catalog entry asks for Codex's freeform `apply_patch` (a custom tool with a Lark
    grammar) instead of running patches through the shell. `served_catalog`: no catalog
    file; Codex reads the server's (the served model's window, the freeform apply_patch,
    short instructions), and the other catalog arguments do not apply."""
    path.mkdir(parents=True, exist_ok=True)
    if served_catalog:
        (path / "config.toml").write_text(CONFIG.format(
            model=model, catalog="", catalog_url=f'model_catalog_url = "{base_url}/v1/models"\n',
            base_url=base_url, websockets=str(websockets).lower()) + ("" if retries else NO_RETRIES))
        return path
    catalog = json.loads(CATALOG.read_text())
    entry = catalog["models"][0]
    entry["slug"] = model
    if instructions is not None:
        entry["model_messages"]["instructions_template"] = instructions
    if context_window is not None:
        entry["context_window"] = entry["max_context_window"] = context_window
    if freeform_apply_patch:
        entry["apply_patch_tool_type"] = "freeform"
    (path / "catalog.json").write_text(json.dumps(catalog))
    (path / "config.toml").write_text(CONFIG.format(
        model=model, catalog=f'model_catalog_json = "{path / "catalog.json"}"\n', catalog_url="", base_url=base_url,
        websockets=str(websockets).lower()) + ("" if retries else NO_RETRIES))
    return path


@dataclass
class CodexRun:
    rc: int
    events: list[dict[str, Any]]
    stderr: str

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [e["item"] for e in self.events if e["type"] == "item.completed" and e["item"]["type"] == kind]


def run_codex(home: Path, workdir: Path, prompt: str, *, key: str, resume: bool = False,
              timeout: float = 300, disable: tuple[str, ...] = ("goals", "multi_agent"),
              output_schema: Path | None = None, sandbox: str | None = None) -> CodexRun:
    """`codex exec --json`; `disable`: Codex features turned off (the default keeps the
    four function tools of the conformance recordings; () is Codex's default tool set).
    `sandbox`: Codex's ``--sandbox`` mode; None runs without its sandbox and approvals."""
    if not CODEX.exists():
        raise RuntimeError(f"{CODEX} is missing: `make test` installs it (npm ci --prefix tests/clients)")
    args = [str(CODEX), "exec", "--skip-git-repo-check", "--json"]
    args += ["--dangerously-bypass-approvals-and-sandbox"] if sandbox is None else ["--sandbox", sandbox]
    for feature in disable:
        args += ["--disable", feature]
    if output_schema is not None:
        args += ["--output-schema", str(output_schema)]
    if resume:
        args += ["resume", "--last"]
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CODEX_HOME=str(home), IGNIS_API_KEY=key, NO_COLOR="1")
    try:
        proc = subprocess.run([*args, prompt], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:  # a run that hangs is a failed run, with what it printed
        def text(b: bytes | str | None) -> str:
            return b.decode("utf-8", "replace") if isinstance(b, bytes) else b or ""

        rc, stdout, stderr = -9, text(exc.output), text(exc.stderr) + f"\n[timed out after {timeout:g} s]"
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return CodexRun(rc, events, stderr)


# For models with a small context (SmolLM2: 8k tokens): Codex's own instructions are
# ~4k tokens and its four function tools ~4.5k more.
SMALL_MODEL_INSTRUCTIONS = ("You are Codex, a coding agent. Answer the user briefly. "
                            "Use the exec_command tool only when a shell command is needed.")


def main() -> None:
    ap = argparse.ArgumentParser(description="Write a CODEX_HOME (config.toml) for ignis: Codex reads the model's "
                                             "metadata from the server's GET /v1/models.")
    ap.add_argument("--home", type=Path, required=True, help="the directory to write (then CODEX_HOME=it)")
    ap.add_argument("--base-url", default=os.environ.get("IGNIS_BASE_URL", "http://127.0.0.1:8000"),
                    help="the ignis server, without /v1 (default: $IGNIS_BASE_URL, else http://127.0.0.1:8000)")
    ap.add_argument("--model", default="smollm2-135m", help="the model name ignis serves")
    ap.add_argument("--http", action="store_true", help="HTTP + SSE instead of the WebSocket mode")
    args = ap.parse_args()
    home = codex_home(args.home.expanduser(), args.base_url, model=args.model, websockets=not args.http,
                      retries=True, served_catalog=True)
    print(f"wrote {home}/config.toml; run: CODEX_HOME={home} IGNIS_API_KEY=... codex exec "
          "--disable goals --disable multi_agent --skip-git-repo-check \"PROMPT\"")


if __name__ == "__main__":
    main()
