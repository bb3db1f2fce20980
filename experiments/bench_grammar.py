"""Grammar-constrained decoding: what a constrained row costs a decode step.

    PYTHONPATH=. python experiments/bench_grammar.py [--steps 12] [--threads 1]

Two tables, SmolLM2's 49,152-token vocabulary:

1. The mask alone, per step for N constrained rows: llguidance filling the bitmasks
   (real JSON-schema matchers walked through a JSON document, so the masks are those
   of strings, numbers and structure), and applying them to [N, V] fp32 logits three
   ways: the naive shift-every-word unpack (ignis_kernels.token_mask_ref), the CPU path
   (numpy unpackbits + one where), and llguidance's own numpy helper for scale.
2. The engine's decode step (embedded SmolLM2, greedy, N sequences all decoding) with
   N rows unconstrained vs N rows under a JSON schema, the two engines' steps
   alternating: median ms per step, and the ratio. Ratios are what to quote (a shared
   machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from experiments.timing import median_ms
from ignis.engine.grammar import Grammar, GrammarState, fill_masks, ll_tokenizer
from ignis_kernels.token_mask_ref import apply_token_bitmask_cpu_, apply_token_bitmask_ref_

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}, "summary": {"type": "string"}},
    "required": ["title", "year", "tags", "summary"],
    "additionalProperties": False,
}
DOC = '{"title": "The long road", "year": 1987, "tags": ["travel", "memoir"], "summary": "A walk across the country'


def mask_table(loaded, rows_list: list[int], reps: int) -> list[str]:
    tok = loaded.tokenizer
    V = loaded.config.vocab_size
    lt = ll_tokenizer(tok, V)
    grammar = Grammar.json_schema(SCHEMA)
    doc_ids = tok.encode(DOC)
    out = [f"{'rows':>5} {'fill (llg)':>11} {'naive unpack':>13} {'cpu path':>9} {'llg numpy':>10}"]
    for n in rows_list:
        states = []
        for k in range(n):  # row k stands k tokens into the document: a mix of states
            s = GrammarState(grammar, lt)
            for t in doc_ids[: (k * 7) % len(doc_ids)]:
                assert s.advance(t) is None
            states.append(s)
        masks = np.zeros((n, states[0].mask_words), dtype=np.int32)
        fill_ms = median_ms(lambda: fill_masks(states, masks), reps, warmup=False)
        logits = torch.randn(n, V)
        bitmask = torch.from_numpy(masks.copy())
        rows = torch.arange(n)
        naive = median_ms(lambda: apply_token_bitmask_ref_(logits.clone(), bitmask, rows), reps, warmup=False)
        cpu = median_ms(lambda: apply_token_bitmask_cpu_(logits.clone(), bitmask, rows), reps, warmup=False)
        clone = median_ms(lambda: logits.clone(), reps, warmup=False)  # what every variant above also pays
        try:
            from llguidance.numpy import apply_token_bitmask_inplace

            x = logits.numpy().copy()
            llg = median_ms(lambda: apply_token_bitmask_inplace(x, masks), max(3, reps // 4), warmup=False)
        except ImportError:
            llg = float("nan")
        out.append(f"{n:>5} {fill_ms:>10.3f}ms {naive - clone:>12.2f}ms {cpu - clone:>8.2f}ms {llg:>9.1f}ms")
    return out


def engine_table(loaded, rows_list: list[int], steps: int) -> list[str]:
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams

    tok = loaded.tokenizer
    prompt = tok.encode("<|im_start|>user\nDescribe a book as JSON with title, year, tags and summary.<|im_end|>\n"
                        "<|im_start|>assistant\n", special=True)
    grammar = Grammar.json_schema(SCHEMA)
    out = [f"{'rows':>5} {'free ms/step':>13} {'grammar ms/step':>16} {'ratio':>6}"]
    for n in rows_list:
        engines = {}
        for label, g in (("free", None), ("grammar", grammar)):
            engine = LLMEngine(loaded, EngineConfig(max_num_seqs=max(rows_list), num_kv_blocks=64 * 40))
            # Different prompts per row (a suffix), so rows walk different grammar states.
            for k in range(n):
                engine.add_request(f"r{k}", prompt + tok.encode(" " * (k % 5)),
                                   SamplingParams.greedy(steps + 8, grammar=g, ignore_eos=g is None))
            engine.step()  # the prefills
            engine.step()
            engines[label] = engine
        # Steps alternate between the two engines (which goes first alternates too), so a
        # shared machine's load falls on both alike.
        times: dict[str, list[float]] = {"free": [], "grammar": []}
        for i in range(steps):
            order = list(engines.items())
            for label, engine in order if i % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                outs = engine.step()
                times[label].append(time.perf_counter() - t)
            if any(o.finished for o in outs):
                break
        per = {label: 1e3 * statistics.median(ts) for label, ts in times.items()}
        out.append(f"{n:>5} {per['free']:>13.1f} {per['grammar']:>16.1f} {per['grammar'] / per['free']:>6.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--masks-only", action="store_true", help="only the first table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from ignis.model import load_model

    loaded = load_model(progress=False)
    print(f"torch threads {torch.get_num_threads()}, vocab {loaded.config.vocab_size}")
    print("\n".join(mask_table(loaded, args.rows, args.reps)))
    if args.masks_only:
        return
    print()
    print("\n".join(engine_table(loaded, args.rows, args.steps)))


if __name__ == "__main__":
    main()
