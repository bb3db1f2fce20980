"""Benchmarks time the real thing: the compiled kernels on CUDA, the references on CPU.

Unlike tests/conftest.py this does not set TRITON_INTERPRET (the interpreter would time
Python, not the kernel); Triton benchmarks are skipped where there is no CUDA device.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
