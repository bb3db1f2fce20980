"""Every weight form on every CPU tier answers as the float32 reference does.

The embedded SmolLM2 runs tests/model/greedy_paths.py in a fresh process per (tier, form):
the host's tier and each IGNIS_CPU_CAPS below it, so an AVX-512 machine also runs what an
AVX2 and a portable one run. Its prompts cross every path boundary (1, 4, 5, 255, 256, 300
and 2000 tokens; uncached, from the prefix cache, and all together).

Tolerance, documented: the packed forms round activations to bf16 before each GEMM (and
requantize 4-bit blocks to int8 below the avx512 tier), so their logits move by up to
~0.2 nats at the top (measured 0.15-0.17, every tier and form, 2026-12-01). Greedy tokens
must match the reference's until a step where the reference's own two best candidates lie
within NEAR_TIE of each other (there a rounded path may pick the other one, and the
answers part); every step before that must agree, and each first step's best logprob
must lie within TOP_LOGPROB of the reference's. A path that computes garbage (a misread
weight layout, a missed key) moves every prompt past both bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch

from ignis.model.weight_plan import plan_weights
from ignis_kernels import cpu_platform

ROOT = Path(__file__).resolve().parents[2]
NEAR_TIE = 0.3
TOP_LOGPROB = 0.35
HOST = cpu_platform.current().host_level
TIERS = [t for t in reversed(cpu_platform.LEVELS) if cpu_platform.LEVELS.index(t) <= cpu_platform.LEVELS.index(HOST)]
FORMS = ("quantized", "mixed", "bfloat16")


def _env(tier: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                            "MKL_ENABLE_INSTRUCTIONS", "IGNIS_CPU_CAPS")}
    env["PYTHONPATH"] = str(ROOT)
    if tier is not None:
        env["IGNIS_CPU_CAPS"] = tier
    return env


@cache
def _answers(tier: str | None, form: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.model.greedy_paths", "--form", form], cwd=ROOT, env=_env(tier),
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _agree(ref: dict, got: dict) -> list[str]:
    """What differs beyond the documented tolerance (see the module docstring)."""
    problems = []
    for want, have in zip(ref["answers"], got["answers"], strict=True):
        where = f"{want['pass']} prompt of {want['length']} tokens"
        first_ref, first_got = want["top"][0][0][1], have["top"][0][0][1]
        if abs(first_ref - first_got) > TOP_LOGPROB:
            problems.append(f"{where}: best logprob {first_got:.3f} vs {first_ref:.3f}")
        for step, (a, b) in enumerate(zip(want["tokens"], have["tokens"], strict=True)):
            if a == b:
                continue
            (_, lp1), (_, lp2) = want["top"][step][:2]
            if lp1 - lp2 >= NEAR_TIE:
                problems.append(f"{where}: token {step} is {b}, the reference's {a} (margin {lp1 - lp2:.2f})")
            break  # past a near-tie the answers part
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tier", TIERS)
def test_every_form_on_every_tier_answers_as_float32(tier: str, form: str) -> None:
    ref = _answers(None, "float32")
    assert ref["form"] == "float32"
    if form == "bfloat16" and not _has_bf16(tier):
        pytest.skip("no oneDNN bf16 GEMM on this tier: the form is refused at start (test_unrunnable_form_...)")
    got = _answers(None if tier == HOST else tier, form)
    assert (got["form"], got["level"]) == (form, tier)
    assert got["native"] == (form != "bfloat16"), "int4/int8 forms decode natively on every tier"
    assert plan_weights(form, kind="gguf", device=torch.device("cpu"), max_num_seqs=8).form == form
    assert not _agree(ref, got), _agree(ref, got)
    # the prefix cache served the second pass
    cached = [a for a in got["answers"] if a["pass"] == "cached"]
    assert all(a["cached_tokens"] >= a["length"] - 16 for a in cached if a["length"] >= 32)


@cache
def _has_bf16(tier: str) -> bool:
    code = "import ignis_kernels; from ignis_kernels import cpu_platform as c; print(c.current().has_gemm('bf16'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(None if tier == HOST else tier),
                          capture_output=True, text=True, timeout=300, check=False)
    return proc.stdout.strip().endswith("True")


@pytest.mark.parametrize("tier", [t for t in TIERS if t != "avx512"] or ["avx2"])
def test_unrunnable_form_is_a_one_line_error_at_start(tier: str) -> None:
    """`python -m ignis.serve model.weight_form=bfloat16` on a CPU without oneDNN bf16 (or
    capped below it): exit status 1 and one line naming the form and what is missing."""
    if tier not in TIERS or _has_bf16(tier):
        pytest.skip("this CPU runs bf16 GEMMs at every tier it has")
    proc = subprocess.run([sys.executable, "-m", "ignis.serve", "+model=smollm2-135m", "model.weight_form=bfloat16",
                           "server.port=0"], cwd=ROOT, env=_env(None if tier == HOST else tier), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ignis.serve: model.weight_form=bfloat16 needs oneDNN's bf16 GEMM"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
