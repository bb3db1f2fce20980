"""llama.cpp's own GGUF converter (convert_hf_to_gguf.py with its gguf-py), run on tiny
checkpoints: the GGUFs real users bring are written by it.

    converter = converter_dir()          # None when it is not on this machine
    convert(converter, [(model_dir, out_gguf), ...])   # one process for all of them

`make test` extracts the converter from the llama-cpp-python sdist into
.cache/llamacpp/ (no build needed; experiments/bench_vs_llamacpp.py builds the binaries
in the same tree); IGNIS_LLAMACPP_DIR points elsewhere.

The converter refuses a BPE vocabulary whose pre-tokenizer it does not recognise by hash,
as our tiny trained tokenizers are; their pre-tokenizer is GPT-2's byte-level split, so the
driver names it "gpt-2" (what tokenizer.ggml.pre then says). Nothing else is changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / ".cache" / "llamacpp" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"

_DRIVER = r"""
import sys
conv_dir, outtype, *paths = sys.argv[1:]
sys.path.insert(1, conv_dir + "/gguf-py")
sys.path.insert(1, conv_dir)
import convert_hf_to_gguf as converter
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for src, dst in zip(paths[::2], paths[1::2]):
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", dst, "--outtype", outtype]
    converter.main()
"""


def converter_dir() -> Path | None:
    path = Path(os.environ.get("IGNIS_LLAMACPP_DIR") or DEFAULT)
    return path if (path / "convert_hf_to_gguf.py").is_file() and (path / "gguf-py").is_dir() else None


def convert(converter: Path, jobs: list[tuple[Path, Path]], outtype: str = "f32") -> None:
    """Write each (HF directory, .gguf path) pair with llama.cpp's converter (weights as
    `outtype`: f32, f16, bf16 or q8_0, its --outtype)."""
    args = [str(p) for pair in jobs for p in pair]
    res = subprocess.run([sys.executable, "-c", _DRIVER, str(converter), outtype, *args], capture_output=True, text=True, check=False,
                         timeout=600)
    if res.returncode:
        raise RuntimeError(f"convert_hf_to_gguf failed:\n{res.stderr[-4000:]}")
