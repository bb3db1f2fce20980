"""Shared fixtures: a tiny random Llama (built once per session) and the embedded SmolLM2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# tests/model holds the tiny-checkpoint builder; reuse it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model"))

from ignis.model import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("engine") / "tiny-llama", "llama", seed=3)


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> LoadedModel:
    return load_model(str(tiny_dir), progress=False)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model(progress=False)
