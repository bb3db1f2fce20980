"""Offline decode throughput of the engine with SmolLM2-135M, beside transformers' generate.

    .venv/bin/python experiments/bench_engine.py                      # 1, 16 and 64 concurrent
    .venv/bin/python experiments/bench_engine.py --threads 1 --max-tokens 64 --no-hf
    .venv/bin/python experiments/bench_engine.py --record experiments/RESULTS.md
    .venv/bin/python experiments/bench_engine.py --profile 64         # top ops of one decode step
    .venv/bin/python experiments/bench_engine.py --temperature 1      # sampled (OpenAI's defaults), not greedy
    .venv/bin/python experiments/bench_engine.py --no-hf --weight-forms float32 bfloat16 quantized  # alternated
    .venv/bin/python -m pytest experiments/bench_engine.py --benchmark-only -q   # per-step timings

N distinct chat prompts (~40 tokens) are submitted together and decoded greedily for
--max-tokens tokens each (EOS ignored, so every request runs to the end and the batch
stays N wide). "decode tok/s" counts the tokens after each request's first one, over
the time from the moment every request has its first token to the end: the
continuous-batching decode rate. "end-to-end" is all tokens over the whole run,
prefill included. transformers runs `generate` on the same prompts (left-padded,
greedy, its default dynamic KV cache), timed once with max_new_tokens=1 (prefill)
and once with the full length: its decode rate is the difference. Each configuration
runs --repeat times and the fastest run counts (noise on a shared machine only slows).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

QUESTIONS = [
    "the ocean", "volcanoes", "the moon", "honey bees", "the Roman empire", "jazz", "glaciers",
    "octopuses", "the printing press", "coffee", "black holes", "chess", "rainforests", "trains",
    "the human heart", "origami",
]
STYLES = ["Tell me a fact about {}.", "Write two sentences about {}.", "Why is {} interesting?", "Describe {} to a child."]


def prompts_for(loaded, n: int) -> list[list[int]]:
    from ignis.model.chat_template import encode_chat

    texts = [STYLES[i // len(QUESTIONS) % len(STYLES)].format(QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
    return [encode_chat(loaded.tokenizer, loaded.chat_template, [{"role": "user", "content": t}]) for t in texts]


@dataclass
class Run:
    concurrency: int
    decode_tps: float
    e2e_tps: float
    prefill_s: float
    step_ms: float  # mean decode step
    form: str = "float32"  # the model's weight form (ignis/model/packed.py)


def best_of(runs: list[Run]) -> Run:
    """The fastest of several runs: on a shared machine, noise only ever slows a run down."""
    return max(runs, key=lambda r: r.decode_tps)


def run_ignis(loaded, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0) -> Run:
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams

    n = len(prompts)
    blocks = n * (-(-(max(map(len, prompts)) + max_tokens) // 16) + 1)
    # Plain decoding: the raw step rate (llama-bench and transformers do not speculate either;
    # experiments/bench_speculation.py measures speculation).
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=max(n, 1), num_kv_blocks=blocks, speculative="none"))
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams.greedy(4))  # warm-up (allocator, oneDNN kernels)
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, params)
    have_first: set[str] = set()
    start = time.perf_counter()
    first_all = None
    steps = 0
    total = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            total += len(out.token_ids)
            if out.token_ids:
                have_first.add(out.request_id)
        if first_all is None and len(have_first) == n:
            first_all, steps = time.perf_counter(), 0
        else:
            steps += 1
    end = time.perf_counter()
    decode_time = end - first_all
    return Run(n, n * (max_tokens - 1) / decode_time, total / (end - start), first_all - start,
               decode_time / max(steps, 1) * 1e3, getattr(loaded.model, "weight_form", "float32"))


def load_hf():
    from transformers import AutoModelForCausalLM

    from ignis.model.embedded import smollm2_gguf_path

    path = smollm2_gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@torch.inference_mode()
def run_hf(hf, prompts: list[list[int]], max_tokens: int, pad_id: int, temperature: float = 0.0) -> Run:
    n = len(prompts)
    width = max(map(len, prompts))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1

    def gen(new: int) -> float:
        t = time.perf_counter()
        hf.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
            **({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature
               else {"do_sample": False}),
            pad_token_id=pad_id, eos_token_id=None,
        )
        return time.perf_counter() - t

    gen(2)  # warm-up
    prefill = min(gen(1) for _ in range(2))
    full = gen(max_tokens)
    return Run(n, n * (max_tokens - 1) / (full - prefill), n * max_tokens / full, prefill, (full - prefill) / (max_tokens - 1) * 1e3)


def table(ignis_runs: list[Run], hf_runs: dict[int, Run]) -> str:
    lines = [
        "| concurrent | weights | ignis decode tok/s | ignis end-to-end tok/s | ignis decode step | transformers decode tok/s | ignis / transformers |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in ignis_runs:
        h = hf_runs.get(r.concurrency)
        lines.append(
            f"| {r.concurrency} | {r.form} | {r.decode_tps:.1f} | {r.e2e_tps:.1f} | {r.step_ms:.1f} ms | "
            + (f"{h.decode_tps:.1f} | {r.decode_tps / h.decode_tps:.2f}x |" if h else "- | - |")
        )
    return "\n".join(lines)


def record(path: Path, command: str, body: str, machine: str) -> None:
    header = "# Results\n"
    old = path.read_text() if path.exists() else header
    rest = old[len(header):] if old.startswith(header) else "\n" + old
    entry = (
        f"\n## Engine decode throughput, SmolLM2-135M fp32 ({datetime.date.today().isoformat()})\n\n"
        f"- machine: {machine}\n- command: `{command}`\n\n{body}\n"
    )
    path.write_text(header + entry + rest)


def profile_step(loaded, n: int) -> None:
    from torch.profiler import profile

    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams

    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=n, num_kv_blocks=n * 16))
    for i, p in enumerate(prompts_for(loaded, n)):
        engine.add_request(f"p{i}", p, SamplingParams.greedy(200, ignore_eos=True))
    for _ in range(40):  # past prefill: pure decode steps, ~80 tokens of context
        engine.step()
    with profile() as prof:
        for _ in range(5):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy (default); else sampled at this temperature, top_p 1, no top_k (OpenAI's defaults)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration; the fastest counts")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--weight-forms", nargs="+", default=["float32"],
                    help="model.weight_form values to compare, alternated run by run (auto: per concurrency)")
    ap.add_argument("--hf-concurrency", type=int, nargs="*", default=None, help="default: same as --concurrency")
    ap.add_argument("--record", type=Path, default=None, help="prepend the table to this RESULTS.md")
    ap.add_argument("--machine", default=None, help="machine description for --record")
    ap.add_argument("--profile", type=int, default=None, metavar="N", help="profile a decode step at N concurrent")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from ignis.model import load_model

    models = {
        form: load_model(progress=False, weight_form=form, max_num_seqs=min(args.concurrency))
        for form in args.weight_forms if form != "auto"
    }
    if "auto" in args.weight_forms:  # what `auto` picks at each concurrency
        for n in args.concurrency:
            loaded = load_model(progress=False, weight_form="auto", max_num_seqs=n)
            models.setdefault(loaded.model.weight_form, loaded)
    loaded = next(iter(models.values()))
    if args.profile:
        for form, m in models.items():
            print(f"-- {form}")
            profile_step(m, args.profile)
        return
    all_prompts = prompts_for(loaded, max(args.concurrency))
    hf = None if args.no_hf else load_hf()
    hf_ns = set(args.concurrency if args.hf_concurrency is None else args.hf_concurrency)
    pad = loaded.tokenizer.eos_token_id or 0
    runs: list[Run] = []
    hf_runs: dict[int, Run] = {}
    for n in args.concurrency:
        # ignis and transformers take turns, so that both meet the same machine.
        theirs: list[Run] = []
        mine = {form: [] for form in models}
        for _ in range(args.repeat):
            for form, m in models.items():
                mine[form].append(run_ignis(m, all_prompts[:n], args.max_tokens, args.temperature))
            if hf is not None and n in hf_ns:
                theirs.append(run_hf(hf, all_prompts[:n], args.max_tokens, pad, args.temperature))
        for form in models:
            runs.append(best_of(mine[form]))
            print(f"ignis {n:>3} concurrent, {form}: {runs[-1].decode_tps:.1f} decode tok/s", file=sys.stderr)
        if theirs:
            hf_runs[n] = best_of(theirs)
            print(f"transformers {n:>3} concurrent: {hf_runs[n].decode_tps:.1f} decode tok/s", file=sys.stderr)
    body = table(runs, hf_runs)
    print(body)
    if args.record:
        machine = args.machine or f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"
        record(args.record, "python " + " ".join(sys.argv), body, machine)


# -- pytest-benchmark: one engine step at each concurrency (make bench) ---------------------


@pytest.fixture(scope="module")
def smollm2():
    from ignis.model import load_model

    return load_model(progress=False)


@pytest.mark.parametrize("concurrency", [1, 16, 64])
def test_engine_decode_step(benchmark, smollm2, concurrency: int) -> None:
    from ignis.config import EngineConfig
    from ignis.engine import LLMEngine, SamplingParams

    engine = LLMEngine(smollm2, EngineConfig(max_num_seqs=concurrency, num_kv_blocks=concurrency * 20))
    for i, p in enumerate(prompts_for(smollm2, concurrency)):
        engine.add_request(f"s{i}", p, SamplingParams.greedy(10_000, ignore_eos=True))
    for _ in range(3):  # prefill and a first decode
        engine.step()
    benchmark.extra_info["concurrency"] = concurrency
    benchmark.pedantic(engine.step, rounds=20, iterations=1, warmup_rounds=2)
    benchmark.extra_info["tok_per_s"] = concurrency / benchmark.stats.stats.median


if __name__ == "__main__":
    main()
