"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors -> dequantized weights.

Every tensor is dequantized once at load (gguf.quants.dequantize covers F32/F16/BF16,
Q4_0/Q4_1/Q5_x/Q8_0, the K-quants and more) and handed out under transformers' names.

llama.cpp's converter permutes the rows of Q and K (weights and biases) of the "llama"
architecture so that its interleaved RoPE (pairs 2i, 2i+1) computes what HF's rotate-half
RoPE (pairs i, i + d/2) computes. We undo that permutation here, so one RoPE form (HF's)
serves every checkpoint. "qwen2"/"qwen3" GGUFs are stored unpermuted (NeoX RoPE).
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

log = logging.getLogger(__name__)

_ARCH_FAMILY = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def _get(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _int(value: Any) -> int:
    # Some converters store per-layer arrays (e.g. head_count_kv); ignis needs them uniform.
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise NotImplementedError(f"per-layer values {value} are not supported")
        value = value[0]
    return int(value)


def config_from_gguf(reader: gguf.GGUFReader) -> ModelConfig:
    arch = _get(reader, "general.architecture")
    if arch not in _ARCH_FAMILY:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported ({sorted(_ARCH_FAMILY)})")
    tensors = {t.name: t for t in reader.tensors}
    hidden = _int(_get(reader, f"{arch}.embedding_length"))
    num_heads = _int(_get(reader, f"{arch}.attention.head_count"))
    num_kv_heads = _int(_get(reader, f"{arch}.attention.head_count_kv", num_heads))
    head_dim = _int(_get(reader, f"{arch}.attention.key_length", hidden // num_heads))
    vocab = _get(reader, f"{arch}.vocab_size")
    if vocab is None:  # older files: the embedding's row count (GGUF shapes are reversed)
        vocab = int(tensors["token_embd.weight"].shape[-1])

    scaling: dict[str, Any] | None = None
    kind = _get(reader, f"{arch}.rope.scaling.type", "none")
    factor = _get(reader, f"{arch}.rope.scaling.factor")
    original = _get(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "linear" and factor:
        scaling = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn" and factor:
        scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    elif kind not in ("none", "linear", "yarn"):
        raise NotImplementedError(f"GGUF rope scaling {kind!r} is not supported")
    if "rope_freqs.weight" in tensors:  # llama3-style scaling baked into per-frequency divisors
        factors = gguf.quants.dequantize(tensors["rope_freqs.weight"].data, tensors["rope_freqs.weight"].tensor_type)
        scaling = {"rope_type": "freq_factors", "factors": [float(x) for x in np.asarray(factors).ravel()]}

    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = _get(reader, key)
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    bos = _get(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        family=_ARCH_FAMILY[arch],  # type: ignore[arg-type]
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=_int(_get(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(_get(reader, f"{arch}.feed_forward_length")),
        rms_norm_eps=float(_get(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_get(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=_int(_get(reader, f"{arch}.context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        o_proj_bias="blk.0.attn_output.bias" in tensors,
        mlp_bias="blk.0.ffn_up.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=tuple(eos),
    )


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows (head, d/2, 2) back to (head, 2, d/2)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def ignis_name(gguf_name: str) -> str | None:
    """transformers-style name for a GGUF tensor; None for tensors that are not weights."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == "rope_freqs.weight":
        return None  # folded into the config's rope scaling
    m = _BLOCK_RE.match(gguf_name)
    if m is None or m.group(2) not in _BLOCK_NAMES:
        raise KeyError(f"unknown GGUF tensor {gguf_name!r}")
    return f"layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def iter_gguf_weights(reader: gguf.GGUFReader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, fp32 tensor) for every weight, dequantized, Q/K un-permuted for "llama"."""
    permuted = _get(reader, "general.architecture") == "llama"
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    log.info("dequantizing %d GGUF tensors (%s)", len(reader.tensors), ", ".join(f"{n} {k}" for k, n in kinds.items()))
    for t in reader.tensors:
        name = ignis_name(t.name)
        if name is None:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        # Shapes in GGUF are reversed; dequantize gives (rows, cols) but flat 1-D for vectors.
        w = np.asarray(w, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        if permuted and (".q_proj." in name or ".k_proj." in name):
            w = unpermute_rope_rows(w, config.num_heads if ".q_proj." in name else config.num_kv_heads)
        w = np.ascontiguousarray(w)
        if not w.flags.writeable:  # memmapped F32/vectors: copy rather than alias the file
            w = w.copy()
        yield name, torch.from_numpy(w)
