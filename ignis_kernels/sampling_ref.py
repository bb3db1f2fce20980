"""PyTorch reference of batched sampling: the CPU path and the oracle of the Triton kernel.

Definition (shared with the kernel, which must draw the same token):

1. x = logits in float32, penalised (ignis_kernels.sampling_penalties).
2. Greedy rows (temperature < GREEDY_EPS): the first index of max(x).
3. Otherwise the kept set, all thresholds on x (temperature is monotone, so the sets
   are those of the tempered distribution p = softmax(x / T)):
     finite      x > -inf
     min_p       x >= max(x) + T * log(min_p)       (p >= min_p * p_max)
     top_k       #{j : x_j > x_i} < k               (all tokens tied with the k-th kept)
     top_p       on the renormalised survivors of the above, with q = exp((x - max) / T):
                 sum{q_j : x_j > x_i, j kept so far} < top_p * sum{q_j : j kept so far}
                 (the smallest top set of mass >= top_p; ties at the boundary all kept)
   vLLM's order: min_p, then top_k, then top_p over what is left.
4. Exponential race / Gumbel-max over the kept set: argmax of x * (1/T) + G_i with
   G_i = -log(-log(U_i)); ties go to the lowest token id.
5. logprob (optional) = log_softmax(x * (1/T))[token] with T = 1 for greedy rows: the
   penalised, tempered distribution before any top-k/top-p/min-p masking (what
   OpenAI's logprobs report for the sampled token).

Noise: U_i depends only on (seed, step, token id), via a counter-based 32-bit hash
(`row_keys`, `uniform_bits`) written with int64 ops masked to 32 bits here and uint32
ops in the kernel: U = ((h >> 9) + 0.5) / 2**23, exactly representable in float32, so
0 < U < 1 always. (With 24 bits, (h >> 8) + 0.5 rounded to 2**24 for the top value:
U = 1, G = +inf, and a token of probability ~0, a grammar's -1e30 floor, won the race
once in ~2**24 draws: 0.3% of the steps of a 49k-token vocabulary.)
A row's draw therefore never depends on the batch around it or its position.

This module may sort (it is the oracle and the CPU path); the kernel does not.
"""

from __future__ import annotations

import torch

from ignis_kernels.sampling_penalties import apply_penalties_, apply_penalties_dense
from ignis_kernels.sampling_tensors import GREEDY_EPS, SamplingTensors

_M32 = 0xFFFFFFFF
# Constants of the hash (also in ignis_kernels.sampling_triton): lowbias32's multipliers
# (C. Wellons), the golden-ratio step, and digits of pi to separate the inputs.
MIX_A, MIX_B, GOLDEN = 0x7FEB352D, 0x846CA68B, 0x9E3779B1
SALT_SEED, SALT_STEP, SALT_K1 = 0x243F6A88, 0x13198A2E, 0x03707344


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for a in [0, 2**32) without int64 overflow: a multiplier above
    2**31 is used as c - 2**32 (same residue), so |a * c| < 2**63."""
    return (a * (c - (1 << 32) if c >= 1 << 31 else c)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijective 32-bit mixer with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_A)
    x ^= x >> 15
    x = _mul32(x, MIX_B)
    x ^= x >> 16
    return x


def row_keys(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys per row from (seed, step), as int64 tensors in [0, 2**32)."""
    seed, step = seed.long(), step.long()
    h = mix32(((seed >> 32) & _M32) ^ SALT_SEED)
    h = mix32(h ^ (seed & _M32))
    h = mix32(h ^ ((step >> 32) & _M32) ^ SALT_STEP)
    h = mix32(h ^ (step & _M32))
    return h, mix32(h ^ SALT_K1)


def uniform_bits(k0: torch.Tensor, k1: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """32 random bits for each (row keys, token id); broadcasts like k0 op token."""
    v = mix32(_mul32(token.long(), GOLDEN) ^ k0)
    return mix32((v + k1) & _M32)


def _as_i32(c: int) -> int:
    return c - (1 << 32) if c >= 1 << 31 else c


def _mix32_i32(x: torch.Tensor) -> torch.Tensor:
    """`mix32` on int32 tensors holding the same 32 bits: wrapping multiplies, logical
    shifts by masking (torch's >> on int32 is arithmetic)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _as_i32(MIX_A)
    x ^= (x >> 15) & 0x1FFFF
    x = x * _as_i32(MIX_B)
    x ^= (x >> 16) & 0xFFFF
    return x


def uniform_bits_i32(k0: torch.Tensor, k1: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """`uniform_bits` as int32 (the same bits, two's complement): the CPU path, a quarter
    of the int64 version's time over [B, V]. Checked bit for bit against it in the tests."""
    k0 = (k0.long() - ((k0.long() >> 31) << 32)).to(torch.int32)  # [0, 2**32) -> int32, same bits
    k1 = (k1.long() - ((k1.long() >> 31) << 32)).to(torch.int32)
    v = _mix32_i32((token.to(torch.int32) * _as_i32(GOLDEN)) ^ k0)
    return _mix32_i32(v + k1)


def gumbel(k0: torch.Tensor, k1: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise in float32 from 23 of the hash bits (finite: 0 < U < 1 exactly)."""
    if token.device.type == "cpu":
        u = (((uniform_bits_i32(k0, k1, token) >> 9) & 0x7FFFFF).float() + 0.5) * 2.0**-23
    else:
        u = ((uniform_bits(k0, k1, token) >> 9).float() + 0.5) * 2.0**-23
    return -torch.log(-torch.log(u))


def inverse_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """1/T in float32, 1 for greedy rows (their logprobs are of the untempered logits)."""
    t = temperature.float()
    return torch.where(t < GREEDY_EPS, 1.0, 1.0 / t.clamp(min=GREEDY_EPS))


def keep_mask(x: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """[B, V] bool: the tokens a sampled row may draw (definition 3 above)."""
    B, V = x.shape
    t = params.temperature.float()
    inv_t = inverse_temperature(t)[:, None]
    min_p = params.min_p.float()
    off = torch.where(min_p > 0, t * torch.log(torch.where(min_p > 0, min_p, 1.0)), float("-inf"))[:, None]
    k = params.top_k.long()[:, None]
    if x.device.type == "cpu" and not bool((((k > 0) & (k < V)) | (params.top_p[:, None] < 1)).any()):
        # No row filters by rank (top_k) or mass (top_p), the OpenAI defaults: the same
        # rules on the unsorted row, without the sort (the CPU path; reading the flag back
        # costs nothing there).
        return (x > float("-inf")) & (x >= x.max(1, keepdim=True).values + off)
    # Work in ascending order; last[j] = the last position of xs[j]'s run of ties, so
    # the tokens strictly above xs[j] are exactly xs[last[j] + 1:].
    xs, order = x.sort(1)
    m = xs[:, -1:]
    pos = torch.arange(V, device=x.device).expand(B, V)
    run_end = torch.cat([xs[:, 1:] != xs[:, :-1], torch.ones_like(xs[:, :1], dtype=torch.bool)], 1)
    last = torch.where(run_end, pos, V).flip(1).cummin(1).values.flip(1)
    keep = (xs > float("-inf")) & (xs >= m + off)
    keep &= ~((k > 0) & (k < V)) | (V - 1 - last < k)

    # top_p in float64 so the oracle's own rounding stays far below the kernel's.
    q = torch.where(keep, torch.exp((xs - m) * inv_t).double(), 0.0)
    prefix = q.cumsum(1)
    total = prefix[:, -1:]
    mass_above = total - prefix.gather(1, last)
    top_p = params.top_p.double()[:, None]
    keep &= (top_p >= 1) | (mass_above < top_p * total) | (xs == m)  # top_p = 0 keeps the max
    return torch.zeros_like(keep).scatter_(1, order, keep)


def logprob_distribution(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """[B, V] float32: the distribution of definition 5, whose entry at the sampled token
    is the logprob `sample(..., return_logprobs=True)` reports (penalised, tempered with
    T = 1 for greedy rows, before top-k/top-p/min-p). For a row's top logprobs. Never
    modifies `logits`; penalties go in place on a copy (bit-identical to the dense form)."""
    x = logits.float()
    if params.has_penalty_tokens:
        x = apply_penalties_(x.clone() if x is logits else x, params)
    return torch.log_softmax(x * inverse_temperature(params.temperature)[:, None], 1)


def sample_ref(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    return_logprobs: bool = False,
    inplace_penalties: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B] int64 (and their logprobs [B] float32). Never modifies `logits`."""
    del inplace_penalties  # the reference always works on its own copy
    x = logits.float()
    if params.has_penalty_tokens:
        x = apply_penalties_dense(x, params)
    B, V = x.shape
    greedy = params.temperature.float() < GREEDY_EPS
    inv_t = inverse_temperature(params.temperature)[:, None]
    k0, k1 = row_keys(params.seed, params.step)
    noise = gumbel(k0[:, None], k1[:, None], torch.arange(V, device=x.device))
    key = torch.where(keep_mask(x, params), x * inv_t + noise, float("-inf"))
    tokens = torch.where(greedy, x.argmax(1), key.argmax(1))
    if not return_logprobs:
        return tokens
    logprobs = torch.log_softmax(x * inv_t, 1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
