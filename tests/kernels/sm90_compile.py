"""Compile every Triton kernel configuration the launchers can pick (attention, its split
combine, write_kv, the sampler), for sm_90, without a GPU.

The interpreter runs kernels as Python, so it cannot catch what only the compiler sees
(type-unstable loop variables, unsupported constructs, shared-memory overflow, spills).
Triton compiles ahead of time for an explicit target with the ptxas it bundles, so this
runs on a CPU machine. Run as a script (TRITON_INTERPRET must be unset; --quick for the
common configurations only): prints one JSON line per configuration with its shared
memory, registers, spills, and what shows whether loads are pipelined and reductions
cheap: the shared-memory buffers the pipeliner allocated for the loop's loads (`buffers`:
name -> copies, e.g. {"k": 3, "v": 3} for triple-buffered K and V), the largest
`async_wait` count (copies left in flight at a wait; 0: every wait drains them all),
barriers in the PTX, reduce ops in the IR (all, and inside loops: paid per chunk) and
16-byte global loads. tests/kernels/test_sm90_compile.py drives it, and
experiments/RESULTS.md quotes it (with Triton 3.7.1 and 3.6.0, the GPU image's).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ignis_kernels.attention_triton import tile_config
from ignis_kernels.attention_kernel import paged_attention_kernel
from ignis_kernels.moe_kernel import grouped_gemm_kernel
from ignis_kernels.moe_mxfp4_kernel import grouped_gemm_mxfp4_kernel
from ignis_kernels.attention_split import combine_splits_kernel
from ignis_kernels.kv_cache_triton import _write_kv_kernel
from ignis_kernels.sampling_tensors import GREEDY_EPS
from ignis_kernels.sampling_triton import DEFAULT_CONFIG as SAMPLER, _sample_kernel

TARGET = GPUTarget("cuda", 90, 32)
_TY = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _compile(fn, ptr_types: dict[str, str], float_args: set[str], const: dict, num_warps: int, num_stages: int,
             divisible: frozenset[str] = frozenset()):
    names = fn.arg_names
    # What the runtime specialises: stride 1 is a constant, pointers and the other
    # strides of real caches are multiples of 16 (elements or bytes), and so is any int
    # argument the caller names in `divisible` (the sampler's vocabulary: 151,936 and
    # 49,152 are multiples of 16, which lets its loads be 16 bytes wide).
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in const:
            sig[n] = "constexpr"
        elif n in ptr_types:
            sig[n] = ptr_types[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in float_args:
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if (n.startswith("stride_") and n not in ("stride_bts",)) or n in divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(
        ASTSource(fn, sig, const, attrs), target=TARGET, options=dict(num_warps=num_warps, num_stages=num_stages)
    )
    return kernel


def _ptxas_stats(ptx: str) -> dict:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ignis_sm90_{os.getpid()}.ptx"
    path.write_text(ptx)
    res = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(path), "-o", os.devnull], capture_output=True, text=True)
    path.unlink()
    info = res.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": int(spills.group(1)) if spills else None}


_ALLOC = re.compile(r"%(\w+?)_\d+ = ttg\.local_alloc\s*:\s*\(\)\s*->\s*!ttg\.memdesc<(\d+)x[^>]*mutable>")
_WAIT = re.compile(r"ttg\.async_wait[^{]*\{num = (\d+)")


def _loop_reduces(ttgir: str) -> int:
    """Reduce and scan ops inside scf.for bodies: the ones paid on every chunk of a pass."""
    stack: list[bool] = []
    count = 0
    for line in ttgir.splitlines():
        text = line.strip()
        closes = text.startswith("}")
        if closes and stack:
            stack.pop()
        if any(stack) and ('"tt.reduce"(' in text or '"tt.scan"(' in text):
            count += 1
        if text.endswith("{") and not text.startswith("tt.reduce.return"):
            stack.append("scf.for" in text and not closes)
    return count


def ir_stats(kernel) -> dict:
    """Pipelining and synchronisation, read off the compiled IR and PTX (module doc)."""
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    buffers: dict[str, int] = {}
    for name, copies in _ALLOC.findall(ttgir):
        buffers[name] = max(buffers.get(name, 0), int(copies))
    waits = [int(n) for n in _WAIT.findall(ttgir)]
    return {
        "buffers": buffers,
        # The most copies a wait leaves in flight: 0 = every wait (the loop's included)
        # drains all of them, so no load overlaps the math that precedes its use.
        "max_async_wait": max(waits) if waits else None,
        "barriers": len(re.findall(r"\b(?:bar|barrier)\.sync\b", ptx)),
        "reduces": ttgir.count('"tt.reduce"('),
        "loop_reduces": _loop_reduces(ttgir),
        "wide_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)),
    }


def attention_configs(quick: bool = False):
    if quick:  # what SmolLM2-class models and the GPU check run: a few seconds to compile
        for dtype in (torch.bfloat16, torch.float32):
            for head_dim in (64, 128):
                for max_q, splits, window in ((1, 1, False), (1, 4, False), (4096, 1, head_dim == 64)):
                    yield dtype, head_dim, head_dim, 4, max_q, splits, window, tile_config(head_dim, 4, max_q, dtype)
        return
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for head_dim in (64, 128, 256, 80):
            head_dim_pad = triton.next_power_of_2(head_dim)
            for group in (1, 3, 4, 8):
                group_pad = triton.next_power_of_2(group)
                for max_q in (1, 8, 4096):
                    for splits in ((1, 4) if max_q == 1 else (1,)):
                        for window in (False, True):
                            if dtype != torch.bfloat16 and (window or head_dim == 80 or group in (3, 8)):
                                continue  # keep the sweep short: the rest is dtype independent
                            yield dtype, head_dim, head_dim_pad, group_pad, max_q, splits, window, tile_config(
                                head_dim_pad, group_pad, max_q, dtype
                            )


def sink_configs(quick: bool = False):
    """Attention sinks (gpt-oss: head_dim 64, 8 query heads per kv head): one split, split-KV
    decode, prefill."""
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32):
        for max_q, splits in ((1, 1), (1, 4), (4096, 1)):
            yield dtype, 64, 64, 8, max_q, splits, True, tile_config(64, 8, max_q, dtype)


def compile_all(quick: bool = False) -> list[dict]:
    rows = []
    configs = [(c, False) for c in attention_configs(quick)] + [(c, True) for c in sink_configs(quick)]
    for (dtype, head_dim, head_dim_pad, group_pad, max_q, splits, window, cfg), sinks in configs:
        ty = _TY[dtype]
        ptrs = {n: f"*{ty}" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
        ptrs |= {n: "*i32" for n in ("block_tables_ptr", "qsl_ptr", "seq_lens_ptr")}
        ptrs |= {n: "*fp32" for n in ("part_m_ptr", "part_l_ptr", "part_acc_ptr", "sinks_ptr")}
        const = dict(
            BLOCK_SIZE=16, HEAD_DIM=head_dim_pad, PAD_D=head_dim != head_dim_pad, GROUP_PAD=group_pad,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DECODE=max_q <= 1, NUM_SPLITS=splits,
            USE_WINDOW=window, SOFTCAP=False, HAS_SINKS=sinks, UPCAST=False, FP32_DOT=dtype == torch.float32,
            stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1, stride_btb=1,
        )
        # The runtime marks an int argument divisible by 16 when it is (head_dim 80 is):
        # what lets the masked loads of a padded head stay 16-byte async copies.
        divisible = frozenset({"head_dim"}) if head_dim % 16 == 0 else frozenset()
        k = _compile(paged_attention_kernel, ptrs, {"qk_scale", "softcap"}, const, cfg.num_warps, cfg.num_stages, divisible)
        rows.append({
            "kernel": "paged_attention", "dtype": ty, "head_dim": head_dim, "group_pad": group_pad,
            "max_query_len": max_q, "splits": splits, "window": window, "sinks": sinks, **cfg.__dict__,
            "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k),
        })
    for dtype in (torch.bfloat16, torch.float32):
        for head_dim_pad, sinks in ((128, False), (64, True)) if quick else ((64, False), (128, False), (64, True)):
            const = dict(NUM_SPLITS=5, SPLITS_PAD=8, HEAD_DIM=head_dim_pad, HAS_SINKS=sinks, stride_od=1)
            ptrs = {"part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32",
                    "out_ptr": f"*{_TY[dtype]}", "qsl_ptr": "*i32", "sinks_ptr": "*fp32"}
            k = _compile(combine_splits_kernel, ptrs, set(), const, 4, 1)
            rows.append({"kernel": "combine_splits", "dtype": _TY[dtype], "head_dim": head_dim_pad, "sinks": sinks,
                         "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k)})
    for dtype in (torch.bfloat16, torch.float32):
        for head_dim, heads in ((64, 3), (128, 8)) if quick else ((64, 3), (128, 8), (80, 2)):
            block_d = triton.next_power_of_2(head_dim)
            const = dict(BLOCK_SIZE=16, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=block_d, PAD_D=block_d != head_dim,
                         stride_kd=1, stride_vd=1, stride_kcd=1, stride_vcd=1)
            ty = f"*{_TY[dtype]}"
            ptrs = {"key_ptr": ty, "value_ptr": ty, "k_cache_ptr": ty, "v_cache_ptr": ty, "slot_ptr": "*i64"}
            k = _compile(_write_kv_kernel, ptrs, set(), const, 4, 1)
            rows.append({"kernel": "write_kv", "dtype": _TY[dtype], "head_dim": head_dim, "heads": heads,
                         "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k)})
    for dtype in (torch.bfloat16, torch.float32):
        for logprobs in (False, True) if not quick or dtype == torch.bfloat16 else (False,):
            ptrs = {"x_base": f"*{_TY[dtype]}", "topk_ptr": "*i32", "ci_base": "*i32", "dbg_pass_ptr": "*i32",
                    "seed_ptr": "*i64", "step_ptr": "*i64", "tok_ptr": "*i64"}
            ptrs |= {n: "*fp32" for n in ("temp_ptr", "topp_ptr", "minp_ptr", "cx_base", "lp_ptr", "dbg_tau_ptr")}
            const = dict(BLOCK=SAMPLER.block, BLOCK_P=SAMPLER.block_p, NP=SAMPLER.num_pivots, CAP=SAMPLER.cap,
                         MAX_ITERS=SAMPLER.max_iters, GREEDY_EPS=GREEDY_EPS, LOGPROBS=logprobs, DEBUG=False)
            # num_stages as launched (Triton's default, 3, before the config named it).
            stages = getattr(SAMPLER, "num_stages", 3)
            k = _compile(_sample_kernel, ptrs, set(), const, SAMPLER.num_warps, stages, divisible=frozenset({"V"}))
            rows.append({"kernel": "sample", "dtype": _TY[dtype], "logprobs": logprobs, "num_stages": stages,
                         "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k)})
    # The grouped expert GEMM at ignis_kernels.moe's default tiles (mixtures of experts).
    for dtype in (torch.bfloat16, torch.float32):
        for bias in (False, True) if not quick else (False,):
            ty = f"*{_TY[dtype]}"
            ptrs = {"x_ptr": ty, "w_ptr": ty, "bias_ptr": ty, "out_ptr": ty, "offsets_ptr": "*i32"}
            const = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, HAS_BIAS=bias, UPCAST=False,
                         FP32_DOT=dtype == torch.float32, stride_xk=1, stride_wk=1, stride_bn=1, stride_on=1)
            k = _compile(grouped_gemm_kernel, ptrs, set(), const, 4, 3)
            rows.append({"kernel": "grouped_gemm", "dtype": _TY[dtype], "bias": bias,
                         "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k)})
    # The MXFP4 grouped GEMM (gpt-oss's experts) at ignis_kernels.moe_mxfp4's tiles: tile_m's 16
    # (decode) and 64 rows, K a multiple of BLOCK_K (2880 = 45 x 64: 16-byte async copies) or
    # not. K is marked divisible by 16 as the runtime does for 2880; bias as gpt-oss has it.
    mxfp4 = [(torch.bfloat16, 16, True), (torch.bfloat16, 64, True), (torch.bfloat16, 16, False),
             (torch.float32, 16, True)]
    for dtype, block_m, even_k in mxfp4 if quick else mxfp4 + [(torch.float32, 64, True), (torch.bfloat16, 32, True)]:
        ty = f"*{_TY[dtype]}"
        ptrs = {"x_ptr": ty, "w_ptr": "*u8", "s_ptr": "*u8", "bias_ptr": ty, "out_ptr": ty, "offsets_ptr": "*i32"}
        const = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, HAS_BIAS=True, UPCAST=False, EVEN_K=even_k,
                     FP32_DOT=dtype == torch.float32, stride_xk=1, stride_sg=1, stride_bn=1, stride_on=1)
        k = _compile(grouped_gemm_mxfp4_kernel, ptrs, set(), const, 4, 3, divisible=frozenset({"K"}))
        rows.append({"kernel": "grouped_gemm_mxfp4", "dtype": _TY[dtype], "block_m": block_m, "even_k": even_k,
                     "shared": k.metadata.shared, **_ptxas_stats(k.asm["ptx"]), **ir_stats(k)})
    return rows


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles for sm_90")
    for row in compile_all(quick="--quick" in sys.argv):
        print(json.dumps(row))
