// quant_gemm.h's AVX-512 bodies on a CPU without AVX-512: SIMDe (Debian's libsimde-dev)
// stands in for the intrinsics, so an AVX2 machine checks what an AVX-512 one runs (its
// VNNI byte body included, -DIGNIS_QGEMM_VNNI=1). Built and run by
// tests/kernels/test_quant_gemm_emulated.py; the host compiles for AVX2 (SIMDe's emulation
// uses it where it can). Each format's weights are drawn at random in its layout, y = x W^T
// is checked against a float64 product of the weights as the format defines them, and each
// row of x alone must give that row's result bit for bit. Prints one line per case (with a
// hash of y: the AVX2 and VNNI byte bodies must agree bit for bit), exits 1 on any
// difference beyond the tolerance.
#include <immintrin.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

// What SIMDe 0.7.4 lacks (a sum's order does not matter here: each row's results are
// compared with the same build's).
static inline simde__m512 ignis_cvtepi32_ps(simde__m512i a) {
  simde__m512_private r;
  simde__m512i_private v = simde__m512i_to_private(a);
  for (int i = 0; i < 16; ++i) r.f32[i] = float(v.i32[i]);
  return simde__m512_from_private(r);
}
static inline simde__m512i ignis_cvtepu8_epi32(simde__m128i a) {
  simde__m512i_private r;
  simde__m128i_private v = simde__m128i_to_private(a);
  for (int i = 0; i < 16; ++i) r.i32[i] = v.u8[i];
  return simde__m512i_from_private(r);
}
static inline simde__m512i ignis_cvtepi8_epi32(simde__m128i a) {
  simde__m512i_private r;
  simde__m128i_private v = simde__m128i_to_private(a);
  for (int i = 0; i < 16; ++i) r.i32[i] = v.i8[i];
  return simde__m512i_from_private(r);
}
static inline float ignis_reduce_add_ps(simde__m512 a) {
  simde__m512_private v = simde__m512_to_private(a);
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v.f32[i];
  return s;
}
#undef _mm512_madd_epi16  // SIMDe 0.7.4's alias takes the masked form's four arguments
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define _mm512_cvtepi32_ps ignis_cvtepi32_ps
#define _mm512_cvtepu8_epi32 ignis_cvtepu8_epi32
#define _mm512_cvtepi8_epi32 ignis_cvtepi8_epi32
#define _mm512_reduce_add_ps ignis_reduce_add_ps

#ifndef IGNIS_QGEMM_AVX512
#define IGNIS_QGEMM_AVX512 1  // (0: the host's AVX2 bodies, checked the same way)
#endif
#include "../../ignis_kernels/cpu/quant_gemm.h"

#include <cstdio>
#include <random>

using qgemm::Format;

namespace {

// Rows from which Q4_K (its own scales) and Q6_K take the many-row body, where the build has one.
#if IGNIS_QGEMM_MANY
constexpr int64_t kMany = qgemm::kManyRows;
#else
constexpr int64_t kMany = int64_t(1) << 40;
#endif

struct Case {
  Format f;
  int64_t N, K;
  std::vector<uint8_t> q;
  std::vector<uint32_t> qh;
  std::vector<float> so;
  std::vector<uint16_t> d;
  std::vector<uint8_t> e;
  std::vector<uint8_t> sm;  // the K types' scales, in place of so
  std::vector<float> ds;    // (and kQ6's super-block d)
  std::vector<uint8_t> hb;  // kQ6's high bits and sixteens' scales
  std::vector<int8_t> sc;

  qgemm::Weights weights() const {
    return {f, q.data(), qh.empty() ? nullptr : qh.data(), so.empty() ? nullptr : so.data(),
            d.empty() ? nullptr : d.data(), e.empty() ? nullptr : e.data(), N, K,
            sm.empty() ? nullptr : sm.data(), ds.empty() ? nullptr : ds.data(), hb.empty() ? nullptr : hb.data(),
            sc.empty() ? nullptr : sc.data()};
  }

  // The K types' scales as the (scale, offset) pairs they stand for.
  Case with_pairs() const {
    Case c = *this;
    const qgemm::Weights w = weights();
    c.sm.clear(), c.ds.clear();
    c.so.resize(N * K / qgemm::kGroup * 2);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < K / qgemm::kGroup; ++g) w.scale_offset(n, g, c.so[2 * w.unit(n, g)], c.so[2 * w.unit(n, g) + 1]);
    return c;
  }

  // W[n, k] as the format defines it (quant_gemm.h's header).
  double at(int64_t n, int64_t k) const {
    const qgemm::Weights w = weights();
    const int64_t g = k / qgemm::kGroup, i = (k % qgemm::kGroup) / 2, G = K / qgemm::kGroup;
    if (f == qgemm::kQ8) return double(int8_t(q[n * K + k])) * qgemm::half_to_float(d[n * G + g]);
    if (f == qgemm::kQ6) return double(w.q6(n, k)) * double(w.q6_scale(n, k));
    const uint8_t byte = q[16 * w.unit(n, g) + i];
    int v = k % 2 ? byte >> 4 : byte & 15;
    if (f == qgemm::kMX4) return double(qgemm::kE2M1[v]) * qgemm::e8m0_to_float(e[w.unit(n, g)]);
    if (f == qgemm::kQ5) v |= int((qh[w.unit(n, g)] >> (k % 2 ? 16 + i : i)) & 1) << 4;
    float s, o;
    w.scale_offset(n, g, s, o);
    return double(v) * s + o;
  }
};

Case random_case(Format f, int64_t N, int64_t K, std::mt19937& rng, bool k_scales = false) {
  Case c{f, N, K};
  const int64_t G = K / qgemm::kGroup;
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  c.q.resize(f == qgemm::kQ8 ? N * K : N * K / 2);
  for (auto& b : c.q) b = uint8_t(byte(rng));
  if (f == qgemm::kQ8) {
    c.d.resize(N * G);
    for (auto& h : c.d) h = c10::Half(std::abs(normal(rng)) + 1e-3f).x;
  } else if (f == qgemm::kMX4) {
    c.e.resize(N * G);
    std::uniform_int_distribution<int> exponent(118, 128);
    for (auto& x : c.e) x = uint8_t(exponent(rng));
    c.e[0] = 0;  // e8m0's 0 (2^-127) once
  } else if (f == qgemm::kQ6) {  // Q6_K's int8 scale per 16, fp16 d per 256
    std::uniform_int_distribution<int> scale(-128, 127);
    c.hb.resize(N * G * 8);
    for (auto& b : c.hb) b = uint8_t(byte(rng));
    c.sc.resize(N * G * 2);
    for (auto& v : c.sc) v = int8_t(scale(rng));
    c.ds.resize(N * G / 8);
    for (auto& v : c.ds) v = float(c10::Half(std::abs(normal(rng)) / 64));
  } else if (k_scales) {  // six-bit (sc, m), fp16 (d, dmin) per eight groups, as Q4_K / Q5_K hold them
    std::uniform_int_distribution<int> six(0, 63);
    c.sm.resize(N * G * 2);
    for (auto& b : c.sm) b = uint8_t(six(rng));
    c.ds.resize(N * G / 8 * 2);
    for (int64_t v = 0; v < N * G / 8; ++v)
      c.ds[2 * v] = float(c10::Half(std::abs(normal(rng)) / 32)), c.ds[2 * v + 1] = -float(c10::Half(std::abs(normal(rng)) / 32));
  } else {
    c.so.resize(N * G * 2);
    for (int64_t u = 0; u < N * G; ++u) c.so[2 * u] = std::abs(normal(rng)), c.so[2 * u + 1] = normal(rng);
  }
  if (f == qgemm::kQ5) {
    c.qh.resize(N * G);
    for (auto& h : c.qh) h = uint32_t(rng());
  }
  return c;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  int failures = 0;
  for (Format f : {qgemm::kQ4, qgemm::kQ5, qgemm::kQ6, qgemm::kQ8, qgemm::kMX4})
    for (int64_t N : {1, 7, 8, 12, 64, 100})
      for (int64_t K : {64, 256, 512})
        for (bool k_scales : {false, true}) {
        if (k_scales && (K % 256 || (f != qgemm::kQ4 && f != qgemm::kQ5))) continue;
        if (f == qgemm::kQ6 ? K == 64 || k_scales : !k_scales && K == 512) continue;  // (kQ6: K of 256s)
        const Case c = random_case(f, N, K, rng, k_scales);
        const qgemm::Weights w = c.weights();
        const Case paired = k_scales ? c.with_pairs() : Case{};
        // 20 and 37 rows: the many-row body's (quant_gemm_many.h), where it serves the format
        // (37: many16_vnni's 32, 4 and 1 rows of x at a time, against 16 for the last 16 alone)
        const bool many_format = (f == qgemm::kQ4 && k_scales) || f == qgemm::kQ6;
        for (int64_t T : {1, 2, 3, 4, 5, 9, 20, 37}) {
          if (T >= 20 && !many_format) continue;
          const bool many = T >= kMany;
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> x(T * K), y(T * N), one(N);
          for (auto& v : x) v = normal(rng);
          x[0] = 0.0f;  // a zero and an exactly representable one
          x[1] = 1.0f;
          qgemm::gemm(w, x.data(), T, y.data());
          double worst = 0.0, top = 0.0;  // top: the largest sum of |W x| (x's rounding scales with it)
          bool alone = true;
          std::vector<double> want(T * N);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
              double s = 0.0, a = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                s += c.at(n, k) * double(x[t * K + k]);
                a += std::abs(c.at(n, k) * double(x[t * K + k]));
              }
              want[t * N + n] = s;
              top = std::max(top, a);
            }
          for (int64_t i = 0; i < T * N; ++i) worst = std::max(worst, std::abs(double(y[i]) - want[i]));
          bool exact8 = true;  // the many-row bodies: the product of their own 8-bit x, to fp32's rounding
          if (many) {  // (8-bit x from kManyRows rows on: any such step gives a row the same sums)
            std::vector<float> fewer(kMany * N);
            qgemm::gemm(w, x.data() + (T - kMany) * K, kMany, fewer.data());
            alone = std::memcmp(fewer.data(), y.data() + (T - kMany) * N, 4 * fewer.size()) == 0;
#if IGNIS_QGEMM_MANY
            const qgemm::Split8 x8(x.data(), T, K, f);
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = 0; n < N / 8 * 8; ++n) {  // (a tail of N % 8 rows: the exact body)
                double s = 0.0, a = 0.0;
                for (int64_t k = 0; k < K; ++k) {
                  const int64_t tg = x8.at(t, k / 32), i = k % 32;  // q: the 16 even elements, then the odd
                  const int up = IGNIS_QGEMM_VNNI ? x8.up32[tg] : int(x8.up[tg]);
                  const double v = std::ldexp(double(x8.q[32 * tg + (i % 2) * 16 + i / 2]) * x8.d[t * x8.S + k / 256], up);
                  s += c.at(n, k) * v;
                  a += std::abs(c.at(n, k) * v);
                }
                exact8 = exact8 && std::abs(double(y[t * N + n]) - s) <= 1e-5 * a + 1e-30;
              }
#endif
          } else {
            for (int64_t t = 0; t < T; ++t) {
              qgemm::gemm(w, x.data() + t * K, 1, one.data());
              for (int64_t n = 0; n < N; ++n) alone = alone && one[n] == y[t * N + n];
            }
          }
          bool same_as_pairs = true;  // the K types' scales give the pairs' outputs, bit for bit
          if (k_scales && !many) {  // (the pairs have no many-row body)
            std::vector<float> yp(T * N);
            qgemm::gemm(paired.weights(), x.data(), T, yp.data());
            same_as_pairs = std::memcmp(yp.data(), y.data(), 4 * T * N) == 0;
          }
          // x as int16 (kQ8, kQ6; everything with VNNI or on AVX2): within 2^-14 of a group's largest |x|
          const bool int16 = !IGNIS_QGEMM_AVX512 || IGNIS_QGEMM_VNNI || f == qgemm::kQ8 || f == qgemm::kQ6;
          const double rtol = many && N >= 8 ? 1e-2 : int16 ? 3e-4 : 1e-5;  // (a tail of N % 8 rows: the exact body)
          const bool ok = worst <= rtol * top && alone && same_as_pairs && exact8;
          failures += !ok;
          uint64_t hash = 1469598103934665603ull;  // FNV-1a of y's bits: equal outputs across builds
          for (float v : y) {
            uint32_t bits;
            std::memcpy(&bits, &v, 4);
            hash = (hash ^ bits) * 1099511628211ull;
          }
          std::printf("%s format %d%s N %ld K %ld T %ld: worst %.3g of %.3g, y %016llx%s%s%s\n", ok ? "ok" : "FAIL", int(f),
                      k_scales ? "k" : "", long(N), long(K), long(T), worst, top, static_cast<unsigned long long>(hash),
                      alone ? "" : ", a row alone differs", same_as_pairs ? "" : ", the pairs' outputs differ",
                      exact8 ? "" : ", not its 8-bit x's product");
        }
      }
  std::printf("avx512 %d vnni %d: %d failures\n", IGNIS_QGEMM_AVX512, IGNIS_QGEMM_VNNI, failures);
  return failures ? 1 : 0;
}
