"""Rotary position embeddings: inverse frequencies (plain and scaled) and the cos/sin table.

The inverse frequencies follow transformers' `modeling_rope_utils` formula for formula
(same fp32 operations, so the table is bit-identical), and the table is built once up to
max_position_embeddings and indexed by position: no per-step trigonometry, no host sync.
The rotation is the rotate-half (GPT-NeoX / HF) form; GGUF weights are un-permuted at load.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ignis.model.config import ModelConfig


def _default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor = p["factor"]
    low_freq_factor = p["low_freq_factor"]
    high_freq_factor = p["high_freq_factor"]
    old_context_len = p["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated by `factor`, short ones kept, the middle band blended.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(head_dim: int, theta: float, p: dict[str, Any], max_pos: int) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original
    attention_factor = p.get("attention_factor")
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1
    truncate = p.get("truncate", True)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)

    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def rope_inv_freq(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim // 2] fp32, attention scaling applied to cos/sin)."""
    dim, theta = config.head_dim, config.rope_theta
    p = config.rope_scaling
    kind = (p or {}).get("rope_type", "default")
    if kind == "default":
        return _default_inv_freq(dim, theta), 1.0
    if kind == "linear":
        return _default_inv_freq(dim, theta) / p["factor"], 1.0
    if kind == "dynamic":
        # Dynamic NTK only changes the base once a sequence outgrows max_position_embeddings,
        # and the table stops there, so within it this is plain RoPE (as in transformers).
        return _default_inv_freq(dim, theta), 1.0
    if kind == "llama3":
        return _llama3(_default_inv_freq(dim, theta), p), 1.0
    if kind == "yarn":
        return _yarn(dim, theta, p, config.max_position_embeddings)
    if kind == "freq_factors":
        # llama.cpp's GGUF form of llama3 scaling: per-frequency divisors (rope_freqs.weight).
        factors = torch.tensor(p["factors"], dtype=torch.float32)
        return _default_inv_freq(dim, theta) / factors, 1.0
    raise NotImplementedError(f"rope_scaling type {kind!r} is not supported")


# Per token position: (cat(cos, cos), cat(-sin, sin)), [T, 1, head_dim], built once per
# forward so that each layer's rotation is three ops (apply_rotary).
Rope = tuple[torch.Tensor, torch.Tensor]


class RotaryEmbedding(nn.Module):
    """cos/sin for every position up to max_position_embeddings, indexed by position."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        inv_freq, scaling = rope_inv_freq(config)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]  # same fp32 product as transformers
        # Computed in fp32 then cast once, as transformers casts cos/sin to the activation dtype.
        self.register_buffer("cos", (freqs.cos() * scaling).to(dtype).to(device), persistent=False)
        self.register_buffer("sin", (freqs.sin() * scaling).to(dtype).to(device), persistent=False)

    def forward(self, positions: torch.Tensor) -> Rope:
        """The Rope of positions [T] (see `Rope`); looked up once per forward."""
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by a Rope: x*cat(cos,cos) + rotate_half(x)*cat(sin,sin), where
    rotate_half(x) = cat(-x2, x1) is x with its halves swapped (a roll) times the signed sin.
    Three ops instead of eight on the halves (at one row: ~6 vs ~10 us per layer)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)
