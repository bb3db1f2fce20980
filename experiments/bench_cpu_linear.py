"""CPU GEMM forms per SmolLM2-135M projection shape and row count: which kernel to pack for.

    .venv/bin/python experiments/bench_cpu_linear.py [--threads 2] [--rows 1 16 64 512]

Times y = x W^T (best of 5 batches, microseconds per call) for each of SmolLM2's four
per-layer GEMMs (q|k|v 960x576, o 576x576, gate|up 3072x576, down 576x1536) and its LM
head (49152x576), with:
  f32_mkl   F.linear in fp32 (MKL sgemm)
  f32_dnn   oneDNN over a weight reordered once (engine.cpu_pack_weights, weight_form float32)
  bf16_dnn  the same in bf16 (weight_form bfloat16, and every form's LM head)
  bf16_lin  F.linear in bf16, unpacked
  i8_bf16   torch's int8 weight-only GEMM, bf16 activations, one scale per row
  i4_bf16   torch's int4 weight-only GEMM, bf16 activations, group 32 (weight_form quantized)
  i8_f32 / i4_f32: the same two with fp32 activations (--fp32-quant; a scalar fallback, slow)
Random weights: speed only. One process, every form per shape in turn.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}


def best_us(fn, reps: int, clock=time.perf_counter) -> float:
    """Microseconds a call of `fn`: the best of 5 batches of `reps` after two warm calls, by
    `clock` (time.process_time: the process's CPU time, which a VM's stolen time does not
    inflate; all threads' together)."""
    fn()
    fn()
    best = float("inf")
    for _ in range(5):
        start = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - start) / reps)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 512])
    ap.add_argument("--fp32-quant", action="store_true", help="also time the int8/int4 GEMMs on fp32 activations")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"| shape | rows | {' | '.join(['f32_mkl', 'f32_dnn', 'bf16_dnn', 'bf16_lin', 'i8_bf16', 'i4_bf16'])} |")
    print("|---|---:|" + "---:|" * 6)
    with torch.inference_mode():
        for name, (n, k) in SHAPES.items():
            w = torch.randn(n, k) * 0.05
            p32 = torch.ops.mkldnn._reorder_linear_weight(w, 64)
            wb = w.bfloat16()
            pb = torch.ops.mkldnn._reorder_linear_weight(wb, 64)
            q4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
            sz = torch.stack([torch.rand(k // 32, n), torch.randn(k // 32, n)], -1)
            szb = sz.bfloat16()
            w8 = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            sc = torch.rand(n)
            for m in args.rows:
                x = torch.randn(m, k)
                xb = x.bfloat16()
                reps = max(3, int(2e6 / (n * k * max(m, 8) / 8)))
                forms = {
                    "f32_mkl": lambda: F.linear(x, w),
                    "f32_dnn": lambda: torch.ops.mkldnn._linear_pointwise(x, p32, None, "none", [], ""),
                    "bf16_dnn": lambda: torch.ops.mkldnn._linear_pointwise(xb, pb, None, "none", [], ""),
                    "bf16_lin": lambda: F.linear(xb, wb),
                    "i8_bf16": lambda: torch.ops.aten._weight_int8pack_mm(xb, w8, sc.bfloat16()),
                    "i4_bf16": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, q4, 32, szb),
                }
                if args.fp32_quant:
                    forms["i8_f32"] = lambda: torch.ops.aten._weight_int8pack_mm(x, w8, sc)
                    forms["i4_f32"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, q4, 32, sz)
                times = {f: best_us(fn, reps) for f, fn in forms.items()}
                print(f"| {name} | {m} | " + " | ".join(f"{t:.1f}" for t in times.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
