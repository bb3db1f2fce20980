"""Packed token bitmasks on logits, in place: Triton on CUDA, numpy-unpacked on the CPU.

    apply_token_bitmask_(logits, bitmask, rows, floor=-1e30, backend=None)

Contract: ignis_kernels.token_mask_ref (the reference is `apply_token_bitmask_ref_`); the
kernel: ignis_kernels.token_mask_triton, imported only when it runs (Triton's import alone
is ~70 MB of a CPU server's memory).
"""

from __future__ import annotations

import torch

from ignis_kernels.backend import Backend, use_triton
from ignis_kernels.token_mask_ref import DEFAULT_FLOOR, apply_token_bitmask_cpu_, apply_token_bitmask_ref_

__all__ = ["apply_token_bitmask_", "apply_token_bitmask_cpu_", "apply_token_bitmask_ref_"]


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: torch.Tensor,
    floor: float = DEFAULT_FLOOR,
    backend: Backend | None = None,
) -> None:
    """Mask `logits` rows `rows` by `bitmask` in place (see ignis_kernels.token_mask_ref)."""
    if use_triton(logits, backend):
        from ignis_kernels.token_mask_triton import apply_token_bitmask_triton_

        apply_token_bitmask_triton_(logits, bitmask, rows, floor)
    elif logits.device.type == "cpu":
        apply_token_bitmask_cpu_(logits, bitmask, rows, floor)
    else:
        apply_token_bitmask_ref_(logits, bitmask, rows, floor)
