"""The CPU path (ignis_kernels.sampling_cpu): the reference's draw from each row's largest
logits, without the sort. Against ignis_kernels.sampling_ref on the random rows of
test_sampling.py (ties, -inf, penalties, every filter), with few candidates so that
both the covered rows and the fallback are exercised; then a realistic vocabulary."""

from __future__ import annotations

import random

import pytest
import torch

from ignis_kernels.sampling import sample
from ignis_kernels.sampling_cpu import _candidate_keep, sample_cpu
from ignis_kernels.sampling_penalties import apply_penalties_dense
from ignis_kernels.sampling_ref import keep_mask, sample_ref
from ignis_kernels.sampling_tensors import SamplingTensors
from tests.kernels.test_sampling import boundary_tie, random_logits, random_params, seed  # noqa: F401


@pytest.mark.parametrize("candidates", [1, 4, 16, 64])
def test_kept_sets_of_covered_rows_are_the_reference(seed, candidates):  # noqa: F811
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    seen = {True: 0, False: 0}
    for trial in range(4):
        # Trial 0 is wider than every candidate count; its row 0 keeps the whole
        # vocabulary (the fallback) and its row 1 only the top token (covered), so both
        # paths run whatever the seed draws.
        B, V = 24, 300 if trial == 0 else rng.choice([37, 64, 130, 300])
        params = random_params(rng, B, V, trial % 2 == 1)
        if trial == 0:
            params.temperature[:2], params.top_p[:2], params.min_p[:2] = 1.0, 1.0, 0.0
            params.top_k[0], params.top_k[1] = 0, 1
        x = apply_penalties_dense(random_logits(g, rng, B, V).float(), params)
        params.prompt_tokens = params.output_tokens = None
        ids, keep, covered = _candidate_keep(x, params, min(candidates, V))
        want = keep_mask(x, params)
        for r in range(B):
            seen[bool(covered[r])] += 1
            if not covered[r]:
                continue
            got = torch.zeros(V, dtype=torch.bool)
            got[ids[r][keep[r]]] = True
            diff = (got != want[r]).nonzero()[:, 0]
            msg = f"seed={seed} trial={trial} row={r} V={V} C={candidates}"
            assert len(diff) == 0 or boundary_tie(x, params, r, diff), f"{msg}: {diff.tolist()}"
    if candidates >= 16:
        assert seen[True] > 0  # the sort-free path ran
    assert seen[False] > 0  # and so did the fallback


@pytest.mark.parametrize("candidates", [2, 16, 256])
def test_draws_and_logprobs_are_the_reference(seed, candidates):  # noqa: F811
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    for trial in range(4):
        B, V = 32, rng.choice([37, 130, 300])
        x = random_logits(g, rng, B, V)
        params = random_params(rng, B, V, penalties=trial % 2 == 1)
        got, got_lp = sample_cpu(x, params, return_logprobs=True, candidates=candidates)
        want, want_lp = sample_ref(x, params, return_logprobs=True)
        xp = apply_penalties_dense(x.float(), params)
        for r in range(B):
            if got[r] != want[r]:
                assert boundary_tie(xp, params, r, torch.stack([got[r], want[r]])), f"seed={seed} row={r}"
        assert torch.allclose(got_lp, want_lp, atol=1e-6, equal_nan=True), f"seed={seed}"


def test_a_chat_sized_vocabulary(seed):  # noqa: F811
    """49,152 logits spread like a model's, top_p / top_k as generation configs set them:
    the same token as the reference at every step; `sample` takes this path on the CPU."""
    g = torch.Generator().manual_seed(seed)
    B, V = 6, 49_152
    x = torch.randn(B, V, generator=g) * 2.5
    x[:, :40] += 9.0  # a head of likely tokens
    params = SamplingTensors.from_lists([0.7, 1.0, 0.6, 1.0, 1.3, 0.0], top_k=[0, 20, 0, 0, 50, 0],
                                        top_p=[0.9, 0.95, 0.8, 1.0, 0.99, 0.9], min_p=[0.0, 0.0, 0.05, 0.0, 0.0, 0.0],
                                        seed=list(range(B)), step=[seed % 1000] * B)
    for step in range(5):
        params.step += 1
        assert sample(x, params).tolist() == sample_ref(x, params).tolist(), f"seed={seed} step={step}"
