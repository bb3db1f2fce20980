"""gpt-oss's expert GEMMs on the CPU: which exact form of MXFP4 weights is fastest.

    .venv/bin/python experiments/bench_mxfp4_gemm.py [--threads 2] [--rows 1 2 4 16]

An MXFP4 weight (e2m1 values, an e8m0 scale per 32) can be held exactly as
  mxfp4  its own nibbles and exponent bytes (packed.Mx4Linear, quant_gemm kMX4), 0.53 B/w
  q8     2 x e2m1 as int8 with half the scale as fp16 (packed.Q8Linear, quant_gemm kQ8), 1.06 B/w
and, not exactly, as torch's int8 weight-only GEMM (one scale per row, bf16 activations,
1 B/w) or widened to bf16 (oneDNN, 2 B/w). Times y = x W^T for an expert's gate|up (5760 x
2880) and down (2880 x 2880) at a few row counts (best of 5 batches, microseconds per call),
each call on the next of --experts experts (32: one layer's, hundreds of MB, so the weights
come from memory as in a decode step; --experts 1 times them cache-resident), and the
weight bytes read per second at the best time. Random weights: speed only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.bench_cpu_linear import best_us  # noqa: E402

SHAPES = {"gate_up": (5760, 2880), "down": (2880, 2880)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16])
    ap.add_argument("--experts", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gguf import GGMLQuantizationType as QT

    from ignis.model.gguf_quant import decode_mxfp4_nibbles, decode_q8
    from ignis.model.packed import Int8Linear, Mx4Linear, Q8Linear, wide_linear
    from ignis_kernels import cpu_native, cpu_platform

    if not cpu_native.load():
        sys.exit("the native op is not built here")
    print(f"CPU: {cpu_platform.current().describe()}; {args.threads} threads")
    rng = np.random.default_rng(0)
    wide = "bf16" if cpu_platform.current().has_gemm("bf16") else "fp16"  # (AVX2: no oneDNN bf16 GEMM)
    print(f"| GEMM | rows | mxfp4 us (GB/s) | q8 us (GB/s) | int8 us | {wide} us |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES.items():
        forms: dict[str, list] = {"mxfp4": [], "q8": [], "int8": [], "wide": []}
        for _ in range(args.experts):
            raw = rng.integers(0, 256, (n, k // 32, 17), dtype=np.uint8)
            raw[..., 0] = rng.integers(119, 121, (n, k // 32))
            raw = raw.reshape(n, -1)
            mx = Mx4Linear(*decode_mxfp4_nibbles(raw, k), None)
            q, d = decode_q8(raw, QT.MXFP4, k)
            dense = mx.widen(0, n, torch.float32)
            forms["mxfp4"].append(mx)
            forms["q8"].append(Q8Linear(torch.from_numpy(q), torch.from_numpy(d), None))
            forms["int8"].append(Int8Linear(dense, None))
            forms["wide"].append(wide_linear(dense, wide))
        for rows in args.rows:
            x = torch.randn(rows, k)
            reps = max(args.experts, 200 // rows)
            t = {}
            for f, ops in forms.items():
                turn = iter(range(1 << 62))
                t[f] = best_us(lambda ops=ops, turn=turn: ops[next(turn) % len(ops)](x), reps)
            mx_b, q8_b = forms["mxfp4"][0].nbytes, forms["q8"][0].nbytes
            print(f"| {name} {n}x{k} | {rows} | {t['mxfp4']:.0f} ({mx_b / t['mxfp4'] / 1e3:.1f}) "
                  f"| {t['q8']:.0f} ({q8_b / t['q8'] / 1e3:.1f}) | {t['int8']:.0f} | {t['wide']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
