"""How far prompt-lookup speculation can go on the agent edit: the engine's drafts, and the
best any n-gram drafter could do, replayed on the edit's greedy output.

    .venv/bin/python experiments/speculation_bound.py [--tokens 8 16] [--threads 2]

Decodes bench_speculation.py's edit (SmolLM2, 256 greedy tokens) with speculation off and on
(the engine's own timings and draft counts), and from them the cost of one drafted row as a
fraction c of a plain one-row step: t_on = t_row * (steps + c * drafted). Then replays drafting
on the recorded output, where a step of k drafted tokens keeps the prefix that matches and
adds one sampled token:
  engine   the engine's NgramDrafter itself on a Sequence (ignis/engine/speculation.py: one
           longer than the last draft kept, or whole while the tokens follow the last draft's
           source; waits after drafts that kept nothing)
  oracle   every earlier occurrence of the last two tokens tried, the one whose continuation
           matches longest drafted, always num_tokens long: no n-gram drafter keeps more
Each line: steps, rows drafted, tokens kept, the speedup t_off / t_on that the measured c gives,
and the c under which that drafting would reach 2x. Deterministic but for the timings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

N = 256


def replay(prompt: list[int], out: list[int], k_max: int, oracle: bool, tokenizer: object) -> tuple[int, int, int]:
    """(steps, tokens drafted, tokens kept) decoding `out` after `prompt` with drafts of at
    most k_max tokens: the engine's own NgramDrafter on a Sequence, or the oracle."""
    from ignis.engine import SamplingParams
    from ignis.engine.sequence import Sequence
    from ignis.engine.speculation import NgramDrafter
    from ignis.engine.stop import TextStream

    seq = Sequence("replay", prompt, SamplingParams.greedy(N, ignore_eos=True), seed=0, max_tokens=N,
                   text=TextStream(tokenizer))
    drafter = NgramDrafter(k_max)
    i = steps = drafted = kept_all = 0
    while i < N:
        if oracle:
            draft = best_continuation(seq.token_ids, out[i:], min(k_max, N - i - 1))
        else:
            draft = drafter(seq, k_max, 1)
        kept = 0
        while kept < len(draft) and draft[kept] == out[i + kept]:
            kept += 1
        if draft and not oracle:
            drafter.observe(seq, len(draft), kept)
        seq.token_ids += out[i : i + kept + 1]
        steps, drafted, kept_all, i = steps + 1, drafted + len(draft), kept_all + kept, i + kept + 1
    return steps, drafted, kept_all


def best_continuation(tokens: list[int], truth: list[int], k: int) -> list[int]:
    """Of every earlier occurrence of the last two tokens, the continuation that matches
    `truth` longest (k tokens; [] when the two never occurred before)."""
    best, best_len = [], -1
    for end in range(1, len(tokens) - 1):
        if tokens[end - 1 : end + 1] == tokens[-2:]:
            cont = tokens[end + 1 : end + 1 + k]
            m = next((j for j, (a, b) in enumerate(zip(cont, truth)) if a != b), min(len(cont), len(truth)))
            if m > best_len:
                best, best_len = cont, m
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 16], help="draft lengths (num_speculative_tokens)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from experiments.bench_speculation import EDIT, SOURCE
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.model import load_model
    from ignis.model.chat_template import encode_chat

    loaded = load_model(None, progress=False, weight_form="quantized", max_num_seqs=1)
    prompt = encode_chat(loaded.tokenizer, loaded.chat_template,
                         [{"role": "user", "content": EDIT.format(src=SOURCE.read_text())}])
    common = dict(max_num_seqs=1, num_kv_blocks=2048, step_time_budget_ms=None)
    params = SamplingParams.greedy(N, ignore_eos=True)
    timed: dict[str, tuple[float, list[int], int, int]] = {}
    for mode in ("none", "ngram"):
        engine = LLMEngine(loaded, EngineConfig(**common, speculative=mode, num_speculative_tokens=args.tokens[0]))
        engine.generate([prompt], SamplingParams.greedy(2))  # the prompt into the prefix cache
        best = float("inf")
        for _ in range(3):
            d0, a0 = engine.num_draft_tokens, engine.num_accepted_draft_tokens
            start = time.perf_counter()
            out = engine.generate([prompt], params)[0].token_ids
            best = min(best, time.perf_counter() - start)
        timed[mode] = (best, out, engine.num_draft_tokens - d0, engine.num_accepted_draft_tokens - a0)
        engine.close()
    (t_off, out, _, _), (t_on, out_on, drafted, kept) = timed["none"], timed["ngram"]
    assert out == out_on, "speculation changed the greedy output"
    steps = N - kept
    c = (t_on / (t_off / N) - steps) / drafted
    print(f"measured ({args.threads} threads): off {N / t_off:.1f} tok/s, on {N / t_on:.1f} tok/s "
          f"({t_off / t_on:.2f}x; {steps} steps, {drafted} drafted, {kept} kept); "
          f"a drafted row costs c = {c:.2f} of a one-row step")
    replayed = replay(prompt, out, args.tokens[0], False, loaded.tokenizer)
    if replayed != (steps, drafted, kept):  # the replay stands for the engine only where it agrees
        print(f"warning: the engine's policy replayed gives {replayed}, the engine {(steps, drafted, kept)}")
    print("\n| drafting | draft tokens | steps | drafted | kept | on / off at c | c for 2x |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k in args.tokens:
        for name, oracle in (("engine", False), ("oracle n-gram", True)):
            s, d, a = replay(prompt, out, k, oracle, loaded.tokenizer)
            print(f"| {name} | {k} | {s} | {d} | {a} | {N / (s + c * d):.2f}x | {(N / 2 - s) / d:.2f} |")


if __name__ == "__main__":
    main()
