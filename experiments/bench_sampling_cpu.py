"""The CPU sampler with top_p / top_k: the reference (sorts every row) vs ignis_kernels.sampling_cpu.

    PYTHONPATH=. python experiments/bench_sampling_cpu.py [--threads 1]

Median ms per call over [B, 49152] fp32 logits spread like a model's (a head of 40
likely tokens), alternating the two paths three times (best median kept), at B = 1, 16
and 64 and three settings: temperature 0.7 + top_p 0.9, temperature 0.7 + top_k 20 +
top_p 0.95 (Qwen3's generation_config), temperature 1 without filters (both paths are
the reference there).
"""

from __future__ import annotations

import argparse

import torch

from experiments.timing import median_ms
from ignis_kernels.sampling_cpu import sample_cpu
from ignis_kernels.sampling_ref import sample_ref
from ignis_kernels.sampling_tensors import SamplingTensors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    V = 49_152
    logits = torch.randn(64, V, generator=g) * 2.5
    logits[:, :40] += 9.0
    settings = {
        "T 0.7, top_p 0.9": (0.7, {"top_p": 0.9}),
        "T 0.7, top_k 20, top_p 0.95": (0.7, {"top_k": 20, "top_p": 0.95}),
        "T 1, no filter": (1.0, {}),
    }
    print("| rows | setting | reference ms | CPU path ms | speed-up |")
    print("|---:|---|---:|---:|---:|")
    for B in (1, 16, 64):
        x = logits[:B]
        for name, (temp, kw) in settings.items():
            params = SamplingTensors.from_lists([temp] * B, seed=list(range(B)),
                                                **{k: [v] * B for k, v in kw.items()})
            ref, cpu = [], []
            for _ in range(3):
                ref.append(median_ms(lambda: sample_ref(x, params), 15))
                cpu.append(median_ms(lambda: sample_cpu(x, params), 15))
            print(f"| {B} | {name} | {min(ref):.2f} | {min(cpu):.2f} | {min(ref) / min(cpu):.1f}x |", flush=True)


if __name__ == "__main__":
    main()
