"""Resident memory of a one-user engine after a long prompt, per KV-cache dtype.

    PYTHONPATH=. .venv/bin/python experiments/kv_memory.py                  # float32, then bfloat16
    PYTHONPATH=. .venv/bin/python experiments/kv_memory.py --tokens 2000 --kv-cache-dtypes bfloat16
    PYTHONPATH=. .venv/bin/python experiments/kv_memory.py --no-thp        # 4 KiB pages only

Each engine.kv_cache_dtype runs in a fresh process: the embedded SmolLM2 (`quantized`,
engine.max_num_seqs=1, so the automatic cache holds one 8k-token sequence and becomes
resident only as its blocks fill), a prompt of --tokens tokens (experiments/
perplexity_text.txt repeated) prefilled, then --decode tokens decoded greedily. Reported:
VmRSS after `import torch`, after the load and engine start, after the prefill (its first
token sampled) and after the decode, the peak (VmHWM), and the transparent huge pages
resident (AnonHugePages). The KV cache declines huge pages since session 7 (it was numpy's
calloc, which madvises large allocations for them, so a cache region became resident
2 MiB at a time); --no-thp turns them off for the whole measured process (prctl
PR_SET_THP_DISABLE). The engine trims the C heap when it falls idle (ignis/engine/heap.py),
so "after the decode" is after that trim.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
TEXT = Path(__file__).with_name("perplexity_text.txt")


def rss_mib() -> dict[str, float]:
    """VmRSS, VmHWM and AnonHugePages of this process, in MiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    huge = re.search(r"^AnonHugePages:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text(), re.MULTILINE)
    out["AnonHugePages"] = int(huge.group(1)) / 1024 if huge else float("nan")
    return out


def one(kv_cache_dtype: str, tokens: int, decode: int, no_thp: bool) -> dict[str, object]:
    """This process: one engine, one prompt; memory at each stage."""
    if no_thp and ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")
    import torch  # noqa: F401  (measured on its own first)

    torch_mib = rss_mib()["VmRSS"]
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.model.embedded import smollm2_gguf_path
    from ignis.model.loader import load_model

    loaded = load_model(smollm2_gguf_path(), progress=False, weight_form="quantized", max_num_seqs=1)
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=1, kv_cache_dtype=kv_cache_dtype))
    ready_mib = rss_mib()["VmRSS"]
    ids = loaded.tokenizer.encode(TEXT.read_text())
    prompt = (ids * (tokens // len(ids) + 1))[:tokens]
    engine.add_request("r", prompt, SamplingParams.greedy(1 + decode, ignore_eos=True))
    got = 0
    while got == 0:
        got += sum(len(o.token_ids) for o in engine.step())
    prefill = rss_mib()
    while engine.has_unfinished_requests():
        got += sum(len(o.token_ids) for o in engine.step())
    end = rss_mib()
    return {
        "kv_cache_dtype": str(engine.kv_cache_dtype).removeprefix("torch."), "tokens": len(prompt),
        "torch_mib": torch_mib, "ready_mib": ready_mib, "prefill_mib": prefill["VmRSS"],
        "huge_mib": prefill["AnonHugePages"], "decode_mib": end["VmRSS"], "peak_mib": end["VmHWM"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=5600)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--no-thp", action="store_true", help="no transparent huge pages in the measured process")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one dtype, JSON out
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.tokens, args.decode, args.no_thp)))
        return
    rows = []
    for kv in args.kv_cache_dtypes:
        cmd = [sys.executable, __file__, "--one", kv, "--tokens", str(args.tokens), "--decode", str(args.decode)]
        out = subprocess.run(cmd + ["--no-thp"] * args.no_thp, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    pages = "4 KiB pages only (--no-thp)" if args.no_thp else "huge pages as the kernel gives them"
    print(f"{rows[0]['tokens']}-token prompt, then {args.decode} tokens decoded; MiB; {pages}; one run")
    print("| KV cache | RSS after import torch | engine ready | after prefill (of it huge pages) "
          "| after decode | peak |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kv_cache_dtype']} | {r['torch_mib']:.0f} | {r['ready_mib']:.0f} "
              f"| {r['prefill_mib']:.0f} ({r['huge_mib']:.0f}) | {r['decode_mib']:.0f} | {r['peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
