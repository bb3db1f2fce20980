"""Tiny random checkpoints for the tensor-parallel tests, and engines over them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

# name -> (family, hf_config keys): heads that split over 2 ranks, biases on every
# projection (a row-parallel bias must be added once), a tied head over an odd vocabulary
# (the last rank's slice is padded), and one KV head (replicated on both ranks).
TP_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", {}),
    "llama-bias-tied": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
                                  "vocab_size": 401}),
    "llama-one-kv-head": ("llama", {"num_kv_heads": 1}),
}


def build(root: Path, name: str) -> Path:
    from tests.model.tiny_models import build_tiny_model

    family, keys = TP_MODELS[name]
    return build_tiny_model(root / name, family, seed=7, **keys)


@contextmanager
def torch_threads() -> Iterator[None]:
    """A tensor-parallel engine sets this process's thread count (its share of the cores)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
