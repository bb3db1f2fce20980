"""Which implementation of each op runs: Triton kernels or their PyTorch references.

`auto` picks Triton for CUDA tensors and the reference everywhere else (the CPU path).
`triton` forces the kernels; on a CPU tensor that only works under Triton's
interpreter (`TRITON_INTERPRET=1` set before triton is imported), which is how the
tests exercise them without a GPU.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["auto", "triton", "torch"]
_BACKENDS = ("auto", "triton", "torch")
_default: Backend = os.environ.get("IGNIS_KERNEL_BACKEND", "auto")  # type: ignore[assignment]
if _default not in _BACKENDS:
    raise ValueError(f"IGNIS_KERNEL_BACKEND must be one of {_BACKENDS}, got {_default!r}")


def set_backend(backend: Backend) -> None:
    """Set the process-wide default backend used when an op is called with backend=None."""
    global _default
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    _default = backend


def get_backend() -> Backend:
    return _default


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(tensor: torch.Tensor, backend: Backend | None = None) -> bool:
    """Resolve `backend` (or the default) to a decision for an op over `tensor`."""
    choice = backend or _default
    if choice not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {choice!r}")
    if choice == "torch":
        return False
    if choice == "triton":
        if not tensor.is_cuda and not interpreting():
            raise RuntimeError(
                "backend='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before triton is imported"
            )
        return True
    return tensor.is_cuda
