"""The CPU path never imports Triton: its import alone is ~70 MB of a CPU server's memory
(ignis_kernels' public ops import their kernels only when one runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import sys
import torch
import ignis.server.app, ignis.serve  # noqa: F401  the server's whole import graph
import ignis_kernels
from ignis.config import EngineConfig
from ignis.engine import LLMEngine, SamplingParams
from ignis.model import load_model
from ignis_kernels.moe import moe, route
from ignis_kernels.moe_mxfp4 import grouped_gemm_mxfp4

loaded = load_model(sys.argv[1], dtype="float32", device="cpu", progress=False)
engine = LLMEngine(loaded, EngineConfig(max_num_seqs=2, num_kv_blocks=16))
out = engine.generate([[1, 2, 3, 4], [5, 6]], SamplingParams.greedy(4))
assert all(len(o.token_ids) == 4 for o in out), out

logits = torch.randn(2, 40)
ignis_kernels.apply_token_bitmask_(logits, torch.tensor([[0b1011]], dtype=torch.int32), torch.tensor([1]))
assert torch.isinf(logits[1, 2]) and not torch.isinf(logits[1, 3])
x = torch.randn(3, 8)
weights, ids = route(torch.randn(3, 4), 2)
moe(x, weights, ids, torch.randn(4, 12, 8), torch.randn(4, 8, 6))
blocks, scales = torch.zeros(2, 4, 1, 16, dtype=torch.uint8), torch.full((2, 4, 1), 127, dtype=torch.uint8)
grouped_gemm_mxfp4(torch.randn(3, 32), blocks, scales, torch.tensor([0, 1, 3]))
print(sorted(m for m in sys.modules if m.split(".")[0] == "triton"))
"""


def test_cpu_serving_path_imports_no_triton(tmp_path):
    from tests.model.tiny_models import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", "llama", seed=1)
    out = subprocess.run([sys.executable, "-c", RUN, str(path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "IGNIS_KERNEL_BACKEND": "auto"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
