"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors -> dequantized weights.

Every tensor is dequantized once at load (gguf.quants.dequantize covers F32/F16/BF16,
Q4_0/Q4_1/Q5_x/Q8_0, the K-quants and more) and handed out under transformers' names,
by the family's map (ignis/model/families): general.architecture picks the family.

llama.cpp's converter permutes the rows of Q and K (weights and biases) of the "llama"
architecture so that its interleaved RoPE (pairs 2i, 2i+1) computes what HF's rotate-half
RoPE (pairs i, i + d/2) computes. We undo that permutation here, so one RoPE form (HF's)
serves every checkpoint. Families whose llama.cpp RoPE is NeoX's (qwen*, gemma*, phi3,
olmo2) are stored unpermuted; llama (and Mixtral) and granite are permuted.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import torch

from ignis.model.config import ModelConfig
from ignis.model.families import family, for_gguf_arch
from ignis.model.families.base import Family, GGUFMeta

log = logging.getLogger(__name__)

_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Tensors that are not weights: folded into the config (rope scaling) or unused here.
_NOT_WEIGHTS = {"rope_freqs.weight"}


def gguf_family(reader: gguf.GGUFReader) -> Family:
    """The family that reads this file (by general.architecture and, for "llama", whether it
    holds experts)."""
    return for_gguf_arch(_get(reader, "general.architecture"), (t.name for t in reader.tensors))


def _get(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def config_from_gguf(reader: gguf.GGUFReader) -> ModelConfig:
    return gguf_family(reader).gguf_config(GGUFMeta(reader))


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows (head, d/2, 2) back to (head, 2, d/2)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def ignis_name(gguf_name: str, fam: Family | None = None) -> str | None:
    """transformers-style name for a GGUF tensor by the family's map (None: Llama's);
    None for tensors that are not weights."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name in _NOT_WEIGHTS:
        return None
    fam = fam or family("llama")
    names = fam.gguf_tensors
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in names:
        raise KeyError(f"unknown GGUF tensor {gguf_name!r} for the {fam.name} family")
    if m.group(2) in fam.gguf_params:
        return f"layers.{m.group(1)}.{names[m.group(2)]}"
    return f"layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def rope_heads(name: str, config: ModelConfig) -> int | None:
    """The head count of a Q or K weight/bias whose rows llama.cpp permuted (None otherwise)."""
    if ".q_proj." in name:
        return config.num_heads
    if ".k_proj." in name:
        return config.num_kv_heads
    return None


def iter_gguf_weights(reader: gguf.GGUFReader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 tensor) for every weight, dequantized, Q/K un-permuted where the family's
    files permute them."""
    fam = family(config.family)
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    log.info("dequantizing %d GGUF tensors (%s)", len(reader.tensors), ", ".join(f"{n} {k}" for k, n in kinds.items()))
    for t in reader.tensors:
        name = ignis_name(t.name, fam)
        if name is None:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        # Shapes in GGUF are reversed; dequantize gives (rows, cols) but flat 1-D for vectors.
        w = np.asarray(w, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        heads = rope_heads(name, config) if fam.gguf_rope_permuted else None
        if heads is not None:
            w = unpermute_rope_rows(w, heads)
        w = np.ascontiguousarray(w)
        if not w.flags.writeable:  # memmapped F32/vectors: copy rather than alias the file
            w = w.copy()
        yield name, torch.from_numpy(w)
