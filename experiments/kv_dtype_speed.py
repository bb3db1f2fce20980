"""One user's decode speed after a long prompt, per KV-cache dtype, on this CPU tier.

    PYTHONPATH=. .venv/bin/python experiments/kv_dtype_speed.py                       # this CPU
    IGNIS_CPU_CAPS=avx2 PYTHONPATH=. .venv/bin/python experiments/kv_dtype_speed.py   # as an AVX2 one
    PYTHONPATH=. .venv/bin/python experiments/kv_dtype_speed.py --contexts 512 4096 --rounds 3

What engine.kv_cache_dtype's `auto` rests on (ignis/model/kv_cache.py): a bf16 cache is half
the bytes attention reads per token, and widening bf16 to fp32 is a shift, so it should be
faster wherever attention is memory-bound; this measures it on the tier it runs on. The
embedded SmolLM2 (`quantized`, one sequence, native decode), a prompt of each --contexts
tokens, then --decode greedy tokens; one engine per dtype, alternated --rounds times in
one process (a shared machine slows both alike), the best round per dtype reported as
decode tokens/s, with the ratio bf16 / fp32.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
TEXT = Path(__file__).with_name("perplexity_text.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.model.embedded import smollm2_gguf_path
    from ignis.model.loader import load_model
    from ignis_kernels import cpu_platform

    p = cpu_platform.current()
    loaded = load_model(smollm2_gguf_path(), progress=False, weight_form="quantized", max_num_seqs=1)
    ids = loaded.tokenizer.encode(TEXT.read_text())
    while len(ids) < max(args.contexts):
        ids = ids + ids
    engines = {d: LLMEngine(loaded, EngineConfig(max_num_seqs=1, kv_cache_dtype=d, max_model_len=8192,
                                                 enable_prefix_caching=False))
               for d in ("float32", "bfloat16")}
    params = SamplingParams(max_tokens=args.decode, temperature=0.0, ignore_eos=True)
    print(f"{p.describe()}; native flags {' '.join(p.native_flags)}")
    print("| context | fp32 KV tok/s | bf16 KV tok/s | bf16 / fp32 |\n|---:|---:|---:|---:|")
    for n in args.contexts:
        best = {d: 0.0 for d in engines}
        for _ in range(args.rounds):
            for dtype, engine in engines.items():
                engine.generate([ids[:n]], SamplingParams(max_tokens=1, temperature=0.0))  # warm, same prompt
                first = time.perf_counter()
                outputs = []
                engine.add_request(f"r{n}", ids[:n], params)
                while engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.token_ids and not outputs:
                            first = time.perf_counter()
                        outputs.append(out)
                rate = (args.decode - 1) / (time.perf_counter() - first)
                best[dtype] = max(best[dtype], rate)
        print(f"| {n} | {best['float32']:.1f} | {best['bfloat16']:.1f} | {best['bfloat16'] / best['float32']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
