"""The per-step costs that grow with the vocabulary, at SmolLM2's 49,152 and Gemma 3's 262,144.

    .venv/bin/python experiments/bench_large_vocab.py [--threads 2]

On the CPU, for 1, 16 and 64 sampling rows: the LM head (ignis/model/lm_head.py: the
int8 dynamic GEMM for few rows, the wide bf16/fp16/fp32 one for more, each with its exact
fp32 refinement of the top candidates; hidden 640 as Gemma 3 270M), the sampler
(ignis_kernels.sample: greedy; temperature + top-p 0.9; with logprobs), top-5 logprobs
(logprob_distribution + topk, what the engine does for them) and a grammar's token
bitmask applied in place (ignis_kernels.apply_token_bitmask_). Median of repeated calls
(experiments/timing.py), in milliseconds, and the 262k / 49k ratio: a cost linear in the
vocabulary is 5.3x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOCABS = (49152, 262144)
ROWS = (1, 16, 64)
HIDDEN = 640


def median_ms(fn, repeat: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import ignis_kernels
    from ignis.model.lm_head import RefinedHead, int8_dynamic_head
    from ignis.model.packed import wide_linear
    from ignis.model.weight_plan import plan_weights
    from ignis_kernels.sampling import SamplingTensors, logprob_distribution

    plan = plan_weights("mixed", kind="gguf", device=torch.device("cpu"), max_num_seqs=64)
    g = torch.Generator().manual_seed(0)
    results: dict[tuple[str, int], dict[int, float]] = {}
    for vocab in VOCABS:
        w = torch.randn(vocab, HIDDEN, generator=g) * 0.05
        table = w.clone()
        head = RefinedHead(lambda ids: table.index_select(0, ids), wide=wide_linear(w, plan.wide),
                           narrow=int8_dynamic_head(w, full_range=plan.head_full_range) if plan.head_int8 else None)
        for rows in ROWS:
            x = torch.randn(rows, HIDDEN, generator=g)
            logits = torch.randn(rows, vocab, generator=g) * 3
            greedy = SamplingTensors.from_lists([0.0] * rows)
            top_p = SamplingTensors.from_lists([0.8] * rows, top_p=[0.9] * rows, seed=list(range(rows)))
            words = (vocab + 31) // 32
            mask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=g, dtype=torch.int64).to(torch.int32)
            mask_rows = torch.arange(rows, dtype=torch.int32)
            work = logits.clone()
            cases = {
                "LM head (refined)": lambda: head(x),
                "sample greedy": lambda: ignis_kernels.sample(logits, greedy),
                "sample top-p 0.9": lambda: ignis_kernels.sample(logits, top_p),
                "sample + logprobs": lambda: ignis_kernels.sample(logits, top_p, return_logprobs=True),
                "top-5 logprobs": lambda: logprob_distribution(logits, top_p).topk(5, dim=-1),
                "grammar bitmask": lambda: ignis_kernels.apply_token_bitmask_(work, mask, mask_rows),
            }
            with torch.inference_mode():
                for name, fn in cases.items():
                    results.setdefault((name, rows), {})[vocab] = median_ms(fn)
    print(f"| op | rows | {VOCABS[0]} (ms) | {VOCABS[1]} (ms) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for (name, rows), by_vocab in results.items():
        a, b = by_vocab[VOCABS[0]], by_vocab[VOCABS[1]]
        print(f"| {name} | {rows} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
    print(f"\n({args.threads} threads; head GEMMs: {plan.wide} wide, int8 dynamic narrow: {plan.head_int8})")


if __name__ == "__main__":
    main()
