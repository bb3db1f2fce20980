"""Engine decode throughput with a Qwen3-0.6B-shaped random model, as achieved bandwidth.

    cases(ctx) -> list[Case]   (driven by experiments/gpu/check_kernels.py)
    python experiments/gpu/engine_check.py [--batch 1 64 256] [--device cuda] [--tiny]

For each batch size: admit that many 512-token prompts, prefill them, then time whole
engine steps of pure decode. Reported per step: wall ms, tokens/s, the bytes a decode
step must read (every weight once, the LM head included, plus each sequence's K/V)
over the step time as GB/s, and that as a fraction of the card's copy bandwidth. The
model forward alone at the same shapes is timed too: the gap between the two is the
host's share of a step (what CUDA graphs could win back).

Travels light (the GPU machine's image has no gguf, Hydra, OmegaConf, Sanic or
pydantic, and the 98 MB embedded GGUF cannot be carried): weights are random (the
shapes are what matter for bandwidth), and the tokenizer is a byte-level BPE of 512
entries trained here in a fraction of a second from the text below (`tokenizers` is on
the image), with ChatML's specials; ids beyond it decode to nothing. `--tiny` runs the
same code at toy sizes on a CPU, and the dry run builds all of it without a step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.gpu.common import Case, Context  # noqa: E402

QWEN3_0_6B = dict(family="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                  num_kv_heads=8, head_dim=128, intermediate_size=3072, rms_norm_eps=1e-6,
                  rope_theta=1_000_000.0, max_position_embeddings=40960, tie_word_embeddings=True,
                  qk_norm=True)
TINY = dict(QWEN3_0_6B, vocab_size=1024, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, intermediate_size=128)
PROMPT_LEN = 512
TOKENIZER_VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "def main() -> int:\n    return 0\n",
    "Attention reads every key and value of the context once per decoded token.",
    "Sampling draws the next token from the filtered distribution.",
]


def compact_tokenizer():  # -> ignis.model.tokenizer.Tokenizer
    """A small byte-level BPE (every byte spellable) with ChatML's specials, built in memory."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from ignis.model.tokenizer import Tokenizer

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS * 4, trainer)
    return Tokenizer(bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def random_model(shape: dict, device: str, dtype: torch.dtype):  # -> LoadedModel
    from ignis.model import LoadedModel, ModelConfig, Transformer
    from ignis.model.chat_template import ChatTemplate

    config = ModelConfig(**shape)
    model = Transformer(config, dtype=dtype, device=device).eval()
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    tokenizer = compact_tokenizer()
    return LoadedModel(model=model, config=config, tokenizer=tokenizer,
                       chat_template=ChatTemplate(None, eos_token=tokenizer.eos_token),  # ChatML
                       eos_token_ids=(), name="qwen3-0.6b-random", path="-", kind="hf")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_bytes(loaded, batch: int, context: int) -> int:
    c = loaded.config
    item = torch.empty((), dtype=loaded.dtype).element_size()
    weights = sum(p.numel() for p in loaded.model.parameters()) * item  # tied head: counted once, read once
    kv = batch * context * c.num_layers * 2 * c.num_kv_heads * c.head_dim * item
    return weights + kv


def run_batch(loaded, batch: int, steps: int, device: str, prompt_len: int = PROMPT_LEN) -> dict:
    from ignis.config import EngineConfig, KernelBackend
    from ignis.engine import LLMEngine, SamplingParams

    blocks_per_seq = -(-(prompt_len + steps + 80) // 16)
    cfg = EngineConfig(kernel_backend=KernelBackend.auto, max_num_seqs=batch, num_kv_blocks=batch * blocks_per_seq + 8,
                       max_num_batched_tokens=max(4096, batch), enable_prefix_caching=False)
    engine = LLMEngine(loaded, cfg)
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(3, min(40000, loaded.config.vocab_size), (prompt_len,), generator=gen).tolist()
        engine.add_request(f"r{i}", prompt, SamplingParams.greedy(steps + 64, ignore_eos=True))
    while any(s.num_output_tokens == 0 for s in engine.seqs.values()):  # prefill (chunked)
        engine.step()
    for _ in range(3):  # warm up the decode shapes
        engine.step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(device)
    step_ms = (time.perf_counter() - start) * 1000 / steps
    context = prompt_len + 3 + steps // 2  # mean context over the timed steps
    forward_ms = time_forward(engine, device)
    return {"batch": batch, "step_ms": step_ms, "tok_s": batch * 1000 / step_ms,
            "bytes": decode_bytes(loaded, batch, context), "forward_ms": forward_ms}


def time_forward(engine, device: str, iters: int = 20) -> float | None:
    """The model forward + head alone at the engine's current decode shapes (no scheduling,
    no sampling, no host-side batch building)."""
    runner = engine.runner
    captured = {}
    real_forward = runner.model.forward

    def spy(input_ids, positions, kv_caches, meta):
        captured.update(args=(input_ids.clone(), positions.clone(), kv_caches, meta))
        return real_forward(input_ids, positions, kv_caches, meta)

    runner.model.forward = spy
    try:
        engine.step()
    finally:
        del runner.model.forward
    if "args" not in captured:
        return None
    input_ids, positions, kv, meta = captured["args"]
    # Re-running a captured step rewrites the same K/V slots with the same values.
    with torch.inference_mode():
        for _ in range(3):
            runner.model.compute_logits(runner.model(input_ids, positions, kv, meta))
        sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            runner.model.compute_logits(runner.model(input_ids, positions, kv, meta))
        sync(device)
    return (time.perf_counter() - start) * 1000 / iters


CALL = b'<tool_call>\n{"name": "get_weather", "arguments": '


def check_constrained(loaded, device: str, batch: int = 8, steps: int = 64) -> dict:
    """The paths a plain decode never takes, on this device: half the rows held by a grammar
    to open a tool call (llguidance's bitmasks uploaded and applied by ignis_kernels.token_mask),
    sampled at temperature 1 with 5 top logprobs, beside free greedy rows.
    ok = every forced row starts with the call, every free row equals its run alone, and
    every alternatives list is sorted and holds the sampled token's logprob when present."""
    from ignis.config import EngineConfig, KernelBackend
    from ignis.engine import LLMEngine, SamplingParams
    from ignis.engine.grammar import Grammar

    # Enough tokens for the call spelt a byte at a time (a random model picks short pieces).
    cfg = EngineConfig(kernel_backend=KernelBackend.auto, max_num_seqs=batch, num_kv_blocks=batch * 8 + 8,
                       enable_prefix_caching=False)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, min(40000, loaded.config.vocab_size), (32,), generator=gen).tolist()
               for _ in range(batch)]
    forced = SamplingParams(max_tokens=steps, temperature=1.0, seed=7, ignore_eos=True, top_logprobs=5,
                            grammar=Grammar.lark(f"start: {json.dumps(CALL.decode())} /(.|\\n)*/"))
    free = SamplingParams.greedy(steps, ignore_eos=True)
    params = [forced if i % 2 == 0 else free for i in range(batch)]
    sync(device)
    start = time.perf_counter()
    outs = LLMEngine(loaded, cfg).generate(prompts, params)
    sync(device)
    ms = (time.perf_counter() - start) * 1000
    tok = loaded.tokenizer
    problems = []
    for i, out in enumerate(outs):
        if i % 2 == 0:
            text = b"".join(tok.token_bytes(t) for t in out.token_ids if t < tok.vocab_size)
            if not text.startswith(CALL):
                problems.append(f"row {i} not forced")
            for t, lp, top in zip(out.token_ids, out.logprobs or (), out.top_logprobs or ()):
                lps = [a_lp for _, a_lp in top]
                if lps != sorted(lps, reverse=True) or any(a == t and abs(a_lp - lp) > 1e-4 for a, a_lp in top):
                    problems.append(f"row {i} alternatives")
                    break
    alone = LLMEngine(loaded, cfg).generate([prompts[1]], free)[0]
    if alone.token_ids != outs[1].token_ids:
        problems.append("a free row changed beside forced ones")
    return {"op": "engine grammar + top_logprobs", "shape": f"bs={batch} ({batch // 2} forced) x {steps}",
            "ms": ms, "gbs": None, "frac_bw": None, "vs": "; ".join(problems) or "grammar rows open the call",
            "max_err": None, "ok": not problems}


def _batch_row(loaded, batch: int, steps: int, device: str, tiny: bool, copy_gbs: float | None,
               prompt_len: int) -> dict:
    r = run_batch(loaded, batch, steps, device, prompt_len)
    gbs = r["bytes"] / (r["step_ms"] * 1e-3) / 1e9
    fwd = r["forward_ms"]
    vs = f"{r['tok_s']:.0f} tok/s" + (f"; forward alone {fwd:.3f} ms" if fwd is not None else "")
    return {"op": "engine decode step", "shape": f"{'tiny' if tiny else 'qwen3-0.6b'} bs={batch} ctx~{prompt_len}",
            "ms": r["step_ms"], "gbs": gbs, "frac_bw": gbs / copy_gbs if copy_gbs else None, "vs": vs,
            "max_err": None, "ok": True}


_MODEL: dict = {}


def _model(device: str, tiny: bool):
    """One random model per run, built by the first case that needs it."""
    key = (device, tiny)
    if key not in _MODEL:
        _MODEL.clear()
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        _MODEL[key] = random_model(TINY if tiny else QWEN3_0_6B, device, dtype)
    return _MODEL[key]


def cases(ctx: Context, batches: tuple[int, ...] = (1, 64, 256), steps: int = 32) -> list[Case]:
    device = ctx.device.type
    shape = "tiny" if ctx.small else "qwen3-0.6b"
    prompt_len = 32 if ctx.small else PROMPT_LEN
    out = [Case("engine decode step", f"{shape} bs={b} ctx~{prompt_len}",
                lambda c, b=b: _batch_row(_model(device, c.small), b, steps, device, c.small, c.copy_gbs, prompt_len),
                "wall clock over whole steps", "forward alone; copy bandwidth") for b in batches]
    out.append(Case("engine grammar + top_logprobs", "bs=8 (4 forced) x 64",
                    lambda c: check_constrained(_model(device, c.small), device), "wall clock", "free rows alone"))
    return out


def dry_run(ctx: Context) -> None:
    """Everything but the GPU: the compact tokenizer, the tiny model on the CPU, an engine over
    it (the PyTorch reference path) and a few steps, the bytes count, and the grammar
    check at a few steps."""
    loaded = _model("cpu", True)
    r = run_batch(loaded, 2, 2, "cpu", prompt_len=8)
    assert r["step_ms"] > 0 and r["bytes"] > 0
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("get_weather")) == "get_weather"
    forced = check_constrained(loaded, "cpu", batch=2, steps=len(CALL) + 4)
    assert forced["ok"], forced
    _MODEL.clear()


def run(copy_gbs: float | None, *, batches=(1, 64, 256), steps: int = 32, device: str = "cuda",
        tiny: bool = False, prompt_len: int = PROMPT_LEN) -> list[dict]:
    """Rows in check_kernels.py's table format."""
    loaded = _model(device, tiny)
    rows = []
    for batch in batches:
        print(f"engine decode at {batch} sequences ...", flush=True)
        rows.append(_batch_row(loaded, batch, steps, device, tiny, copy_gbs, prompt_len))
    print("engine grammar rows and top logprobs ...", flush=True)
    rows.append(check_constrained(loaded, device))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (to check the script on a CPU)")
    args = ap.parse_args()
    copy = None
    if args.device.startswith("cuda"):
        from experiments.gpu.common import measure_copy_bandwidth

        copy = measure_copy_bandwidth()
    rows = run(copy, batches=args.batch, steps=args.steps, device=args.device, tiny=args.tiny,
               prompt_len=32 if args.tiny else PROMPT_LEN)
    print(f"\n{'shape':<34} {'step ms':>8} {'GB/s':>7} {'%bw':>5}  notes")
    for r in rows:
        frac = "-" if r["frac_bw"] is None else f"{100 * r['frac_bw']:.0f}"
        gbs = "-" if r["gbs"] is None else f"{r['gbs']:7.1f}"
        print(f"{r['shape']:<34} {r['ms']:8.3f} {gbs:>7} {frac:>5}  {r['vs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
