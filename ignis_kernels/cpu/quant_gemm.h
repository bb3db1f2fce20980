// Weight-only GEMMs over small-integer weights in layouts of ignis's own: y [T, N] = x [T, K]
// @ W^T, fp32 in and out, for the few rows of decode steps (and anything under the widening
// threshold). Each format holds a family of GGUF blocks' values exactly (ignis/model/packed.py
// builds them); g = k / 32:
//
//   kQ4  W[n, k] = q * s[n, g] + o[n, g], q in [0, 16) (Q4_0, Q4_1, Q4_K):
//        q: nibbles [N, K/2] uint8, byte i of a row holding element 2i (low) and 2i + 1 (high)
//        so: [N, K/32, 2] fp32 (s, o)
//   kQ5  the same with q in [0, 32) (Q5_0, Q5_1, Q5_K, and Q4 blocks beside them): the
//        nibbles hold q's low four bits, qh [N, K/32] uint32 the fifth: bit i of a group's
//        word that of its element 2i, bit 16 + i that of element 2i + 1
//   kQ8  W[n, k] = q * d[n, g], q int8 (Q8_0's blocks split into values and scales):
//        q: [N, K] int8 in order, d: [N, K/32] fp16. An embedding table of Q8_0 is exactly
//        this, so a tied head multiplies by the lookup table itself.
//        or, for Q4_K / Q5_K (the file's own scales, 0.59 bytes a weight for 4 bits against
//        0.75): sm [N, K/32, 2] uint8 (sc, m) and ds [N, K/256, 2] fp32 (d, -dmin) per
//        super-block of eight groups, s = sc * d and o = m * -dmin: exactly so's values
//   kQ6  W[n, k] = d[n, k / 256] * sc[n, k / 16] * (q - 32), q in [0, 64) (Q6_K exactly, 0.83
//        bytes a weight as the file's): kQ4's nibbles hold q's low four bits, hb [N, K/32, 8]
//        uint8 the high two (byte i of a group's eight: bits 0-1 element 2i + 1's, 2-3 element
//        2i + 17's, 4-5 element 2i's, 6-7 element 2i + 16's: where the AVX2 body's shifts of
//        whole 64-bit lanes put them), sc [N, K/32, 2] int8 (each 16's scale) and d [N, K/256]
//        fp32 per super-block (the ds layout)
//   kMX4 W[n, k] = e2m1(q) * 2^(e[n, g] - 127) (MXFP4: gpt-oss's experts): kQ4's nibbles,
//        each an e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; bit 3 the sign),
//        and e: [N, K/32] uint8 exponents (e8m0), laid out as kQ4's pairs: 0.53 bytes a weight.
//
// It replaces torch's int4 GEMM, whose packing is private and differs between CPUs, and
// holds 5- and 8-bit blocks at 0.875 and 1.06 bytes a weight. Activations stay fp32 (torch's
// takes bf16). Per row and group: sum_k W x = s * sum_k q x + o * sum_k x, so for kQ4/kQ5 x
// is split once per call into its even and odd elements (the nibbles' order) and its group
// sums, and the inner loop widens 32 values of each of several weight rows and multiplies them
// into up to four rows of x at once. AVX-512 without VNNI: a table of the group's 16 (kQ4) or
// 32 (kQ5) possible weights q * s + o (kMX4: e2m1 * 2^e), looked up by the nibbles (vpermps /
// vpermt2ps: no int-to-float conversion, the offset comes with the weight). AVX2+FMA and
// portable bodies beside.
//
// AVX2 has no such lookup, and widening values to fp32 (convert, scale, FMA) costs three
// floating-point operations per eight weights. There the nibble formats multiply their
// values as unsigned bytes into x's bytes (nibbles_avx2, below: 1.6x the int16 body for
// int4 on a Zen 3, a 1B model's decode step 63.5 -> 38.6 ms), as kQ6 does on every AVX2
// CPU. kQ8 holds x as int16 per group of 32,
// scaled by a power of two (x = xq * 2^e, |xq| < 2^15: a relative error under 2^-15 of the
// group's largest |x|, some 250x finer than bf16's), the values are multiplied into it with
// integer multiply-adds (16 products an instruction, exact in int32), and each group's sum
// is scaled once: s * 2^e * sum_k q xq. A power of two keeps x's exact values where they fit
// (the identity's ones, zeros) and the scaling exact.
//
// With AVX512-VNNI every nibble format and kQ6 multiply as bytes (bytes_vnni): the fp32
// lookups cost three shuffles and two FMAs per 32 weights and a row of x. There the values go
// as unsigned bytes (kMX4: a byte shuffle to 2 * e2m1 + 12, in [0, 24]; kQ5: + 16 by a mask;
// kQ6: the high bits or'ed in) and vpdpbusd multiplies them into x as bytes, four products a
// lane. x is the int16 above at 14 bits (|xq| <= 2^14: within 2^-15 of the group's largest
// |x|) split exactly into two signed bytes, xq = 256 h + l (two products per weight, none of
// x's precision lost to bytes); a bias (kMX4's + 12, kQ6's + 32) comes back out as -bias *
// sum(xq) per lane, once per group and call. AVX2 runs the same arithmetic with vpmaddubsw +
// vpmaddwd (nibbles_avx2: 1.9x the int16 body it replaced on a Zen 3), bit for bit the VNNI
// body's outputs; both are checked on any x86 machine, the VNNI one through SIMDe
// (tests/kernels/qgemm_emulated.cpp). One load holds a group of four rows (the blocks of
// eight, below), and the int32 sums (exact) are scaled once per group by the row's scale
// times x's power.
//
// Steps of many rows (kManyRows and more) of Q4_K and Q6_K on AVX2 without AVX-512 take a body
// of their own (quant_gemm_many.h): x at 8 bits per super-block of 256, the weights' integer
// scales inside the integer sums, fp32 once per super-block: at 64 rows 1.7-2x fbgemm's fp16
// GEMM over a kept copy, and 2-4x the weights widened to fp32 at prefill sizes.

#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// The AVX-512 bodies, and the VNNI byte body among them: where the compiler targets them, or
// where a test sets these itself (tests/kernels/qgemm_emulated.cpp runs them through SIMDe's
// emulation on a CPU without AVX-512).
#ifndef IGNIS_QGEMM_AVX512
#if defined(__AVX512F__)
#define IGNIS_QGEMM_AVX512 1
#else
#define IGNIS_QGEMM_AVX512 0
#endif
#endif
#ifndef IGNIS_QGEMM_VNNI
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define IGNIS_QGEMM_VNNI 1
#else
#define IGNIS_QGEMM_VNNI 0
#endif
#endif

// AMX's tile body for many rows of Q4_K and Q6_K (quant_gemm_amx.h): only where the compiler targets
// AMX-INT8 (the host's own -march=native), used where the kernel grants the tiles.
#ifndef IGNIS_QGEMM_AMX
#if IGNIS_QGEMM_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define IGNIS_QGEMM_AMX 1
#else
#define IGNIS_QGEMM_AMX 0
#endif
#endif

#if IGNIS_QGEMM_AVX512 || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if IGNIS_QGEMM_AMX
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#endif

namespace qgemm {

constexpr int64_t kGroup = 32;

enum Format : int64_t { kQ4 = 4, kQ5 = 5, kQ6 = 6, kQ8 = 8, kMX4 = 40 };

struct Weights {
  Format format;
  const uint8_t* q;    // kQ4/kQ5: nibbles [N, K/2]; kQ8: int8 values [N, K]
  const uint32_t* qh;  // kQ5: fifth bits [N, K/32]
  const float* so;     // kQ4/kQ5: (s, o) [N, K/32, 2]
  const uint16_t* d;   // kQ8: fp16 scales [N, K/32]
  const uint8_t* e;    // kMX4: e8m0 exponents [N, K/32]
  int64_t N, K;
  const uint8_t* sm = nullptr;  // kQ4/kQ5 with the K types' scales (so null): (sc, m) [N, K/32, 2]
  const float* ds = nullptr;    // and their super-blocks' (d, -dmin) [N, K/256, 2]; kQ6: d [N, K/256]
  const uint8_t* hb = nullptr;  // kQ6: the high two bits [N, K/32, 8]
  const int8_t* sc = nullptr;   // kQ6: each 16's scale [N, K/32, 2]
  int64_t ldy = 0;              // y's row stride (0: N); a part of a stack of formats writes its columns

  int64_t stride() const { return ldy ? ldy : N; }

  // kQ6: row n's element k as q - 32 (in [-32, 32)) and its sixteen's scale d * sc.
  int q6(int64_t n, int64_t k) const {
    const int64_t u = unit(n, k / kGroup), i = (k % kGroup) / 2, j = i % 8, shift = (k % 2 ? 0 : 4) + 2 * (i / 8);
    const uint8_t byte = q[16 * u + i];
    return ((k % 2 ? byte >> 4 : byte & 15) | (((hb[8 * u + j] >> shift) & 3) << 4)) - 32;
  }
  float q6_scale(int64_t n, int64_t k) const {
    return float(sc[2 * unit(n, k / kGroup) + (k % kGroup) / 16]) * ds[super(n, k / (8 * kGroup))];
  }

  // Row n's group g's (scale, offset), from so or from the K types' scales (the same values).
  void scale_offset(int64_t n, int64_t g, float& s, float& o) const {
    const int64_t u = unit(n, g);
    if (!sm) {
      s = so[2 * u], o = so[2 * u + 1];
      return;
    }
    const int64_t v = super(n, g / 8);
    s = float(sm[2 * u]) * ds[2 * v], o = float(sm[2 * u + 1]) * ds[2 * v + 1];
  }

  // kQ4/kQ5/kMX4: where row n's group g is, in units of a group's 16 nibble bytes, (s, o)
  // pair, fifth-bit word or exponent byte. Rows go in blocks of eight, group-major within a block (block b's group
  // g: its eight rows' in turn), so the eight rows the AVX-512 body takes at once are one
  // sequential stream (eight rows apart, they were eight: 50% of the read bandwidth when the
  // weights come from memory); the last N % 8 rows follow row by row.
  int64_t unit(int64_t n, int64_t g) const {
    const int64_t G = K / kGroup, N8 = N & ~int64_t(7);
    return n < N8 ? ((n >> 3) * G + g) * 8 + (n & 7) : n * G + g;
  }
  // The same layout over super-blocks of eight groups (ds).
  int64_t super(int64_t n, int64_t j) const {
    const int64_t S = K / (8 * kGroup), N8 = N & ~int64_t(7);
    return n < N8 ? ((n >> 3) * S + j) * 8 + (n & 7) : n * S + j;
  }
};

// e8m0's 2^(e - 127), exactly (e = 0: 2^-127, a subnormal).
inline float e8m0_to_float(uint8_t e) {
  if (e == 0) return std::ldexp(1.0f, -127);
  const uint32_t bits = uint32_t(e) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// e2m1 by nibble, and doubled (integers: what the int16 paths multiply).
constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
#define IGNIS_QGEMM_INT16_X 1
#endif
#if IGNIS_QGEMM_VNNI && !IGNIS_QGEMM_INT16_X
#error "the VNNI byte body takes its tail rows through nibbles_avx2: build with AVX2 and FMA"
#endif

// Whether a format reads x as int16 (below): kQ8 wherever AVX2 is (AVX-512 looks the nibble
// formats' weights up as fp32; AVX2 multiplies them into x's bytes: byte_x).
constexpr bool int16_x(Format f) {
#if IGNIS_QGEMM_INT16_X || IGNIS_QGEMM_AVX512
  return f == kQ8;
#else
  return false;
#endif
}

// Whether a format reads x as bytes: every nibble format with AVX512-VNNI (bytes_vnni) or on
// AVX2 without AVX-512 (nibbles_avx2), and kQ6 wherever AVX2 is.
constexpr bool byte_x(Format f) {
#if IGNIS_QGEMM_VNNI || (!IGNIS_QGEMM_AVX512 && IGNIS_QGEMM_INT16_X)
  return f != kQ8;
#elif IGNIS_QGEMM_INT16_X
  return f == kQ6;
#else
  return false;
#endif
}

// x as the format reads it. kQ4/kQ5/kQ6/kMX4 ("interleaved"): xe [T, K/2] (x[2i]), xo [T, K/2]
// (x[2i+1]), xs [T, G] (group sums, from fp32 x); kQ8: x itself. As int16 (int16_x): per
// group, xq [T, K] (interleaved: the 16 even then the 16 odd elements; kQ8: in order) and
// the power of two that scales them, xp [T, G], in place of xe, xo and x. As bytes (byte_x):
// per group 64 int8, the 16 even elements' l, the 16 odd ones' l, then their h (xq = 256 h
// + l, 14-bit xq), and xp; kMX4 adds xc [T, G, 4] int32: -12 times each 4-lane's sum of xq
// (lane j: elements 2i and 2i + 1, i in [4j, 4j + 4)), with xp halved (its weights come
// doubled); kQ6 xb (above), and with VNNI xc at -32 (its bias); kQ4/kQ5 keep xs (their
// offsets' term).
struct Split {
  std::vector<float> xe, xo, xs;
  const float* xn = nullptr;
  std::vector<int16_t> xq;
  std::vector<int8_t> x8;
  std::vector<int32_t> xc;
  std::vector<int16_t> xb;  // kQ6: per group, 32 times each int16 lane's four l, then h (its + 32 bias)
  std::vector<float> xp;
  int64_t T, K, K2, G;

  Split(const float* x, int64_t T_, int64_t K_, Format f) : T(T_), K(K_), K2(K_ / 2), G(K_ / kGroup) {
    const bool interleaved = f != kQ8, int16 = int16_x(f), mx4 = f == kMX4, q6 = f == kQ6;
    if (byte_x(f)) {
      x8.resize(T * G * 64);
      // the bias the weights' bytes carry, taken back out per int32 lane (bytes_vnni's lanes)
      const int bias = mx4 ? 12 : q6 && IGNIS_QGEMM_VNNI ? 32 : 0;
      if (bias) xc.resize(T * G * 4);
      if (q6) xb.resize(T * G * 16);
      else if (!mx4) xs.resize(T * G);
      xp.resize(T * G);
      int16_t v[kGroup];
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t tg = t * G + g;
          to_int16(x + t * K + g * kGroup, true, v, &xp[tg], 14);
          int8_t* b = x8.data() + tg * 64;
          for (int i = 0; i < kGroup; ++i) {  // i < 16: even elements, else odd (interleaved)
            const int h = (v[i] + 128) >> 8;   // |v| <= 2^14: h in [-64, 64], l in [-128, 128)
            b[i] = int8_t(v[i] - 256 * h);
            b[32 + i] = int8_t(h);
          }
          if (q6) {  // 32 times each int16 lane's four l (then h): elements 4k .. 4k + 3
            for (int k = 0; k < 8; ++k) {
              xb[tg * 16 + k] = int16_t(32 * (b[2 * k] + b[2 * k + 1] + b[16 + 2 * k] + b[17 + 2 * k]));
              xb[tg * 16 + 8 + k] = int16_t(32 * (b[32 + 2 * k] + b[33 + 2 * k] + b[48 + 2 * k] + b[49 + 2 * k]));
            }
          } else if (!mx4) {
            float sum = 0.0f;
            for (int64_t k = 0; k < kGroup; ++k) sum += x[t * K + g * kGroup + k];
            xs[tg] = sum;
          }
          if (mx4) xp[tg] *= 0.5f;
          if (bias)
            for (int j = 0; j < 4; ++j) {  // the weights' bias taken back out
              int32_t sum = 0;
              for (int i = 4 * j; i < 4 * j + 4; ++i) sum += v[i] + v[16 + i];
              xc[tg * 4 + j] = -bias * sum;
            }
        }
      return;
    }
    if (interleaved) xs.assign(T * G, 0.0f);
    if (int16) {
      xq.resize(T * K);
      xp.resize(T * G);
    } else if (interleaved) {
      xe.resize(T * K2);
      xo.resize(T * K2);
    } else {
      xn = x;
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* r = x + t * K;
      if (int16) {
        for (int64_t g = 0; g < G; ++g) to_int16(r + g * kGroup, interleaved, xq.data() + t * K + g * kGroup, &xp[t * G + g]);
      } else if (interleaved) {
        for (int64_t i = 0; i < K2; ++i) {
          xe[t * K2 + i] = r[2 * i];
          xo[t * K2 + i] = r[2 * i + 1];
        }
      }
      if (!interleaved) continue;
      for (int64_t g = 0; g < G; ++g) {
        float s = 0.0f;
        for (int64_t k = 0; k < kGroup; ++k) s += r[g * kGroup + k];
        xs[t * G + g] = s;
      }
    }
  }

  // One group of 32 as int16 (interleaved or in order, |out| <= 2^bits) and its power of two.
  static void to_int16(const float* v, bool interleaved, int16_t* out, float* power, int bits = 15) {
#if IGNIS_QGEMM_INT16_X
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i evens_first = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 f[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      f[j] = _mm256_loadu_ps(v + 8 * j);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, f[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    // The smallest 2^e with amax / 2^e < 2^bits (rounding may reach 2^15: packs saturates).
    int e = 0;
    if (amax > 0.0f) {
      std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1): amax < 2^e
      e -= bits;
    }
    const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, -e));
    __m256i i[4];
    for (int j = 0; j < 4; ++j) {  // rounded to nearest
      i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(f[j], scale));
      if (interleaved) i[j] = _mm256_permutevar8x32_epi32(i[j], evens_first);  // 4 even, then 4 odd
    }
    const __m256i a = _mm256_packs_epi32(i[0], i[1]), b = _mm256_packs_epi32(i[2], i[3]);
    if (interleaved) {  // a, b: [evens | odds] of their 16
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(a, b, 0x31));
    } else {  // packs interleaves 128-bit lanes: 64-bit quarters 0, 2, 1, 3 restore the order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute4x64_epi64(a, 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute4x64_epi64(b, 0xD8));
    }
    *power = std::ldexp(1.0f, e);
#else
    (void)v, (void)interleaved, (void)out, (void)power, (void)bits;  // int16_x() is false without AVX2
#endif
  }
};

// NB weight rows from n0 against TB rows of x from t0: y[t0 + t, n0 + r]. Every output is
// the same sum in the same order whatever NB and TB are, so results do not depend on how
// many rows a step has (speculative drafts are checked against plain decoding's results).
// The nibble formats on AVX-512 keep one accumulator per output and NB x TB of them in
// flight (one row alone is a chain of dependent FMAs, latency-bound); kQ8 goes one weight
// row at a time (rows() below) with two accumulators per output, even and odd groups: eight
// rows of a large table interleaved were eight streams, and read at 60% of the bandwidth.
template <Format F, int NB, int TB>
inline void block(const Weights& w, const Split& x, int64_t n0, int64_t t0, float* y) {
  const int64_t K = x.K, K2 = x.K2, G = x.G;
  float zero[NB][TB] = {};
  float dot[NB][TB];
#if IGNIS_QGEMM_AVX512
  if constexpr (F == kQ8) {
    // 32 int8 weights widened to int16 against x's 32 int16 (Split), 16 pairwise products
    // summed an instruction (exact in int32), each group's sums scaled once: d * 2^e.
    __m512 acc[2][NB][TB];
    for (int r = 0; r < NB; ++r)
      for (int t = 0; t < TB; ++t) acc[0][r][t] = acc[1][r][t] = _mm512_setzero_ps();
    const auto step = [&](int64_t g, __m512 (&c)[NB][TB]) __attribute__((always_inline)) {
      __m512i a[TB];
      for (int t = 0; t < TB; ++t) a[t] = _mm512_loadu_si512(x.xq.data() + (t0 + t) * K + kGroup * g);
      for (int r = 0; r < NB; ++r) {
        const int8_t* q = reinterpret_cast<const int8_t*>(w.q) + (n0 + r) * K + kGroup * g;
        const __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
        const float d = half_to_float(w.d[(n0 + r) * G + g]);
        for (int t = 0; t < TB; ++t)
          c[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(v, a[t])),
                                    _mm512_set1_ps(d * x.xp[(t0 + t) * G + g]), c[r][t]);
      }
    };
    int64_t g = 0;
    for (; g + 2 <= G; g += 2) {
      step(g, acc[0]);
      step(g + 1, acc[1]);
    }
    if (g < G) step(g, acc[0]);
    for (int r = 0; r < NB; ++r)
      for (int t = 0; t < TB; ++t) dot[r][t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r][t], acc[1][r][t]));
  } else {
    // Each group's possible weights q * s + o as a table (16 entries, or 32 in two registers),
    // looked up by the values: no int-to-float conversion, and the offset comes with the weight.
    __m512 acc[NB][TB];
    for (int r = 0; r < NB; ++r)
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi32(15), sixteen = _mm512_set1_epi32(16);
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 iota16 = _mm512_add_ps(iota, _mm512_set1_ps(16.0f));
    const __m512 e2m1 = _mm512_loadu_ps(kE2M1);
    for (int64_t g = 0; g < G; ++g) {
      __m512 e[TB], o[TB];
      for (int t = 0; t < TB; ++t) {
        e[t] = _mm512_loadu_ps(x.xe.data() + (t0 + t) * K2 + 16 * g);
        o[t] = _mm512_loadu_ps(x.xo.data() + (t0 + t) * K2 + 16 * g);
      }
      alignas(32) float scale[8];  // kMX4: the NB rows' powers of two for group g
      if constexpr (F == kMX4) {
        if constexpr (NB >= 4) {  // rows of one block of eight: their group-g exponents lie side by side (unit)
          int64_t bytes = 0;
          std::memcpy(&bytes, w.e + w.unit(n0, g), NB);
          const __m256i ei = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
          // 2^(e - 127) built in the exponent field; e = 0 (2^-127, a subnormal) apart
          const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(ei, 23));
          const __m256 zero_e = _mm256_castsi256_ps(_mm256_cmpeq_epi32(ei, _mm256_setzero_si256()));
          _mm256_store_ps(scale, _mm256_blendv_ps(f, _mm256_set1_ps(e8m0_to_float(0)), zero_e));
        } else {
          scale[0] = e8m0_to_float(w.e[w.unit(n0, g)]);
        }
      }
      for (int r = 0; r < NB; ++r) {
        const int64_t n = n0 + r;
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + 16 * w.unit(n, g))));
        __m512 lo, hi;
        if constexpr (F == kMX4) {  // e2m1's 16 values times the group's power of two: exact
          const __m512 table = _mm512_mul_ps(e2m1, _mm512_set1_ps(scale[r]));
          lo = _mm512_permutexvar_ps(b, table);  // vpermps reads an index's low four bits: no mask
          hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
        } else if constexpr (F == kQ4) {
          float so[2];
          w.scale_offset(n, g, so[0], so[1]);
          const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(so[0]), _mm512_set1_ps(so[1]));
          lo = _mm512_permutexvar_ps(b, table);  // vpermps reads an index's low four bits: no mask
          hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
        } else {
          float so[2];
          w.scale_offset(n, g, so[0], so[1]);
          const __m512 s = _mm512_set1_ps(so[0]), off = _mm512_set1_ps(so[1]);
          const __m512 table = _mm512_fmadd_ps(iota, s, off);
          const uint32_t bits = w.qh[w.unit(n, g)];
          const __m512i il = _mm512_and_si512(b, low), ih = _mm512_srli_epi32(b, 4);
          const __m512i jl = _mm512_mask_or_epi32(il, __mmask16(bits & 0xFFFF), il, sixteen);
          const __m512i jh = _mm512_mask_or_epi32(ih, __mmask16(bits >> 16), ih, sixteen);
          const __m512 table16 = _mm512_fmadd_ps(iota16, s, off);
          lo = _mm512_permutex2var_ps(table, jl, table16);
          hi = _mm512_permutex2var_ps(table, jh, table16);
        }
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(hi, o[t], _mm512_fmadd_ps(lo, e[t], acc[r][t]));
      }
    }
    for (int r = 0; r < NB; ++r)
      for (int t = 0; t < TB; ++t) dot[r][t] = _mm512_reduce_add_ps(acc[r][t]);
  }
#else
  static_assert(NB == 1, "one weight row at a time below AVX-512");
  const int64_t n = n0;
  if constexpr (F == kQ4 || F == kQ5) {  // the o * sum(x) terms (the AVX-512 tables hold the offsets)
    for (int t = 0; t < TB; ++t) {
      const float* xs = x.xs.data() + (t0 + t) * G;
      float z = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        float sc, o;
        w.scale_offset(n, g, sc, o);
        z += o * xs[g];
      }
      zero[0][t] = z;
    }
  }
#endif
#if !IGNIS_QGEMM_AVX512 && IGNIS_QGEMM_INT16_X  // (kQ8 only: the nibble formats are nibbles_avx2's)
  static_assert(F == kQ8, "the nibble formats go through nibbles_avx2 on AVX2");
  __m256 acc[2][TB];
  for (int t = 0; t < TB; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
  const auto step = [&](int64_t g, __m256 (&c)[TB]) __attribute__((always_inline)) {
    // the group's 32 weights as int16, against x's 32 int16 (Split)
    const int8_t* q = reinterpret_cast<const int8_t*>(w.q) + n * K + kGroup * g;
    const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
    const float scale = half_to_float(w.d[n * G + g]);
    for (int t = 0; t < TB; ++t) {
      const int16_t* xq = x.xq.data() + (t0 + t) * K + g * kGroup;
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
      // |q| <= 128 times |xq| < 2^15, two a lane, 16 lanes into 8: far inside int32
      const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo, e), _mm256_madd_epi16(hi, o));
      c[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(scale * x.xp[(t0 + t) * G + g]), c[t]);
    }
  };
  int64_t g = 0;
  for (; g + 2 <= G; g += 2) {
    step(g, acc[0]);
    step(g + 1, acc[1]);
  }
  if (g < G) step(g, acc[0]);
  for (int t = 0; t < TB; ++t) {
    const __m256 a = _mm256_add_ps(acc[0][t], acc[1][t]);
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    dot[0][t] = _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
  }
#elif !IGNIS_QGEMM_AVX512
  // Sixteen lanes per row of x, summed in a fixed order at the end: elementwise loops the
  // compiler vectorizes without reordering any sum (an `omp simd` reduction may order its
  // sum by the code around it, and results must not depend on TB).
  float lanes[TB][16] = {};
  for (int64_t g = 0; g < G; ++g) {
    if constexpr (F == kQ8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.q) + n * K + kGroup * g;
      const float d = half_to_float(w.d[n * G + g]);
      for (int t = 0; t < TB; ++t) {
        const float* v = x.xn + (t0 + t) * K + kGroup * g;
        for (int i = 0; i < 16; ++i) lanes[t][i] += (float(q[i]) * v[i] + float(q[i + 16]) * v[i + 16]) * d;
      }
    } else {
      const uint8_t* q = w.q + 16 * w.unit(n, g);
      float wl[16], wh[16];
      if constexpr (F == kMX4) {
        const float s = e8m0_to_float(w.e[w.unit(n, g)]);
        for (int i = 0; i < 16; ++i) {
          wl[i] = kE2M1[q[i] & 15] * s;
          wh[i] = kE2M1[q[i] >> 4] * s;
        }
      } else if constexpr (F == kQ6) {
        for (int i = 0; i < 16; ++i) {  // elements 2i and 2i + 1 share their sixteen's scale
          const int64_t k = kGroup * g + 2 * i;
          const float s = w.q6_scale(n, k);
          wl[i] = float(w.q6(n, k)) * s;
          wh[i] = float(w.q6(n, k + 1)) * s;
        }
      } else {
        float s, o;
        w.scale_offset(n, g, s, o);
        const uint32_t bits = F == kQ5 ? w.qh[w.unit(n, g)] : 0;
        for (int i = 0; i < 16; ++i) {
          wl[i] = float((q[i] & 15) | (((bits >> i) & 1) << 4)) * s;
          wh[i] = float((q[i] >> 4) | (((bits >> (16 + i)) & 1) << 4)) * s;
        }
      }
      for (int t = 0; t < TB; ++t) {
        const float* e = x.xe.data() + (t0 + t) * K2 + 16 * g;
        const float* o = x.xo.data() + (t0 + t) * K2 + 16 * g;
        for (int i = 0; i < 16; ++i) lanes[t][i] += wl[i] * e[i] + wh[i] * o[i];
      }
    }
  }
  for (int t = 0; t < TB; ++t) {
    float sum = 0.0f;
    for (int i = 0; i < 16; ++i) sum += lanes[t][i];
    dot[0][t] = sum;
  }
#endif
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) y[(t0 + t) * w.stride() + n0 + r] = dot[r][t] + zero[r][t];
}

#if IGNIS_QGEMM_INT16_X
// kQ6 on AVX2, a register's two rows (Two; else one row in both halves): the high two bits
// (hb: each row's eight bytes) into bits 4-5 of lo (even elements) and hi (odd ones), each
// row's eight bytes in both 64-bit lanes of its half.
template <bool Two>
inline void q6_high_bits(const uint8_t* hb, __m256i& lo, __m256i& hi) {
  const __m128i v = Two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(hb))
                        : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hb));
  const __m256i t = _mm256_permute4x64_epi64(_mm256_castsi128_si256(v), Two ? 0x50 : 0x00);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_setr_epi64x(0, 2, 0, 2)), bits45));
  hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_sllv_epi64(t, _mm256_setr_epi64x(4, 2, 4, 2)), bits45));
}

// kQ6: 256 times each int16 lane's sixteen's scale (lanes 0-3 of a half: elements 0-15), from
// the two rows' two int8 scales each at sc (one row's two, in both halves, without Two).
template <bool Two>
inline __m256i q6_scales_256(const int8_t* sc) {
  int32_t four = 0;
  std::memcpy(&four, sc, Two ? 4 : 2);
  constexpr char a = 0, b = 1, c = Two ? 2 : 0, e = Two ? 3 : 1, z = char(0x80);
  return _mm256_shuffle_epi8(_mm256_set1_epi32(four), _mm256_setr_epi8(z, a, z, a, z, a, z, a, z, b, z, b, z, b, z, b,
                                                                         z, c, z, c, z, c, z, c, z, e, z, e, z, e, z, e));
}

// The nibble formats on AVX2, two weight rows a register (a 128-bit half each: a block of
// eight's group g is 128 bytes in a row), as unsigned bytes multiplied into x's bytes by
// vpmaddubsw (pairs, in int16: at most 2 * 31 * 128, no saturation) and summed to int32 by
// vpmaddwd (by 1 for l, 256 for h): four int32 lanes a row, scaled once per group. kMX4: the
// weights 2 e2m1 + 12 by a byte shuffle, the + 12 taken back out through xc: the VNNI body's
// four-lane sums (vpdpbusd's), so its outputs bit for bit (1.9x the int16 body it replaced on
// a Zen 3). kQ4/kQ5: the nibbles (and fifth bits) as they are, scaled by s, plus o * sum(x)
// per group, one FMA chain per row (a lane of eight rows', or a scalar one: the same sums).
// NB = 8 (a block of eight) or 1 (a tail row, in the low half).
template <Format F, int NB, int TB>
inline void nibbles_avx2(const Weights& w, const Split& x, int64_t n0, int64_t t0, float* y) {
  static_assert(NB == 8 || NB == 1, "a block of eight rows, or one");
  constexpr int P = NB == 8 ? 4 : 1;
  const int64_t G = x.G;
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m256i nib = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1), high = _mm256_set1_epi16(256);
  // kQ5: byte i of a half takes bit i % 8 of its word's byte i / 8 (the low word's for even
  // elements, the high word's, bytes 2 and 3, for odd ones)
  const __m256i bitmask = _mm256_set1_epi64x(0x8040201008040201ll), sixteen = _mm256_set1_epi8(16);
  const __m256i even_bytes = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                                              1, 1, 1, 1, 1, 1, 1, 1);
  const __m256i odd_bytes = _mm256_add_epi8(even_bytes, _mm256_set1_epi8(2));
  const __m256 tiny = _mm256_set1_ps(e8m0_to_float(0));
  const auto wide = [](const void* p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  __m256 acc[P][TB], zero8[TB];  // zero8: NB = 8's o * sum(x), row r in lane r
  float zero1[TB];               // NB = 1's
  for (int t = 0; t < TB; ++t) {
    zero8[t] = _mm256_setzero_ps();
    zero1[t] = 0.0f;
    for (int p = 0; p < P; ++p) acc[p][t] = _mm256_setzero_ps();
  }
  __m256 d, dmin;  // the K types' scales: the eight rows' super-block (d, -dmin), from each eighth group
  for (int64_t g = 0; g < G; ++g) {
    const int64_t u = w.unit(n0, g);
    __m256 ws;  // NB = 8: row r's scale in lane r; NB = 1: the row's in every lane (kQ6: its super-block's d)
    if constexpr (F == kQ6) {
      if (g % 8 == 0) d = NB == 8 ? _mm256_loadu_ps(w.ds + w.super(n0, g / 8)) : _mm256_set1_ps(w.ds[w.super(n0, g / 8)]);
      ws = d;
    } else if constexpr (F == kMX4) {
      if constexpr (NB == 8) {
        int64_t bytes;
        std::memcpy(&bytes, w.e + u, 8);
        const __m256i ei = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
        ws = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_slli_epi32(ei, 23)), tiny,
                              _mm256_castsi256_ps(_mm256_cmpeq_epi32(ei, _mm256_setzero_si256())));
      } else {
        ws = _mm256_set1_ps(e8m0_to_float(w.e[u]));
      }
    } else if constexpr (NB == 8) {  // the eight rows' (s, o) pairs lie side by side: split them
      const auto pairs = [](const float* p, __m256& first, __m256& second) {  // 8 pairs -> 8 firsts, 8 seconds
        const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
        first = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        second = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
      };
      __m256 o;
      if (w.sm) {  // s = sc * d, o = m * -dmin: the eight rows' bytes and super-block pairs side by side
        if (g % 8 == 0) pairs(w.ds + 2 * w.super(n0, g / 8), d, dmin);
        const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sm + 2 * u)),
                                           _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
        ws = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), d);
        o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b))), dmin);
      } else {
        pairs(w.so + 2 * u, ws, o);
      }
      for (int t = 0; t < TB; ++t) zero8[t] = _mm256_fmadd_ps(o, _mm256_set1_ps(x.xs[(t0 + t) * G + g]), zero8[t]);
    } else {
      float s, o;
      w.scale_offset(n0, g, s, o);
      ws = _mm256_set1_ps(s);
      for (int t = 0; t < TB; ++t) zero1[t] = std::fma(o, x.xs[(t0 + t) * G + g], zero1[t]);
    }
    __m256 wsx[TB];  // the rows' scales times x's powers of two (one product per lane, as the VNNI body's)
    for (int t = 0; t < TB; ++t) wsx[t] = _mm256_mul_ps(ws, _mm256_set1_ps(x.xp[(t0 + t) * G + g]));
    for (int p = 0; p < P; ++p) {
      const __m256i b = NB == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q + 16 * u + 32 * p)) : wide(w.q + 16 * u);
      __m256i lo = _mm256_and_si256(b, nib), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), nib);
      if constexpr (F == kMX4) {
        lo = _mm256_shuffle_epi8(lut, lo);
        hi = _mm256_shuffle_epi8(lut, hi);
      } else if constexpr (F == kQ6) {
        q6_high_bits<NB == 8>(w.hb + 8 * (u + 2 * p), lo, hi);
      } else if constexpr (F == kQ5) {  // + 16 where an element's fifth bit is set
        const __m256i words = NB == 8 ? _mm256_setr_m128i(_mm_set1_epi32(int32_t(w.qh[u + 2 * p])),
                                                          _mm_set1_epi32(int32_t(w.qh[u + 2 * p + 1])))
                                      : _mm256_set1_epi32(int32_t(w.qh[u]));
        const auto fifth = [&](__m256i which) {
          const __m256i bits = _mm256_and_si256(_mm256_shuffle_epi8(words, which), bitmask);
          return _mm256_and_si256(_mm256_cmpeq_epi8(bits, bitmask), sixteen);
        };
        lo = _mm256_or_si256(lo, fifth(even_bytes));
        hi = _mm256_or_si256(hi, fifth(odd_bytes));
      }
      const __m256i pair = _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);
      __m256i s16, s256;  // kQ6: each int16 lane's sixteen's scale sc, and 256 sc (lanes 0-3 of a half: elements 0-15)
      if constexpr (F == kQ6) {
        s256 = q6_scales_256<NB == 8>(w.sc + 2 * (u + 2 * p));
        s16 = _mm256_srai_epi16(s256, 8);
      }
      for (int t = 0; t < TB; ++t) {
        const int64_t tg = (t0 + t) * G + g;
        const int8_t* xb = x.x8.data() + tg * 64;
        const __m256 wp = NB == 8 ? _mm256_permutevar8x32_ps(wsx[t], pair) : wsx[t];
        __m256i l = _mm256_add_epi16(_mm256_maddubs_epi16(lo, wide(xb)), _mm256_maddubs_epi16(hi, wide(xb + 16)));
        __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(lo, wide(xb + 32)), _mm256_maddubs_epi16(hi, wide(xb + 48)));
        __m256i sum;
        if constexpr (F == kQ6) {  // (q - 32) x per four (within int16: 4 * 32 * 128), times sc in the madd
          l = _mm256_sub_epi16(l, wide(x.xb.data() + tg * 16));
          h = _mm256_sub_epi16(h, wide(x.xb.data() + tg * 16 + 8));
          sum = _mm256_add_epi32(_mm256_madd_epi16(l, s16), _mm256_madd_epi16(h, s256));
        } else {
          sum = _mm256_add_epi32(_mm256_madd_epi16(l, one), _mm256_madd_epi16(h, high));
        }
        if constexpr (F == kMX4) sum = _mm256_add_epi32(wide(x.xc.data() + tg * 4), sum);
        acc[p][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), wp, acc[p][t]);
      }
    }
  }
  for (int t = 0; t < TB; ++t) {
    alignas(32) float zero[8];
    _mm256_store_ps(zero, zero8[t]);
    for (int p = 0; p < P; ++p) {  // each row's four lanes, in the VNNI body's order
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[p][t]);
      for (int r = 0; r < (NB == 8 ? 2 : 1); ++r) {
        const float dot = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        y[(t0 + t) * w.stride() + n0 + 2 * p + r] = F == kMX4 || F == kQ6 ? dot : dot + (NB == 8 ? zero[2 * p + r] : zero1[t]);
      }
    }
  }
}
#endif

#if IGNIS_QGEMM_VNNI
// The nibble formats with AVX512-VNNI: nibbles_avx2's arithmetic four weight rows a 512-bit
// register (a 128-bit quarter each; a block of eight's group g is 128 bytes in a row), the
// values as unsigned bytes (kMX4: 2 e2m1 + 12 by a byte shuffle; kQ5: + 16 where the fifth bit
// is set; kQ6: the high two bits in bits 4-5) multiplied into x's two signed bytes by vpdpbusd,
// four products an int32 lane. Those are the lanes nibbles_avx2's vpmaddubsw + vpmaddwd sum,
// so its outputs bit for bit (tail rows, NB = 1, go through it). The biases (kMX4's + 12,
// kQ6's + 32) come back out through xc, kQ6's sixteens' scales multiply each lane in int32
// (its madd's products), and kQ4/kQ5 add o * sum(x) per group in a chain of their own.
// NB = 4 or 8.
constexpr int64_t kPrefetch = 2048;  // bytes ahead in a block's stream of nibbles

// kQ6's high two bits into bits 4-5 of four rows' low and high nibbles (a register quarter a
// row): hb is the first row's eight bytes for the group, the other three rows' following;
// each row's bytes go to both 64-bit lanes of its quarter, shifted to the elements they hold.
inline void q6_high_bits_512(const uint8_t* hb, __m512i& lo, __m512i& hi) {
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i t = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3),
                                             _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hb))));
  lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_srlv_epi64(t, _mm512_setr_epi64(0, 2, 0, 2, 0, 2, 0, 2)), bits45));
  hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_sllv_epi64(t, _mm512_setr_epi64(4, 2, 4, 2, 4, 2, 4, 2)), bits45));
}

// KS: kQ4/kQ5 with the K types' scales (Weights::sm). Rows n0 .. n0 + NB lie in one block of
// eight (Weights::unit), so group g's units are u0 + 8 g (+ 4 for the second four rows) and a
// super-block j's v0 + 8 j: every address steps by a constant, and each group's scales come
// from one load for all NB rows (this and the constant steps: a 1B model's Q4_K GEMMs at one
// row 25 -> 33 GB/s in sequence on a 2-core Zen 4, where they had been bound by instructions).
template <Format F, int NB, int TB, bool KS>
inline void bytes_vnni_of(const Weights& w, const Split& x, int64_t n0, int64_t t0, float* y) {
  static_assert(NB == 4 || NB == 8, "rows go four to a register");
  static_assert(F != kQ8, "kQ8 holds its values as they are");
  constexpr int C = NB / 4;
  const int64_t G = x.G, u0 = w.unit(n0, 0), v0 = w.super(n0, 0);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i nib = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  // lane -> its row (a quarter each), and its row's entry in pairs laid row by row
  const __m512i row = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i first = _mm512_add_epi32(row, row), four = _mm512_set1_epi32(4), eight = _mm512_set1_epi32(8);
  // kQ6: lane j of row r's quarter holds elements 8 j .. 8 j + 7, in sixteen j / 2: scale 2 r + j / 2
  const __m512i sixteens = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 tiny = _mm512_set1_ps(e8m0_to_float(0));
  const auto x16 = [](const void* p) { return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  // the NB rows' bytes of a group's per-row pair (sm, sc) or single (e): never past the block's
  const auto pairs_of = [](const void* p) {
    return NB == 8 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)) : _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  };
  const auto singles_of = [](const uint8_t* p) {
    int64_t v = 0;
    std::memcpy(&v, p, NB);
    return _mm_cvtsi64_si128(v);
  };
  // One row of x (a decode step's): x's power of two goes into the rows' scales before they
  // are spread over the lanes, one multiply a group instead of one a register (the same
  // products: a power of two times a float, in either order).
  constexpr bool one = TB == 1;
  __m512 acc[C][TB], zacc[TB];  // zacc: kQ4/kQ5's o * sum(x), row r's in lane 2 r + 1 (the pairs' layout)
  for (int t = 0; t < TB; ++t) {
    zacc[t] = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) acc[c][t] = _mm512_setzero_ps();
  }
  __m512 supers;  // the NB rows' super-block scales (KS: (d, -dmin) pairs row by row; kQ6: d)
  for (int64_t g = 0; g < G; ++g) {
    const int64_t u = u0 + 8 * g;
    if ((KS || F == kQ6) && g % 8 == 0) {
      const float* p = w.ds + (KS ? 2 : 1) * (v0 + g);  // (super(n0, g / 8) = v0 + g: eight units a super-block)
      constexpr int n = (KS ? 2 : 1) * NB;
      supers = n == 16 ? _mm512_loadu_ps(p) : n == 8 ? _mm512_castps256_ps512(_mm256_loadu_ps(p)) : _mm512_castps128_ps512(_mm_loadu_ps(p));
    }
    // The group's scales for all NB rows, once: what ws spreads over the rows' quarters
    // (kQ4/kQ5: the (s, o) pairs, kQ6: the super-block's d; at one row times x's power).
    __m512 spread;
    __m512i sc;  // kQ6: the NB rows' sixteens' scales, row by row
    if constexpr (F == kQ6) {
      spread = supers;
      sc = _mm512_cvtepi8_epi32(pairs_of(w.sc + 2 * u));
    } else if constexpr (F != kMX4) {
      if constexpr (KS) {  // s = sc * d, o = m * -dmin
        spread = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pairs_of(w.sm + 2 * u))), supers);
      } else {
        spread = NB == 8 ? _mm512_loadu_ps(w.so + 2 * u) : _mm512_castps256_ps512(_mm256_loadu_ps(w.so + 2 * u));
      }
      // o * sum(x) in the pairs' own lanes (row r's o at 2 r + 1): no spreading
      for (int t = 0; t < TB; ++t) zacc[t] = _mm512_fmadd_ps(spread, _mm512_set1_ps(x.xs[(t0 + t) * G + g]), zacc[t]);
    }
    if constexpr (F != kMX4 && one) spread = _mm512_mul_ps(spread, _mm512_set1_ps(x.xp[t0 * G + g]));
    __m512 ws[C];    // each row's scale (kQ6: its super-block's d; one: times x's power), in its quarter
    __m512i sc6[C];  // kQ6: each lane's sixteen's scale
    for (int c = 0; c < C; ++c) {
      if constexpr (F == kMX4) {
        const __m512i ei = _mm512_permutexvar_epi32(_mm512_add_epi32(row, c ? four : _mm512_setzero_si512()),
                                                    _mm512_cvtepu8_epi32(singles_of(w.e + u)));
        // 2^(e - 127) built in the exponent field; e = 0 (2^-127, a subnormal) apart
        ws[c] = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(ei, _mm512_setzero_si512()),
                                     _mm512_castsi512_ps(_mm512_slli_epi32(ei, 23)), tiny);
      } else if constexpr (F == kQ6) {
        ws[c] = _mm512_permutexvar_ps(_mm512_add_epi32(row, c ? four : _mm512_setzero_si512()), spread);
        sc6[c] = _mm512_permutexvar_epi32(_mm512_add_epi32(sixteens, c ? eight : _mm512_setzero_si512()), sc);
      } else {
        ws[c] = _mm512_permutexvar_ps(_mm512_add_epi32(first, c ? eight : _mm512_setzero_si512()), spread);
      }
    }
    for (int c = 0; c < C; ++c) {
      const uint8_t* q = w.q + 16 * (u + 4 * c);
      const __m512i b = _mm512_loadu_si512(q);
      // a long row's block (K 8192) left to the hardware's prefetch read at 23-26 GB/s on a
      // Zen 4, with this 30-32 (a block of K 2048 at ~31 either way)
      _mm_prefetch(reinterpret_cast<const char*>(q + kPrefetch), _MM_HINT_T0);
      __m512i lo = _mm512_and_si512(b, nib), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), nib);
      if constexpr (F == kMX4) {
        lo = _mm512_shuffle_epi8(lut, lo);
        hi = _mm512_shuffle_epi8(lut, hi);
      } else if constexpr (F == kQ5) {  // byte 16 r + i: bit i (even elements) or 16 + i (odd) of row r's word
        const __m128i words = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qh + u + 4 * c)),
                                               _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
        lo = _mm512_mask_add_epi8(lo, __mmask64(_mm_cvtsi128_si64(words)), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, __mmask64(_mm_extract_epi64(words, 1)), hi, sixteen);
      } else if constexpr (F == kQ6) {
        q6_high_bits_512(w.hb + 8 * (u + 4 * c), lo, hi);
      }
      for (int t = 0; t < TB; ++t) {
        const int64_t tg = (t0 + t) * G + g;
        const int8_t* xb = x.x8.data() + tg * 64;
        const __m512i h = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x16(xb + 32)), hi, x16(xb + 48));
        __m512i sum;  // 256 h + l
        if constexpr (F == kMX4 || F == kQ6) {  // l from the bias, beside h
          const __m512i l = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x16(x.xc.data() + tg * 4), lo, x16(xb)), hi, x16(xb + 16));
          sum = _mm512_add_epi32(l, _mm512_slli_epi32(h, 8));
        } else {  // no bias: l's products added into h's shifted sums (an add fewer)
          sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(h, 8), lo, x16(xb)), hi, x16(xb + 16));
        }
        if constexpr (F == kQ6) sum = _mm512_mullo_epi32(sum, sc6[c]);
        const __m512 scale = one && F != kMX4 ? ws[c] : _mm512_mul_ps(ws[c], _mm512_set1_ps(x.xp[tg]));
        acc[c][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[c][t]);
      }
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int c = 0; c < C; ++c) {  // each row's four lanes, in nibbles_avx2's order
      alignas(64) float lanes[16], zero[16];
      _mm512_store_ps(lanes, acc[c][t]);
      _mm512_store_ps(zero, zacc[t]);
      for (int r = 0; r < 4; ++r) {
        const float dot = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        y[(t0 + t) * w.stride() + n0 + 4 * c + r] = F == kMX4 || F == kQ6 ? dot : dot + zero[2 * (4 * c + r) + 1];
      }
    }
}

// Rows n0 .. n0 + NB against TB rows of x from t0.
template <Format F, int NB, int TB>
inline void bytes_vnni(const Weights& w, const Split& x, int64_t n0, int64_t t0, float* y) {
  if ((F == kQ4 || F == kQ5) && w.sm) return bytes_vnni_of<F, NB, TB, true>(w, x, n0, t0, y);
  bytes_vnni_of<F, NB, TB, false>(w, x, n0, t0, y);
}
#endif

#if IGNIS_QGEMM_INT16_X && (!IGNIS_QGEMM_AVX512 || IGNIS_QGEMM_VNNI)
#define IGNIS_QGEMM_MANY 1
#include "quant_gemm_many.h"
#else
#define IGNIS_QGEMM_MANY 0
#endif

// Weight rows [n0, n1) against every row of x. Nibble formats on AVX-512: eight weight rows
// against two rows of x at a time, or four against four (each group's table and lookups then
// serve four rows of x: the lookups, not the FMAs, are most of the work). kQ8, and every
// format below AVX-512: one weight row against up to four (AVX-512) or two rows of x, rows
// of x going over a tile of weight rows so that both stay in the first-level cache.
template <Format F>
inline void rows(const Weights& w, const Split& x, int64_t n0, int64_t n1, int64_t T, float* y) {
  int64_t t0 = 0;
#if IGNIS_QGEMM_VNNI
  if constexpr (F != kQ8) {
    for (int64_t n = n0; n < n1; n += (n + 8 <= n1 ? 8 : 1)) {
      int64_t t = 0;
      if (n + 8 > n1) {  // a tail row (tiles start at a block of eight: Weights::unit), the same sums
        for (; t + 2 <= T; t += 2) nibbles_avx2<F, 1, 2>(w, x, n, t, y);
        if (T - t == 1) nibbles_avx2<F, 1, 1>(w, x, n, t, y);
        continue;
      }
      for (; t + 4 <= T; t += 4) {
        bytes_vnni<F, 4, 4>(w, x, n, t, y);
        bytes_vnni<F, 4, 4>(w, x, n + 4, t, y);
      }
      for (; t + 2 <= T; t += 2) bytes_vnni<F, 8, 2>(w, x, n, t, y);
      if (T - t == 1) bytes_vnni<F, 8, 1>(w, x, n, t, y);
    }
    return;
  } else  // (the rest is not instantiated for them)
#endif
#if IGNIS_QGEMM_INT16_X
  if constexpr (F == kQ6 || (!IGNIS_QGEMM_AVX512 && F != kQ8)) {
    for (int64_t n = n0; n < n1; n += (n + 8 <= n1 ? 8 : 1)) {
      const bool eight = n + 8 <= n1;  // (tiles start at a block of eight: Weights::unit)
      int64_t t = 0;
      for (; t + 2 <= T; t += 2) eight ? nibbles_avx2<F, 8, 2>(w, x, n, t, y) : nibbles_avx2<F, 1, 2>(w, x, n, t, y);
      if (T - t == 1) eight ? nibbles_avx2<F, 8, 1>(w, x, n, t, y) : nibbles_avx2<F, 1, 1>(w, x, n, t, y);
    }
    return;
  } else  // (the rest is not instantiated for them)
#endif
  {
#if IGNIS_QGEMM_AVX512
  if constexpr (F != kQ8) {
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) {
      int64_t t = 0;
      for (; t + 4 <= T; t += 4) {
        block<F, 4, 4>(w, x, n, t, y);
        block<F, 4, 4>(w, x, n + 4, t, y);
      }
      for (; t + 2 <= T; t += 2) block<F, 8, 2>(w, x, n, t, y);
      if (T - t == 1) block<F, 8, 1>(w, x, n, t, y);
    }
    n0 = n;  // the tile's last rows, one at a time below
  }
  for (; t0 + 4 <= T; t0 += 4)
    for (int64_t n = n0; n < n1; ++n) block<F, 1, 4>(w, x, n, t0, y);
#endif
  for (; t0 + 2 <= T; t0 += 2)
    for (int64_t n = n0; n < n1; ++n) block<F, 1, 2>(w, x, n, t0, y);
  if (T - t0 == 1)
    for (int64_t n = n0; n < n1; ++n) block<F, 1, 1>(w, x, n, t0, y);
  }
}

// Weight rows a tile of rows() walks (the nibble formats' blocks of eight: Weights::unit).
constexpr int64_t kTileRows = 8;

template <Format F>
inline void run(const Weights& w, const float* x, int64_t T, float* y) {
#if IGNIS_QGEMM_MANY
  if constexpr (F == kQ4 || F == kQ6) {
    if (many_rows(w, T)) {  // whole blocks of eight rows there; a tail of N % 8 rows below
#if IGNIS_QGEMM_AMX
      const Split8 x8(x, T, w.K, F, w.N >= 16 && amx_ready());  // (the tiles take pairs of blocks)
#else
      const Split8 x8(x, T, w.K, F);
#endif
      const int64_t blocks = w.N / 8, tail = blocks * 8;
      // spans of blocks the body takes together (VNNI: pairs, many16_vnni), whatever the
      // threads' split: a row's sums never depend on the step's row count
      const int64_t span = IGNIS_QGEMM_VNNI ? 2 : 1, spans = (blocks + span - 1) / span;
      const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / (8 * span * w.K * T));
      at::parallel_for(0, spans, grain, [&](int64_t b0, int64_t b1) {
        many_rows_of<F>(w, x8, 8 * span * b0, std::min(8 * span * b1, tail), y);
      });
      if (tail < w.N) rows<F>(w, Split(x, T, w.K, F), tail, w.N, T, y);
      return;
    }
  }
#endif
  const Split xs(x, T, w.K, F);
  // Enough weights per task to be worth a thread; a small GEMM stays on this one.
  const int64_t grain =
      std::max<int64_t>(kTileRows, (int64_t(1) << 18) / std::max<int64_t>(1, w.K * T)) / kTileRows * kTileRows;
  // Over tiles, so that a thread's rows start at a tile (the layout's blocks of eight).
  const int64_t tiles = (w.N + kTileRows - 1) / kTileRows;
  at::parallel_for(0, tiles, grain / kTileRows, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) rows<F>(w, xs, b * kTileRows, std::min((b + 1) * kTileRows, w.N), T, y);
  });
}

// y [T, N] fp32 = x [T, K] fp32 @ W^T (K a multiple of 32; y's rows ldy apart where set), output
// rows split over torch's threads.
inline void gemm(const Weights& w, const float* x, int64_t T, float* y) {
  switch (w.format) {
    case kQ4: return run<kQ4>(w, x, T, y);
    case kQ5: return run<kQ5>(w, x, T, y);
    case kQ6: return run<kQ6>(w, x, T, y);
    case kQ8: return run<kQ8>(w, x, T, y);
    case kMX4: return run<kMX4>(w, x, T, y);
  }
}

}  // namespace qgemm
