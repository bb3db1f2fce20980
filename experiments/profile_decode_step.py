"""Where a decode step goes: torch's profiler over decode steps of any file, one user's or a batch's.

    .venv/bin/python experiments/profile_decode_step.py --gguf .cache/synthetic/gpt-oss-20b-mxfp4.gguf
    .venv/bin/python experiments/profile_decode_step.py --gguf FILE --batch 64

Loads the file as the benches' engines do (weight_form auto, max_num_seqs --batch: one user
as `bench_gemma3_vs_llamacpp.py`'s, 64 as the 64-concurrent row's), decodes a warm-up, then
profiles --steps more tokens for each of --batch sequences and prints the ops by their own CPU
time per step (the native GEMMs are ops of their own: ignis_cpu::quant_gemm, decode_layers),
beside the step's wall time. Speculation off: one token a sequence a step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rows", type=int, default=14, help="ops to list")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together (max_num_seqs)")
    ap.add_argument("--weight-form", default="auto")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    from ignis.config import EngineConfig
    from ignis.engine.engine import LLMEngine
    from ignis.engine.sampling_params import SamplingParams
    from ignis.model.loader import load_model

    print(f"loading {args.gguf.name} ...", file=sys.stderr, flush=True)
    loaded = load_model(str(args.gguf), weight_form=args.weight_form, max_num_seqs=args.batch, progress=False)
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=args.batch, max_model_len=4096, speculative="none"))
    prompts = [loaded.tokenizer.encode(f"Story {i}: once upon a time, in a small village,") for i in range(args.batch)]
    engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))  # warm
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True)

    def timed(p: SamplingParams) -> float:
        start = time.perf_counter()
        engine.generate(prompts, p)
        return time.perf_counter() - start

    # a decode step alone: the same request with one token less than --steps + 1, subtracted
    # (the prompt's prefill, cached after the warm-up, and the request's start cancel out)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    wall = min(timed(params) - timed(one) for _ in range(2)) / args.steps
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.generate(prompts, params)
    steps = args.steps + 1  # (the prefill is one step among them)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[: args.rows]
    print(f"{args.gguf.name}: {wall * 1e3:.1f} ms a decode step of {args.batch} unprofiled "
          f"({args.batch / wall:.2f} tok/s, {args.threads} threads)")
    print(f"{'op':44s} {'calls/step':>10s} {'self ms/step':>12s}")
    for e in rows:
        print(f"{e.key[:44]:44s} {e.count / steps:10.1f} {e.self_cpu_time_total / 1e3 / steps:12.2f}")
    # The GEMMs by shape: [x rows, K], [weight rows, K/2 or K] (nibbles or bytes), scales.
    gemms = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == "ignis_cpu::quant_gemm"]
    print(f"\n{'quant_gemm x / weight shapes':44s} {'calls/step':>10s} {'self ms/step':>12s} {'us/call':>8s}")
    for e in sorted(gemms, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.rows]:
        shapes = " ".join(str(s) for s in e.input_shapes[:2])
        print(f"{shapes[:44]:44s} {e.count / steps:10.1f} {e.self_cpu_time_total / 1e3 / steps:12.2f} "
              f"{e.self_cpu_time_total / e.count:8.0f}")
    engine.close()


if __name__ == "__main__":
    main()
