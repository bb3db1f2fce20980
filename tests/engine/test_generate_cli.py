"""ignis.generate: the offline Python API and the Hydra entry point, on the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ignis.config import EngineConfig
from ignis.engine import EngineFinish, SamplingParams
from ignis.generate import build_engine, encode_prompt, generate
from ignis.model import LoadedModel

ROOT = Path(__file__).resolve().parents[2]


def test_python_api_takes_text_messages_and_ids(tiny: LoadedModel) -> None:
    engine = build_engine(tiny, EngineConfig(num_kv_blocks=64, block_size=4))
    prompts = ["Hello!", [{"role": "user", "content": "Hello!"}], [1, 2, 3, 4]]
    assert encode_prompt(tiny, prompts[0]) == encode_prompt(tiny, prompts[1])
    results = generate(engine, prompts, SamplingParams.greedy(6, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [6, 6, 6]
    assert results[0].token_ids == results[1].token_ids
    assert all(r.finish_reason is EngineFinish.LENGTH for r in results)


def test_cli_runs_the_engine(tiny_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ignis.generate", "+model=hf", f"model.path={tiny_dir}",
            "prompt=Hello there", "max_new_tokens=5", "engine.num_kv_blocks=32", "engine.cpu_threads=1",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5 generated" in proc.stderr and "tok/s" in proc.stderr


def test_a_model_format_without_its_file_is_one_line_and_exit_2() -> None:
    # `path: ???` in a group file does not survive the merge onto the schema's null, so
    # `+model=hf` alone used to load the embedded GGUF as a directory (a traceback), and
    # `+model=gguf` or `+model=gpt-oss` alone served the embedded model under their names.
    for module, model, key in [("ignis.serve", "hf", "model.path"), ("ignis.generate", "scripted", "model.script"),
                               ("ignis.serve", "gguf", "model.path"), ("ignis.serve", "gpt-oss", "model.path")]:
        proc = subprocess.run([sys.executable, "-m", module, f"+model={model}"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == f"ignis: missing config value {key} (set it with {key}=...)"
