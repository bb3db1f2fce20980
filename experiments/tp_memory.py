"""Tensor parallelism's memory on the CPU: each rank's resident memory with a TP=2 engine.

    .venv/bin/python experiments/tp_memory.py                 # 8-layer Qwen3-0.6B shape, 32k vocabulary
    .venv/bin/python experiments/tp_memory.py --layers 2 --vocab 4096

A random model (experiments/gpu/tp_check.py's, bench_tp's shape) is written as an HF
checkpoint; then each case runs in a fresh process, as `ignis.serve` would start:
- `shard`: the LoadedModel without weights (what `ignis.serve` loads at TP > 1), the
  engine loads rank 0's shard by path;
- `full`: the full weights loaded first and handed to the engine (what `ignis.serve` did
  before every rank loaded only its shard; here the caller keeps them alive).
Reported per rank, once the engine is ready: resident memory (VmRSS), its peak (VmHWM),
and the parameter bytes held (rank 0: the engine's and the LoadedModel's, distinct
storages). The KV cache is small and fixed (64 blocks) so that the weights dominate.
Run it from another checkout with `--case full` to compare with an older engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
_MIB = 1 << 20


def proc_status(pid: str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def measure(checkpoint: Path, case: str) -> dict:
    """One case in this (fresh) process: a TP=2 engine over `checkpoint`."""
    from experiments.gpu.engine_check import compact_tokenizer
    from ignis.config import EngineConfig, KernelBackend
    from ignis.engine import LLMEngine
    from ignis.model import LoadedModel
    from ignis.model.chat_template import ChatTemplate
    from ignis.model.hf_loader import iter_hf_weights, read_hf_config
    from ignis.model.loader import build_model

    config = read_hf_config(checkpoint)
    model = build_model(config, iter_hf_weights(checkpoint)) if case == "full" else None
    tokenizer = compact_tokenizer()
    loaded = LoadedModel(model=model, config=config, tokenizer=tokenizer,  # type: ignore[arg-type]
                         chat_template=ChatTemplate(None, eos_token=tokenizer.eos_token), eos_token_ids=(),
                         name="random", path=str(checkpoint), kind="hf")
    del model
    engine = LLMEngine(loaded, EngineConfig(kernel_backend=KernelBackend.torch, num_kv_blocks=64, max_num_seqs=4,
                                            tensor_parallel_size=2))
    try:
        held = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in engine.runner.model.parameters()}
        if loaded.model is not None:
            held |= {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in loaded.model.parameters()}
        rank0 = proc_status()
        worker = proc_status(str(engine.runner.workers[0].pid))
    finally:
        engine.close()
    full = (checkpoint / "model.safetensors").stat().st_size  # fp32, as the engine loads it
    return {"case": case, "params_mib": sum(held.values()) / _MIB, "full_model_mib": full / _MIB,
            "rank0_rss_mib": rank0["VmRSS"], "rank0_peak_mib": rank0["VmHWM"],
            "worker_rss_mib": worker["VmRSS"], "worker_peak_mib": worker["VmHWM"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--case", nargs="+", default=["shard", "full"], choices=["shard", "full"])
    ap.add_argument("--checkpoint", type=Path, help="an existing checkpoint (default: write a random one)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one case, in a child process
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.measure:
        print(json.dumps(measure(args.checkpoint, args.case[0])))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = write_checkpoint(Path(tmp) / "ckpt", args.layers, args.vocab)
        rows = []
        for case in args.case:
            out = subprocess.run([sys.executable, __file__, "--measure", "--checkpoint", str(checkpoint),
                                  "--case", case], check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"model: Qwen3-0.6B shape, {args.layers} layers, vocab {args.vocab}, fp32 "
          f"({rows[0]['full_model_mib']:.0f} MiB of weights); TP=2 on the CPU, 64 KV blocks\n")
    print("| case | rank 0 parameters MiB | rank 0 RSS MiB | rank 0 peak RSS MiB | worker RSS MiB | worker peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['params_mib']:.0f} | {r['rank0_rss_mib']:.0f} | {r['rank0_peak_mib']:.0f} "
              f"| {r['worker_rss_mib']:.0f} | {r['worker_peak_mib']:.0f} |")
    return 0


def write_checkpoint(path: Path, layers: int, vocab: int) -> Path:
    """bench_tp's random model as an HF directory, written from a child process so that
    this one never holds it."""
    code = ("import sys, torch; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
            "from experiments.gpu.engine_check import QWEN3_0_6B, random_model;"
            "from experiments.gpu.tp_check import save_hf_checkpoint;"
            "shape = dict(QWEN3_0_6B, num_layers=int(sys.argv[3]), vocab_size=int(sys.argv[4]));"
            "save_hf_checkpoint(random_model(shape, 'cpu', torch.float32).model, Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parents[1]), str(path), str(layers),
                    str(vocab)], check=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
