"""GGUF quantized blocks read as integers plus group scales, without dequantizing.

The packed CPU weight forms (ignis/model/packed.py) keep a file's 4-bit weights 4-bit, as
w = q * scale + offset with q in [0, 16) and one (scale, offset) per group of 32 along K.
llama.cpp's 4-bit blocks all fit that form exactly (every product below is exact in fp32):

  Q4_0: w = d * (q - 8)              -> scale d,      offset -8 d
  Q4_1: w = d * q + m                -> scale d,      offset m
  Q4_K: w = d*sc_j * q - dmin*m_j    -> scale d*sc_j, offset -dmin*m_j  (32-wide sub-blocks)

Q8_0 (w = d * q, q int8, 32 per block) is read as int8 values plus per-block scales:
the embedding table keeps exactly that. Every other type is dequantized by the gguf
package. Layouts follow ggml's block structs (ggml-common.h); the tests check each
decoder against gguf.quants.dequantize.

Rows are whole blocks, so llama.cpp's Q/K row permutation can be undone on the raw
bytes (see gguf_loader.unpermute_rope_rows) before decoding.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

GROUP = 32  # every decoder here yields groups of 32 along K
INT4_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q4_K})


def _f16(raw: np.ndarray) -> np.ndarray:
    """A [..., 2] uint8 view of little-endian halves -> float32 [...]."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: the low nibbles are elements 0..15, the high 16..31."""
    return np.concatenate((qs & 0x0F, qs >> 4), axis=-1)


def decode_int4(raw: np.ndarray, qtype: QT, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw rows [N, row_bytes] of a Q4_0/Q4_1/Q4_K tensor -> (q uint8 [N, K] in [0, 16),
    scale float32 [N, K/32], offset float32 [N, K/32]) with w = q * scale + offset."""
    n = raw.shape[0]
    groups = n_cols // GROUP
    if qtype == QT.Q4_0:
        b = raw.reshape(n, groups, 18)
        d = _f16(b[..., 0:2])
        q = _nibbles(b[..., 2:18])
        scale, offset = d, -8 * d
    elif qtype == QT.Q4_1:
        b = raw.reshape(n, groups, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        q = _nibbles(b[..., 4:20])
        scale, offset = d, m
    elif qtype == QT.Q4_K:
        nb = n_cols // 256
        b = raw.reshape(n, nb, 144)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        s = b[..., 4:16].astype(np.uint8)  # 12 bytes: 8 six-bit scales and 8 six-bit mins
        sc = np.empty((n, nb, 8), dtype=np.uint8)
        mn = np.empty((n, nb, 8), dtype=np.uint8)
        sc[..., :4] = s[..., 0:4] & 63
        mn[..., :4] = s[..., 4:8] & 63
        sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
        mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
        qs = b[..., 16:144].reshape(n, nb, 4, 32)  # 4 chunks of 64 values: low nibbles, then high
        q = np.stack((qs & 0x0F, qs >> 4), axis=3)  # [n, nb, 4, 2, 32] -> sub-block 2i, 2i+1
        scale = d[..., None] * sc.astype(np.float32)
        offset = -dmin[..., None] * mn.astype(np.float32)
    else:
        raise ValueError(f"{qtype.name} is not a 4-bit block type")
    return (
        np.ascontiguousarray(q.reshape(n, n_cols)),
        np.ascontiguousarray(scale.reshape(n, groups), dtype=np.float32),
        np.ascontiguousarray(offset.reshape(n, groups), dtype=np.float32),
    )


def decode_q8_0(raw: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw Q8_0 rows [N, row_bytes] -> (q int8 [N, K], scale float16 [N, K/32]): w = q * scale."""
    n = raw.shape[0]
    b = raw.reshape(n, n_cols // GROUP, 34)
    scale = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
    q = np.ascontiguousarray(b[..., 2:34]).view(np.int8)
    return np.ascontiguousarray(q.reshape(n, n_cols)), np.ascontiguousarray(scale)


# What the packed CPU forms make of each GGUF tensor type (ignis/model/packed.py): the
# start-up log names every type a file holds, so none passes unaccounted for.
_TYPE_FATE = {
    QT.F32: "kept fp32",
    QT.F16: "widened from fp16",
    QT.BF16: "widened from bf16",
    QT.Q4_0: "int4 exact",
    QT.Q4_1: "int4 exact",
    QT.Q4_K: "int4 exact",
    QT.Q8_0: "int8 (exact in the embedding table)",
}


def describe_types(counts: dict[QT, int]) -> str:
    """'F32 109 (kept fp32), Q4_K 27 (int4 exact), ...' for a file's tensor types."""
    parts = []
    for qtype, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        fate = _TYPE_FATE.get(qtype, "dequantized, then requantized to int8 in the packed forms")
        parts.append(f"{qtype.name} {n} ({fate})")
    return ", ".join(parts)
