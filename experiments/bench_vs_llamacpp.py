"""ignis beside llama.cpp on the same GGUF and thread count, in one run, with ratios.

    .venv/bin/python experiments/bench_vs_llamacpp.py                 # build once, then measure
    .venv/bin/python experiments/bench_vs_llamacpp.py --quick         # decode 1/64 + RSS only
    .venv/bin/python experiments/bench_vs_llamacpp.py --png experiments/vs_llamacpp.png
    .venv/bin/python experiments/bench_vs_llamacpp.py --cpu-caps avx2 --llamacpp-build build-avx2   # as an AVX2 CPU
    .venv/bin/python experiments/bench_vs_llamacpp.py --gguf .cache/synthetic/llama-3.2-1b-q4_k_m.gguf
                                                      # any GGUF (experiments/synthetic_gguf.py writes real shapes)

llama.cpp is built from the `llama-cpp-python` 0.3.36 sdist's vendored tree (the same
source DESIGN.md's numbers came from) into `.cache/llamacpp/` (git-ignored): `pip
download --no-binary` fetches the sdist, cmake builds llama-bench, llama-batched-bench
and llama-server with -DGGML_NATIVE=ON under `nice -n 19` with -j2 (~11-60 minutes on
2 shared cores). Never run in CI or tests. --llamacpp-build build-avx2 builds (and runs) a
second tree for CPUs without AVX-512 (GGML_NATIVE off, AVX2/FMA/F16C on, every AVX-512
and VNNI extension off); --cpu-caps sets IGNIS_CPU_CAPS for ignis (in this process and the
servers it starts), so the two run the same instruction tier. The table says which.
--llamacpp-repack off runs every llama.cpp tool without its repacked weights (`--repack 0`,
`-nr`): on a Xeon with AMX, 0.3.36 repacks Q4_K / Q6_K / Q4_1 into AMX tiles by default, and
with them llama-batched-bench dies (SIGSEGV, SIGILL) at 16 and 64 sequences, llama-server at
start on SmolLM2's file, llama-bench at a 2k depth (2026-12-06); its empty-context batch 1
runs with them (on the Q4_K_M files about as fast as without, on SmolLM2's Q4_1 2.4x faster).

Measured, alternating the two engines where it matters (a shared machine only slows):
  decode, batch 1      llama-bench tg128, one repetition | ignis engine, 128 tokens, 1 sequence;
                       --batch1-rounds alternated rounds (5), the medians and each round's ratio
  decode, N concurrent llama-batched-bench -npl N        | ignis engine, N sequences
  decode at depth      llama-bench -d D tg64: one        | ignis engine, one sequence after a
                       sequence after D tokens of context  D-token prompt, 64 tokens
  served prefill       llama-server /completion, 1 token out, cache_prompt false, its
                       timings.prompt_per_second        | ignis server (experiments/serving.py),
                       /v1/responses with max_output_tokens 1: input tokens / wall time
  RSS                  server idle after load and one request (-np 1 -c 8192 against
                       engine.max_num_seqs=1; torch's import alone is reported beside)
  served throughput    N concurrent clients, one request each of --max-tokens output
                       tokens (EOS ignored, greedy): llama-server -np 64 -c 32768 /completion
                       | ignis server max_num_seqs 64 (--served-weight-form, default quantized
                       as `make serve`), /v1/responses; output tokens / wall
ignis runs with model.weight_form auto (quantized at max_num_seqs <= 4, mixed above; --weight-form
sets it), its decode steps native (engine.cpu_native_decode) and its KV cache bf16
(engine.kv_cache_dtype auto).

The memory limit: the run first measures the machine's copy bandwidth (torch's copy of a
1 GiB buffer with --threads threads, best of 5, bytes read + written per second as STREAM
counts them) and its read bandwidth (a sum over the same buffer). Batch-1 decode is also
given as a fraction of the copy bandwidth: the file's bytes of weights one token reads
(experiments/synthetic_gguf.py's weight_bytes_per_token: every tensor once, the embedding
table only when the head is tied to it) x tok/s / bandwidth. ignis's own forms may read more
bytes than the file holds (Q6_K as int8); the numerator is the file's for both engines.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "llamacpp"
VERSION = "0.3.36"
SRC = CACHE / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
BIN = SRC / "build" / "bin"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-server")
# cmake options per build tree: the host's own instructions, or AVX2 and nothing above it.
BUILDS = {
    "build": ["-DGGML_NATIVE=ON"],
    "build-avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                   "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
                   "-DGGML_AVX_VNNI=OFF"],
}
TEXT = Path(__file__).with_name("perplexity_text.txt")
# llama.cpp repacks weights for the CPU's own kernels by default (on AMX CPUs into AMX tiles);
# --llamacpp-repack off turns that off in every tool (llama-bench's --repack 0, the others' -nr).
REPACK = True


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- llama.cpp: fetch and build once ------------------------------------------------------


def build_llamacpp(jobs: int = 2, tree: str = "build") -> Path:
    global BIN
    BIN = SRC / tree / "bin"
    if all((BIN / t).exists() for t in TOOLS):
        return BIN
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.exists():
        log(f"downloading the llama-cpp-python {VERSION} sdist ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={VERSION}", "-d", str(CACHE)], check=True)
    if not (SRC / "CMakeLists.txt").exists():  # absent, or only the converter (make test's)
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    log("building llama.cpp (nice -n 19, this takes a while) ...")
    nice = ["nice", "-n", "19"]
    subprocess.run(nice + ["cmake", "-B", tree, *BUILDS[tree], "-DCMAKE_BUILD_TYPE=Release",
                           "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"],
                   cwd=SRC, check=True)
    subprocess.run(nice + ["cmake", "--build", tree, f"-j{jobs}", "--target", *TOOLS], cwd=SRC, check=True)
    return BIN


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict, timeout: float = 900) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def bench_repack() -> list[str]:
    return [] if REPACK else ["--repack", "0"]


def no_repack(repack: bool | None = None) -> list[str]:
    """llama-server's and llama-batched-bench's flag for `repack` (None: --llamacpp-repack's)."""
    return [] if (REPACK if repack is None else repack) else ["-nr"]


def llama_bench_tg(gguf: Path, threads: int, reps: int = 3) -> float:
    out = subprocess.run([str(BIN / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", "128",
                          "-r", str(reps), "-o", "json", *bench_repack()], capture_output=True, text=True,
                         check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def llama_bench_depth(gguf: Path, threads: int, depth: int) -> float:
    """Batch-1 decode tok/s of 64 tokens after `depth` tokens of context."""
    out = subprocess.run([str(BIN / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", "64",
                          "-d", str(depth), "-r", "2", "-o", "json", *bench_repack()], capture_output=True, text=True,
                         check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def llama_batched(gguf: Path, threads: int, npl: int, ntg: int) -> float:
    """Decode tok/s (S_TG) of npl sequences of 40 prompt tokens, ntg tokens each."""
    ctx = npl * (40 + ntg) + 64
    out = subprocess.run([str(BIN / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
                          "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", "40", "-ntg", str(ntg), "-npl", str(npl),
                          "--output-format", "jsonl", *no_repack()], capture_output=True, text=True)
    if out.returncode < 0 and REPACK:  # 0.3.36's AMX tiles (a Xeon with AMX, 2026-12-06): SIGSEGV / SIGILL
        raise RuntimeError(f"llama-batched-bench died of signal {-out.returncode} with repacked weights; "
                           "--llamacpp-repack off runs llama.cpp without them")
    out.check_returncode()
    rows = [json.loads(line) for line in (out.stdout + out.stderr).splitlines() if line.startswith('{"n_kv_max"')]
    return float(rows[-1]["speed_tg"])


class LlamaServer:
    def __init__(self, gguf: Path, threads: int, ctx: int = 8192, parallel: int = 1, extra: Sequence[str] = (),
                 repack: bool | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(BIN / "llama-server"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
             "-np", str(parallel), "--port", str(self.port), "--host", "127.0.0.1", *no_repack(repack), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # e.g. SIGSEGV with repacked (AMX) weights: -nr / --llamacpp-repack off
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} before it served")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("llama-server did not come up")

    def completion(self, body: dict) -> dict:
        """The server's /completion answer to `body` (its `timings` hold the speeds)."""
        return post(f"http://127.0.0.1:{self.port}/completion", body)

    def prefill(self, prompt: str) -> tuple[int, float]:
        t = self.completion({"prompt": prompt, "n_predict": 1, "cache_prompt": False, "temperature": 0})["timings"]
        return int(t["prompt_n"]), float(t["prompt_per_second"])

    def generate(self, prompt: str, max_tokens: int) -> int:
        r = self.completion({"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "cache_prompt": False,
                             "temperature": 0})
        return int(r["timings"]["predicted_n"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- ignis ---------------------------------------------------------------------------------


def memory_bandwidth(threads: int, size: int = 1 << 30) -> tuple[float, float]:
    """(copy, read) bandwidth in GB/s of a `size`-byte buffer: a copy counts the bytes read
    and written, as STREAM's copy does; a read is a sum over the buffer. Best of 5."""
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(size // 4)
    b = torch.empty_like(a)
    copy = read = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        copy = min(copy, time.perf_counter() - t)
        t = time.perf_counter()
        a.sum()
        read = min(read, time.perf_counter() - t)
    return 2 * size / copy / 1e9, size / read / 1e9


def ignis_decode(n: int, max_tokens: int, gguf: Path | None = None, weight_form: str = "auto") -> float:
    from experiments.bench_engine import prompts_for, run_ignis
    from ignis.model import load_model

    loaded = load_model(str(gguf) if gguf else None, progress=False, weight_form=weight_form, max_num_seqs=n)
    runs = [run_ignis(loaded, prompts_for(loaded, n), max_tokens) for _ in range(2)]
    return max(r.decode_tps for r in runs)


def batch1_rounds(gguf: Path, threads: int, rounds: int, weight_form: str) -> list[tuple[float, float]]:
    """(llama.cpp, ignis) batch-1 decode tok/s of 128 tokens, `rounds` times in alternation
    (one llama-bench repetition, then one ignis run on the model loaded once): on a shared
    machine a neighbour's load lands on both sides alike, and the rounds show the spread."""
    from experiments.bench_engine import prompts_for, run_ignis
    from ignis.model import load_model

    loaded = load_model(str(gguf), progress=False, weight_form=weight_form, max_num_seqs=1)
    prompts = prompts_for(loaded, 1)
    out = []
    for r in range(rounds):
        theirs = llama_bench_tg(gguf, threads, reps=1)
        mine = run_ignis(loaded, prompts, 128).decode_tps
        log(f"batch 1, round {r + 1}: llama.cpp {theirs:.1f}, ignis {mine:.1f} tok/s ({mine / theirs:.2f}x)")
        out.append((theirs, mine))
    return out


def ignis_decode_at_depth(loaded, depth: int, max_tokens: int = 64) -> float:
    """One sequence's decode tok/s after a `depth`-token prompt (the perplexity text) with the
    one-sequence model `loaded`. The run's warm-up prefills the prompt once; the timed
    request then finds it in the prefix cache."""
    from experiments.bench_engine import run_ignis

    ids = loaded.tokenizer.encode(long_prompt(depth + 1000))[:depth]
    return run_ignis(loaded, [ids], max_tokens).decode_tps


def ignis_prefill(srv, prompt: str, salt: int) -> tuple[int, float]:
    # A fresh first line each time, so no prefix-cache block is reused.
    body = {"model": "fake-model", "input": f"[{salt}] {prompt}", "max_output_tokens": 1, "store": False}
    start = time.perf_counter()
    r = post(srv.base_url + "/v1/responses", body)
    wall = time.perf_counter() - start
    n = int(r["usage"]["input_tokens"])
    return n, n / wall


def ignis_generate(srv, prompt: str, max_tokens: int) -> int:
    body = {"model": "fake-model", "input": prompt, "max_output_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "store": False}
    return int(post(srv.base_url + "/v1/responses", body)["usage"]["output_tokens"])


def served_tps(generate, clients: int, max_tokens: int) -> float:
    """Output tok/s of `clients` concurrent requests (distinct short prompts), one each."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Request {k}: write a long story about a lighthouse keeper named {k}." for k in range(clients)]
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        total = sum(pool.map(lambda p: generate(p, max_tokens), prompts))
    return total / (time.perf_counter() - start)


def long_prompt(tokens: int) -> str:
    """The perplexity text repeated to about `tokens` SmolLM2 tokens (~930 per copy)."""
    text = TEXT.read_text()
    return "\n\n".join([text] * max(1, round(tokens / 930)))


# -- table and plot --------------------------------------------------------------------------


def _num(v: float) -> str:
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def table(rows: list[tuple[str, float | None, float | None, bool]]) -> str:
    lines = ["| measure | llama.cpp | ignis | ignis / llama.cpp |", "|---|---:|---:|---:|"]
    for name, theirs, mine, lower_better in rows:
        if theirs is None or mine is None:
            lines.append(f"| {name} | {theirs if theirs is not None else '-'} | {mine if mine is not None else '-'} | - |")
            continue
        ratio = mine / theirs
        note = " (lower is better)" if lower_better else ""
        lines.append(f"| {name}{note} | {_num(theirs)} | {_num(mine)} | {ratio:.2f}x |")
    return "\n".join(lines)


def plot(path: Path, decode: dict[int, tuple[float, float]], prefill: dict[int, tuple[float, float]],
         depth: dict[int, tuple[float, float]]) -> None:
    pylib = CACHE.parent / "pylib"  # a git-ignored install target, so the venv stays as pinned
    if pylib.is_dir() and str(pylib) not in sys.path:
        sys.path.append(str(pylib))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ns = sorted(decode)
    axes[0].plot(ns, [decode[n][0] for n in ns], "o-", label="llama.cpp")
    axes[0].plot(ns, [decode[n][1] for n in ns], "s-", label="ignis")
    axes[0].set(xscale="log", xlabel="concurrent sequences", ylabel="decode tok/s", title="decode vs concurrency")
    ls = sorted(prefill)
    if ls:
        axes[1].plot(ls, [prefill[n][0] for n in ls], "o-", label="llama-server")
        axes[1].plot(ls, [prefill[n][1] for n in ls], "s-", label="ignis server")
    axes[1].set(xlabel="prompt tokens", ylabel="prefill tok/s", title="served prefill vs prompt length")
    ds = sorted(depth)
    if ds:
        axes[2].plot(ds, [depth[d][0] for d in ds], "o-", label="llama.cpp")
        axes[2].plot(ds, [depth[d][1] for d in ds], "s-", label="ignis")
    axes[2].set(xlabel="context tokens", ylabel="decode tok/s", title="one sequence's decode vs its context")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prefill", type=int, nargs="+", default=[1500, 6000], help="prompt lengths (tokens, about)")
    ap.add_argument("--max-tokens", type=int, default=64, help="decode tokens per sequence at N > 1")
    ap.add_argument("--depths", type=int, nargs="*", default=[2048, 4096, 7936],
                    help="context lengths for batch-1 decode at depth (SmolLM2's context is 8192)")
    ap.add_argument("--batch1-rounds", type=int, default=5,
                    help="batch-1 decode: alternated rounds of llama-bench and ignis (medians reported)")
    ap.add_argument("--quick", action="store_true", help="batch-1 and 64-concurrent decode and RSS only")
    ap.add_argument("--png", type=Path, default=Path(__file__).with_name("vs_llamacpp.png"))
    ap.add_argument("--served-weight-form", default="quantized",
                    help="the ignis server's model.weight_form for the served-throughput rows (quantized: what "
                         "`make serve` holds, the embedded group's setting; auto: bfloat16 at 64 slots)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF both engines run (default: the embedded SmolLM2)")
    ap.add_argument("--weight-form", default="auto", help="ignis's model.weight_form for the decode rows")
    ap.add_argument("--llamacpp-build", choices=sorted(BUILDS), default="build",
                    help="llama.cpp's build tree: the host's instructions, or build-avx2 (nothing above AVX2)")
    ap.add_argument("--llamacpp-repack", choices=["on", "off"], default="on",
                    help="llama.cpp's weight repacking for the CPU (its default: on; AMX tiles where the CPU has AMX)")
    ap.add_argument("--cpu-caps", choices=["avx512", "avx2", "portable"], default=None,
                    help="IGNIS_CPU_CAPS for ignis (this process and its servers)")
    args = ap.parse_args()
    global REPACK
    REPACK = args.llamacpp_repack == "on"
    build_llamacpp(tree=args.llamacpp_build)
    if args.build_only:
        return
    if args.cpu_caps:
        import os

        os.environ["IGNIS_CPU_CAPS"] = args.cpu_caps  # before torch's first op; servers inherit it
    sys.path.insert(0, str(ROOT))
    import torch

    from ignis_kernels import cpu_platform  # (importing kernels applies the cap)

    log(f"ignis: {cpu_platform.current().describe()}; llama.cpp: {args.llamacpp_build}, repack {args.llamacpp_repack}")

    torch.set_num_threads(args.threads)
    from experiments.serving import ServerProcess
    from ignis.model import load_model
    from ignis.model.embedded import smollm2_gguf_path

    gguf = args.gguf.resolve() if args.gguf else smollm2_gguf_path()
    from experiments.synthetic_gguf import weight_bytes_per_token

    per_token = weight_bytes_per_token(gguf)
    copy_bw, read_bw = memory_bandwidth(args.threads)
    log(f"{gguf.name}: {gguf.stat().st_size / 1e9:.2f} GB, {per_token / 1e9:.3f} GB of weights per token; "
        f"memory: copy {copy_bw:.1f} GB/s, read {read_bw:.1f} GB/s ({args.threads} threads)")
    conc = [1, 64] if args.quick else args.concurrency
    prefill_lens = [] if args.quick else args.prefill
    rows: list[tuple[str, float | None, float | None, bool]] = []
    decode: dict[int, tuple[float, float]] = {}
    rounds: list[tuple[float, float]] = []
    for n in conc:  # llama.cpp, then ignis, per concurrency
        if n == 1:  # medians of alternated rounds
            rounds = batch1_rounds(gguf, args.threads, args.batch1_rounds, args.weight_form)
            theirs, mine = statistics.median(t for t, _ in rounds), statistics.median(m for _, m in rounds)
        else:
            theirs = llama_batched(gguf, args.threads, n, args.max_tokens)
            mine = ignis_decode(n, args.max_tokens, args.gguf, args.weight_form)
        decode[n] = (theirs, mine)
        log(f"decode {n}: llama.cpp {theirs:.1f}, ignis {mine:.1f} tok/s")
        rows.append((f"decode, {n} concurrent (tok/s)", theirs, mine, False))
        if n == 1:
            rows.append(("decode, batch 1: % of copy bandwidth", 100 * theirs * per_token / 1e9 / copy_bw,
                         100 * mine * per_token / 1e9 / copy_bw, False))

    depth: dict[int, tuple[float, float]] = {}
    depths = [] if args.quick else args.depths
    one_seq = (load_model(str(args.gguf) if args.gguf else None, progress=False, weight_form=args.weight_form,
                          max_num_seqs=1) if depths else None)
    for d in depths:
        theirs, mine = llama_bench_depth(gguf, args.threads, d), ignis_decode_at_depth(one_seq, d)
        depth[d] = (theirs, mine)
        log(f"decode after {d} tokens: llama.cpp {theirs:.1f}, ignis {mine:.1f} tok/s")
        rows.append((f"decode, 1 sequence after {d} tokens (tok/s)", theirs, mine, False))

    prefill: dict[int, tuple[float, float]] = {}
    llama = LlamaServer(gguf, args.threads)
    try:
        with ServerProcess(max_num_seqs=1, threads=args.threads, gguf=args.gguf) as srv:
            warm = long_prompt(200)
            llama.prefill(warm)
            ignis_prefill(srv, warm, 0)
            for i, length in enumerate(prefill_lens):
                prompt = long_prompt(length)
                n_theirs, theirs = llama.prefill(prompt)
                n_mine, mine = ignis_prefill(srv, prompt, i + 1)
                prefill[n_mine] = (theirs, mine)
                log(f"prefill ~{length}: llama-server {theirs:.1f} tok/s ({n_theirs} tokens), "
                    f"ignis {mine:.1f} tok/s ({n_mine} tokens)")
                rows.append((f"served prefill, {n_mine} tokens (tok/s)", theirs, mine, False))
            rows.append(("server RSS idle, one 8k sequence (MB)", rss_mb(llama.proc.pid), rss_mb(srv.proc.pid), True))
            file_mb = gguf.stat().st_size / 2**20
            rows.append(("server RSS idle / file size", rss_mb(llama.proc.pid) / file_mb, rss_mb(srv.proc.pid) / file_mb,
                         True))
    finally:
        llama.stop()

    served: dict[int, tuple[float, float]] = {}
    if not args.quick:  # both servers with 64 slots, 1/16/64 clients each, alternating
        most = max(args.concurrency)
        llama = LlamaServer(gguf, args.threads, ctx=most * 512, parallel=most)
        try:
            with ServerProcess(max_num_seqs=most, threads=args.threads, weight_form=args.served_weight_form,
                               gguf=args.gguf) as srv:
                served_tps(llama.generate, 1, 4)
                served_tps(lambda p, m: ignis_generate(srv, p, m), 1, 4)
                for n in args.concurrency:
                    theirs = served_tps(llama.generate, n, args.max_tokens)
                    mine = served_tps(lambda p, m: ignis_generate(srv, p, m), n, args.max_tokens)
                    served[n] = (theirs, mine)
                    log(f"served {n} clients: llama-server {theirs:.1f}, ignis {mine:.1f} tok/s")
                    rows.append((f"served throughput, {n} clients (output tok/s)", theirs, mine, False))
        finally:
            llama.stop()
    torch_only = subprocess.run([sys.executable, "-c", "import torch; print(open('/proc/self/status').read())"],
                                capture_output=True, text=True).stdout
    torch_mb = int(re.search(r"VmRSS:\s+(\d+)", torch_only).group(1)) / 1024
    print(table(rows))
    print(f"\n(`import torch` alone: {torch_mb:.0f} MB RSS; {args.threads} threads; one run)")
    if rounds:
        print("(batch 1, alternated rounds, ignis / llama.cpp: "
              + ", ".join(f"{m / t:.2f}x ({m:.1f} / {t:.1f})" for t, m in rounds) + ")")
    print(f"file: {gguf.name}, {gguf.stat().st_size / 1e9:.2f} GB, {per_token / 1e9:.3f} GB of weights per token; "
          f"memory: copy {copy_bw:.1f} GB/s, read {read_bw:.1f} GB/s")
    print(f"ignis: {cpu_platform.current().describe()}")
    print(f"llama.cpp: {args.llamacpp_build} ({' '.join(BUILDS[args.llamacpp_build])}), repack {args.llamacpp_repack}")
    try:
        plot(args.png, decode, prefill, depth)
        print(f"plot: {args.png}")
    except ImportError:  # matplotlib: pip install matplotlib (or --target .cache/pylib)
        log("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
