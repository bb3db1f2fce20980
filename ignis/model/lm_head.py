"""The LM head of the packed CPU weight forms: a GEMM sized to the step's rows, then the
exact top.

    head = RefinedHead(rows=table, wide=Bf16Linear(w, None), narrow=Int8DynamicHead(w))
    logits = head(hidden)   # [M, vocab] fp32

The head streams the whole vocabulary's weights (49152 x 576 for SmolLM2) at every step,
which at one sampling row makes it the largest single cost of a decode step. Two GEMMs:

  narrow  (at most NARROW_ROWS rows): int8 weights, one scale per vocabulary row, through
          torch's dynamic-quantized linear (fbgemm: activations quantized per row to uint8,
          VNNI int8 dot products). Half bf16's bytes; measured 4x faster than oneDNN bf16 at
          one row, 3x at four (RESULTS.md, session 6).
  wide    (more rows, or no narrow GEMM): oneDNN bf16, the more accurate of the two (the
          int8 GEMM's activation rounding moves logits ~4% of the largest, bf16's ~0.5%).

Either way each row's top candidates are then recomputed in fp32 from the exact rows (the
embedding table when tied): rounding moves logits enough to flip a near-tie at the top, and
with it a 135M model's greedy answer ("What is the capital of France?": "The capital of
France is Paris." in fp32, "L'Etoile, la Marseillaise, ..." with a bf16 head, measured).
Greedy choices match fp32 whenever fp32's best is among the GEMM's top (always so on
experiments/perplexity_text.txt with 8 candidates for bf16, 16 for int8).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# Rows up to which the narrow (int8) GEMM serves when a wide one exists too: a one-user
# engine's steps (packed.ONE_USER_MAX_SEQS), where the head's weights dominate its time.
NARROW_ROWS = 4
# Candidates recomputed exactly per row, by the GEMM that ranked them (int8's larger error
# needs more to keep fp32's best among them, and to bring perplexity back within 0.2%).
WIDE_TOP = 8
NARROW_TOP = 16

Gemm = Callable[[torch.Tensor], torch.Tensor]


class Int8DynamicHead:
    """y = x W^T with W as int8, one scale per output row (absmax / 127), and x quantized
    per call by torch's dynamic-quantized linear (full 8-bit range: fbgemm's 7-bit
    `reduce_range` only matters for CPUs without VNNI and doubles the error). fp32 in, fp32 out."""

    form = "int8-dynamic"

    def __init__(self, w: torch.Tensor) -> None:
        w = w.float()
        n = w.shape[0]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        # torch's quantized-tensor constructors warn that they are deprecated; the
        # prepacked form is what the dynamic linear takes (torch pinned, see DESIGN.md).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.in_features = w.shape[1]
        self.nbytes = w.numel() + n * 8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self.packed, False)


def int8_dynamic_head(w: torch.Tensor) -> Int8DynamicHead | None:
    """The narrow head over `w` [vocab, hidden], or None where this torch build has no
    dynamic-quantized linear (then the wide head serves every row)."""
    try:
        head = Int8DynamicHead(w)
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
        cand = logits.topk(min(top, logits.shape[1]), dim=-1, sorted=False).indices  # [M, top]
        w = self.rows(cand.reshape(-1)).view(*cand.shape, -1).float()  # [M, top, K]
        exact = torch.bmm(w, x.float()[:, :, None])[..., 0]
        return logits.scatter_(1, cand, exact)
