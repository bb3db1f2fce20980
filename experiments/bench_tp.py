"""Tensor parallelism on the CPU (gloo): engine decode step at TP=1 vs TP=2.

    .venv/bin/python experiments/bench_tp.py                   # bs 1 and 16, 8-layer Qwen3-0.6B shape
    .venv/bin/python experiments/bench_tp.py --batch 1 --layers 2 --steps 8

On one host's CPU, TP=2 is a correctness vehicle: both ranks share the same cores and
memory bandwidth, so each step pays the collectives on top of the same work. What this
reports is that price: rank 0's milliseconds per step inside the 2 x layers all-reduces
and the logits gather (waiting for the other rank included), next to the step time of
each size and a bare gloo all-reduce of one hidden row between two processes. The model
is random (experiments/gpu/tp_check.py writes it as a checkpoint for the worker); the
greedy tokens of TP=1 and TP=2 must agree (the `same` column).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def bare_all_reduce_us(numel: int, iters: int = 200) -> float:
    """Median-free mean of a gloo all-reduce of `numel` fp32 between two fresh processes."""
    import torch.multiprocessing as mp

    from ignis.engine.tensor_parallel import _free_port

    port = _free_port()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    p = ctx.Process(target=_ar_rank, args=(1, port, numel, iters, None), daemon=True)
    p.start()
    _ar_rank(0, port, numel, iters, q)
    p.join(30)
    return q.get()


def _ar_rank(rank: int, port: int, numel: int, iters: int, q) -> None:  # noqa: ANN001
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.ones(numel)
    for _ in range(20):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if q is not None:
        q.put((time.perf_counter() - start) / iters * 1e6)
    dist.destroy_process_group()


def main() -> int:
    from experiments.gpu.engine_check import QWEN3_0_6B
    from experiments.gpu.tp_check import random_loaded, step_times

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    shape = dict(QWEN3_0_6B, num_layers=args.layers, vocab_size=args.vocab)
    cores = torch.get_num_threads()
    print(f"model: Qwen3-0.6B shape, {args.layers} layers, vocab {args.vocab}, fp32; {cores} cores; "
          f"TP=1 runs {cores} threads, each TP=2 rank {max(1, cores // 2)}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        loaded = random_loaded(shape, "cpu", torch.float32, Path(tmp) / "ckpt")
        for b in args.batch:
            one = step_times(loaded, 1, b, args.steps, args.prompt_len, "cpu", threads=cores)
            single = step_times(loaded, 1, b, args.steps, args.prompt_len, "cpu", threads=1)
            two = step_times(loaded, 2, b, args.steps, args.prompt_len, "cpu")
            rows.append((b, one["step_ms"], single["step_ms"], two["step_ms"], two["collective_ms"],
                         two["collectives_per_step"], one["tokens"] == two["tokens"] == single["tokens"]))
            print(f"  bs={b} done", flush=True)
    hidden = shape["hidden_size"]
    bare = {n: bare_all_reduce_us(hidden * n) for n in (1, 16)}
    print(f"\n| batch | TP=1 step ms ({cores} threads) | TP=1 step ms (1 thread) | TP=2 step ms (1 thread/rank) "
          "| TP=2 rank 0 in collectives ms/step | collectives/step | same tokens |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for b, t1, t1s, t2, coll, calls, same in rows:
        print(f"| {b} | {t1:.2f} | {t1s:.2f} | {t2:.2f} | {coll:.2f} | {calls:.0f} | {'yes' if same else 'NO'} |")
    print(f"\nbare gloo all-reduce between 2 processes: {bare[1]:.0f} us for 1 x {hidden} fp32, "
          f"{bare[16]:.0f} us for 16 x {hidden}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
