"""How often the embedded SmolLM2 answers the README's first request briefly, per sampling
setting: N seeded samples of "What is the capital of France?" each, capped at CAP tokens.

    .venv/bin/python experiments/first_request_sampling.py N CAP [WEIGHT_FORM] [SETTING ...]

WEIGHT_FORM: float32 (default), bfloat16 or quantized; SETTING: labels to run (default all).

The setting chosen for configs/model/smollm2-135m.yaml comes from this (RESULTS.md).
"""
import sys, time, torch
from ignis.model import load_model
from ignis.config import EngineConfig
from ignis.generate import build_engine, generate
from ignis.engine import SamplingParams
torch.set_num_threads(2)
loaded = load_model(None, progress=False, weight_form=sys.argv[3] if len(sys.argv) > 3 else "float32")
eng = build_engine(loaded, EngineConfig(num_kv_blocks=4096, max_num_seqs=64))
q = "What is the capital of France?"
N = int(sys.argv[1]); cap = int(sys.argv[2])
configs = [("t0.2 p0.9 (model card)", dict(temperature=0.2, top_p=0.9)),
           ("t0.2 p0.9 rep1.1", dict(temperature=0.2, top_p=0.9, repetition_penalty=1.1)),
           ("t0.2 p0.5", dict(temperature=0.2, top_p=0.5)),
           ("greedy", dict(temperature=0.0))]
if len(sys.argv) > 4:
    configs = [c for c in configs if c[0] in sys.argv[4:]]
params = [SamplingParams(max_tokens=cap, seed=i, **kw) for _, kw in configs for i in range(N)]
t = time.time()
outs = generate(eng, [q] * len(params), params)
print(f"{time.time()-t:.0f}s", flush=True)
for j, (label, _) in enumerate(configs):
    part = outs[j*N:(j+1)*N]
    lens = sorted(len(c.token_ids) for c in part)
    capped = [c for c in part if c.finish_reason.value == "length"]
    print(label, "capped", len(capped), "/", N, "lens", lens, flush=True)
    for c in capped: print("   ", repr(c.text[:120]))
