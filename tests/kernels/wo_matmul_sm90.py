"""Compile every weight-only matmul tile configuration for sm_90 without a GPU and print
one JSON line each (shared memory, registers, spills). Run with TRITON_INTERPRET unset;
tests/kernels/test_wo_matmul.py drives it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ignis_kernels.wo_matmul import wo_matmul_kernel, wo_tile_config

TARGET = GPUTarget("cuda", 90, 32)


def ptxas_stats(ptx: str) -> dict:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ignis_wo_sm90_{os.getpid()}.ptx"
    path.write_text(ptx)
    res = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(path), "-o", os.devnull], capture_output=True, text=True)
    path.unlink()
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spills = re.search(r"(\d+) bytes spill stores", res.stderr)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return {"regs": int(regs.group(1)) if regs else None, "spill_bytes": int(spills.group(1)) if spills else None}


def main() -> None:
    for bits in (4, 8):
        for ty in ("bf16", "fp16"):
            for M in (1, 64, 512):
                cfg = wo_tile_config(M, bits)
                const = dict(BITS=bits, GROUP=32, HAS_ZEROS=bits == 4, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                             BLOCK_K=cfg.block_k, UPCAST=False, stride_xk=1, stride_qk=1, stride_on=1)
                ptrs = {"x_ptr": f"*{ty}", "q_ptr": "*u8" if bits == 4 else "*i8", "s_ptr": f"*{ty}",
                        "z_ptr": f"*{ty}", "out_ptr": f"*{ty}"}
                sig, attrs = {}, {}
                for i, n in enumerate(wo_matmul_kernel.arg_names):
                    if n in const:
                        sig[n] = "constexpr"
                    elif n in ptrs:
                        sig[n] = ptrs[n]
                        attrs[(i,)] = [["tt.divisibility", 16]]
                    else:
                        sig[n] = "i32"
                        if n in ("K", "N", "stride_xm", "stride_qn", "stride_om"):
                            attrs[(i,)] = [["tt.divisibility", 16]]
                k = triton.compile(ASTSource(wo_matmul_kernel, sig, const, attrs), target=TARGET,
                                   options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
                print(json.dumps({"kernel": "wo_matmul", "bits": bits, "dtype": ty, "M": M, **cfg.__dict__,
                                  "shared": k.metadata.shared, **ptxas_stats(k.asm["ptx"])}), flush=True)


if __name__ == "__main__":
    main()
