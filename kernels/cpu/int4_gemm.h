// Int4 weight-only GEMM over a layout of ignis's own: y [T, N] = x [T, K] @ W^T, fp32 in and
// out, for the few rows of decode steps (and anything under the widening threshold).
//
//   W[n, k] = q[n, k] * s[n, g] + o[n, g],  g = k / 32
//   q:  nibbles [N, K/2] uint8: byte i of a row holds element 2i (low nibble) and 2i + 1 (high)
//   so: [N, K/32, 2] fp32: (s, o) per row and group of 32
//
// It replaces torch's int4 GEMM, whose packing is private and differs between CPUs: this one
// reads what ignis/model/packed.py's Int4Linear wrote, on every CPU. Activations stay fp32
// (torch's takes bf16). Per row and group: sum_k W x = s * sum_k q x + o * sum_k x,
// so x is split once per call into its even and odd elements (the nibbles' order) and its
// group sums, and the inner loop widens 32 nibbles of each of several weight rows and
// multiplies them into up to two rows of x at once. AVX-512 (a 16-entry table of q * s + o
// per group, looked up by the nibbles: fp32 throughout) and AVX2+FMA bodies, portable loops
// otherwise.
//
// AVX2 has no such lookup, and widening nibbles to fp32 (convert, scale, FMA) costs three
// floating-point operations per eight weights. There x is also held as int16 per group of 32,
// scaled by a power of two (x = xq * 2^e, |xq| < 2^15: a relative error under 2^-15 of the
// group's largest |x|, some 250x finer than bf16's), the nibbles are multiplied into it with
// integer multiply-adds (16 products an instruction, exact in int32), and each group's sum
// is scaled once: s * 2^e * sum_k q xq. A power of two keeps x's exact values where they fit
// (the identity's ones, zeros) and the scaling exact.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace int4 {

constexpr int64_t kGroup = 32;

struct Weights {
  const uint8_t* q;   // [N, K/2]
  const float* so;    // [N, G, 2]
  int64_t N, K;
};

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define IGNIS_INT4_INT16_X 1
#endif

// x split as the nibbles are: xe [T, K/2] (x[2i]), xo [T, K/2] (x[2i+1]), xs [T, G] (group
// sums, from fp32 x). AVX2: per group, the 16 even then the 16 odd elements as int16 (xq
// [T, K]) and the power of two that scales them (xp [T, G]) in place of xe and xo.
struct Split {
  std::vector<float> xe, xo, xs;
#if IGNIS_INT4_INT16_X
  std::vector<int16_t> xq;
  std::vector<float> xp;
#endif
  int64_t T, K2, G;

  Split(const float* x, int64_t T_, int64_t K) : T(T_), K2(K / 2), G(K / kGroup) {
    xs.assign(T * G, 0.0f);
#if IGNIS_INT4_INT16_X
    xq.resize(T * K);
    xp.resize(T * G);
#else
    xe.resize(T * K2);
    xo.resize(T * K2);
#endif
    for (int64_t t = 0; t < T; ++t) {
      const float* r = x + t * K;
#if IGNIS_INT4_INT16_X
      const __m256 sign = _mm256_set1_ps(-0.0f);
      const __m256i evens_first = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
      for (int64_t g = 0; g < G; ++g) {
        const float* v = r + g * kGroup;
        __m256 f[4];
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < 4; ++j) {
          f[j] = _mm256_loadu_ps(v + 8 * j);
          m = _mm256_max_ps(m, _mm256_andnot_ps(sign, f[j]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
        // The smallest 2^e with amax / 2^e < 2^15 (rounding may reach 32768: packs saturates).
        int e = 0;
        if (amax > 0.0f) {
          std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1): amax < 2^e
          e -= 15;
        }
        const __m256 scale = _mm256_set1_ps(std::ldexp(1.0f, -e));
        __m256i i[4];
        for (int j = 0; j < 4; ++j)  // rounded to nearest; each 8 as its 4 even, then 4 odd
          i[j] = _mm256_permutevar8x32_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(f[j], scale)), evens_first);
        const __m256i a = _mm256_packs_epi32(i[0], i[1]), b = _mm256_packs_epi32(i[2], i[3]);  // [evens | odds]
        int16_t* out = xq.data() + t * K + g * kGroup;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(a, b, 0x31));
        xp[t * G + g] = std::ldexp(1.0f, e);
      }
#else
      for (int64_t i = 0; i < K2; ++i) {
        xe[t * K2 + i] = r[2 * i];
        xo[t * K2 + i] = r[2 * i + 1];
      }
#endif
      for (int64_t g = 0; g < G; ++g) {
        float s = 0.0f;
        for (int64_t k = 0; k < kGroup; ++k) s += r[g * kGroup + k];
        xs[t * G + g] = s;
      }
    }
  }
};

// NB weight rows from n0 against TB rows of x from t0: y[t0 + t, n0 + r]. Several weight
// rows at once keep NB x TB independent accumulators in flight (one row alone is a chain of
// dependent FMAs, latency-bound).
template <int NB, int TB>
inline void block(const Weights& w, const Split& x, int64_t n0, int64_t t0, float* y) {
  const int64_t K2 = x.K2, G = x.G;
  float zero[NB][TB] = {};
#if !defined(__AVX512F__)  // (the AVX-512 body's table holds the offsets)
  for (int r = 0; r < NB; ++r) {  // the o * sum(x) terms
    const float* so = w.so + (n0 + r) * G * 2;
    for (int t = 0; t < TB; ++t) {
      const float* xs = x.xs.data() + (t0 + t) * G;
      float z = 0.0f;
      for (int64_t g = 0; g < G; ++g) z += so[2 * g + 1] * xs[g];
      zero[r][t] = z;
    }
  }
#endif
  float dot[NB][TB];
#if defined(__AVX512F__)
  // Each group's 16 possible weights q * s + o as a table, looked up by the nibbles
  // (vpermps): no int-to-float conversion, and the offset comes with the weight.
  __m512 acc[NB][TB];
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(15);
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t g = 0; g < G; ++g) {
    __m512 e[TB], o[TB];
    for (int t = 0; t < TB; ++t) {
      e[t] = _mm512_loadu_ps(x.xe.data() + (t0 + t) * K2 + 16 * g);
      o[t] = _mm512_loadu_ps(x.xo.data() + (t0 + t) * K2 + 16 * g);
    }
    for (int r = 0; r < NB; ++r) {
      const uint8_t* q = w.q + (n0 + r) * K2 + 16 * g;
      const float* so = w.so + ((n0 + r) * G + g) * 2;
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(so[0]), _mm512_set1_ps(so[1]));
      const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(b, low), table);
      const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(hi, o[t], _mm512_fmadd_ps(lo, e[t], acc[r][t]));
    }
  }
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) dot[r][t] = _mm512_reduce_add_ps(acc[r][t]);
#elif IGNIS_INT4_INT16_X
  __m256 acc[NB][TB];
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi16(15);
  const int64_t K = 2 * K2;
  for (int64_t g = 0; g < G; ++g) {
    __m256i e[TB], o[TB];  // x's 16 even and 16 odd elements of the group, int16
    __m256 p[TB];
    for (int t = 0; t < TB; ++t) {
      const int16_t* xq = x.xq.data() + (t0 + t) * K + g * kGroup;
      e[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      o[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
      p[t] = _mm256_set1_ps(x.xp[(t0 + t) * G + g]);
    }
    for (int r = 0; r < NB; ++r) {
      const uint8_t* q = w.q + (n0 + r) * K2 + 16 * g;
      // 16 bytes, one a 16-bit lane: the low nibbles are the even elements, the high the odd
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      const __m256i lo = _mm256_and_si256(b, low), hi = _mm256_srli_epi16(b, 4);
      const __m256 s = _mm256_set1_ps(w.so[((n0 + r) * G + g) * 2]);
      for (int t = 0; t < TB; ++t) {
        // 15 * 32767 * 2 per int32 lane, 16 lanes summed into 8: far inside int32
        const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo, e[t]), _mm256_madd_epi16(hi, o[t]));
        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), p[t]), s, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) {
      __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[r][t]), _mm256_extractf128_ps(acc[r][t], 1));
      v = _mm_add_ps(v, _mm_movehl_ps(v, v));
      dot[r][t] = _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
    }
#else
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) dot[r][t] = 0.0f;
  for (int r = 0; r < NB; ++r) {
    const uint8_t* q = w.q + (n0 + r) * K2;
    for (int64_t g = 0; g < G; ++g) {
      const float s = w.so[((n0 + r) * G + g) * 2];
      float wl[16], wh[16];
      for (int i = 0; i < 16; ++i) {
        wl[i] = float(q[16 * g + i] & 15) * s;
        wh[i] = float(q[16 * g + i] >> 4) * s;
      }
      for (int t = 0; t < TB; ++t) {
        const float* e = x.xe.data() + (t0 + t) * K2 + 16 * g;
        const float* o = x.xo.data() + (t0 + t) * K2 + 16 * g;
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (int i = 0; i < 16; ++i) part += wl[i] * e[i] + wh[i] * o[i];
        dot[r][t] += part;
      }
    }
  }
#endif
  for (int r = 0; r < NB; ++r)
    for (int t = 0; t < TB; ++t) y[(t0 + t) * w.N + n0 + r] = dot[r][t] + zero[r][t];
}

// Weight rows x rows of x per block: as many accumulators as the registers hold (AVX-512: 32
// registers, 8 x 2; AVX2: 16, 4 x 2: 8 accumulators, 4 x, 4 weights).
#if defined(__AVX512F__)
constexpr int kWeightRows = 8;
#else
constexpr int kWeightRows = 4;
#endif
constexpr int kRows = 2;

// Weight rows [n0, n1) against every row of x.
template <int NB>
inline void rows(const Weights& w, const Split& x, int64_t n0, int64_t T, float* y) {
  int64_t t0 = 0;
#if defined(__AVX512F__)
  // Four rows of x against half the weight rows at a time: each group's table and lookups
  // then serve four rows instead of two (the lookups, not the FMAs, are most of the work),
  // so a step of 4-16 rows (a few sequences, a speculative draft) costs less per row. Each
  // output is still the same sum in the same order: results do not depend on T.
  if constexpr (NB % 2 == 0) {
    for (; t0 + 4 <= T; t0 += 4) {
      block<NB / 2, 4>(w, x, n0, t0, y);
      block<NB / 2, 4>(w, x, n0 + NB / 2, t0, y);
    }
  }
#endif
  for (; t0 + kRows <= T; t0 += kRows) block<NB, kRows>(w, x, n0, t0, y);
  if (T - t0 == 1) block<NB, 1>(w, x, n0, t0, y);
}

// y [T, N] fp32 = x [T, K] fp32 @ W^T (K a multiple of 32), output rows split over torch's threads.
inline void gemm(const Weights& w, const float* x, int64_t T, float* y) {
  const Split xs(x, T, w.K);
  // Enough weights per task to be worth a thread (a multiple of the weight-row block); a
  // small GEMM stays on this one.
  const int64_t grain = std::max<int64_t>(kWeightRows, (int64_t(1) << 18) / std::max<int64_t>(1, w.K * T)) /
                        kWeightRows * kWeightRows;
  at::parallel_for(0, w.N, grain, [&](int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + kWeightRows <= n1; n += kWeightRows) rows<kWeightRows>(w, xs, n, T, y);
    for (; n < n1; ++n) rows<1>(w, xs, n, T, y);
  });
}

}  // namespace int4
