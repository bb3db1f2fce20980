"""Hugging Face checkpoint directories: config.json -> ModelConfig, *.safetensors -> tensors.

Reads the files directly (json + safetensors), without transformers: config.json in
either transformers 4 form (rope_theta + rope_scaling) or 5 form (rope_parameters),
single-file or sharded weights (model.safetensors.index.json), and eos ids from
generation_config.json (an int or a list).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ignis.model.config import ModelConfig

log = logging.getLogger(__name__)

# model_type -> family; Mistral is the Llama block (plus an optional sliding window).
_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_ROPE_TYPES = {"default", "linear", "dynamic", "llama3", "yarn"}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, normalised rope_scaling or None) from either config.json generation."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in _ROPE_TYPES:
        raise NotImplementedError(f"rope type {kind!r} is not supported (supported: {sorted(_ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1 is not supported")
    params.pop("partial_rotary_factor", None)
    if kind == "default":
        return theta, None
    if kind in ("llama3", "yarn"):
        # transformers falls back to the model's max_position_embeddings here.
        params.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings")),
        )
    return theta, {"rope_type": kind, **params}


def config_from_hf_dict(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    """ModelConfig from the parsed config.json (and generation_config.json, if any)."""
    model_type = cfg.get("model_type")
    if model_type not in _FAMILY:
        raise NotImplementedError(
            f"model_type {model_type!r} is not supported (supported: {sorted(_FAMILY)})"
        )
    family = _FAMILY[model_type]
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {cfg['hidden_act']!r} is not supported")
    num_heads = cfg["num_attention_heads"]
    num_layers = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    theta, scaling = _rope(cfg)

    # Qwen2/3 and Mistral ship a sliding_window value that only counts when enabled.
    sliding_window = cfg.get("sliding_window")
    if family in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        sliding_window = None
    layer_types = cfg.get("layer_types")
    if sliding_window is not None and layer_types is None and "max_window_layers" in cfg:
        layer_types = [
            "sliding_attention" if i >= cfg["max_window_layers"] else "full_attention"
            for i in range(num_layers)
        ]
    if sliding_window is None:
        layer_types = None

    attention_bias = bool(cfg.get("attention_bias", False))
    generation = generation or {}
    eos = _ids(generation.get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
    return ModelConfig(
        family=family,  # type: ignore[arg-type]
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 hard-codes q/k/v bias; Llama's attention_bias covers o_proj as well.
        attention_bias=True if family == "qwen2" else attention_bias,
        o_proj_bias=attention_bias if family == "llama" else False,
        mlp_bias=bool(cfg.get("mlp_bias", False)) if family == "llama" else False,
        qk_norm=family == "qwen3",
        sliding_window=sliding_window,
        layer_types=tuple(layer_types) if layer_types is not None else None,
        bos_token_id=generation.get("bos_token_id", cfg.get("bos_token_id")),
        eos_token_ids=eos,
    )


def read_hf_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    gen_path = path / "generation_config.json"
    generation = json.loads(gen_path.read_text()) if gen_path.is_file() else None
    config = config_from_hf_dict(cfg, generation)
    if not config.tie_word_embeddings and "lm_head.weight" not in hf_tensor_names(path):
        # A head-less checkpoint marked untied (older configs relied on a tied default):
        # tie rather than run with an uninitialised head.
        log.warning("%s has no lm_head.weight: tying the output head to the embeddings", path)
        config = replace(config, tie_word_embeddings=True)
    return config


def safetensors_files(path: str | Path) -> list[Path]:
    """The weight files of a directory: the index's shards, model.safetensors, or else
    every *.safetensors (the first two keep e.g. Mistral's consolidated.safetensors out)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    return files


def hf_tensor_names(path: str | Path) -> list[str]:
    """Checkpoint tensor names (headers only, no data read), "model." prefix stripped."""
    names: list[str] = []
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            names.extend(key.removeprefix("model.") for key in f.keys())
    return names


def iter_hf_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) with the "model." prefix stripped; buffers such as rotary inv_freq skipped."""
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                name = key.removeprefix("model.")
                yield name, f.get_tensor(key)
