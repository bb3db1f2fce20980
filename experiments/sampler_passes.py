"""Passes over the vocabulary the sampling kernel makes per row, by kind of request.

    python experiments/sampler_passes.py [--rows 2] [--vocab 151936]

A pass reads the whole row of logits: pass A (always), each full-row pivot pass of the
threshold search, and the race when it cannot run on the copied candidates. The kernel's
debug counters report them (`sample_triton_debug`), so this runs wherever the kernel
does: compiled on a GPU, or in Triton's interpreter on a CPU (set TRITON_INTERPRET=1;
a few seconds a pass at the full 151,936-entry vocabulary). Logits are
experiments/gpu/sampling_check.py's LLM-like rows; its GPU rows report the same mean.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=151_936)
    args = ap.parse_args()
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("no CUDA: set TRITON_INTERPRET=1 to count in the interpreter", file=sys.stderr)
        return 2
    from experiments.gpu.sampling_check import KINDS, make_logits, make_params
    from ignis_kernels.sampling_triton import sample_triton_debug

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = make_logits(args.rows, args.vocab, torch.float32, device)
    print(f"{'kind':<12} {'passes/row':>10} {'full pivot':>10} {'cand pivot':>10} {'full race':>9}")
    for kind in KINDS:
        params = make_params(args.rows, kind, device, vocab=args.vocab)
        _, _, p = sample_triton_debug(x, params)
        p = p.float().mean(0)
        if len(p) < 3:  # a kernel from before 2026-12-01 did not count its full-row races
            print(f"{kind:<12} {'-':>10} {p[0]:10.2f} {p[1]:10.2f} {'-':>9}", flush=True)
            continue
        print(f"{kind:<12} {1 + p[0] + p[2]:10.2f} {p[0]:10.2f} {p[1]:10.2f} {p[2]:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
