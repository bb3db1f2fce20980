"""Check and time every Triton kernel on a CUDA machine, in one call.

    python experiments/gpu/check_kernels.py [--out DIR]

Measures the card's device-to-device copy bandwidth first, then runs each kernel
family's check (against its PyTorch reference at full size) and timing (CUDA events,
median of many runs), then the engine's decode step with a Qwen3-0.6B-shaped model at
1, 64 and 256 sequences (engine_check.py), and prints one short table last. Meant to finish in a few
minutes on an H200; writes the rows as JSON to --out when given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.gpu import attention_check, engine_check, sampling_check  # noqa: E402
from experiments.gpu.common import measure_copy_bandwidth  # noqa: E402


def fmt(value: object, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET to time the compiled kernels", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    start = time.perf_counter()
    copy_bw = measure_copy_bandwidth()
    print(f"{name}: copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    rows: list[dict] = []
    for check in (attention_check, sampling_check, engine_check):
        label = check.__name__.rsplit(".", 1)[-1]
        print(f"running {label} ...", flush=True)
        try:
            rows += check.run(copy_bw)
        except Exception as exc:  # one family failing must not hide the others' numbers
            rows.append({"op": label, "shape": "-", "ms": None, "gbs": None, "frac_bw": None,
                         "vs": f"crashed: {type(exc).__name__}: {exc}"[:120], "max_err": None, "ok": False})
    elapsed = time.perf_counter() - start
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernels.json").write_text(
            json.dumps({"device": name, "copy_gbs": copy_bw, "seconds": elapsed, "rows": rows}, indent=1)
        )
    print(f"\n{name}, torch {torch.__version__}, copy {copy_bw:.0f} GB/s, {elapsed:.0f} s")
    header = f"{'op':<28} {'shape':<34} {'ms':>9} {'GB/s':>7} {'%bw':>5}  {'ok':<3} {'max_err':>8}  vs"
    print(header)
    print("-" * len(header))
    for r in rows:
        frac = None if r.get("frac_bw") is None else 100 * r["frac_bw"]
        print(
            f"{r['op']:<28} {r['shape']:<34} {fmt(r.get('ms'), '9.4f')} {fmt(r.get('gbs'), '7.0f')} "
            f"{fmt(frac, '5.0f')}  {'yes' if r.get('ok') else 'NO':<3} {fmt(r.get('max_err'), '8.1e')}  {r.get('vs', '')}"
        )
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
