"""Test-wide setup. Triton's interpreter must be chosen before triton is first imported,
so this runs before any test module (and so before `kernels`) is collected."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# Nothing is ever fetched from a model hub, in tests or anywhere else.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
# Helper modules shared across test folders (server_harness, responses_sdk, tiny_models...).
for _extra in ("server", "protocol", "model", "clients"):
    if str(TESTS / _extra) not in sys.path:
        sys.path.append(str(TESTS / _extra))

SCRIPT = TESTS / "clients" / "script.yaml"


@pytest.fixture(scope="session")
def scripted_model() -> Any:
    """The scripted model (SmolLM2's tokenizer and template, replies from
    tests/clients/script.yaml): a deterministic agent for tool loops."""
    from ignis.model import load_model

    return load_model(kind="scripted", script=str(SCRIPT), device="cpu", name="scripted")


@pytest.fixture(scope="session")
def scripted_server(scripted_model: Any) -> Iterator[Any]:
    """A real server over the scripted model on 127.0.0.1: key server_harness.KEY; answers
    to 'scripted' and 'fake-model' (the name in Codex's recorded catalog)."""
    from ignis.server.background import BackgroundServer
    from server_harness import make_config

    srv = BackgroundServer(make_config(engine={"num_kv_blocks": 8192, "max_num_seqs": 16}), scripted_model).start()
    yield srv
    srv.stop()
