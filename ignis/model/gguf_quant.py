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
        sc, mn = _scales_6bit(b[..., 4:16])
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


# 5-bit block types, q * scale + offset per 32 inputs with q in [0, 32): packed.py's int5 form.
INT5_TYPES = frozenset({QT.Q5_0, QT.Q5_1, QT.Q5_K})
# Types whose values are d * (signed byte) per 32 inputs with d fp16: packed.py's q8 form
# (MXFP4 when its scales fit fp16: mxfp4_fits_q8).
Q8_TYPES = frozenset({QT.Q8_0, QT.Q5_0, QT.Q4_0, QT.MXFP4})
# MXFP4's 16 values (e2m1) doubled: integers, so 2 * value fits a signed byte exactly.
MXFP4_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def decode_mxfp4_codes(raw: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw MXFP4 rows [N, row_bytes] (per 32 inputs: an e8m0 exponent byte, then 16 bytes
    whose low nibbles are elements 0-15 and high nibbles 16-31, as ggml stores them) ->
    (e2m1 codes uint8 [N, K] in element order, exponents uint8 [N, K/32]): w = e2m1(code) * 2^(e - 127)."""
    n = raw.shape[0]
    b = raw.reshape(n, n_cols // GROUP, 17)
    return np.ascontiguousarray(_nibbles(b[..., 1:]).reshape(n, n_cols)), np.ascontiguousarray(b[..., 0])


def decode_mxfp4_nibbles(raw: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw MXFP4 rows -> (codes two a byte [N, K/2] uint8, element 2i low and 2i + 1 high:
    an HF checkpoint's order and packed.Mx4Linear's; exponents uint8 [N, K/32]), byte
    for byte, without widening the codes (ggml's byte j holds elements j and j + 16)."""
    n = raw.shape[0]
    b = raw.reshape(n, n_cols // GROUP, 17)
    qs = b[..., 1:]
    even, odd = qs[..., 0::2], qs[..., 1::2]  # ggml bytes 2i, 2i + 1: elements 2i, 2i + 1 (and + 16)
    nib = np.concatenate(((even & 0x0F) | ((odd & 0x0F) << 4), (even >> 4) | (odd & 0xF0)), axis=-1)
    return np.ascontiguousarray(nib.reshape(n, n_cols // 2)), np.ascontiguousarray(b[..., 0])


def decode_mxfp4(raw: np.ndarray, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw MXFP4 rows -> (q int8 [N, K] = 2 * the e2m1 value, d float32 [N, K/32] = 2^(e - 128)): w = q * d."""
    codes, e = decode_mxfp4_codes(raw, n_cols)
    return MXFP4_DOUBLED[codes], np.ldexp(np.float32(1.0), e.astype(np.int32) - 128).astype(np.float32)


def mxfp4_fits_q8(raw: np.ndarray, n_cols: int) -> bool:
    """Whether every block scale 2^(e - 128) is a float16 (2^-24 .. 2^15), as the q8 form holds d."""
    e = raw.reshape(raw.shape[0], n_cols // GROUP, 17)[..., 0].astype(np.int32) - 128
    return bool(e.size == 0 or (e.min() >= -24 and e.max() <= 15))


def decode_q8(raw: np.ndarray, qtype: QT, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw Q8_0/Q5_0/Q4_0/MXFP4 rows [N, row_bytes] -> (q int8 [N, K], d float16 [N, K/32]):
    w = q * d (Q5_0's d * (q - 16) and Q4_0's d * (q - 8) with the offset taken into q,
    MXFP4's doubled e2m1 values with half its power-of-two scale)."""
    if qtype == QT.Q8_0:
        return decode_q8_0(raw, n_cols)
    if qtype == QT.MXFP4:
        q, d = decode_mxfp4(raw, n_cols)
        return q, d.astype(np.float16)  # exact where mxfp4_fits_q8
    if qtype == QT.Q5_0:
        q, scale, _ = decode_wide_int(raw, qtype, n_cols)
        centre = 16
    elif qtype == QT.Q4_0:
        q, scale, _ = decode_int4(raw, qtype, n_cols)
        centre = 8
    else:
        raise ValueError(f"{qtype.name} is not d * (signed byte) per 32")
    signed = (q.astype(np.int16) - centre).astype(np.int8)
    return np.ascontiguousarray(signed), np.ascontiguousarray(scale.astype(np.float16))  # d came from fp16: exact


# Types whose values are q * scale + offset per 32 inputs with q of up to 8 bits: split
# as q = 16 * hi + lo, each a 4-bit weight, two int4 GEMMs hold them exactly.
WIDE_INT_TYPES = frozenset({QT.Q5_0, QT.Q5_1, QT.Q5_K, QT.Q8_0})


def _scales_6bit(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> 8 six-bit scales and 8 six-bit mins."""
    sc = np.empty((*s.shape[:-1], 8), dtype=np.uint8)
    mn = np.empty((*s.shape[:-1], 8), dtype=np.uint8)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def decode_q6_k(raw: np.ndarray, qtype: QT, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw rows [N, row_bytes] of a Q6_K tensor -> (q uint8 [N, K] in [0, 64), sc int8 [N, K/16],
    d float32 [N, K/256]) with w = d * sc * (q - 32), each sixteen's scale sc."""
    if qtype != QT.Q6_K:
        raise ValueError(f"{qtype.name} is not Q6_K")
    n, nb = raw.shape[0], n_cols // 256
    b = raw.reshape(n, nb, 210)  # ql [128], qh [64], scales [16] int8, d fp16
    ql = b[..., 0:128].reshape(n, nb, 2, 64)  # per half of 128: 64 bytes of low nibbles
    qh = b[..., 128:192].reshape(n, nb, 2, 32)  # and 32 of four high-bit pairs
    low = np.stack((ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4), axis=-2)
    high = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-2)  # quarter j of a half: bits 2j
    q = (low | (high << 4)).reshape(n, n_cols)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).reshape(n, n_cols // 16)
    return np.ascontiguousarray(q), np.ascontiguousarray(sc), _f16(b[..., 208:210])


# Block types whose scales are six-bit multiples of a super-block's (d, dmin): held as they
# are by the nibble formats (ignis_kernels/cpu/quant_gemm.h's K types' scales), not as fp32 pairs.
K_SCALE_TYPES = frozenset({QT.Q4_K, QT.Q5_K})


def decode_k_scales(raw: np.ndarray, qtype: QT, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw rows [N, row_bytes] of a Q4_K/Q5_K tensor -> ((sc, m) uint8 [N, K/32, 2], (d, -dmin)
    float32 [N, K/256, 2]): scale = sc * d and offset = m * -dmin, decode_int4's and
    decode_wide_int's values exactly (both products are exact in fp32)."""
    if qtype not in K_SCALE_TYPES:
        raise ValueError(f"{qtype.name} has no super-block scales")
    n, nb = raw.shape[0], n_cols // 256
    b = raw.reshape(n, nb, 144 if qtype == QT.Q4_K else 176)
    sc, mn = _scales_6bit(b[..., 4:16])
    ds = np.stack((_f16(b[..., 0:2]), -_f16(b[..., 2:4])), axis=-1)
    return np.ascontiguousarray(np.stack((sc, mn), axis=-1).reshape(n, nb * 8, 2)), np.ascontiguousarray(ds)


def decode_wide_int(raw: np.ndarray, qtype: QT, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw rows [N, row_bytes] of a Q5_0/Q5_1/Q5_K/Q8_0 tensor -> (q uint8 [N, K] in [0, 256),
    scale float32 [N, K/32], offset float32 [N, K/32]) with w = q * scale + offset."""
    n = raw.shape[0]
    groups = n_cols // GROUP
    if qtype == QT.Q8_0:  # w = d * q, q int8: (q + 128) * d - 128 d
        b = raw.reshape(n, groups, 34)
        d = _f16(b[..., 0:2])
        q = (np.ascontiguousarray(b[..., 2:34]).view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        scale, offset = d, -128 * d
    elif qtype in (QT.Q5_0, QT.Q5_1):  # 4 bits in qs, the fifth in a 32-bit mask
        size = 22 if qtype == QT.Q5_0 else 24
        b = raw.reshape(n, groups, size)
        d = _f16(b[..., 0:2])
        h0 = 2 if qtype == QT.Q5_0 else 4
        qh = np.ascontiguousarray(b[..., h0 : h0 + 4]).view(np.uint32)[..., 0]
        high = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles(b[..., h0 + 4 : h0 + 20]) | (high << 4)
        if qtype == QT.Q5_0:
            scale, offset = d, -16 * d
        else:
            scale, offset = d, _f16(b[..., 2:4])
    elif qtype == QT.Q5_K:
        nb = n_cols // 256
        b = raw.reshape(n, nb, 176)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _scales_6bit(b[..., 4:16])
        qh = b[..., 16:48]  # [n, nb, 32]: bit 2j / 2j + 1 of byte l: element l of sub-block 2j / 2j + 1
        qs = b[..., 48:176].reshape(n, nb, 4, 32)
        bits = np.arange(8, dtype=np.uint8).reshape(4, 2)
        high = (qh[:, :, None, None, :] >> bits[None, None, :, :, None]) & 1  # [n, nb, 4, 2, 32]
        low = np.stack((qs & 0x0F, qs >> 4), axis=3)
        q = low | (high << 4)
        dsc = d[..., None] * sc.astype(np.float32)
        scale, offset = dsc, -dmin[..., None] * mn.astype(np.float32)
    else:
        raise ValueError(f"{qtype.name} is not a 5- or 8-bit block type")
    return (
        np.ascontiguousarray(q.reshape(n, n_cols)),
        np.ascontiguousarray(scale.reshape(n, groups), dtype=np.float32),
        np.ascontiguousarray(offset.reshape(n, groups), dtype=np.float32),
    )


# What the packed CPU forms make of each GGUF tensor type (ignis/model/packed.py): the
# start-up log names every type a file holds, so none passes unaccounted for.
_TYPE_FATE = {
    QT.F32: "kept fp32",
    QT.F16: "widened from fp16",
    QT.BF16: "widened from bf16",
    QT.Q4_0: "int4 exact",
    QT.Q4_1: "int4 exact",
    QT.Q4_K: "int4 exact",
    QT.Q8_0: "int8 + block scales, exact (the embedding table too)",
    QT.Q5_0: "int5 exact, or int8 + block scales beside Q8_0",
    QT.Q5_1: "int5 exact",
    QT.Q5_K: "int5 exact",
    QT.Q6_K: "q6 exact (beside other types, a stack of each part's form); a table held once as q6, exact",
}


def describe_types(counts: dict[QT, int]) -> str:
    """'F32 109 (kept fp32), Q4_K 27 (int4 exact), ...' for a file's tensor types."""
    parts = []
    for qtype, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        fate = _TYPE_FATE.get(qtype, "dequantized, then requantized to int8 in the packed forms")
        parts.append(f"{qtype.name} {n} ({fate})")
    return ", ".join(parts)
