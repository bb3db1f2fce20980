"""Apply packed per-row token bitmasks to logits: the PyTorch reference and the CPU path.

    apply_token_bitmask_(logits, bitmask, rows, floor=-1e30)

`bitmask` is [R, W] int32, one bit per token (bit t % 32 of word t // 32, least
significant first: llguidance's layout); row r of it is for logits row `rows[r]`.
In those rows every token whose bit is 0, and every column past 32 * W, becomes -inf,
and an allowed token keeps its logit but at least `floor`: a model that gave an
allowed token -inf (a one-hot scripted model) still leaves the row something to
sample. Rows not in `rows` are untouched. In place, and idempotent (applying it twice
equals once), so a caller that retries a sampling step may apply it again.

`apply_token_bitmask_ref_` is the definition, one obvious unpack (shift every word by
0..31); `apply_token_bitmask_cpu_` is the fast CPU path: the bitmask's bytes through
numpy's `unpackbits` (little bit order, so byte b's bit k is token 8b + k), then, in
place on the rows' numpy view, the floor (`np.maximum`) and -inf through a boolean
index. In place matters: a fresh 12 MB result per step (64 x 49k fp32) costs page
faults, and `torch.where` over these masks measured 2-4x slower (bench_grammar.py).
bfloat16 (no numpy dtype) takes one `torch.where`.
"""

from __future__ import annotations

import numpy as np
import torch

NEG_INF = float("-inf")
DEFAULT_FLOOR = -1e30


def check_args(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or rows.dim() != 1:
        raise ValueError(
            f"expected logits [B, V], bitmask [R, W], rows [R]; got {tuple(logits.shape)}, "
            f"{tuple(bitmask.shape)}, {tuple(rows.shape)}"
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.shape[0] != rows.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, rows names {rows.shape[0]}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")


def unpack_bits_ref(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, W] int32 -> [R, vocab] bool (False past 32 * W)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask[:, :, None] >> shifts) & 1).reshape(bitmask.shape[0], -1).bool()
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    pad = torch.zeros((bits.shape[0], vocab - bits.shape[1]), dtype=torch.bool, device=bits.device)
    return torch.cat([bits, pad], dim=1)


def apply_token_bitmask_ref_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, floor: float = DEFAULT_FLOOR
) -> None:
    check_args(logits, bitmask, rows)
    if rows.numel() == 0:
        return
    floor = max(floor, torch.finfo(logits.dtype).min)
    allowed = unpack_bits_ref(bitmask, logits.shape[1])
    sub = logits.index_select(0, rows)
    sub = torch.where(allowed, sub.clamp(min=floor), torch.full_like(sub, NEG_INF))
    logits.index_copy_(0, rows, sub)


def apply_token_bitmask_cpu_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, floor: float = DEFAULT_FLOOR
) -> None:
    """The reference's result on CPU tensors, ~5-10x faster (see experiments/bench_grammar.py)."""
    check_args(logits, bitmask, rows)
    R, V = rows.shape[0], logits.shape[1]
    if R == 0:
        return
    floor = max(floor, torch.finfo(logits.dtype).min)
    words = np.ascontiguousarray(bitmask.numpy())
    # Little-endian int32 words: token t is byte t // 8, bit t % 8 of the row's bytes.
    bits = np.unpackbits(words.view(np.uint8), axis=1, count=min(V, 32 * words.shape[1]), bitorder="little")
    allowed = torch.from_numpy(bits.view(np.bool_))
    if allowed.shape[1] < V:
        allowed = torch.cat([allowed, torch.zeros((R, V - allowed.shape[1]), dtype=torch.bool)], dim=1)
    every = R == logits.shape[0] and bool((rows == torch.arange(R)).all())
    sub = logits if every else logits.index_select(0, rows)
    if sub.dtype in (torch.float32, torch.float16, torch.float64) and sub.is_contiguous():
        view = sub.numpy()
        np.maximum(view, view.dtype.type(floor), out=view)
        view[~allowed.numpy()] = -np.inf
        out = sub
    else:
        out = torch.where(allowed, sub.clamp(min=floor), NEG_INF)
    if every:
        if out is not logits:
            logits.copy_(out)
    else:
        logits.index_copy_(0, rows, out)
