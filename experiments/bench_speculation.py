"""Speculative decoding by prompt lookup (engine.speculative=ngram) against plain decoding, one
sequence, greedy, in one run.

    .venv/bin/python experiments/bench_speculation.py [--gguf FILE] [--rounds 3] [--tokens 8] [--workloads edit,chat]
        [--llamacpp ngram-simple,ngram-mod,ngram-map-k,ngram-cache]

Two workloads, alternated round by round with speculation off and on (one engine each, the
same loaded model):
  edit   a Codex-like edit: a ~2k-token source file (ignis/engine/block_manager.py, read
         at this commit) in the prompt, and the instruction to rewrite it whole with one
         class renamed, as apply_patch rewrites what it read; 256 output tokens
  grammar  the edit under an output grammar that any text without a NUL matches (as a
         structured output or a custom tool's grammar holds a reply): each draft position
         then samples under its own mask (ignis/engine/grammar.py fill_draft_masks)
  chat   plain questions with nothing to copy (the engine benchmark's), 128 tokens each
Each timed request's prompt is in the prefix cache already (a warm-up request runs it
first), so the time is the decode's; both engines prefill in chunks of
max_num_batched_tokens (no step-time budget), so their caches hold the same values.
Reported: output tok/s off and on, their ratio, the draft tokens checked and kept, and
whether the outputs are the same token for token (they must be). --gguf times another file
(a synthetic one of a real shape: its random weights copy nothing, so only the cost of
checking drafts shows, not their gain).

--llamacpp ngram-simple,ngram-mod,... adds llama.cpp on the same file and the same edit prompt
(its token ids): llama-server (experiments/bench_vs_llamacpp.py's build) with each
`--spec-type` at its defaults, and with none, greedy, 256 tokens, its own generation-only
tok/s (timings.predicted_per_second) and draft counts. A fresh server per request: ngram-mod
and ngram-cache learn from what a server generated before, and would be timed on an answer
they had already seen. --llamacpp-repack off runs it without repacked weights (on a Xeon with
AMX, 0.3.36's AMX tiles crash llama-server at start on SmolLM2's Q4_1 file).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "ignis" / "engine" / "block_manager.py"
EDIT = ("Here is a Python file:\n\n```python\n{src}```\n\nRewrite the whole file with the class BlockManager "
        "renamed to KVBlockManager. Output only the file.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--weight-form", default="quantized")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8, help="engine.num_speculative_tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default="edit,grammar,chat", help="comma-separated: edit, grammar, chat")
    ap.add_argument("--llamacpp", default="", metavar="TYPES",
                    help="comma-separated llama-server --spec-type values to time on the edit (none is added)")
    ap.add_argument("--llamacpp-repack", choices=["on", "off"], default="on",
                    help="llama-server's weight repacking (its default: on; off where its AMX tiles crash it)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from experiments.bench_engine import prompts_for
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.engine.grammar import Grammar
    from ignis.model import load_model
    from ignis.model.chat_template import encode_chat

    loaded = load_model(str(args.gguf) if args.gguf else None, progress=False, weight_form=args.weight_form,
                        max_num_seqs=1)
    edit = encode_chat(loaded.tokenizer, loaded.chat_template,
                       [{"role": "user", "content": EDIT.format(src=SOURCE.read_text())}])
    chats = prompts_for(loaded, 3)
    print(f"model {loaded.name}; edit prompt {len(edit)} tokens; {args.threads} threads", file=sys.stderr)
    # No step-time budget: with one, a prompt's prefill chunks follow the measured step times, and
    # two chunkings round the prompt's cache differently (the edit's greedy output then parts at a
    # near-tie around its 111th token, speculation or not): both engines chunk alike here.
    common = dict(max_num_seqs=1, num_kv_blocks=2048, step_time_budget_ms=None)
    engines = {
        "off": LLMEngine(loaded, EngineConfig(**common, speculative="none")),
        "on": LLMEngine(loaded, EngineConfig(**common, speculative="ngram", num_speculative_tokens=args.tokens)),
    }
    work = {"edit": ([edit], 256), "grammar": ([edit], 256), "chat": (chats, 128)}
    unknown = set(args.workloads.split(",")) - set(work)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)} (edit, grammar, chat)")
    work = {k: v for k, v in work.items() if k in args.workloads.split(",")}
    grammar = Grammar.regex(r"[^\x00]*")
    rates: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], list[list[int]]] = {}
    drafts: dict[str, list[int]] = {}
    for name, (prompts, n) in work.items():  # warm-up: the prompts into each engine's prefix cache
        for engine in engines.values():  # (and the grammar's tokenizer built: seconds at 200k tokens)
            engine.generate(prompts, SamplingParams.greedy(2, grammar=grammar if name == "grammar" else None))
    for r in range(args.rounds):
        for name, (prompts, n) in work.items():
            for mode, engine in (engines.items() if r % 2 == 0 else reversed(engines.items())):
                params = SamplingParams.greedy(n, ignore_eos=True, grammar=grammar if name == "grammar" else None)
                d0, a0 = engine.num_draft_tokens, engine.num_accepted_draft_tokens
                tokens, elapsed = 0, 0.0
                outs = []
                for p in prompts:  # one sequence at a time
                    start = time.perf_counter()
                    out = engine.generate([p], params)[0]
                    elapsed += time.perf_counter() - start
                    tokens += len(out.token_ids)
                    outs.append(out.token_ids)
                rates.setdefault((name, mode), []).append(tokens / elapsed)
                outputs[(name, mode)] = outs
                if mode == "on":
                    d = drafts.setdefault(name, [0, 0])
                    d[0] += engine.num_draft_tokens - d0
                    d[1] += engine.num_accepted_draft_tokens - a0
                print(f"round {r + 1} {name} {mode}: {tokens / elapsed:.1f} tok/s", file=sys.stderr)
    print(f"| workload | off (tok/s) | on (tok/s) | on / off | drafts checked | kept | same tokens |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in work:
        off, on = statistics.median(rates[(name, "off")]), statistics.median(rates[(name, "on")])
        checked, kept = drafts.get(name, [0, 0])
        same = outputs[(name, "off")] == outputs[(name, "on")]
        print(f"| {name} | {off:.1f} | {on:.1f} | {on / off:.2f}x | {checked} | {kept} "
              f"({kept / max(checked, 1):.0%}) | {'yes' if same else 'NO'} |")
    print(f"\n(medians of {args.rounds} rounds; {loaded.name}, weight_form {args.weight_form}, "
          f"num_speculative_tokens {args.tokens}, {args.threads} threads)")
    if args.llamacpp:
        from ignis.model.embedded import smollm2_gguf_path

        gguf = args.gguf.resolve() if args.gguf else smollm2_gguf_path()
        types = ["none"] + [t for t in args.llamacpp.split(",") if t != "none"]
        theirs = llamacpp_edit(gguf, edit, 256, types, args.rounds, args.threads, args.llamacpp_repack == "on")
        mine = statistics.median(rates[("edit", "on")]) if ("edit", "on") in rates else None
        plain = statistics.median(theirs["none"][0])
        print("\n| llama.cpp on the edit | tok/s | / its none | drafts checked | kept | ignis ngram / this |")
        print("|---|---:|---:|---:|---:|---:|")
        for t in types:
            rate, (checked, kept) = statistics.median(theirs[t][0]), theirs[t][1]
            vs = f"{mine / rate:.2f}x" if mine else "-"
            print(f"| --spec-type {t} | {rate:.1f} | {rate / plain:.2f}x | {checked} | {kept} "
                  f"({kept / max(checked, 1):.0%}) | {vs} |")
        print(f"\n(llama.cpp: medians of {args.rounds} fresh servers per type, generation-only tok/s; ignis's "
              f"edit with speculation: {mine:.1f} tok/s)" if mine else "")


def llamacpp_edit(gguf: Path, prompt: list[int], n: int, types: list[str], rounds: int,
                  threads: int, repack: bool = True) -> dict[str, tuple[list[float], list[int]]]:
    """Per --spec-type: llama-server's generation tok/s over `rounds` fresh servers, and the
    draft tokens it checked and kept in all."""
    from experiments.bench_vs_llamacpp import LlamaServer, build_llamacpp

    build_llamacpp()
    out: dict[str, tuple[list[float], list[int]]] = {t: ([], [0, 0]) for t in types}
    for r in range(rounds):
        for t in types:
            server = LlamaServer(gguf, threads, extra=[] if t == "none" else ["--spec-type", t], repack=repack)
            try:
                timings = server.completion({"prompt": prompt, "n_predict": n, "ignore_eos": True,
                                             "temperature": 0})["timings"]
            finally:
                server.stop()
            out[t][0].append(float(timings["predicted_per_second"]))
            out[t][1][0] += int(timings.get("draft_n", 0))
            out[t][1][1] += int(timings.get("draft_n_accepted", 0))
            print(f"round {r + 1} llama.cpp {t}: {timings['predicted_per_second']:.1f} tok/s", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
