"""Shared by the serving experiments: a real ignis server in a child process, and
Codex-shaped request bodies.

    python experiments/serving.py serve --model smollm2|scripted [--script FILE] [--gguf FILE]
        [--max-num-seqs N] [--no-token-cache]          # prints "PORT <n>", serves until stdin closes

The server is `ignis.server.background.BackgroundServer` on 127.0.0.1 with an ephemeral
port, in its own process so that the clients measuring it do not share its GIL. No API
key. `--no-token-cache` turns the renderer's token cache off (the whole prompt is
tokenized every request: ignis before the cache), for before/after comparisons.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CODEX = ROOT / "tests" / "protocol" / "data" / "codex_requests.jsonl"


# -- a server in a child process --------------------------------------------------------


class ServerProcess:
    def __init__(self, *, model: str = "smollm2", script: str | None = None, max_num_seqs: int = 64,
                 num_kv_blocks: int | None = None, token_cache: bool = True, threads: int | None = None,
                 weight_form: str = "auto", gguf: str | Path | None = None) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "serve", "--model", model,
               "--max-num-seqs", str(max_num_seqs), "--weight-form", weight_form]
        if gguf:
            cmd += ["--gguf", str(gguf)]
        if script:
            cmd += ["--script", script]
        if num_kv_blocks:
            cmd += ["--num-kv-blocks", str(num_kv_blocks)]
        if threads:
            cmd += ["--threads", str(threads)]
        if not token_cache:
            cmd.append("--no-token-cache")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/responses"

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(args: argparse.Namespace) -> None:
    import torch

    from ignis.config import EngineConfig, IgnisConfig, ServerConfig
    from ignis.engine import AsyncEngine
    from ignis.model import load_model
    from ignis.server.background import BackgroundServer

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model == "scripted":
        loaded = load_model(kind="scripted", script=args.script, device="cpu", name="scripted")
    else:
        loaded = load_model(args.gguf, progress=False, weight_form=args.weight_form, max_num_seqs=args.max_num_seqs)
    engine = EngineConfig(max_num_seqs=args.max_num_seqs, num_kv_blocks=args.num_kv_blocks, cpu_threads=args.threads)
    cfg = IgnisConfig(engine=engine, server=ServerConfig(host="127.0.0.1", port=0, api_key=None, access_log=False,
                                                         model_aliases=["fake-model"]))
    os.environ.pop("IGNIS_API_KEY", None)
    # Built here, in the thread that loaded the model, as ignis.serve does (the engine then
    # frees this thread's OpenMP team: see ignis/engine/openmp.py).
    with BackgroundServer(cfg, loaded, engine=AsyncEngine(loaded, cfg.engine)) as srv:
        if args.no_token_cache:  # every prompt tokenized whole (still counted in /metrics)
            srv.ctx.renderer.token_cache.why_off = "turned off (experiments/serving.py --no-token-cache)"
        print(f"PORT {srv.port}", flush=True)
        sys.stdin.read()  # until the parent closes it (or exits)


# -- Codex-shaped bodies --------------------------------------------------------------------


def codex_base() -> dict[str, Any]:
    """Codex CLI 0.171's second HTTP request of its tool case (developer instructions,
    environment, the user's question, one exec_command call and its output), with its
    function tools only (ignis refuses `namespace` and `web_search` tools)."""
    for line in CODEX.read_text().splitlines():
        entry = json.loads(line)
        if entry["case"] == "http_tool" and entry["n"] > 0:
            body = entry["body"]
            return dict(body, tools=[t for t in body["tools"] if t["type"] == "function"])
    raise LookupError("http_tool not in the recorded Codex requests")


def tool_output(k: int, lines: int = 31) -> str:
    """A deterministic command output of about 1,000 SmolLM2 tokens (a source listing)."""
    body = "\n".join(
        f"{k:03d}.{i:03d}    def handler_{k}_{i}(request, ctx):  # route {i * 7 % 13} returns {i * k % 97} items"
        for i in range(lines)
    )
    return f"Chunk ID: {k:06x}\nWall time: 0.{k:04d} seconds\nProcess exited with code 0\nOutput:\n{body}\n"


def codex_history(pairs: int, *, lines: int = 31) -> list[dict[str, Any]]:
    """Codex's first four messages plus `pairs` exec_command calls with their outputs."""
    items = [i for i in codex_base()["input"] if i["type"] == "message"]
    for k in range(pairs):
        call_id = f"call_{k:04d}"
        items.append({"type": "function_call", "name": "exec_command", "call_id": call_id, "id": f"fc_{k:04d}",
                      "status": "completed", "arguments": json.dumps({"cmd": f"sed -n '{k * 31},{k * 31 + 30}p' app.py"})})
        items.append({"type": "function_call_output", "call_id": call_id, "output": tool_output(k, lines)})
    return items


def codex_body(items: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    base = codex_base()
    body = {k: v for k, v in base.items() if k != "input"}
    body.update(model="fake-model", input=items, **over)
    return body


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def p50(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    import platform

    return f"{platform.machine()}, {os.cpu_count()} CPUs"


def wait_ready(url: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--model", choices=["smollm2", "scripted"], default="smollm2")
    s.add_argument("--script", default=None)
    s.add_argument("--max-num-seqs", type=int, default=64)
    s.add_argument("--num-kv-blocks", type=int, default=None)
    s.add_argument("--threads", type=int, default=None)
    s.add_argument("--no-token-cache", action="store_true")
    s.add_argument("--weight-form", default="auto", help="model.weight_form (ignis/model/packed.py)")
    s.add_argument("--gguf", default=None, help="a GGUF file instead of the embedded SmolLM2 (--model smollm2)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    _serve(a)
