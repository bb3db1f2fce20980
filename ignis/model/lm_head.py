"""The LM head of the packed CPU weight forms: a GEMM sized to the step's rows, then the
exact top.

    head = RefinedHead(rows=table, wide=wide_linear(w, "bf16"), narrow=Int8DynamicHead(w))
    logits = head(hidden)   # [M, vocab] fp32

The head streams the whole vocabulary's weights (49152 x 576 for SmolLM2) at every step,
which at one sampling row makes it the largest single cost of a decode step. Two GEMMs:

  narrow  (at most NARROW_ROWS rows): int8 weights, one scale per vocabulary row, through
          torch's dynamic-quantized linear (fbgemm: the step's activations quantized to
          uint8, int8 dot products). Half bf16's bytes, and the faster at few rows
          (experiments/RESULTS.md). Full 8-bit activations need VNNI: without
          it fbgemm's products pass a saturating 16-bit add, and 7-bit activations
          (torch's reduce_range) keep them exact at twice the rounding. A large Q8_0
          table is multiplied as it is instead (ignis/model/packed.py's Q8Linear: no copy),
          and a large Q6_K one (Q6Linear), which on AVX2 CPUs serves every row count
          itself (its many-row GEMM, faster than the wide one: then no wide copy either).
  wide    (more rows, or no narrow GEMM): the plan's wide GEMM (oneDNN bf16, else fbgemm
          fp16, else fp32: ignis/model/weight_plan.py), the more accurate of the two (the
          int8 GEMM's activation rounding moves logits ~4% of the largest, bf16's ~0.5%).

Either way each row's top candidates are then recomputed in fp32 from the exact rows (the
embedding table when tied): rounding moves logits enough to flip a near-tie at the top, and
with it a small model's greedy answer. Greedy choices match fp32 whenever fp32's best is
among the GEMM's top (8 candidates for bf16, 16 for int8; experiments/RESULTS.md).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

from ignis_kernels import cpu_native

log = logging.getLogger(__name__)

# Rows up to which the narrow (int8) GEMM serves when a wide one exists too: a one-user
# engine's steps (weight_plan.ONE_USER_MAX_SEQS), where the head's weights dominate its time.
NARROW_ROWS = 4
# Candidates recomputed exactly per row, by the GEMM that ranked them (int8's larger error
# needs more to keep fp32's best among them, and to bring perplexity back within 0.2%).
WIDE_TOP = 8
NARROW_TOP = 16

Gemm = Callable[[torch.Tensor], torch.Tensor]


class Int8DynamicHead:
    """y = x W^T with W as int8, one scale per output row (absmax / 127), and x quantized
    per call by torch's dynamic-quantized linear: at the full 8-bit range where the CPU has
    VNNI (`full_range`), else at 7 bits (`reduce_range`: exact without VNNI, twice the
    rounding). fp32 in, fp32 out."""

    form = "int8-dynamic"

    def __init__(self, w: torch.Tensor, full_range: bool = True) -> None:
        self.reduce_range = not full_range
        w = w.float()
        n = w.shape[0]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        # torch's quantized-tensor constructors warn that they are deprecated; the
        # prepacked form is what the dynamic linear takes (torch is pinned in pyproject.toml).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.in_features = w.shape[1]
        self.nbytes = w.numel() + n * 8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self.packed, self.reduce_range)


def int8_dynamic_head(w: torch.Tensor, full_range: bool = True) -> Int8DynamicHead | None:
    """The narrow head over `w` [vocab, hidden], or None where this torch build has no
    dynamic-quantized linear (then the wide head serves every row)."""
    try:
        head = Int8DynamicHead(w, full_range)
        head(torch.zeros(1, w.shape[1]))
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.warning("no int8 dynamic-quantized head (%s); the bf16 head serves every row", exc)
        return None
    return head


class RefinedHead:
    """Logits of the whole vocabulary from `narrow` (at most NARROW_ROWS rows, or when there
    is no `wide`) or `wide`, then each row's top candidates recomputed in fp32 from
    `rows(ids)` (exact weight rows [n, hidden]). At least one of the two GEMMs is given."""

    def __init__(
        self, rows: Callable[[torch.Tensor], torch.Tensor], *, wide: Gemm | None = None,
        narrow: Gemm | None = None, wide_top: int = WIDE_TOP, narrow_top: int = NARROW_TOP,
    ) -> None:
        if wide is None and narrow is None:
            raise ValueError("a head needs a GEMM")
        self.rows, self.wide, self.narrow = rows, wide, narrow
        self.wide_top, self.narrow_top = wide_top, narrow_top
        self.nbytes = sum(getattr(g, "nbytes", 0) for g in (wide, narrow) if g is not None)

    def gemm_for(self, num_rows: int) -> tuple[Gemm, int]:
        """(the GEMM that serves `num_rows` rows, its candidates per row)."""
        if self.narrow is not None and (self.wide is None or num_rows <= NARROW_ROWS):
            return self.narrow, self.narrow_top
        assert self.wide is not None
        return self.wide, self.wide_top

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gemm, top = self.gemm_for(x.shape[0])
        logits = gemm(x)
        if x.shape[0] == 0:
            return logits
        cand = cpu_native.top_k_indices(logits, min(top, logits.shape[1]))  # [M, top]
        w = self.rows(cand.reshape(-1)).view(*cand.shape, -1).float()  # [M, top, K]
        exact = torch.bmm(w, x.float()[:, :, None])[..., 0]
        return logits.scatter_(1, cand, exact)
