"""experiments/gpu/engine_check.py, the GPU session's engine benchmark, run at toy sizes
on the CPU so that the script cannot rot between device sessions."""

from __future__ import annotations

from experiments.gpu import engine_check


def test_engine_check_runs_at_toy_sizes():
    rows = engine_check.run(None, batches=(1, 3), steps=2, device="cpu", tiny=True, prompt_len=32)
    assert [r["shape"] for r in rows[:2]] == ["tiny bs=1 ctx~32", "tiny bs=3 ctx~32"]
    for r in rows[:2]:
        assert r["ok"] and r["ms"] > 0 and r["gbs"] > 0 and "tok/s" in r["vs"]
    assert rows[2]["op"] == "engine grammar + top_logprobs" and rows[2]["ok"], rows[2]["vs"]
