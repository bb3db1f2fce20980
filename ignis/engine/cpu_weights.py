"""oneDNN-packed linear weights for the CPU runner.

torch's fp32 F.linear on the CPU calls MKL's sgemm, which on AMD's AVX-512 parts runs
a non-AVX-512 code path: ~85 GFLOPS on one Zen core for SmolLM2's shapes at 64 rows.
The same GEMMs over weights reordered once into oneDNN's blocked layout run at ~225
GFLOPS (and stream faster at one row: decode at batch 1 is bandwidth bound). This
keeps a packed copy of every projection (and of the LM head) beside the original
weights, which stay the model's own (the embedding, loading and tests use them): the
price is the weights' memory a second time.

Uses torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise, the ops Inductor's
CPU backend emits for frozen linears; anything unexpected falls back to F.linear.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ignis.model.layers import Linear
from ignis.model.transformer import Transformer
from ignis_kernels import cpu_platform

log = logging.getLogger(__name__)

LinearOp = Callable[[torch.Tensor], torch.Tensor]


def _packed_op(weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int) -> LinearOp:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
    linear = torch.ops.mkldnn._linear_pointwise

    def op(x: torch.Tensor) -> torch.Tensor:
        return linear(x, packed, bias, "none", [], "")

    return op


def _check(op: LinearOp, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    x = torch.randn(3, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = F.linear(x, weight, bias)
        got = op(x)
    return got.shape == want.shape and bool(((got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-6).item())


# The row count oneDNN picks its blocked layout for. Measured on Zen 5 (one thread, SmolLM2
# shapes): a layout for 64 rows serves 1 to 512 rows as well as each size's own layout;
# a layout for 1 row is 25% slower even at 1 row, and 2x slower at 64.
BATCH_HINT = 64


def pack_linear_weights(model: Transformer, batch_hint: int = BATCH_HINT) -> LinearOp | None:
    """Install packed GEMMs on every Linear of a CPU fp32 model; return the LM head's op
    (None, and nothing installed, where oneDNN is unavailable or disagrees with F.linear).
    Packing is done once per model: later engines over the same model reuse it."""
    if (
        not isinstance(model, Transformer)  # e.g. the scripted model: no weights
        or getattr(model, "weight_form", "float32") != "float32"  # packed at load (ignis/model/packed.py)
        or model.device.type != "cpu"
        or model.dtype != torch.float32
        or not cpu_platform.current().has_gemm("fp32")  # oneDNN's fp32 GEMM runs here (probed)
    ):
        return None
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    cached = getattr(model, "_ignis_packed_head", None)
    if cached is not None and cached[0] == batch_hint and all(m.linear_op is not None for m in linears):
        return cached[1]
    try:
        head = _packed_op(model.lm_head, None, batch_hint)
        if not _check(head, model.lm_head, None):
            log.warning("oneDNN-packed linear disagrees with F.linear; keeping F.linear")
            return None
        ops = [_packed_op(m.weight, m.bias, batch_hint) for m in linears]
    except (RuntimeError, AttributeError) as exc:  # op missing in this torch build
        log.warning("cannot pack linear weights for oneDNN (%s); keeping F.linear", exc)
        return None
    for m, op in zip(linears, ops):
        m.linear_op = op
    model._ignis_packed_head = (batch_hint, head)  # type: ignore[attr-defined]
    return head


def unpack_linear_weights(model: Transformer) -> None:
    if getattr(model, "weight_form", "float32") != "float32":
        return  # packed weight forms (ignis/model/packed.py): the ops are the only weights
    for m in model.modules():
        if isinstance(m, Linear):
            m.linear_op = None
    model._ignis_packed_head = None  # type: ignore[attr-defined]
