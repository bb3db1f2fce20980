"""Perplexity of the embedded SmolLM2 GGUF on a fixed text, per weight form.

    .venv/bin/python experiments/perplexity.py                       # float32, bfloat16, quantized
    .venv/bin/python experiments/perplexity.py --forms quantized --path model.gguf
    .venv/bin/python experiments/perplexity.py --head-rows 1 --max-num-seqs 1   # the one-user head
    .venv/bin/python experiments/perplexity.py --forms quantized --kv-cache-dtypes float32 bfloat16

The text (experiments/perplexity_text.txt, ~1k tokens, checked in so the numbers stay
comparable) is fed in chunks of --chunk tokens through the paged forward (each chunk
attends to the cached ones before it), and the mean negative log-likelihood of every
next token gives the perplexity. Each form is compared with float32 (the file's values
dequantized, fp32 activations): the perplexity ratio, the largest logit error relative
to float32's largest logit, and how often the argmax agrees. --kv-cache-dtypes runs each
packed form once per engine.kv_cache_dtype value (default auto, the engine's: bf16 for the
packed forms); the float32 reference keeps its fp32 cache.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from ignis.model.attention_metadata import AttentionMetadata
from ignis.model.kv_cache import (
    KV_CACHE_DTYPES,
    allocate_kv_caches,
    resolve_kv_cache_dtype,
)
from ignis.model.loader import load_model

TEXT = Path(__file__).with_name("perplexity_text.txt")


@torch.inference_mode()
def text_logits(loaded, ids: list[int], chunk: int, head_rows: int | None = None,
                kv_cache_dtype: str = "auto") -> torch.Tensor:
    """fp32 logits [len(ids), vocab] of one sequence fed `chunk` tokens per forward; the
    head sees `head_rows` rows per call (None: a chunk's), as a decode step of that many
    sampling rows would (the packed forms pick the head's GEMM by rows: lm_head.py). The
    KV cache's dtype is resolved from `kv_cache_dtype` as the engine resolves it."""
    model = loaded.model
    bs = 16
    n_blocks = -(-len(ids) // bs)
    dtype = kv_dtype_of(loaded, kv_cache_dtype)
    caches = allocate_kv_caches(model.config, n_blocks, bs, dtype=dtype, device=model.device)
    table = [list(range(n_blocks))]
    out = []
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        meta, positions = AttentionMetadata.build(
            query_lens=[len(piece)], seq_lens=[start + len(piece)], block_tables=table, block_size=bs,
            device=model.device,
        )
        hidden = model(torch.tensor(piece), positions, caches, meta)
        step = head_rows or len(piece)
        out.extend(model.compute_logits(hidden[i : i + step]) for i in range(0, len(piece), step))
    return torch.cat(out)


def kv_dtype_of(loaded, choice: str) -> torch.dtype:
    model = loaded.model
    return resolve_kv_cache_dtype(choice, model_dtype=model.dtype, weight_form=model.weight_form,
                                  triton=model.device.type == "cuda")


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    target = torch.tensor(ids[1:])
    nll = torch.nn.functional.cross_entropy(logits[:-1].double(), target, reduction="mean")
    return math.exp(nll.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None, help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--forms", nargs="+", default=["float32", "bfloat16", "quantized"])
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--head-rows", type=int, default=None,
                    help="rows per LM-head call (1: as a one-user decode step; default: a chunk's)")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="the engine batch the packed forms are loaded for (1: the int8 head only)")
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"], choices=KV_CACHE_DTYPES,
                    help="engine.kv_cache_dtype values to run each packed form with (auto: bf16 for them)")
    args = ap.parse_args()

    ref_loaded = load_model(args.path, progress=False, weight_form="float32")
    ids = ref_loaded.tokenizer.encode(TEXT.read_text())
    ref = text_logits(ref_loaded, ids, args.chunk)
    ref_ppl = perplexity(ref, ids)
    print(f"{len(ids)} tokens, chunks of {args.chunk}, head rows per call: {args.head_rows or args.chunk}")
    print("| weight form | KV cache | perplexity | vs float32 | max logit err (rel) | argmax agrees | load s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for form in args.forms:
        start = time.perf_counter()
        if form == "float32":
            runs = [("float32", ref)]
            load_s = float("nan")
        else:
            loaded = load_model(args.path, progress=False, weight_form=form, max_num_seqs=args.max_num_seqs)
            load_s = time.perf_counter() - start
            runs = [(str(kv_dtype_of(loaded, kv)).removeprefix("torch.") + (" (auto)" if kv == "auto" else ""),
                     text_logits(loaded, ids, args.chunk, args.head_rows, kv))
                    for kv in args.kv_cache_dtypes]
            del loaded
        for kv, logits in runs:
            ppl = perplexity(logits, ids)
            err = ((logits - ref).abs().max() / ref.abs().max()).item()
            agree = (logits.argmax(-1) == ref.argmax(-1)).double().mean().item()
            print(f"| {form} | {kv} | {ppl:.3f} | {ppl / ref_ppl:.4f}x | {err:.4f} | {agree:.1%} | {load_s:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
