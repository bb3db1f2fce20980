"""A grammar whose masks take long, beside a plain request: does the plain one wait?

    PYTHONPATH=. python experiments/bench_grammar_stall.py --compare /path/to/other/checkout [--rounds 2]

The embedded SmolLM2 (weight_form quantized) in an AsyncEngine (the server's engine
thread). The plain request (~25 prompt tokens, 8 output tokens, greedy) is timed alone,
then submitted together with a constrained one whose grammar makes llguidance work long
for each token's mask: a JSON schema holding a `--const`-character const (1,000,000: the
report's; a mask costs ~0.2 us per character here). The server refuses such a schema
now (ignis/server/grammar_bounds.py); the engine itself is what is measured, so both
code bases get the grammar. Alternating fresh processes per code base (`--compare DIR`:
DIR's ignis, the code before); ratios are what to quote.
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


def _child(args: argparse.Namespace) -> None:
    from ignis.config import EngineConfig
    from ignis.engine import AsyncEngine, SamplingParams
    from ignis.engine.grammar import Grammar, ll_tokenizer
    from ignis.model import load_model

    loaded = load_model(progress=False, weight_form=args.weight_form)
    tok = loaded.tokenizer
    prompt = tok.encode("Write one short sentence about the sea, the wind and the boats in the harbour at dawn.")
    schema = {"type": "object", "properties": {"a": {"const": "x" * args.const}}, "required": ["a"],
              "additionalProperties": False}
    grammar = Grammar.json_schema(schema).prepared(ll_tokenizer(tok, loaded.config.vocab_size))
    engine = AsyncEngine(loaded, EngineConfig(enable_prefix_caching=False, cpu_threads=args.threads, max_num_seqs=8))

    async def timed(params: SamplingParams) -> tuple[float, str]:
        t0 = time.monotonic()
        final = None
        async for out in engine.submit(prompt, params):
            final = out
        return time.monotonic() - t0, str(final.finish_reason.value if final else None)

    async def main() -> dict[str, object]:
        await timed(SamplingParams.greedy(8))  # warm up
        alone = [(await timed(SamplingParams.greedy(8)))[0] for _ in range(3)]
        slow = asyncio.ensure_future(timed(SamplingParams.greedy(args.grammar_tokens, grammar=grammar)))
        await asyncio.sleep(0.05)  # the constrained one is in the engine first
        beside, _ = await timed(SamplingParams.greedy(8))
        slow_time, slow_end = await slow
        return {"plain_alone_s": statistics.median(alone), "plain_beside_s": beside,
                "constrained_s": slow_time, "constrained_end": slow_end}

    result = asyncio.run(main())
    engine.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compare", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--const", type=int, default=1_000_000)
    ap.add_argument("--grammar-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weight-form", default="quantized")
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    arms = [("after", ROOT)] if args.compare is None else [("before", args.compare.resolve()), ("after", ROOT)]
    rows: dict[str, list[dict[str, object]]] = {name: [] for name, _ in arms}
    for r in range(args.rounds):
        for name, root in arms:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--const", str(args.const),
                   "--grammar-tokens", str(args.grammar_tokens), "--threads", str(args.threads),
                   "--weight-form", args.weight_form]
            out = subprocess.run(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True,
                                 text=True, check=True).stdout
            res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
            rows[name].append(res)
            print(f"round {r + 1} {name}: {res}", flush=True)
    for name, _ in arms:
        alone = statistics.median(float(x["plain_alone_s"]) for x in rows[name])
        beside = statistics.median(float(x["plain_beside_s"]) for x in rows[name])
        slow = statistics.median(float(x["constrained_s"]) for x in rows[name])
        ends = sorted({str(x["constrained_end"]) for x in rows[name]})
        print(f"{name}: plain request alone {alone:.2f} s, beside the {args.const:,}-character const "
              f"{beside:.2f} s ({beside / alone:.1f}x); the constrained one {slow:.2f} s, ended {ends}")


if __name__ == "__main__":
    main()
