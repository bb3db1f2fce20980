"""The native op's GEMMs over a file's own blocks, per format, at real shapes and few rows.

    .venv/bin/python experiments/bench_quant_gemm.py [--shape llama-3.2-1b] [--rows 1 2 4 9 16] [--threads 2]

Times y = x W^T through `torch.ops.ignis_cpu.quant_gemm` (ignis_kernels/cpu/quant_gemm.h) for the
projections of a shape (experiments/synthetic_gguf.py's) in the forms a Q4_K_M or MXFP4 file
loads as: Q4_K (int4 with the file's six-bit scales), Q5_K, Q6_K, Q8_0 and MXFP4. Each call takes the
next of enough copies of the weight to fill 384 MB, so the weights come from memory as in a
decode step. Prints microseconds per call (best of 5 batches) and the weight bytes read per
second; --wide adds the kept bf16 / fp16 copy the `mixed` form holds where a format has no
many-row body; --cached reuses one copy instead, so the weights stay in the caches and the
time is the body's instructions (its ceiling once memory is fast enough); --cpu-time times by
the process's CPU time, which a shared VM's stolen time does not inflate; --amx both times the
many-row GEMMs on AMX's tiles and on VNNI alternately, a row each (the same outputs). Random
weights: speed only. The CPU's tier decides the body (`IGNIS_CPU_CAPS=avx2` times the AVX2 one on an AVX-512
machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.bench_cpu_linear import best_us  # noqa: E402
from experiments.synthetic_gguf import SHAPES  # noqa: E402

POOL = 384 << 20


def k_scaled(n: int, k: int, bits: int, rng: np.random.Generator):
    """A Q4_K / Q5_K weight as ignis holds it: values, the six-bit (sc, m) and (d, -dmin)."""
    from ignis.model.packed import Int4Linear, Int5Linear

    q = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    sm = rng.integers(0, 64, (n, k // 32, 2), dtype=np.uint8)
    ds = np.abs(rng.normal(0, 1e-3, (n, k // 256, 2))).astype(np.float32)
    ds[..., 1] *= -1
    scale = sm[..., 0] * np.repeat(ds[..., 0], 8, axis=1)
    offset = sm[..., 1] * np.repeat(ds[..., 1], 8, axis=1)
    cls = Int4Linear if bits == 4 else Int5Linear
    return cls(q, scale, offset, None, k_scales=(sm, ds))


def q6_k(n: int, k: int, rng: np.random.Generator):
    from ignis.model.packed import Q6Linear

    q = rng.integers(0, 64, (n, k), dtype=np.uint8)
    sc = rng.integers(-128, 128, (n, k // 16), dtype=np.int8)
    d = np.abs(rng.normal(0, 1e-4, (n, k // 256))).astype(np.float32)
    return Q6Linear(q, sc, d, None)


def mxfp4(n: int, k: int, rng: np.random.Generator):
    from ignis.model.gguf_quant import decode_mxfp4_nibbles
    from ignis.model.packed import Mx4Linear

    raw = rng.integers(0, 256, (n, k // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(119, 121, (n, k // 32))
    return Mx4Linear(*decode_mxfp4_nibbles(raw.reshape(n, -1), k), None)


def q8_0(n: int, k: int, rng: np.random.Generator):
    from ignis.model.packed import Q8Linear

    q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
    d = torch.from_numpy(np.abs(rng.normal(0, 1e-3, (n, k // 32))).astype(np.float16))
    return Q8Linear(q, d, None)


FORMS = {"q4_k": lambda n, k, rng: k_scaled(n, k, 4, rng), "q5_k": lambda n, k, rng: k_scaled(n, k, 5, rng),
         "q6_k": q6_k, "q8_0": q8_0, "mxfp4": mxfp4}


def cells(ops: list, k: int, row_counts: list[int], clock=time.perf_counter) -> str:
    """One table row's cells: microseconds a call (GB/s of weights) at each row count, each call
    taking the next of `ops` (copies of one weight) so that it comes from memory."""
    out = []
    for rows in row_counts:
        x = torch.randn(rows, k)
        turn = iter(range(1 << 62))
        us = best_us(lambda: ops[next(turn) % len(ops)](x), max(len(ops), 64 // rows), clock)
        out.append(f"{us:.0f} ({ops[0].nbytes / us / 1e3:.1f})")
    return " | ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--forms", nargs="+", default=["q4_k", "q5_k", "q6_k"], choices=sorted(FORMS))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 9, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--wide", action="store_true",
                    help="also time the kept wide copy `mixed` would hold instead (bf16 where oneDNN has it, else fp16)")
    ap.add_argument("--cached", action="store_true",
                    help="one copy of each weight, reused: timed from the caches, not memory "
                         "(the body's instruction ceiling)")
    ap.add_argument("--amx", choices=["on", "off", "both"], default="on",
                    help="many-row Q4_K / Q6_K GEMMs on AMX's tiles where the op has them (on), on VNNI (off), "
                         "or a row of each, alternated (both)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the process's CPU time (all threads' together) instead of the wall clock: "
                         "a VM's stolen time does not count (with --threads 1, a core's time a call)")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    from ignis.model.packed import wide_linear
    from ignis.model.weight_plan import wide_kind
    from ignis_kernels import cpu_native, cpu_platform

    if not cpu_native.load():
        sys.exit("the native op is not built here")
    tiles = [True, False] if args.amx == "both" else [args.amx == "on"]
    if tiles[0] and not cpu_native.amx():
        print("(no AMX tiles here: CPU, build, kernel or IGNIS_AMX=0)")
        tiles = [False]
    s = SHAPES[args.shape]
    q_rows = s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim
    gemms = {"q|k|v": (q_rows, s.hidden), "o": (s.hidden, s.heads * s.head_dim), "gate|up": (2 * s.ffn, s.hidden),
             "down": (s.hidden, s.ffn)}
    pool = 0 if args.cached else POOL
    print(f"CPU: {cpu_platform.current().describe()}; {args.threads} threads; shape {args.shape}"
          + ("; weights from the caches" if args.cached else "") + ("; CPU time" if args.cpu_time else ""))
    print("| form | GEMM | " + " | ".join(f"{r} rows us (GB/s)" for r in args.rows) + " |")
    print("|---|---|" + "---:|" * len(args.rows))
    rng = np.random.default_rng(0)
    for form in args.forms:
        for name, (n, k) in gemms.items():
            first = FORMS[form](n, k, rng)
            ops = [first] + [FORMS[form](n, k, rng) for _ in range(max(1, pool // first.nbytes) - 1)]
            for on in tiles:
                cpu_native.amx(on)
                body = (" (tiles)" if on else " (VNNI)") if len(tiles) > 1 else ""
                print(f"| {form} | {name} {n}x{k}{body} | " + cells(ops, k, args.rows, clock) + " |", flush=True)
            if args.wide:
                kind = wide_kind(cpu_platform.current())
                dense = first.widen(0, n, torch.float32)
                wide = [wide_linear(dense, kind)]
                wide += [wide_linear(dense.clone(), kind) for _ in range(max(1, pool // wide[0].nbytes) - 1)]
                del ops
                print(f"| {kind} copy | {name} {n}x{k} | " + cells(wide, k, args.rows, clock) + " |", flush=True)


if __name__ == "__main__":
    main()
