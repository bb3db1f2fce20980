"""GPU check of the weight-only quantized matmul (ignis_kernels/wo_matmul.py): W4A16 and W8A16
with group-32 scales, against its PyTorch reference and a bf16 torch.matmul baseline.

`run(copy_bw_gbs)` returns one row per case in check_kernels.py's row format (op, shape,
ms, gbs, frac_bw, vs, max_err, ok): gbs counts what the op must move (packed weight,
scales/zeros, x and the output) over the median time, frac_bw that over the card's
measured copy bandwidth (decode rows are bandwidth bound: frac_bw near 1 is the goal).
Shapes: Qwen3-0.6B's MLP (gate|up 6144 x 1024, down 1024 x 3072) and a 4096 x 4096
layer, at 1, 16 and 64 rows. Standalone: python experiments/gpu/wo_matmul_check.py.
Imports cleanly on a CPU machine (nothing runs until run()).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

SHAPES = [(6144, 1024), (1024, 3072), (4096, 4096)]  # (N, K)
ROWS = [1, 16, 64]
GROUP = 32


def _time_ms(fn, iters: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):  # five batches of back-to-back launches: the median batch counts
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return sorted(times)[len(times) // 2]


def run(copy_bw_gbs: float | None = None) -> list[dict]:
    from ignis_kernels.wo_matmul import wo_matmul_triton
    from ignis_kernels.wo_matmul_ref import pack_int4, wo_matmul_ref

    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []
    for N, K in SHAPES:
        scales = (torch.rand(N, K // GROUP, device=dev, generator=g) * 0.02 + 0.005).to(dt)
        zeros = (torch.randn(N, K // GROUP, device=dev, generator=g) * 0.05).to(dt)
        q4 = pack_int4(torch.randint(0, 16, (N, K), device=dev, generator=g))
        q8 = torch.randint(-127, 128, (N, K), device=dev, generator=g, dtype=torch.int8)
        dense = torch.randn(N, K, device=dev, generator=g).to(dt)
        for M in ROWS:
            x = torch.randn(M, K, device=dev, generator=g).to(dt)
            base_ms = _time_ms(lambda: x @ dense.t())
            for bits, q, z in ((4, q4, zeros), (8, q8, None)):
                got = wo_matmul_triton(x, q, scales, z, bits=bits, group_size=GROUP)
                want = wo_matmul_ref(x, q, scales, z, bits=bits, group_size=GROUP)
                err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
                ms = _time_ms(lambda: wo_matmul_triton(x, q, scales, z, bits=bits, group_size=GROUP))
                nbytes = q.numel() + scales.numel() * 2 * (2 if z is not None else 1) + (M * K + M * N) * 2
                gbs = nbytes / ms / 1e6
                rows.append({
                    "op": f"wo_matmul W{bits}A16", "shape": f"M{M} N{N} K{K} g{GROUP}", "ms": ms, "gbs": gbs,
                    "frac_bw": gbs / copy_bw_gbs if copy_bw_gbs else None,
                    "vs": f"bf16 torch.matmul {base_ms:.4f} ms ({base_ms / ms:.2f}x)",
                    "max_err": err, "ok": err < 1e-2,
                })
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy_ms = _time_ms(lambda: y.copy_(x), iters=10)
    copy_gbs = 2 * x.numel() / copy_ms / 1e6
    rows = run(copy_gbs)
    for r in rows:
        print(f"{r['op']:16s} {r['shape']:26s} {r['ms']:.4f} ms {r['gbs']:7.1f} GB/s "
              f"({r['frac_bw']:.0%} of copy) err {r['max_err']:.1e} {'ok' if r['ok'] else 'FAIL'}  vs {r['vs']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "wo_matmul.json").write_text(json.dumps({"copy_gbs": copy_gbs, "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())


def cases(ctx: "object") -> list:
    """check_kernels.py's interface: one case producing every row of `run`."""
    from experiments.gpu.common import Case

    shapes = ", ".join(f"N{n} K{k}" for n, k in SHAPES)
    return [Case("wo_matmul W4A16/W8A16", f"M{ROWS} x ({shapes})", lambda c: run(c.copy_gbs), "events, median",
                 "bf16 torch.matmul")]
