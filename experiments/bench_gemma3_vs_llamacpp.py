"""Gemma 3 270M (the PyPI package's Q4_K_M GGUF, 262k vocabulary) in ignis beside llama.cpp,
or any other file.

    .venv/bin/python experiments/bench_gemma3_vs_llamacpp.py [--rounds 2] [--threads 2]
    .venv/bin/python experiments/bench_gemma3_vs_llamacpp.py --gguf .cache/synthetic/gpt-oss-20b-mxfp4.gguf
                                                      # (experiments/synthetic_gguf.py --shape gpt-oss-20b --type mxfp4)

Each round measures llama.cpp, then ignis (an engine in a child process, so its RSS is its
own), for: batch-1 decode (llama-bench tg64 | 64 tokens of one sequence), 16 concurrent
(llama-batched-bench -npl 16, 40-token prompts, 32 tokens each | 16 sequences), both
counted from every sequence's first token on (decode alone, as llama.cpp's tools count; the
median of three runs), prefill
of a 512-token prompt (llama-bench pp512 | one 512-token prompt, max_tokens 1) and
resident memory after load and a request (llama-server -np 1 -c 4096 | the child after its
one-sequence runs: engine.max_num_seqs 1, the quantized form). Rounds alternate the two, and each row reports every
round: the machine is shared, and only the ratio within a round means much.
ignis runs model.weight_form auto (quantized at max_num_seqs <= 4, mixed above).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments import bench_vs_llamacpp
from experiments.bench_vs_llamacpp import (
    BIN,
    LlamaServer,
    bench_repack,
    build_llamacpp,
    llama_batched,
    llama_bench_tg,
    rss_mb,
)
from experiments.gemma3_vs_llamacpp import gemma_file


def llama_bench_pp(gguf: Path, threads: int, n: int) -> float:
    out = subprocess.run([str(BIN / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", str(n), "-n", "0",
                          "-r", "2", "-o", "json", *bench_repack()], capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def llama_rss(gguf: Path, threads: int) -> float:
    server = LlamaServer(gguf, threads, ctx=4096, parallel=1)
    try:
        server.completion({"prompt": "Once upon a time", "n_predict": 16})
        return rss_mb(server.proc.pid)
    finally:
        server.stop()


def child(threads: int, path: str, n: int) -> None:
    """ignis's side, printed as one JSON line."""
    import torch

    torch.set_num_threads(threads)
    from ignis.config import EngineConfig
    from ignis.engine.engine import LLMEngine
    from ignis.engine.sampling_params import SamplingParams
    from ignis.model.loader import load_model

    from experiments.bench_engine import run_ignis

    res: dict[str, float] = {}
    # One engine size per process (the parent runs one per size): two large models never share memory.
    loaded = load_model(path, weight_form="auto", max_num_seqs=n, progress=False)
    prompts = [loaded.tokenizer.encode(f"Story {i}: once upon a time, in a small village,") for i in range(n)]
    # Decode alone, from every sequence's first token on, as llama-bench's tg and
    # llama-batched-bench's S_TG count it.
    # (Three runs, their median: one 64-token run is 0.7 s, and two alike runs differed by 20%.)
    runs = sorted(run_ignis(loaded, prompts, 64 if n == 1 else 32).decode_tps for _ in range(3))
    res[f"decode_{n}"] = runs[1]
    if n == 1:
        engine = LLMEngine(loaded, EngineConfig(max_num_seqs=n, max_model_len=4096))
        text = (ROOT / "experiments" / "perplexity_text.txt").read_text()
        ids = loaded.tokenizer.encode(text)[:512]
        engine.generate([ids[:64]], SamplingParams(temperature=0.0, max_tokens=1))  # warm
        ids[0] = 107  # a different first token: no prefix-cache hit
        start = time.perf_counter()
        engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=1))
        res["prefill_512"] = 512 / (time.perf_counter() - start)
        # The one-user engine's memory, as llama-server -np 1's.
        res["rss_mb"] = rss_mb(int(Path("/proc/self/stat").read_text().split()[0]))
        engine.close()
    print(json.dumps(res))


def ignis_round(threads: int, gguf: Path) -> dict[str, float]:
    res: dict[str, float] = {}
    for n in (1, 16):
        out = subprocess.run([sys.executable, __file__, "--child", "--threads", str(threads), "--gguf", str(gguf),
                              "--n", str(n)], capture_output=True, text=True, check=True, cwd=ROOT)
        res.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gguf", type=Path, default=None, help="the file both run (default: Gemma 3 270M's)")
    ap.add_argument("--llamacpp-repack", choices=["on", "off"], default="on",
                    help="llama.cpp's weight repacking (off: on an AMX Xeon its repacked batched tool crashes)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    gguf = (args.gguf or gemma_file()).resolve()
    if args.child:
        child(args.threads, str(gguf), args.n)
        return
    build_llamacpp()
    bench_vs_llamacpp.REPACK = args.llamacpp_repack == "on"
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in ("decode_1", "decode_16", "prefill_512", "rss_mb")}
    for r in range(args.rounds):
        theirs = {"decode_1": llama_bench_tg(gguf, args.threads),
                  "decode_16": llama_batched(gguf, args.threads, 16, 32),
                  "prefill_512": llama_bench_pp(gguf, args.threads, 512),
                  "rss_mb": llama_rss(gguf, args.threads)}
        mine = ignis_round(args.threads, gguf)
        for k in rows:
            rows[k].append((theirs[k], mine[k]))
        print(f"round {r + 1}: llama.cpp {theirs} ignis {mine}", file=sys.stderr, flush=True)
    names = {"decode_1": "decode, batch 1 (tok/s)", "decode_16": "decode, 16 concurrent (tok/s)",
             "prefill_512": "prefill, 512 tokens (tok/s)", "rss_mb": "RSS after load + a request (MB, lower is better)"}
    print(f"file: {gguf.name}, {gguf.stat().st_size / 1e9:.2f} GB")
    print("| measure | llama.cpp | ignis | ignis / llama.cpp (each round) |")
    print("|---|---:|---:|---:|")
    for k, pairs in rows.items():
        ratios = ", ".join(f"{m / t:.2f}x" for t, m in pairs)
        print(f"| {names[k]} | {' / '.join(f'{t:.1f}' for t, _ in pairs)} | {' / '.join(f'{m:.1f}' for _, m in pairs)} "
              f"| {ratios} |")
    file_mb = gguf.stat().st_size / 2**20
    print(f"| RSS / file size | {' / '.join(f'{t / file_mb:.2f}' for t, _ in rows['rss_mb'])} "
          f"| {' / '.join(f'{m / file_mb:.2f}' for _, m in rows['rss_mb'])} | |")


if __name__ == "__main__":
    main()
