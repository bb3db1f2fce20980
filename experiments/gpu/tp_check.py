"""Tensor parallelism: engine step time at TP=1 and TP=2, and rank 0's time in the collectives.

    cases(ctx) -> list[Case]   (driven by experiments/gpu/check_kernels.py)
    python experiments/gpu/tp_check.py [--device cuda] [--tiny]

A random Qwen3-shaped model (engine_check's shapes) is written as a Hugging Face
checkpoint in a temporary directory (the workers load their shard from it), then the
same decode batch runs at TP=1 and TP=2: the step time of each, the greedy tokens (must
agree), and rank 0's milliseconds per step inside the all-reduces and the logits gather
(waiting for the slower rank included). On CUDA the compute group is NCCL; the case is
skipped, with a row saying so, where fewer than 2 GPUs exist (the H200 machine has one).
experiments/bench_tp.py runs the same on the CPU (gloo).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.gpu.common import Case, Context  # noqa: E402

_HF_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def save_hf_checkpoint(model: Any, path: Path) -> Path:
    """A dense Transformer as a Hugging Face directory (config.json + model.safetensors):
    what ignis.model.loader.load_shard reads back on every rank."""
    from safetensors.torch import save_file  # imported here: the GPU dry run hides it

    c = model.config
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [_HF_TYPE[c.family]], "model_type": c.family, "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {}
    for name, t in model.weight_targets().items():
        key = name if name == "lm_head.weight" else f"model.{name}"
        tensors[key] = t.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(path / "model.safetensors"))
    return path


class CollectiveClock:
    """Rank 0's wall time inside the forward's collectives: the row-parallel all-reduces
    (each shard holds its own reference to the group's all_reduce) and the logits gather."""

    def __init__(self, runner: Any, device: str) -> None:
        from ignis.model.sharding import RowParallelLinear

        self.ms = 0.0
        self.calls = 0
        self._device = device
        for m in runner.model.modules():
            if isinstance(m, RowParallelLinear):
                m.all_reduce = self._timed(m.all_reduce)
        runner.group.gather_logits = self._timed(runner.group.gather_logits)

    def _timed(self, fn: Any) -> Any:
        def timed(t: torch.Tensor) -> Any:
            start = time.perf_counter()
            out = fn(t)
            if self._device == "cuda":
                torch.cuda.synchronize()
            self.ms += (time.perf_counter() - start) * 1000
            self.calls += 1
            return out
        return timed


def step_times(loaded: Any, tp: int, batch: int, steps: int, prompt_len: int, device: str,
               threads: int | None = None) -> dict:
    """Mean decode step (ms) of `batch` sequences at tensor_parallel_size `tp`, the greedy
    tokens, and rank 0's collective time per step."""
    from ignis.config import EngineConfig, KernelBackend
    from ignis.engine import LLMEngine, SamplingParams

    blocks = batch * (-(-(prompt_len + steps + 16) // 16)) + 8
    cfg = EngineConfig(kernel_backend=KernelBackend.auto, max_num_seqs=batch, num_kv_blocks=blocks,
                       max_num_batched_tokens=max(2048, batch), enable_prefix_caching=False,
                       cpu_threads=threads, tensor_parallel_size=tp)
    engine = LLMEngine(loaded, cfg)
    try:
        # Collectives are timed only from the decode steps on, once the clock is installed.
        gen = torch.Generator().manual_seed(batch)
        for i in range(batch):
            prompt = torch.randint(3, loaded.config.vocab_size, (prompt_len,), generator=gen).tolist()
            engine.add_request(f"r{i}", prompt, SamplingParams.greedy(steps + 8, ignore_eos=True))
        while any(s.num_output_tokens == 0 for s in engine.seqs.values()):
            engine.step()
        for _ in range(3):
            engine.step()
        clock = CollectiveClock(engine.runner, device) if tp > 1 else None
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        if device == "cuda":
            torch.cuda.synchronize()
        step_ms = (time.perf_counter() - start) * 1000 / steps
        tokens = [list(s.token_ids[prompt_len:]) for s in sorted(engine.seqs.values(), key=lambda s: s.request_id)]
    finally:
        engine.close()
    return {"tp": tp, "batch": batch, "step_ms": step_ms, "tokens": tokens,
            "collective_ms": clock.ms / steps if clock else 0.0,
            "collectives_per_step": clock.calls / steps if clock else 0}


def random_loaded(shape: dict, device: str, dtype: torch.dtype, directory: Path) -> Any:
    """engine_check's random model, with a checkpoint on disk for the workers."""
    from dataclasses import replace

    from experiments.gpu.engine_check import random_model

    loaded = random_model(shape, device, dtype)
    return replace(loaded, path=str(save_hf_checkpoint(loaded.model, directory)), kind="hf")


def tp_rows(device: str, small: bool, batches: tuple[int, ...] = (1, 16, 64), steps: int = 16) -> list[dict]:
    from experiments.gpu.common import row
    from experiments.gpu.engine_check import QWEN3_0_6B, TINY

    shape = TINY if small else QWEN3_0_6B
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    prompt_len = 32 if small else 512
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        loaded = random_loaded(shape, device, dtype, Path(tmp) / "ckpt")
        for b in batches:
            one = step_times(loaded, 1, b, steps, prompt_len, device)
            two = step_times(loaded, 2, b, steps, prompt_len, device)
            same = one["tokens"] == two["tokens"]
            rows.append(row("tp=2 decode step", f"{'tiny' if small else 'qwen3-0.6b'} bs={b}", two["step_ms"],
                            ok=same, vs=f"tp=1 {one['step_ms']:.3f} ms; collectives {two['collective_ms']:.3f} ms/step "
                            f"({two['collectives_per_step']:.0f} calls)" + ("" if same else "; TOKENS DIFFER")))
    return rows


def cases(ctx: Context) -> list[Case]:
    if ctx.device.type == "cuda" and not ctx.dry and torch.cuda.device_count() < 2:
        def skipped(c: Context) -> dict:
            from experiments.gpu.common import row

            return row("tp=2 decode step", "needs 2 GPUs", None, ok=True,
                       vs=f"skipped: {torch.cuda.device_count()} GPU on this machine")
        return [Case("tp=2 decode step", "needs 2 GPUs", skipped, "skipped", "")]
    device = ctx.device.type
    return [Case("tp=2 decode step", "qwen3-0.6b bs=1,16,64", lambda c: tp_rows(device, c.small),
                 "wall clock over whole steps, TP=1 then TP=2", "tp=1; rank 0's collective time")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"skipped: tensor parallelism needs 2 GPUs, this machine has {torch.cuda.device_count()}")
        return 0
    for r in tp_rows(args.device, args.tiny):
        print(f"{r['shape']:<28} {r['ms']:9.3f} ms  ok={r['ok']}  {r['vs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
