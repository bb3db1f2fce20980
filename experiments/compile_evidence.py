"""Summarise sm_90 compile checks side by side: before/after a kernel change, or two Triton versions.

    python tests/kernels/sm90_compile.py > after.jsonl         (TRITON_INTERPRET unset)
    python experiments/compile_evidence.py before.jsonl after.jsonl [more.jsonl ...]

Each input is the JSON-lines output of tests/kernels/sm90_compile.py (one row per kernel
configuration). Rows are grouped by what they are (decode / split decode / prefill
attention, the split combine, write_kv, the sampler, by dtype), and each group shows,
per input: configurations, K/V shared buffers (min-max over the group), the largest
async_wait count (copies left in flight), shared memory, registers, spill bytes, barriers in the PTX and reduce
ops inside loops (max over the group). Prints a Markdown table for experiments/RESULTS.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def group_of(row: dict) -> str:
    kind = row["kernel"]
    if kind == "paged_attention":
        mode = "decode" if row["max_query_len"] <= 1 else "prefill"
        if row.get("splits", 1) > 1:
            mode += " split"
        return f"attention {mode} {row['dtype']}"
    if kind == "sample":
        return f"sample {row['dtype']}" + (" logprobs" if row.get("logprobs") else "")
    return f"{kind} {row['dtype']}"


def _span(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def summarise(rows: list[dict]) -> dict[str, dict[str, str]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(group_of(row), []).append(row)
    out = {}
    for name, members in groups.items():
        kv = [min(r.get("buffers", {}).get("k", 0), r.get("buffers", {}).get("v", 0)) for r in members]
        out[name] = {
            "configs": str(len(members)),
            "K/V buffers": _span(kv) if name.startswith("attention") else "-",
            "max async_wait": _span([r.get("max_async_wait") for r in members]),
            "shared KB": _span([round(r["shared"] / 1024) for r in members]),
            "regs": _span([r.get("regs") for r in members]),
            "spill B": str(max((r.get("spill_bytes") or 0) for r in members)),
            "barriers": _span([r.get("barriers") for r in members]),
            "loop reduces": _span([r.get("loop_reduces") for r in members]),
        }
    return out


def main(paths: list[str]) -> int:
    if len(paths) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    tables = [(Path(p).stem, summarise([json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()]))
              for p in paths]
    names = list(dict.fromkeys(name for _, t in tables for name in t))
    cols = ["configs", "K/V buffers", "max async_wait", "shared KB", "regs", "spill B", "barriers", "loop reduces"]
    print("| group | input | " + " | ".join(cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for name in names:
        for label, table in tables:
            if name in table:
                print(f"| {name} | {label} | " + " | ".join(table[name][c] for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
