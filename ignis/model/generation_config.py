"""The sampling defaults a checkpoint ships with, in ignis's names.

- Hugging Face: ``generation_config.json`` (what vLLM reads by default): temperature,
  top_p, top_k, min_p, repetition_penalty, and ``max_new_tokens`` as the output limit.
  ``do_sample: false`` means greedy decoding (transformers' reading), so it sets
  temperature 0.
- GGUF: llama.cpp's ``general.sampling.*`` metadata (temp, top_k, top_p, min_p,
  penalty_repeat).

Values of the wrong type or out of range are dropped with a warning: a checkpoint's
file must not stop the server, and the request decoder's ranges still hold.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["SAMPLING_DEFAULT_KEYS", "from_hf_dir", "from_gguf"]

# The fields a model may set a default for (the keys of `model.sampling`).
SAMPLING_DEFAULT_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "max_output_tokens",
)

_HF_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_output_tokens",
}
_GGUF_NAMES = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def valid(key: str, value: Any) -> bool:
    """Whether `value` is a usable default for `key` (the request decoder's ranges)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if key in ("top_k", "max_output_tokens"):
        return float(value).is_integer() and value >= (1 if key == "max_output_tokens" else 0)
    if key == "temperature":
        return 0 <= value <= 2
    if key in ("top_p", "min_p"):
        return 0 <= value <= 1
    if key == "repetition_penalty":
        return value > 0
    return -2 <= value <= 2  # presence / frequency penalty


def _checked(raw: dict[str, Any], names: dict[str, str], source: str) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for wire, key in names.items():
        if wire not in raw or raw[wire] is None:
            continue
        value = raw[wire]
        if not valid(key, value):
            log.warning("ignoring %s %s=%r (not a valid %s)", source, wire, value, key)
            continue
        out[key] = int(value) if key in ("top_k", "max_output_tokens") else float(value)
    return out


def from_hf_dir(path: str | Path) -> dict[str, float | int]:
    """The defaults in a Hugging Face directory's ``generation_config.json`` ({} if none)."""
    p = Path(path) / "generation_config.json"
    if not p.is_file():
        return {}
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", p, exc)
        return {}
    if not isinstance(raw, dict):
        return {}
    out = _checked(raw, _HF_NAMES, "generation_config.json")
    if raw.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def from_gguf(reader: Any) -> dict[str, float | int]:
    """The defaults in a GGUF file's ``general.sampling.*`` metadata ({} if none)."""
    raw: dict[str, Any] = {}
    for wire in _GGUF_NAMES:
        field = reader.fields.get(wire)
        if field is None or not field.data:
            continue
        value = field.parts[field.data[0]]
        raw[wire] = value.item() if hasattr(value, "item") and value.size == 1 else None
    return _checked(raw, _GGUF_NAMES, "GGUF metadata")
