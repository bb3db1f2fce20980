"""Which GEMMs a model's CPU weights are built from on this machine: decided once, at load.

    plan = plan_weights("auto", kind="gguf", device=torch.device("cpu"), max_num_seqs=64)
    plan.form, plan.int4, plan.wide, plan.widen_to, plan.why

The forms (`model.weight_form`, built by ignis/model/packed.py):
  float32    dense fp32 (the engine adds oneDNN-packed copies where oneDNN runs:
             ignis/engine/cpu_weights.py); the reference, and HF checkpoints' form.
  bfloat16   oneDNN's bf16 GEMMs; only where oneDNN has them (AVX512-BW/VL/DQ or
             AVX-NE-CONVERT CPUs).
  quantized  the file's quantization: 4-, 5- and 8-bit blocks exactly through the native
             op's GEMMs (`int4`: ignis_kernels/cpu/quant_gemm.h; without the op 4-bit blocks go
             through torch's int4 GEMM) or requantized to torch's int8 one, other types int8. Steps of WIDEN_ROWS rows or more (prefill chunks) widen each weight
             to `widen_to` for the step (bf16 for oneDNN's bf16 GEMM where it runs, else fp32),
             but for weights with a many-row body (below), which take it.
  mixed      the quantized GEMMs for steps of up to NARROW_ROWS rows beside a kept `wide`
             copy for wider ones: bf16 where oneDNN has it, else fbgemm's fp16 (fp16
             weights, fp32 activations: the AVX2 machine's fast wide GEMM), else fp32.
             A weight whose native GEMM has a many-row body (Q4_K, Q6_K on AVX2 CPUs and
             AVX-512 ones with VNNI: ignis_kernels.cpu_native.many_rows, 8-bit activations
             from 16 rows on) keeps no copy: that body is as fast as the wide GEMM at every
             row count (many_replaces_copy).
The LM head (ignis/model/lm_head.py) takes the wide kind for wide steps, and for few rows
int8 with dynamic-quantized activations (at 7 bits where the CPU lacks VNNI), or a large
Q8_0 table's own GEMM (packed.py's Q8Linear).

4-bit blocks stay int4 wherever the native op builds (its int4 GEMM reads ignis's own
layout on every tier: on AVX-512 as fast as torch's int4 GEMM at one row, on AVX2 about 2x
faster than torch's and as fast as torch's int8 one; RESULTS.md "Every CPU"). Without it,
only on the avx512 tier: torch's int4 GEMM is half its int8 one's speed on AVX2, and the
requantized int8 weights cost ~0.7% perplexity there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ignis_kernels import cpu_native, cpu_platform
from ignis_kernels.cpu_platform import CpuPlatform

WEIGHT_FORMS = ("auto", "float32", "bfloat16", "quantized", "mixed")
# The largest engine batch (max_num_seqs) for which `auto` keeps a file's quantization
# alone: a one-user engine, whose steps are almost all one row.
ONE_USER_MAX_SEQS = 4


class UnsupportedWeightForm(ValueError):
    """A weight form this machine cannot run; the message is one line for the start-up log."""


@dataclass(frozen=True)
class WeightPlan:
    form: str  # float32, bfloat16, quantized or mixed
    int4: bool = True  # 4-bit blocks stay torch int4 GEMMs (False: requantized to int8)
    wide: str = "bf16"  # the kept wide GEMM (mixed, bfloat16, the head's wide steps): bf16, fp16 or fp32
    widen_to: str = "bf16"  # what quantized weights widen to for steps of WIDEN_ROWS rows: bf16 or fp32
    head_int8: bool = True  # the head has an int8 dynamic-quantized GEMM for few rows
    head_full_range: bool = True  # ... at 8-bit activations (VNNI); else torch's reduce_range
    why: str = ""


def _tiles(native: bool) -> str:
    return ", on AMX tiles" if native and cpu_native.amx() else ""


def many_replaces_copy() -> bool:
    """Whether the native op's many-row body (Q4_K, Q6_K) is as fast as a kept wide copy at
    every row count, so that `mixed` keeps none of those weights: wherever the op has one.
    AVX2: 1.7-2x fbgemm's fp16 over a kept copy at 64 rows. AVX-512 VNNI, since the body
    takes sixteen rows a register (many16_vnni), against oneDNN's bf16 over a kept copy (the
    1B shape's GEMMs on a 2-core Zen 4, from memory, two runs): Q4_K 1.03-1.26x at 64 rows
    and 0.98-1.10x at 512, Q6_K 0.97-1.15x and 0.92-1.08x, from a quarter to two fifths of
    the copy's bytes (the copy had been 1.07x and 1.27x faster at 64 rows, and was kept)."""
    return cpu_native.many_rows() > 0


def wide_kind(p: CpuPlatform) -> str:
    """The fastest kept GEMM for wide steps: oneDNN bf16, else fbgemm fp16, else fp32."""
    if p.has_gemm("bf16"):
        return "bf16"
    return "fp16" if p.has_gemm("fp16") else "fp32"


def _tier(p: CpuPlatform) -> str:
    return p.level + (f" (capped from {p.host_level})" if p.level != p.host_level else "")


# `auto` keeps `mixed`'s wide copies only while the file and they take at most this share of
# the memory available at load (the KV cache, activations and the rest need the remainder).
MIXED_MEMORY_SHARE = 0.85
_WIDE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def mixed_copy_bytes(matrices: Iterable[tuple[str, int]], p: CpuPlatform | None = None) -> int:
    """What `mixed`'s kept wide copies of `matrices` ((GGUF type name, elements) of every
    matrix but the experts') would take here: none of Q4_K / Q6_K where their many-row body
    replaces a copy (many_replaces_copy)."""
    p = p or cpu_platform.current()
    skip = {"Q4_K", "Q6_K"} if many_replaces_copy() else set()
    return sum(n for t, n in matrices if t not in skip) * _WIDE_BYTES[wide_kind(p)]


def plan_weights(
    form: str, *, kind: str, device: torch.device, max_num_seqs: int | None, platform: CpuPlatform | None = None,
    native: bool | None = None, file_bytes: int = 0, copy_bytes: int = 0, memory: int | None = None,
) -> WeightPlan:
    """model.weight_form -> what to build. `auto`: a GGUF on the CPU keeps its quantization for
    a one-user engine (max_num_seqs <= ONE_USER_MAX_SEQS) and is `mixed` otherwise; HF
    checkpoints and CUDA keep float32. An explicit form this machine cannot run raises
    UnsupportedWeightForm naming what is missing. `native`: whether the native op (and its
    int4 GEMM) is built here; None asks ignis_kernels.cpu_native (building it once if needed).
    `auto` takes `quantized` over `mixed` too where the file's `file_bytes` and mixed's
    `copy_bytes` (mixed_copy_bytes) would exceed MIXED_MEMORY_SHARE of `memory` (the bytes
    available; None: available_memory())."""
    if form not in WEIGHT_FORMS:
        raise ValueError(f"unknown weight form {form!r}; expected one of {WEIGHT_FORMS}")
    if device.type != "cpu":
        if form not in ("auto", "float32"):
            raise UnsupportedWeightForm(f"model.weight_form={form} is a CPU form; use float32 (and model.dtype) on {device}")
        return WeightPlan("float32", why=f"dense weights on {device}")
    if form == "auto" and kind != "gguf":
        return WeightPlan("float32", why="HF checkpoints load dense")
    p = platform or cpu_platform.current()
    narrow = p.has_gemm("int8") or p.has_gemm("int4")
    if form == "auto":
        if not narrow:
            return WeightPlan("float32", why=f"no int8 weight-only GEMM in this torch build (tier {_tier(p)})")
        form = "quantized" if (max_num_seqs or 64) <= ONE_USER_MAX_SEQS else "mixed"
        reason = f"max_num_seqs {'<=' if form == 'quantized' else '>'} {ONE_USER_MAX_SEQS}"
        memory = available_memory() if memory is None else memory
        if form == "mixed" and copy_bytes and memory and file_bytes + copy_bytes > MIXED_MEMORY_SHARE * memory:
            form = "quantized"
            reason += (f", but mixed's wide copies ({copy_bytes / 1e9:.1f} GB beside the file's {file_bytes / 1e9:.1f}) "
                       f"would not fit in {MIXED_MEMORY_SHARE:.0%} of the {memory / 1e9:.1f} GB available")
    else:
        reason = "asked for"
    if form != "float32" and kind != "gguf":
        raise UnsupportedWeightForm("packed weight forms are built from GGUF files; use model.dtype for HF checkpoints")
    if form == "bfloat16" and not p.has_gemm("bf16"):
        raise UnsupportedWeightForm(
            f"model.weight_form=bfloat16 needs oneDNN's bf16 GEMM, which this CPU lacks (tier {_tier(p)}; it needs "
            "AVX512-BW/VL/DQ or AVX-NE-CONVERT): use auto, quantized, mixed or float32"
        )
    if form in ("quantized", "mixed") and not narrow:
        raise UnsupportedWeightForm(
            f"model.weight_form={form} needs torch's int8 weight-only GEMM, which this torch build lacks here: "
            "use float32"
        )
    if form == "float32":
        return WeightPlan("float32", why=reason)
    if native is None:
        native = cpu_native.load()
    int4 = native or (p.level == "avx512" and p.has_gemm("int4")) or not p.has_gemm("int8")
    wide = wide_kind(p)
    widen_to = "bf16" if p.has_gemm("bf16") else "fp32"
    head_int8 = p.has_gemm("int8_dynamic")
    plan = WeightPlan(form, int4=int4, wide=wide, widen_to=widen_to, head_int8=head_int8,
                      head_full_range=p.int8_dynamic_full_range)
    parts = [f"{form} ({reason}; tier {_tier(p)})"]
    if form in ("quantized", "mixed"):
        if int4:
            parts.append("4-bit blocks as int4 GEMMs (" + ("the native op's" if native else "torch's") + ")")
        else:
            parts.append("4-bit blocks requantized to int8 GEMMs (no native op; torch's int4 GEMM is slower "
                         "than its int8 one below avx512)")
    if form == "quantized":
        parts.append(f"steps of many rows widened to {widen_to}"
                     + (f" (but Q4_K / Q6_K: their many-row GEMM{_tiles(native)})" if native and cpu_native.many_rows() > 0 else ""))
    if form in ("mixed", "bfloat16"):
        many = form == "mixed" and native and many_replaces_copy()
        parts.append(f"wide steps through a kept {wide} copy"
                     + (f" (none of Q4_K / Q6_K: their many-row GEMM{_tiles(native)})" if many else ""))
    parts.append(f"head {wide}" + (f" + int8 dynamic ({'8' if plan.head_full_range else '7'}-bit activations)"
                                   if head_int8 else ""))
    return replace(plan, why="; ".join(parts))
