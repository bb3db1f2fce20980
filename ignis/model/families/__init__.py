"""The architecture registry: one module per family, imported when first asked for.

    fam = family("gemma3")                 # its Family (ignis/model/families/base.py)
    fam = for_hf_model_type("mistral")     # config.json's model_type -> the family that reads it
    fam = for_gguf_arch("llama", names)    # GGUF general.architecture (+ tensor names) -> family

A family module defines FAMILY: its HF and GGUF config parsing, its GGUF tensor-name
map, the projections its checkpoints fuse, its tensor-parallel plan and the chat
template it stands for. The decoder layer itself is built from shared blocks
(ignis/model/decoder.py) by the switches its config sets. Unknown architectures get an
error that lists what is supported.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ignis.model.families.base import Family

# family name -> module (ignis/model/families/<module>.py)
_MODULES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "phi3": "phi3",
    "olmo2": "olmo2",
    "granite": "granite",
    "gpt_oss": "gpt_oss",
}
FAMILY_NAMES: tuple[str, ...] = tuple(_MODULES)
# config.json model_type -> family (Mistral is the Llama block with an optional window).
HF_MODEL_TYPES = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
    "gemma3_text": "gemma3", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral", "phi3": "phi3", "olmo2": "olmo2",
    "granite": "granite", "gpt_oss": "gpt_oss",
}
# GGUF general.architecture -> family; llama.cpp writes Mixtral as "llama" with expert tensors.
GGUF_ARCHS = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3",
    "qwen3moe": "qwen3_moe", "phi3": "phi3", "olmo2": "olmo2", "granite": "granite", "gpt-oss": "gpt_oss",
}

_loaded: dict[str, Family] = {}


def family(name: str) -> Family:
    """The Family registered as `name` (ValueError listing the names otherwise)."""
    if name not in _MODULES:
        raise ValueError(f"unknown model family {name!r}; expected one of {FAMILY_NAMES}")
    if name not in _loaded:
        _loaded[name] = importlib.import_module(f"ignis.model.families.{_MODULES[name]}").FAMILY
    return _loaded[name]


def for_hf_model_type(model_type: str | None) -> Family:
    if model_type not in HF_MODEL_TYPES:
        raise NotImplementedError(
            f"model_type {model_type!r} is not supported (supported: {sorted(HF_MODEL_TYPES)})"
        )
    return family(HF_MODEL_TYPES[model_type])


def for_gguf_arch(arch: str | None, tensor_names: Iterable[str] = ()) -> Family:
    if arch not in GGUF_ARCHS:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported (supported: {sorted(GGUF_ARCHS)})")
    if arch == "llama" and any(n.endswith("ffn_gate_exps.weight") for n in tensor_names):
        return family("mixtral")
    return family(GGUF_ARCHS[arch])


__all__ = ["FAMILY_NAMES", "GGUF_ARCHS", "HF_MODEL_TYPES", "family", "for_gguf_arch", "for_hf_model_type"]
