"""Batched, sort-free sampling: logits [B, V] -> token ids [B], one call per step.

    sample(logits, params, *, return_logprobs=False, inplace_penalties=False, backend=None)

`params` is a `SamplingTensors` (ignis_kernels.sampling_tensors: per-row [B] tensors, build it
with `SamplingTensors.from_lists(...)`). The definition of the draw (penalties,
thresholds, tie rule, the counter-based noise and the logprob) is in
ignis_kernels.sampling_ref; the Triton kernel draws the same token for the same inputs.

Nothing here reads a value back to the host: greedy rows, per-row filters and
penalties are all decided on the device (shapes depend only on B, V and the padded
token-list widths), so a decode step never waits on the sampler. Capturing it in a
CUDA graph should work for the same reason but is untested.

On the CPU (no Triton) rows with top-k or top-p go through ignis_kernels.sampling_cpu: the
reference's draw from the row's largest logits, without sorting the vocabulary.

`logprob_distribution(logits, params)` is the [B, V] distribution those logprobs come
from (for top logprobs: a row's most likely tokens, by the same numbers).

`inplace_penalties=True` lets the Triton path penalise float32 `logits` in place
instead of copying them (an engine's per-step logits buffer); the reference never
writes to `logits`.
"""

from __future__ import annotations

import torch

from ignis_kernels.backend import Backend, use_triton
from ignis_kernels.sampling_cpu import sample_cpu
from ignis_kernels.sampling_ref import logprob_distribution, sample_ref
from ignis_kernels.sampling_tensors import GREEDY_EPS, SamplingTensors

__all__ = ["GREEDY_EPS", "SamplingTensors", "logprob_distribution", "sample", "sample_ref"]


def sample(
    logits: torch.Tensor,
    params: SamplingTensors,
    *,
    return_logprobs: bool = False,
    inplace_penalties: bool = False,
    backend: Backend | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B] int64, or (ids, logprobs [B] float32) with return_logprobs."""
    if logits.dim() != 2 or logits.shape[0] != params.batch_size:
        raise ValueError(f"logits must be [B, V] with B = {params.batch_size}, got {tuple(logits.shape)}")
    if use_triton(logits, backend):
        # Imported here so that importing `ignis_kernels` never compiles or loads Triton code
        # before the caller chose the interpreter.
        from ignis_kernels.sampling_triton import sample_triton

        return sample_triton(logits, params, return_logprobs=return_logprobs, inplace_penalties=inplace_penalties)
    if logits.device.type == "cpu":  # the reference's draw without its sort (reads flags back: free here)
        return sample_cpu(logits, params, return_logprobs=return_logprobs, inplace_penalties=inplace_penalties)
    return sample_ref(logits, params, return_logprobs=return_logprobs, inplace_penalties=inplace_penalties)
