"""Per-row sampling parameters as device tensors, shared by the reference and the kernel.

One `SamplingTensors` describes a whole batch: every knob is a [B] tensor so a single
launch serves rows with different settings, and nothing on the hot path has to look at
the values on the host. Neutral values switch a knob off for that row:

  temperature         [B] f32   < GREEDY_EPS (e.g. 0) = greedy (argmax)
  top_k               [B] i32   0 (or <0, or >= vocab) = off
  top_p               [B] f32   1 = off; 0 = keep only the most probable token(s)
  min_p               [B] f32   0 = off
  repetition_penalty  [B] f32   1 = off   (prompt AND output tokens)
  presence_penalty    [B] f32   0 = off   (output tokens only)
  frequency_penalty   [B] f32   0 = off   (output tokens only)
  seed, step          [B] i64   the row's draw depends on (seed, step) only; step is the
                                request's own counter (e.g. tokens generated so far)
  prompt_tokens       [B, Sp] i32/i64, -1 padded, or None
  output_tokens       [B, So] i32/i64, -1 padded, or None

Penalty input: padded token-id lists, not a dense [B, V] count tensor. An engine keeps
each slot's prompt ids and an append-only buffer of its output ids on the device
(appending the sampled token is one indexed write, no sync) and gathers the batch's rows
each step; the sampler turns them into counts with scatter/gather over [B, S] only, so
its cost scales with the tokens seen, never with B x V (151,936 x 256 x 4 bytes would be
another full pass over the logits every step). Pass None for both when no row of the
batch uses a penalty (the host knows that from the requests): the step is then skipped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Temperatures below this are greedy (as vLLM's _SAMPLING_EPS): 1/T would overflow.
GREEDY_EPS = 1e-5

_U64 = (1 << 64) - 1
_INT32_MAX = 2**31 - 1


def _as_int64(seed: int) -> int:
    """Keep a seed's low 64 bits as a signed int64 (OpenAI allows seeds up to 2**64 - 1)."""
    seed &= _U64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _pad(rows: Sequence[Sequence[int]] | torch.Tensor, device: torch.device | str) -> torch.Tensor | None:
    if isinstance(rows, torch.Tensor):  # already [B, S], -1 padded (an engine's own buffers)
        return rows.to(device) if rows.numel() else None
    width = max((len(r) for r in rows), default=0)
    if width == 0:
        return None
    out = torch.full((len(rows), width), -1, dtype=torch.int32)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.int32)
    return out.to(device)


@dataclass
class SamplingTensors:
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor
    prompt_tokens: torch.Tensor | None = None
    output_tokens: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    @property
    def has_penalty_tokens(self) -> bool:
        return self.prompt_tokens is not None or self.output_tokens is not None

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        *,
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        min_p: Sequence[float] | None = None,
        repetition_penalty: Sequence[float] | None = None,
        presence_penalty: Sequence[float] | None = None,
        frequency_penalty: Sequence[float] | None = None,
        seed: Sequence[int | None] | None = None,
        step: Sequence[int] | None = None,
        prompt_tokens: Sequence[Sequence[int]] | None = None,
        output_tokens: Sequence[Sequence[int]] | None = None,
        device: torch.device | str = "cpu",
    ) -> SamplingTensors:
        """Build the batch from per-row Python values (None = neutral for every row).

        A row whose seed is None gets a fresh random one (OpenAI: no seed, no
        reproducibility). Token lists are padded with -1; all-empty lists become None.
        `prompt_tokens` / `output_tokens` may also be given padded already, as one
        [B, S] integer tensor.
        """
        n = len(temperature)

        def col(values, default, name):
            values = [default] * n if values is None else list(values)
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} rows, temperature has {n}")
            return values

        temps = col(temperature, 1.0, "temperature")
        # -1 (off) -> 0; a value past int32 means "no limit" as any value >= V does.
        ks = [min(max(int(k), 0), _INT32_MAX) for k in col(top_k, 0, "top_k")]
        ps = col(top_p, 1.0, "top_p")
        mps = col(min_p, 0.0, "min_p")
        reps = col(repetition_penalty, 1.0, "repetition_penalty")
        if any(t < 0 for t in temps) or any(not 0 <= p <= 1 for p in ps) or any(not 0 <= p <= 1 for p in mps):
            raise ValueError("need temperature >= 0 and top_p, min_p in [0, 1]")
        if any(r <= 0 for r in reps):
            raise ValueError("repetition_penalty must be > 0")
        seeds = [random.getrandbits(63) if s is None else _as_int64(int(s)) for s in col(seed, None, "seed")]
        for name, rows in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
            if rows is not None and len(rows) != n:
                raise ValueError(f"{name} has {len(rows)} rows, temperature has {n}")

        def f32(values):
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=f32(temps),
            top_k=torch.tensor(ks, dtype=torch.int32, device=device),
            top_p=f32(ps),
            min_p=f32(mps),
            repetition_penalty=f32(reps),
            presence_penalty=f32(col(presence_penalty, 0.0, "presence_penalty")),
            frequency_penalty=f32(col(frequency_penalty, 0.0, "frequency_penalty")),
            seed=torch.tensor(seeds, dtype=torch.int64, device=device),
            step=torch.tensor(col(step, 0, "step"), dtype=torch.int64, device=device),
            prompt_tokens=None if prompt_tokens is None else _pad(prompt_tokens, device),
            output_tokens=None if output_tokens is None else _pad(output_tokens, device),
        )

    def select(self, rows: torch.Tensor | Sequence[int]) -> SamplingTensors:
        """The sub-batch of the given rows (in that order), on the same device."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.temperature.device)
        pick = lambda t: None if t is None else t.index_select(0, idx)  # noqa: E731
        return SamplingTensors(**{f: pick(getattr(self, f)) for f in self.__dataclass_fields__})
