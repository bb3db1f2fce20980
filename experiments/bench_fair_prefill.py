"""Fair prefill: a long prompt's prefill beside a short request, before and after.

    PYTHONPATH=. python experiments/bench_fair_prefill.py --compare /path/to/other/checkout [--rounds 2]

The embedded SmolLM2 (model.weight_form quantized, as `make serve` runs it) in an
AsyncEngine (the server's engine thread), prefix caching off so that no round reuses
another's blocks. Each round measures, for each code base in turn (alternating, in
fresh processes: the machine is shared and noisy):

- a short request alone (~30 prompt tokens, 4 output tokens): time to first token and
  total;
- the same short request submitted `--delay` s after a long one (`--long` tokens, the
  5,156 of the report by default): its time to first token and total, and the long
  one's time to first token (what the fairness costs it);
- a decoding request (40 tokens) with the long prompt arriving after its 5th token: its
  longest gap between two tokens, and the gap alone.

`--untimed` adds this checkout with engine.step_time_budget_ms null (the new order of
a step alone, no time budget).

`--compare DIR` runs the same measurements with DIR's ignis (another checkout: the code
before) alternating with this one's; without it, this checkout only. Ratios are what to
quote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("The committee met on a grey morning to review the harbour plans, the budget for the new bridge, and the "
        "letters residents had sent about noise, parking, ferries and the old lighthouse. ")


def _child(args: argparse.Namespace) -> None:
    from ignis.config import EngineConfig
    from ignis.engine import AsyncEngine, SamplingParams
    from ignis.model import load_model

    loaded = load_model(progress=False, weight_form=args.weight_form)
    tok = loaded.tokenizer
    words = (TEXT * 400).split()
    long_ids = tok.encode(" ".join(words))[: args.long]
    short_ids = tok.encode("Question: what is the capital of France, and which river runs through it? Answer in a "
                           "few words, please, and nothing else.")
    cfg = EngineConfig(enable_prefix_caching=False, cpu_threads=args.threads, max_num_seqs=8)
    if args.no_time_budget and hasattr(cfg, "step_time_budget_ms"):
        cfg.step_time_budget_ms = None
    engine = AsyncEngine(loaded, cfg)

    async def timed(ids: list[int], n: int, start_delay: float = 0.0) -> dict[str, float]:
        await asyncio.sleep(start_delay)
        t0 = time.monotonic()
        stream = engine.submit(ids, SamplingParams.greedy(n))
        first, gaps, last = None, [], None
        async for out in stream:
            now = time.monotonic()
            if out.token_ids:
                if first is None:
                    first = now - t0
                if last is not None:
                    gaps.append(now - last)
                last = now
        return {"ttft": first or 0.0, "total": time.monotonic() - t0, "max_gap": max(gaps, default=0.0)}

    async def decode_with_long() -> dict[str, float]:
        t0 = time.monotonic()
        stream = engine.submit(short_ids, SamplingParams.greedy(40))
        gaps, last, count, long_task = [], None, 0, None
        async for out in stream:
            now = time.monotonic()
            if out.token_ids:
                if last is not None:
                    gaps.append(now - last)
                last = now
                count += len(out.token_ids)
                if count >= 5 and long_task is None:
                    long_task = asyncio.ensure_future(timed(long_ids, 1))
        if long_task is not None:
            await long_task
        return {"max_gap": max(gaps, default=0.0), "total": time.monotonic() - t0}

    async def main() -> dict[str, float]:
        await timed(short_ids, 4)  # warm up
        alone = [await timed(short_ids, 4) for _ in range(3)]
        decode_alone = await timed(short_ids, 40)
        long_task = asyncio.ensure_future(timed(long_ids, 1))
        short = await timed(short_ids, 4, start_delay=args.delay)
        long = await long_task
        decoding = await decode_with_long()
        return {
            "short_alone_ttft": statistics.median(a["ttft"] for a in alone),
            "short_alone_total": statistics.median(a["total"] for a in alone),
            "short_beside_long_ttft": short["ttft"], "short_beside_long_total": short["total"],
            "long_ttft": long["ttft"], "long_tokens": len(long_ids),
            "decode_gap_alone": decode_alone["max_gap"], "decode_gap_beside_long": decoding["max_gap"],
        }

    result = asyncio.run(main())
    engine.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


def _run(root: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--long", str(args.long), "--delay",
           str(args.delay), "--threads", str(args.threads), "--weight-form", args.weight_form, *extra]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compare", type=Path, default=None, help="another checkout (the code before)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long", type=int, default=5156)
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weight-form", default="quantized")
    ap.add_argument("--no-time-budget", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--untimed", action="store_true",
                    help="also this checkout with engine.step_time_budget_ms null (the order alone)")
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    arms = [("after", ROOT, [])]
    if args.untimed:
        arms.append(("after, no time budget", ROOT, ["--no-time-budget"]))
    if args.compare is not None:
        arms.insert(0, ("before", args.compare.resolve(), []))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in arms}
    for r in range(args.rounds):
        for name, root, extra in arms:
            res = _run(root, args, extra)
            rows[name].append(res)
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
    keys = list(next(iter(rows.values()))[0])
    print(f"\n| median of {args.rounds} | " + " | ".join(name for name, _, _ in arms) + " |")
    print("|---|" + "---|" * len(arms))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{statistics.median(x[k] for x in rows[name]):.2f}" for name, _, _ in arms)
              + " |")
    for name, _, _ in arms:
        m = {k: statistics.median(x[k] for x in rows[name]) for k in keys}
        print(f"{name}: short TTFT beside the long prompt / alone = "
              f"{m['short_beside_long_ttft'] / max(m['short_alone_ttft'], 1e-9):.1f}x, total "
              f"{m['short_beside_long_total'] / max(m['short_alone_total'], 1e-9):.1f}x; decode gap "
              f"{m['decode_gap_beside_long'] / max(m['decode_gap_alone'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
