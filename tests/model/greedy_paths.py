"""One engine's greedy answers on prompts that cross every CPU path boundary, as JSON.

    python -m tests.model.greedy_paths --form quantized [--gguf FILE] [--max-num-seqs N]

Run in a fresh process per capability cap (IGNIS_CPU_CAPS is read before torch's first op)
by tests/model/test_every_cpu.py. The prompts are natural text cut to 1, 4, 5 (around the
narrow GEMMs' NARROW_ROWS), 255, 256, 300 (around WIDEN_ROWS, where prefill widens the
quantized weights) and 2000 tokens (prefill in chunks of the engine's 1024-token budget),
each run twice (the second time from the prefix cache), then all together (decode steps of
more rows than NARROW_ROWS). Each answer is a few greedy tokens with the two best
candidates of every step, so a comparison can tell a near-tie from a wrong path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LENGTHS = (1, 4, 5, 255, 256, 300, 2000)
STEPS = 4
TEXT = Path(__file__).resolve().parents[2] / "experiments" / "perplexity_text.txt"


def prompts(tokenizer, lengths: tuple[int, ...] = LENGTHS) -> list[list[int]]:
    ids = tokenizer.encode(TEXT.read_text())
    while len(ids) < max(lengths) + 64:
        ids = ids + ids
    # Each prompt starts at its own offset, so that no two share a cached prefix.
    return [ids[7 * i: 7 * i + n] for i, n in enumerate(lengths)]


def run(gguf: str | None, form: str, max_num_seqs: int, lengths: tuple[int, ...] = LENGTHS) -> dict:
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.model.loader import load_model
    from ignis_kernels import cpu_platform

    loaded = load_model(gguf, progress=False, weight_form=form, max_num_seqs=max_num_seqs)
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                                            max_model_len=4096, num_kv_blocks=1024))
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True, top_logprobs=2)
    batch = prompts(loaded.tokenizer, lengths)
    answers = []
    for name, group in [("uncached", [[p] for p in batch]), ("cached", [[p] for p in batch]), ("together", [batch])]:
        for ps in group:
            for p, out in zip(ps, engine.generate(ps, params), strict=True):
                answers.append({"pass": name, "length": len(p), "tokens": out.token_ids,
                                "top": out.top_logprobs, "cached_tokens": out.usage.cached_tokens})
    p = cpu_platform.current()
    return {"form": loaded.model.weight_form, "level": p.level, "native": engine.runner.native is not None,
            "kv_dtype": str(engine.kv_cache_dtype).removeprefix("torch."), "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--form", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="prompt lengths (tokens)")
    args = ap.parse_args()
    json.dump(run(args.gguf, args.form, args.max_num_seqs, tuple(args.lengths)), sys.stdout)


if __name__ == "__main__":
    main()
