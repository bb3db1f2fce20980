"""Hugging Face checkpoint directories: config.json -> ModelConfig, *.safetensors -> tensors.

Reads the files directly (json + safetensors), without transformers: config.json in
either transformers 4 form (rope_theta + rope_scaling) or 5 form (rope_parameters), as
the family of its model_type parses it (ignis/model/families), single-file or sharded
weights (model.safetensors.index.json), and eos ids from generation_config.json (an int
or a list).
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
from ignis.model.families import family, for_hf_model_type
from ignis.model.mxfp4 import dequantize_hf

log = logging.getLogger(__name__)


def config_from_hf_dict(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    """ModelConfig from the parsed config.json (and generation_config.json, if any), by the
    family its model_type names (ignis/model/families)."""
    return for_hf_model_type(cfg.get("model_type")).hf_config(cfg, generation)


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


def iter_hf_weights(path: str | Path, config: ModelConfig | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) with the "model." prefix stripped and the family's renames and
    transforms applied (config: read from the directory when None); buffers such as
    rotary inv_freq skipped. MXFP4 pairs (`W_blocks` + `W_scales`, gpt-oss's experts) come
    out as they are when the config holds its experts so (experts_mxfp4), else as W,
    dequantized, in the layout transformers gives the dense parameter."""
    config = config or read_hf_config(path)
    fam = family(config.family)
    halves: dict[str, torch.Tensor] = {}  # an MXFP4 pair's first half, until its other comes
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                name = key.removeprefix("model.")
                tensor = f.get_tensor(key)
                if name.endswith(("_blocks", "_scales")) and not config.experts_mxfp4:
                    base, _, half = name.rpartition("_")
                    if base not in halves:
                        halves[base] = tensor
                        continue
                    other = halves.pop(base)
                    blocks, scales = (tensor, other) if half == "blocks" else (other, tensor)
                    # [E, N, K] -> transformers' dense layout [E, K, N] (a view; the family's
                    # transform turns it into ignis's)
                    name, tensor = base, dequantize_hf(blocks, scales).transpose(-1, -2)
                if fam.hf_rename is not None:
                    name = fam.hf_rename(name)
                if fam.hf_transform is not None:
                    tensor = fam.hf_transform(name, tensor)
                yield name, tensor
    if halves:
        raise KeyError(f"MXFP4 tensors without their other half: {sorted(halves)[:4]}")
