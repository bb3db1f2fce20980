"""Shared fixtures: a tiny random Llama (built once per session) and the embedded SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest

from ignis.model import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.model.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("engine") / "tiny-llama", "llama", seed=3)


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> LoadedModel:
    return load_model(str(tiny_dir), progress=False)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model(progress=False)
