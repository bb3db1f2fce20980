"""Check and time every Triton kernel on a CUDA machine, in one call.

    python experiments/gpu/check_kernels.py --out $OUT [--deadline 450] [--only NAME ...]
    python experiments/gpu/check_kernels.py --dry-run [--out DIR]     (any machine, no CUDA)

Order: the environment (versions; what is missing and whether it matters), the card's
copy bandwidth, then each check module's cases (CHECKS below), then the table. Every
row is printed as it finishes and appended to OUT/results.jsonl at once, so a run cut
short keeps what it measured. The run stops starting cases once --deadline seconds
have passed, and a watchdog prints the table and exits 3 if a case is still running
DEADLINE + GRACE seconds in (one 10-minute device call must always end with a table).

--dry-run does everything short of launching kernels: the environment check, importing
every check module, each module's host-side preparation (`dry_run(ctx)`: building the
inputs at toy sizes on the CPU, the engine's tokenizer and model, ...), and prints the
rows it would time. tests/kernels/test_gpu_script.py runs it on the CPU with
packages hidden, so the script cannot rot between GPU runs.

--checks MOD ... runs other check modules (a new one before it joins CHECKS); --only NAME
keeps the modules whose name contains NAME.

Exit status: 0 all rows ok, 1 a row failed, 2 cannot run here, 3 the watchdog fired.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The check modules, in the order they run. A new kernel family plugs in with one line:
# a module with `cases(ctx) -> list[Case]` (and optionally `dry_run(ctx)`); see common.py.
CHECKS = [
    "experiments.gpu.attention_check",
    "experiments.gpu.sampling_check",
    "experiments.gpu.engine_check",
    "experiments.gpu.wo_matmul_check",
    "experiments.gpu.token_mask_check",
    "experiments.gpu.tp_check",
]

# What the checks import, and what it serves. The GPU image has these (DESIGN.md) ...
NEEDED = {"torch": "everything", "triton": "the kernels", "numpy": "torch interop",
          "tokenizers": "engine check (tokenizer)", "jinja2": "engine check (chat template)"}
# ... and lacks these: nothing above may need them at import time.
NOT_NEEDED = ("gguf", "hydra", "omegaconf", "antlr4", "sanic", "pydantic", "transformers", "safetensors")
GRACE = 60.0


def _version(name: str) -> str | None:
    """The module's version, or None when it cannot be imported (absent or broken)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    try:
        module = importlib.import_module(name)
    except Exception:
        return None
    return str(getattr(module, "__version__", "present"))


def _present(name: str) -> bool:
    """Installed, without importing it (transformers alone takes seconds to import)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def environment() -> dict:
    """Versions of what the run needs and whether the rest is present; the device when there is one."""
    env: dict = {"python": platform.python_version(), "machine": platform.machine()}
    env["needed"] = {name: _version(name) for name in NEEDED}
    env["missing"] = sorted(n for n, v in env["needed"].items() if v is None)
    env["absent_optional"] = sorted(n for n in NOT_NEEDED if not _present(n))
    env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET")
    env["cuda"] = False
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda"] = bool(torch.cuda.is_available())
        if env["cuda"]:
            props = torch.cuda.get_device_properties(0)
            env["device"] = props.name
            env["sms"] = props.multi_processor_count
            env["capability"] = f"{props.major}.{props.minor}"
            env["memory_gib"] = round(props.total_memory / 2**30, 1)
            env["l2_mib"] = round(getattr(props, "L2_cache_size", 0) / 2**20, 1)
    except Exception as exc:  # a broken torch is reported, not raised
        env["torch_error"] = f"{type(exc).__name__}: {exc}"
    return env


def print_environment(env: dict) -> None:
    needed = ", ".join(f"{k} {v or 'MISSING'}" for k, v in env["needed"].items())
    print(f"python {env['python']} ({env['machine']}); {needed}", flush=True)
    if env["missing"]:
        print("missing: " + ", ".join(f"{m} (needed by {NEEDED[m]})" for m in env["missing"]), flush=True)
    if env["absent_optional"]:
        print("absent, not needed here: " + ", ".join(env["absent_optional"]), flush=True)
    if env.get("cuda"):
        print(f"device: {env['device']} (sm {env['capability']}, {env['sms']} SMs, {env['memory_gib']} GiB, "
              f"L2 {env['l2_mib']} MiB), torch CUDA {env.get('torch_cuda')}", flush=True)
    else:
        print(f"no CUDA device (torch CUDA build: {env.get('torch_cuda')})", flush=True)


def fmt(value: object, spec: str) -> str:
    """format(value, spec), or a dash as wide as the spec's field."""
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width) if value is None else format(value, spec)


class Recorder:
    """Rows as they finish: printed, and appended to OUT/results.jsonl (flushed each time)."""

    def __init__(self, out: Path | None) -> None:
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.path = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.path = out / "results.jsonl"
            self.path.write_text("")

    def add(self, r: dict) -> None:
        with self.lock:
            self.rows.append(r)
            print("row: " + json.dumps(r, default=str), flush=True)
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps(r, default=str) + "\n")
                    f.flush()
                    os.fsync(f.fileno())

    def table(self, title: str) -> str:
        with self.lock:
            rows = [r for r in self.rows if r.get("op") != "environment"]
        header = f"{'op':<30} {'shape':<36} {'ms':>9} {'GB/s':>7} {'%bw':>5}  {'ok':<3} {'max_err':>8}  vs"
        lines = ["", title, header, "-" * len(header)]
        for r in rows:
            frac = None if r.get("frac_bw") is None else 100 * r["frac_bw"]
            ok = "-" if r.get("planned") else ("yes" if r.get("ok") else "NO")
            lines.append(
                f"{str(r.get('op'))[:30]:<30} {str(r.get('shape'))[:36]:<36} {fmt(r.get('ms'), '9.4f')} "
                f"{fmt(r.get('gbs'), '7.0f')} {fmt(frac, '5.0f')}  {ok:<3} {fmt(r.get('max_err'), '8.1e')}  "
                f"{r.get('vs', '')}"
            )
        return "\n".join(lines)


def _crash_row(op: str, shape: str, exc: BaseException) -> dict:
    return {"op": op, "shape": shape, "ms": None, "gbs": None, "frac_bw": None, "max_err": None, "ok": False,
            "vs": f"crashed: {type(exc).__name__}: {exc}"[:200]}


def run_checks(names: list[str], ctx, rec: Recorder, only: list[str] | None) -> None:
    """Every case of every module, in order, until the deadline; failures become rows."""
    for name in names:
        label = name.rsplit(".", 1)[-1]
        if only and not any(o in label for o in only):
            continue
        try:
            module = importlib.import_module(name)
            cases = module.cases(ctx)
        except Exception as exc:  # a module that cannot import or plan must not hide the others
            traceback.print_exc()
            rec.add(_crash_row(label, "-", exc))
            continue
        if ctx.dry:
            try:
                if hasattr(module, "dry_run"):
                    print(f"{label}: host-side preparation ...", flush=True)
                    module.dry_run(ctx)
            except Exception as exc:
                traceback.print_exc()
                rec.add(_crash_row(f"{label} dry run", "-", exc))
            for case in cases:
                rec.add({"op": case.op, "shape": case.shape, "ms": None, "gbs": None, "frac_bw": None,
                         "max_err": None, "ok": True, "planned": True,
                         "vs": "; ".join(filter(None, (case.method, case.baseline)))})
            continue
        print(f"running {label}: {len(cases)} cases ...", flush=True)
        for case in cases:
            if ctx.deadline.expired():
                rec.add({"op": case.op, "shape": case.shape, "ms": None, "gbs": None, "frac_bw": None,
                         "max_err": None, "ok": False, "skipped": True, "vs": "skipped: deadline"})
                continue
            t0 = time.monotonic()
            try:
                result = case.run(ctx)
                for r in result if isinstance(result, list) else [result]:
                    rec.add(r)
            except Exception as exc:
                traceback.print_exc()
                rec.add(_crash_row(case.op, case.shape, exc))
            finally:
                print(f"  ({time.monotonic() - t0:.1f} s; {ctx.deadline.remaining():.0f} s left)", flush=True)
                if ctx.device.type == "cuda":
                    import torch

                    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    parser.add_argument("--deadline", type=float, default=450.0, help="seconds before no new case starts")
    parser.add_argument("--dry-run", action="store_true", help="plan and prepare on any machine; launch nothing")
    parser.add_argument("--only", nargs="+", default=None, help="run only the modules whose name contains one of these")
    parser.add_argument("--checks", nargs="+", default=CHECKS, help="the check modules to run (default: CHECKS)")
    parser.add_argument("--grace", type=float, default=GRACE, help="seconds past the deadline before the watchdog ends it")
    args = parser.parse_args(argv)

    env = environment()
    print_environment(env)
    rec = Recorder(args.out)
    rec.add({"op": "environment", "shape": "-", "ms": None, "ok": not env["missing"], "env": env})
    title = f"{env.get('device', 'no CUDA device')}, python {env['python']}, " + ", ".join(
        f"{k} {v}" for k, v in env["needed"].items() if k in ("torch", "triton"))

    if not args.dry_run:
        if not env["cuda"]:
            print("no CUDA device: nothing to time (--dry-run plans without one)", file=sys.stderr)
            return 2
        if env["TRITON_INTERPRET"] not in (None, "", "0"):
            print("unset TRITON_INTERPRET to time the compiled kernels", file=sys.stderr)
            return 2
    if "torch" in env["missing"]:
        print("torch is missing: nothing can run", file=sys.stderr)
        print(rec.table(title))
        return 2

    import torch

    from experiments.gpu.common import Context, Deadline, measure_copy_bandwidth

    deadline = Deadline(args.deadline)
    finished = threading.Event()

    def watchdog() -> None:
        if not finished.wait(args.deadline + args.grace):
            print(f"\nwatchdog: still running {args.deadline + args.grace:.0f} s in; stopping with what we have",
                  flush=True)
            print(rec.table(title + " (cut short by the watchdog)"), flush=True)
            os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    device = torch.device("cuda" if env["cuda"] and not args.dry_run else "cpu")
    copy_gbs = None
    if device.type == "cuda":
        copy_gbs = measure_copy_bandwidth()
        rec.add({"op": "copy bandwidth", "shape": "1 GiB d2d", "ms": None, "gbs": copy_gbs, "frac_bw": 1.0,
                 "max_err": None, "ok": True, "vs": "read + write counted; the ceiling of every %bw"})
    # The dry run plans the GPU's full sizes (its rows are what the GPU run will time);
    # each module's dry_run(ctx) prepares its inputs at toy sizes on the CPU.
    ctx = Context(device=device, copy_gbs=copy_gbs, deadline=deadline, dry=args.dry_run)
    start = time.monotonic()
    run_checks(args.checks, ctx, rec, args.only)
    finished.set()
    elapsed = time.monotonic() - start
    if args.out:
        (args.out / "kernels.json").write_text(
            json.dumps({"env": env, "copy_gbs": copy_gbs, "seconds": elapsed, "rows": rec.rows}, indent=1, default=str))
    print(rec.table(title + f", {elapsed:.0f} s" + (" (dry run: nothing launched)" if args.dry_run else "")))
    rows = [r for r in rec.rows if r.get("op") != "environment"]
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
