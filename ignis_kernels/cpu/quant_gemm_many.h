// Steps of many rows (kManyRows and more: a batch of decoding sequences) through Q4_K's and
// Q6_K's own values on AVX2 CPUs without AVX-512 and on AVX-512 ones with VNNI, in place of a
// kept fp16 / bf16 copy. Included by quant_gemm.h inside namespace qgemm, where
// IGNIS_QGEMM_INT16_X and either not IGNIS_QGEMM_AVX512 or IGNIS_QGEMM_VNNI.
//
// The few-row body (nibbles_avx2) keeps x at 14 bits per group of 32 (two bytes a value) and
// scales every group's int32 sums in fp32: at one row it waits on memory, but from a few rows
// on that arithmetic is the whole cost (83 GFLOP/s on a 2-core Zen 3, below fbgemm's fp16
// GEMM). Here x is 8-bit, each group of 32 on its super-block's scale times a power of two
// (Split8), so the weights' integer scales (Q4_K's 6-bit sc per 32, Q6_K's int8 per 16),
// shifted by that power, go into vpmaddwd and a super-block's products sum exactly in int32:
// per 32 weights and row of x two vpmaddubsw, one vpmaddwd, a shift and two adds; fp32 once
// per super-block (d * x's d, and Q4_K's -dmin * sum m * sum x from each group's sum of x's
// bytes). A pair of weight rows a register (a 128-bit half each, as nibbles_avx2), decoded
// once for six rows of x. Every output is the same sum in the same order whatever the step's
// row count (from kManyRows), so a sequence's results do not depend on which others share
// its steps there. With AVX512-VNNI (many_vnni) four rows go to a register and vpdpbusd
// sums each int32 lane's eight products (vpmaddubsw + vpmaddwd's lanes: the same integers),
// which vpdpwssd then scales by the weights' shifted integer scale into the lane's sum, two
// groups an instruction (the same int32 sums as AVX2's vpmaddwd and adds). Pairs of blocks
// of eight rows take many16_vnni, a row an int32 lane, up to 32 rows of x at a time.

#pragma once

constexpr int64_t kSuper = 8 * kGroup;
// Rows from which a step takes this body: one user's decode and speculative steps (up to
// nine rows) keep nibbles_avx2's 14-bit x; from here the 8-bit one is the faster, at every
// row count (a 2048-row prefill chunk too: 2-4x the weights widened to fp32 for the step).
constexpr int64_t kManyRows = 16;

// Whether a GEMM goes through many_avx2: Q4_K / Q5_K's scales kept as bytes (sm) or Q6_K,
// K a multiple of a super-block, and rows of x enough.
inline bool many_rows(const Weights& w, int64_t T) {
  return T >= kManyRows && w.K % kSuper == 0 && ((w.format == kQ4 && w.sm) || w.format == kQ6);
}

// How far a group of 32 may scale its x up within its super-block (below): 2^7 for Q4_K, whose
// super-block sums stay under 2^31 at 8 * 2 * (2 * 2 * 15 * 127) * (63 * 2^7); 2^5 for Q6_K
// (8 * 2 * (4 * 32 * 127) * (128 * 2^5)).
constexpr int many_shift(Format f) { return f == kQ6 ? 5 : 7; }

// x as int8 per group of 32 on a super-block's scale: with m the super-block's largest |x| and
// e in [0, many_shift] the largest with the group's largest |x| * 2^e <= m, q = round(x * 2^e *
// 127 / m), x = q * 2^-e * m / 127. A group of small values beside one of large ones keeps 8
// bits of its own (one scale per 256 cost SmolLM2's down projections 0.3% perplexity), and
// the 2^(shift - e) goes into the weights' integer scale (a shift of vpmaddwd's operand), so a
// super-block still sums in int32. Per group (at(t, g): rows ld apart): q [T, G, 32] (the 16
// even elements, then the 16 odd ones: the nibbles' order), up [T, G] = shift - e (the left
// shift), kQ4: sums [T, G], each group's sum of q * 2^(shift - e) (fp32: exact); kQ6: bias
// [T, G, 8], 32 times each int16 lane's four q (elements 4j .. 4j + 3 of a group). Per
// super-block: d [T, S] = m / 127 / 2^shift (the sums' unit). (Group-major, a body's rows of x at constant offsets from
// one address, measured no faster with VNNI and 10% slower on AVX2.)
struct Split8 {
  std::vector<int8_t> q;
  std::vector<float> d;
  // up and bias as the build's body reads them: many_avx2 up [T, G] and bias [T, G, 8];
  // with VNNI up32 [T, G] and, kQ6, bias32 [T, G, 4] (many_vnni: minus each int32 lane's bias,
  // elements 8 j .. 8 j + 7) and bias16 [T, G, 2] (many16_vnni: minus each sixteen's)
  std::vector<int64_t> up;
  std::vector<int32_t> up32;
  std::vector<int32_t> bias16;
  std::vector<float> sums;  // kQ4
  std::vector<int16_t> bias;
  std::vector<int32_t> bias32;
  // with planes (many16_amx): q << (shift - e) as hi * 128 + lo, hi signed and lo unsigned, each
  // by tiles: sixteen rows of x by a pair of groups, 1 KB (tile(t, g): rows 64 B apart)
  std::vector<int8_t> xh;
  std::vector<uint8_t> xl;
  int64_t tile(int64_t t, int64_t g) const { return ((t / 16 * (G / 2) + g / 2) * 16 + t % 16) * 64 + g % 2 * 32; }
  int64_t T, K, G, S, ld;

  // Rows of x are ld groups apart: two more than G, so that a power-of-two K does not put
  // every row of x at the same offset in a page, and many16_vnni's 32 rows in the same sets
  // of the first-level cache (a 2048 x 8192 Q4_K GEMM at 64 rows: 8.1 -> 7.3-7.5 ms).
  int64_t at(int64_t t, int64_t g) const { return t * ld + g; }

  Split8(const float* x, int64_t T_, int64_t K_, Format f, bool planes = false)
      : T(T_), K(K_), G(K_ / kGroup), S(K_ / kSuper), ld(G + 2) {
    const int shift = many_shift(f);
    const int64_t TG = T * ld;
    q.resize(TG * 32);
    d.resize(T * S);
    if (IGNIS_QGEMM_VNNI) up32.resize(TG);
    else up.resize(TG);
    if (f == kQ6) IGNIS_QGEMM_VNNI ? (bias32.resize(TG * 4), bias16.resize(TG * 2)) : bias.resize(TG * 8);
    else sums.resize(TG);
    if (planes) xh.resize((T + 15) / 16 * 16 * K), xl.resize((T + 15) / 16 * 16 * K);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i evens_first = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const auto largest = [&](const float* v, int n) {
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    };
    // Powers of two by multiplication (exact, as ldexp, which gcc leaves a call: ~7 a group).
    float pow2[16];
    for (int i = 0; i < 16; ++i) pow2[i] = float(1 << i);
    const float unit = 1.0f / float(1 << shift);
    const auto row = [&](int64_t t) {
      for (int64_t j = 0; j < S; ++j) {
        const float* v = x + t * K + j * kSuper;
        float amax[8], top = 0.0f;
        for (int gi = 0; gi < 8; ++gi) top = std::max(top, amax[gi] = largest(v + 32 * gi, kGroup));
        d[t * S + j] = top / 127.0f * unit;
        const float inv = top > 0.0f ? 127.0f / top : 0.0f;
        for (int64_t gi = 0; gi < 8; ++gi) {
          const int64_t g = j * 8 + gi;
          int e = 0;
          while (e < shift && amax[gi] * pow2[e + 1] <= top) ++e;
          const int64_t tg = at(t, g);
          if (IGNIS_QGEMM_VNNI) up32[tg] = shift - e;
          else up[tg] = shift - e;
          const __m256 scale = _mm256_set1_ps(inv * pow2[e]);
          __m256i i[4];
          for (int k = 0; k < 4; ++k)  // rounded to nearest (within int8: |x| * scale <= 127)
            i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * gi + 8 * k), scale));
          // each eight's sum: kQ4's group sum, kQ6's biases (elements 8 k .. 8 k + 7)
          __m128i s8[4];
          for (int k = 0; k < 4; ++k) {
            const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(i[k]), _mm256_extracti128_si256(i[k], 1));
            s8[k] = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
            s8[k] = _mm_add_epi32(s8[k], _mm_shuffle_epi32(s8[k], _MM_SHUFFLE(2, 3, 0, 1)));
          }
          for (int k = 0; k < 4; ++k) i[k] = _mm256_permutevar8x32_epi32(i[k], evens_first);  // 4 even, then 4 odd
          // packs works per 128-bit lane: [evens | odds] of 16, then all 16 evens | all 16 odds
          const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.data() + tg * kGroup), b);
#if IGNIS_QGEMM_AMX
          if (planes) {
            const __m512i full = _mm512_sll_epi16(_mm512_cvtepi8_epi16(b), _mm_cvtsi32_si128(shift - e));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(xh.data() + tile(t, g)), _mm512_cvtepi16_epi8(_mm512_srai_epi16(full, 7)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(xl.data() + tile(t, g)),
                                _mm512_cvtepi16_epi8(_mm512_and_si512(full, _mm512_set1_epi16(127))));
          }
#endif
          int32_t eights[4];
          for (int k = 0; k < 4; ++k) eights[k] = _mm_cvtsi128_si32(s8[k]);
          if (f == kQ6) {
            if (IGNIS_QGEMM_VNNI) {
              for (int k = 0; k < 4; ++k) bias32[tg * 4 + k] = -32 * eights[k];
              for (int k = 0; k < 2; ++k) bias16[tg * 2 + k] = bias32[tg * 4 + 2 * k] + bias32[tg * 4 + 2 * k + 1];
            } else {  // 32 times each four's sum (elements 4 k .. 4 k + 3)
              const int8_t* out = q.data() + tg * kGroup;
              for (int k = 0; k < 8; ++k)
                bias[tg * 8 + k] = int16_t(32 * (out[2 * k] + out[2 * k + 1] + out[16 + 2 * k] + out[17 + 2 * k]));
            }
          } else {
            sums[tg] = float(eights[0] + eights[1] + eights[2] + eights[3]) * pow2[shift - e];
          }
        }
      }
    };
    // over rows of x on torch's threads (a 64-row x of 8192 took ~0.5 ms on one)
    at::parallel_for(0, T, std::max<int64_t>(1, 8192 / K), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) row(t);
    });
  }
};

// Q4_K's offsets for a block of eight weight rows from n0 against TB rows of x from t0, into
// offsets[t][r]: sum over super-blocks of -dmin * x's d * sum m * sum q, the products exact in
// fp32 (m < 64, |sum q| <= 32 * 127: under 2^21 summed over a super-block's eight groups).
template <int TB>
inline void many_offsets(const Weights& w, const Split8& x, int64_t n0, int64_t t0, float (&offsets)[TB][8]) {
  const int64_t S = x.S;
  const uint8_t* pairs = w.sm + 2 * w.unit(n0, 0);  // group g's eight (sc, m) at pairs + 16 g
  const float* supers = w.ds + 2 * w.super(n0, 0);  // super-block j's eight (d, -dmin) at supers + 16 j
  const __m128i m_of = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -128, -128, -128, -128, -128, -128, -128, -128);
  __m256 out[TB];
  for (int t = 0; t < TB; ++t) out[t] = _mm256_setzero_ps();
  for (int64_t j = 0; j < S; ++j) {
    __m256 acc[TB];
    for (int t = 0; t < TB; ++t) acc[t] = _mm256_setzero_ps();
    for (int gi = 0; gi < 8; ++gi) {
      const int64_t g = 8 * j + gi;
      const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pairs + 16 * g)), m_of);
      const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
      for (int t = 0; t < TB; ++t) acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sums[x.at(t0 + t, g)]), acc[t]);
    }
    const __m256 a = _mm256_loadu_ps(supers + 16 * j), b = _mm256_loadu_ps(supers + 16 * j + 8);
    const __m256 dmin = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
    for (int t = 0; t < TB; ++t)
      out[t] = _mm256_fmadd_ps(acc[t], _mm256_mul_ps(dmin, _mm256_set1_ps(x.d[(t0 + t) * S + j])), out[t]);
  }
  for (int t = 0; t < TB; ++t) _mm256_store_ps(offsets[t], out[t]);
}

// A block of eight weight rows from n0 (Weights::unit's layout) against TB rows of x from t0.
template <Format F, int TB>
inline void many_avx2(const Weights& w, const Split8& x, int64_t n0, int64_t t0, float* y) {
  const int64_t S = x.S;
  const __m256i nib = _mm256_set1_epi8(15);
  const auto wide = [](const void* p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  alignas(32) float offsets[TB][8];  // kQ4: row r's offset term for row t of x
  if constexpr (F == kQ4) many_offsets<TB>(w, x, n0, t0, offsets);
  const int64_t u0 = w.unit(n0, 0), v0 = w.super(n0, 0);  // group g's units at u0 + 8 g; super-block j's at v0 + 8 j
  for (int p = 0; p < 4; ++p) {  // rows 2p (the low half) and 2p + 1 (the high one)
    alignas(32) float f[TB][8] = {};  // in memory: the registers hold the int32 sums, the weights and x
    // kQ4: each half's int16 lanes take its row's sc of a group's eight (sc, m) pairs
    const __m256i sc_of = _mm256_setr_epi8(4 * p, -128, 4 * p, -128, 4 * p, -128, 4 * p, -128, 4 * p, -128, 4 * p, -128,
                                           4 * p, -128, 4 * p, -128, 4 * p + 2, -128, 4 * p + 2, -128, 4 * p + 2, -128,
                                           4 * p + 2, -128, 4 * p + 2, -128, 4 * p + 2, -128, 4 * p + 2, -128, 4 * p + 2, -128);
    const uint8_t* nibbles = w.q + 16 * u0 + 32 * p;  // group g's two rows at nibbles + 128 g
    for (int64_t j = 0; j < S; ++j) {
      __m256i acc[TB];
      for (int t = 0; t < TB; ++t) acc[t] = _mm256_setzero_si256();
      for (int64_t g = 8 * j; g < 8 * j + 8; ++g) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nibbles + 128 * g));
        __m256i lo = _mm256_and_si256(b, nib), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), nib), sc;
        if constexpr (F == kQ6) {  // the high two bits, and each sixteen's int8 scale
          const int64_t u = u0 + 8 * g + 2 * p;
          q6_high_bits<true>(w.hb + 8 * u, lo, hi);
          sc = _mm256_srai_epi16(q6_scales_256<true>(w.sc + 2 * u), 8);
        } else {
          sc = _mm256_shuffle_epi8(wide(w.sm + 2 * (u0 + 8 * g)), sc_of);
        }
        for (int t = 0; t < TB; ++t) {
          // q in [0, 64), |x| <= 127: a pair's sum and two of them stay in int16
          const int64_t tg = x.at(t0 + t, g);
          const int8_t* xq = x.q.data() + 32 * tg;
          __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, wide(xq)), _mm256_maddubs_epi16(hi, wide(xq + 16)));
          if constexpr (F == kQ6) s = _mm256_sub_epi16(s, wide(x.bias.data() + 8 * tg));  // (q - 32) x: within int16
          const __m256i scu = _mm256_sll_epi16(sc, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.up.data() + tg)));
          acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s, scu));
        }
      }
      __m256 dw;  // the two rows' d, four lanes each
      if constexpr (F == kQ6) {
        const float* dp = w.ds + v0 + 8 * j + 2 * p;
        dw = _mm256_setr_m128(_mm_set1_ps(dp[0]), _mm_set1_ps(dp[1]));
      } else {
        const float* dp = w.ds + 2 * (v0 + 8 * j + 2 * p);
        dw = _mm256_setr_m128(_mm_set1_ps(dp[0]), _mm_set1_ps(dp[2]));
      }
      for (int t = 0; t < TB; ++t)
        _mm256_store_ps(f[t], _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[(t0 + t) * S + j])),
                                              _mm256_load_ps(f[t])));
    }
    for (int t = 0; t < TB; ++t) {
      const float* lanes = f[t];
      for (int r = 0; r < 2; ++r) {
        const float dot = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        y[(t0 + t) * w.stride() + n0 + 2 * p + r] = F == kQ4 ? dot + offsets[t][2 * p + r] : dot;
      }
    }
  }
}

#if IGNIS_QGEMM_VNNI
// many_avx2's arithmetic with AVX512-VNNI: a block of eight weight rows from n0 as two
// registers of four (a 128-bit quarter a row, as bytes_vnni), TB rows of x from t0. Per group
// and row of x: two vpdpbusd into zero (kQ6: minus its bias), whose int32 lanes (eight
// products, |sum| < 2^15) are multiplied by the weights' shifted integer scale and summed,
// exactly over a super-block: two groups' lanes go into one register's int16 halves, so that
// one vpdpwssd scales and adds both (against a vpdpwssd a group: 1.12x at 64 rows of Q4_K on
// a Zen 4, where vpdpbusd, vpdpwssd, vpmaddwd and the FMAs share one 512-bit operation a
// cycle and shifts and blends issue beside them). Each register's scales are put in their
// lanes once a pair of groups, then shifted per row of x.
template <Format F, int TB>
inline void many_vnni(const Weights& w, const Split8& x, int64_t n0, int64_t t0, float* y) {
  const int64_t S = x.S, u0 = w.unit(n0, 0), v0 = w.super(n0, 0);
  const __m512i nib = _mm512_set1_epi8(15), low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i row = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i sixteens = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const auto x16 = [](const void* p) { return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  alignas(32) float offsets[TB][8];  // kQ4: row r's offset term for row t of x
  if constexpr (F == kQ4) many_offsets<TB>(w, x, n0, t0, offsets);
  // the fp32 sums over super-blocks, in memory: touched once a super-block, they leave the
  // registers to the integer sums and the weights
  alignas(64) float f[2][TB][16] = {};
  for (int64_t j = 0; j < S; ++j) {
    __m512i acc[2][TB];
    for (int c = 0; c < 2; ++c)
      for (int t = 0; t < TB; ++t) acc[c][t] = _mm512_setzero_si512();
    for (int64_t g = 8 * j; g < 8 * j + 8; g += 2) {  // two groups at a time: h = 0, 1
      // each lane's integer scales, group g's in its low int16 and g + 1's in its high one
      // (Q4_K's sc of its row, Q6_K's of its sixteen), and both groups' weights
      __m512i lo[2][2], hi[2][2], scc[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t u = u0 + 8 * (g + h);
        const __m512i sc = F == kQ6 ? _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sc + 2 * u))), low16)
                                    : _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sm + 2 * u)));
        for (int c = 0; c < 2; ++c) {
          const __m512i at = F == kQ6 ? _mm512_add_epi32(sixteens, _mm512_set1_epi32(8 * c))  // (sc, m) or each sixteen's
                                      : _mm512_add_epi32(_mm512_add_epi32(row, row), _mm512_set1_epi32(8 * c));
          const __m512i mine = _mm512_permutexvar_epi32(at, sc);
          scc[c] = h ? _mm512_or_si512(scc[c], _mm512_slli_epi32(mine, 16)) : mine;
          const __m512i b = _mm512_loadu_si512(w.q + 16 * (u + 4 * c));
          lo[h][c] = _mm512_and_si512(b, nib), hi[h][c] = _mm512_and_si512(_mm512_srli_epi16(b, 4), nib);
          if constexpr (F == kQ6) q6_high_bits_512(w.hb + 8 * (u + 4 * c), lo[h][c], hi[h][c]);
        }
      }
      for (int t = 0; t < TB; ++t) {
        const int64_t tg = x.at(t0 + t, g);
        const int8_t* xq = x.q.data() + 32 * tg;
        __m512i s[2][2];
        for (int h = 0; h < 2; ++h) {
          const __m512i xl = x16(xq + 32 * h), xh = x16(xq + 32 * h + 16);
          const __m512i init = F == kQ6 ? x16(x.bias32.data() + 4 * (tg + h)) : _mm512_setzero_si512();
          for (int c = 0; c < 2; ++c) s[h][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo[h][c], xl), hi[h][c], xh);
        }
        // the row of x's powers for the two groups, g's in the low int16 and g + 1's in the
        // high one (each int16's own shift: the scales' high bits stay clear)
        const __m512i up = _mm512_set1_epi32(x.up32[tg] | x.up32[tg + 1] << 16);
        for (int c = 0; c < 2; ++c) {
          // both groups' sums (|s| < 2^15) in one register's int16 halves, and one vpdpwssd
          // multiplies each by its scale and adds both to the lane: the same int32 sums as two
          // vpmaddwd and their adds (on AVX2)
          const __m512i both = _mm512_mask_blend_epi16(__mmask32(0xAAAAAAAA), s[0][c], _mm512_slli_epi32(s[1][c], 16));
          acc[c][t] = _mm512_dpwssd_epi32(acc[c][t], both, _mm512_sllv_epi16(scc[c], up));
        }
      }
    }
    for (int c = 0; c < 2; ++c) {  // each row's d in its quarter
      const __m512 dw = F == kQ6 ? _mm512_permutexvar_ps(_mm512_add_epi32(row, _mm512_set1_epi32(4 * c)),
                                                         _mm512_castps256_ps512(_mm256_loadu_ps(w.ds + v0 + 8 * j)))
                                 : _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_add_epi32(row, row), _mm512_set1_epi32(8 * c)),
                                                         _mm512_loadu_ps(w.ds + 2 * (v0 + 8 * j)));
      for (int t = 0; t < TB; ++t)
        _mm512_store_ps(f[c][t], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[c][t]), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(t0 + t) * S + j])),
                                                 _mm512_load_ps(f[c][t])));
    }
  }
  for (int t = 0; t < TB; ++t)
    for (int c = 0; c < 2; ++c) {  // each row's four lanes, in many_avx2's order
      const float* lanes = f[c][t];
      for (int r = 0; r < 4; ++r) {
        const float dot = (lanes[4 * r] + lanes[4 * r + 1]) + (lanes[4 * r + 2] + lanes[4 * r + 3]);
        y[(t0 + t) * w.stride() + n0 + 4 * c + r] = F == kQ4 ? dot + offsets[t][4 * c + r] : dot;
      }
    }
}

// many_offsets for two blocks of eight rows (n0 and n0 + 8) at once, a row a lane of one
// 512-bit register: each lane's arithmetic is many_offsets' own, in the same order. Rows of x
// sixteen at a time, their sums over super-blocks in offsets itself: at TB 32 the registers
// would not hold both (gcc spilled: ~7% of the Q4_K body at 64 rows).
template <int TB>
inline void many_offsets16(const Weights& w, const Split8& x, int64_t n0, int64_t t0, float (&offsets)[TB][16]) {
  constexpr int TC = TB < 16 ? TB : 16;
  static_assert(TB % TC == 0);
  const int64_t S = x.S;
  const uint8_t *pa = w.sm + 2 * w.unit(n0, 0), *pb = w.sm + 2 * w.unit(n0 + 8, 0);
  const float *sa = w.ds + 2 * w.super(n0, 0), *sb = w.ds + 2 * w.super(n0 + 8, 0);
  const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const auto bytes16 = [](const void* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); };
  for (int tc = 0; tc < TB; tc += TC)  // (offsets start at the first super-block: no memset)
    for (int64_t j = 0; j < S; ++j) {
      __m512 acc[TC];
      for (int t = 0; t < TC; ++t) acc[t] = _mm512_setzero_ps();
      for (int gi = 0; gi < 8; ++gi) {
        const int64_t g = 8 * j + gi;
        const __m512 m = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(bytes16(pa + 16 * g), odds, bytes16(pb + 16 * g)));
        for (int t = 0; t < TC; ++t) acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.sums[x.at(t0 + tc + t, g)]), acc[t]);
      }
      const __m512 dmin = _mm512_permutex2var_ps(_mm512_loadu_ps(sa + 16 * j), odds, _mm512_loadu_ps(sb + 16 * j));
      for (int t = 0; t < TC; ++t)
        _mm512_store_ps(offsets[tc + t], _mm512_fmadd_ps(acc[t], _mm512_mul_ps(dmin, _mm512_set1_ps(x.d[(t0 + tc + t) * S + j])),
                                                         j ? _mm512_load_ps(offsets[tc + t]) : _mm512_setzero_ps()));
    }
}

// vpdpbusd of w's bytes and the four signed bytes at x broadcast to every lane: the broadcast
// goes in the instruction's memory operand ({1to16}: no broadcast instruction of its own,
// which gcc does not fold there itself), where the compiler targets VNNI.
inline __m512i dpbusd_x4(__m512i acc, __m512i w, const int32_t* x) {
#if defined(__AVX512VNNI__)
  asm("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*x));
  return acc;
#else
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*x));
#endif
}

// The group g's values of sixteen weight rows (two blocks of eight, units ua and ub) as bytes,
// a row an int32 lane: wq[k]'s lane r holds row r's elements 4k .. 4k + 3 in Split8's order
// (the sixteen even elements, then the odd ones). The group's nibble bytes are transposed by
// fours as they are (byte i: elements 2i and 2i + 1; four vpermt2d, four vpermt2q), then
// split: a quad's low nibbles are the evens 4k .. 4k + 3, its high ones the odds; Q6_K adds
// each one's high two bits. many16_vnni's and many16_amx's weights.
template <Format F>
inline void group_bytes16(const Weights& w, int64_t ua, int64_t ub, int64_t g, __m512i (&wq)[8]) {
  const __m512i nib = _mm512_set1_epi8(15);
  // quads 0 and 1 (then 2 and 3) of rows 0-3 and 4-7 (a register each, a row a quarter)
  const __m512i q01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i q23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  // the low (high) 256 bits of two registers: rows 0-7's quad and rows 8-15's
  const __m512i low = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), high = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
  const auto load = [](const void* p) { return _mm512_loadu_si512(p); };
  __m512i v[4];
  for (int i = 0; i < 4; ++i) v[i] = load(w.q + 16 * ((i < 2 ? ua : ub) + 8 * g + 4 * (i % 2)));
  const __m512i a01 = _mm512_permutex2var_epi32(v[0], q01, v[1]), b01 = _mm512_permutex2var_epi32(v[2], q01, v[3]);
  const __m512i a23 = _mm512_permutex2var_epi32(v[0], q23, v[1]), b23 = _mm512_permutex2var_epi32(v[2], q23, v[3]);
  const __m512i quad[4] = {_mm512_permutex2var_epi64(a01, low, b01), _mm512_permutex2var_epi64(a01, high, b01),
                           _mm512_permutex2var_epi64(a23, low, b23), _mm512_permutex2var_epi64(a23, high, b23)};
  if constexpr (F == kQ4) {
    for (int k = 0; k < 4; ++k) wq[k] = _mm512_and_si512(quad[k], nib), wq[4 + k] = _mm512_and_si512(_mm512_srli_epi16(quad[k], 4), nib);
  } else {
    // the high two bits: each row's eight bytes of hb, 0-3 (h[0]) and 4-7 (h[1]) a lane;
    // nibble byte i < 8 takes bits 4-5 (its low nibble's element) and 0-1 (its high one's)
    // of hb byte i, byte i >= 8 bits 6-7 and 2-3 of hb byte i - 8 (Weights' kQ6 layout)
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    const __m512i ha = load(w.hb + 8 * (ua + 8 * g)), hbb = load(w.hb + 8 * (ub + 8 * g));
    const __m512i h[2] = {_mm512_permutex2var_epi32(ha, evens, hbb), _mm512_permutex2var_epi32(ha, odds, hbb)};
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    for (int k = 0; k < 4; ++k) {
      const __m512i hk = h[k % 2];
      const __m512i hl = k < 2 ? hk : _mm512_srli_epi16(hk, 2), hh = _mm512_slli_epi16(hk, k < 2 ? 4 : 2);
      // (a & b) | (c & 0x30): the low nibble and its high bits
      wq[k] = _mm512_ternarylogic_epi32(quad[k], nib, _mm512_and_si512(hl, bits45), 0xEA);
      wq[4 + k] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(quad[k], 4), nib, _mm512_and_si512(hh, bits45), 0xEA);
    }
  }
}

// Sixteen weight rows (two blocks of eight from n0) against TB rows of x from t0, a row per
// int32 lane. many_vnni's lanes each hold a quarter of a row's group, so every group's scales
// go beside its sums (a blend, two shifts and a vpdpwssd per two groups and four rows: half
// that body's operations), and its weights are unpacked again for every six rows of x. Here
// a group's sixteen rows are transposed (their nibble bytes by fours: four vpermt2d, four
// vpermt2q) and unpacked once per TB rows of x (up to 32) into eight registers, wq[k]
// holding each row's bytes 4k .. 4k + 3 (Split8's order: the sixteen even elements, then the
// odd ones), and vpdpbusd takes x's same four bytes broadcast: eight give
// every lane its row's group sum. Q4_K: in two halves (the even and the odd elements, |s| <
// 2^15 each), which one vpdpwssd scales by the row's sc shifted by x's power; Q6_K: one sum
// per sixteen (quads 0, 1, 4, 5: elements 0-15), each times its scale by vpmulld. Exact in
// int32 over half a super-block (Q4_K: 4 * 32 * 15 * 127 * 63 * 2^7 < 2^31; Q6_K: 8 * 16 * 32 *
// 127 * 128 * 2^5 < 2^31); the two halves' sums go to fp32, are added, and take d times x's
// d once a super-block. 1.4x (Q4_K) and 1.7x (Q6_K) many_vnni at 64 rows on a Zen 4 core. Every row of x takes the same sums in the same order whatever
// TB; they are many_vnni's integers, added in another order before the fp32 step, so not
// many_avx2's bits.
template <Format F, int TB>
inline void many16_vnni(const Weights& w, const Split8& x, int64_t n0, int64_t t0, float* y) {
  const int64_t S = x.S, ua = w.unit(n0, 0), ub = w.unit(n0 + 8, 0), va = w.super(n0, 0), vb = w.super(n0 + 8, 0);
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
  const auto bytes16 = [](const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  alignas(64) float offsets[TB][16];  // kQ4: each row's offset term
  if constexpr (F == kQ4) many_offsets16<TB>(w, x, n0, t0, offsets);
  // the fp32 sums, a row a lane. Neither f nor the halves' sums are zeroed first: the first
  // super-block (group) starts them from a zero register, which saves a 2 KB memset a half
  // super-block (gcc turned the zeroing loops into calls: ~4% of the body at 64 rows)
  alignas(64) float f[TB][16];
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t j = 0; j < S; ++j) {
    // each row's d, and with x's d
    const __m512 d = F == kQ6 ? _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w.ds + va + 8 * j)), _mm256_loadu_ps(w.ds + vb + 8 * j), 1)
                              : _mm512_permutex2var_ps(_mm512_loadu_ps(w.ds + 2 * (va + 8 * j)), evens, _mm512_loadu_ps(w.ds + 2 * (vb + 8 * j)));
    __m512i halves[2][TB];  // each half super-block's int32 sums
    for (int half = 0; half < 2; ++half) {
      __m512i (&acc)[TB] = halves[half];
      for (int64_t g = 8 * j + 4 * half; g < 8 * j + 4 * half + 4; ++g) {
        const bool first = g == 8 * j + 4 * half;
        // the group's sixteen rows by quads: wq[k]'s lane r, row r's bytes 4k .. 4k + 3. The
        // nibbles' bytes are transposed as they are (byte i: elements 2i and 2i + 1), then
        // split: a quad's low nibbles are Split8's evens 4k .. 4k + 3, its high ones the odds
        __m512i wq[8];
        group_bytes16<F>(w, ua, ub, g, wq);
        if constexpr (F == kQ4) {
          // each row's sc (the even bytes of its (sc, m) pairs)
          const __m512i sc = _mm512_permutex2var_epi32(_mm512_cvtepu8_epi32(bytes16(w.sm + 2 * (ua + 8 * g))), evens,
                                                       _mm512_cvtepu8_epi32(bytes16(w.sm + 2 * (ub + 8 * g))));
          const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
          for (int t = 0; t < TB; ++t) {
            const int64_t tg = x.at(t0 + t, g);
            const int32_t* xq = reinterpret_cast<const int32_t*>(x.q.data() + 32 * tg);
            __m512i se = _mm512_setzero_si512(), so = _mm512_setzero_si512();
            for (int k = 0; k < 4; ++k) se = dpbusd_x4(se, wq[k], xq + k), so = dpbusd_x4(so, wq[4 + k], xq + 4 + k);
            const __m512i both = _mm512_mask_blend_epi16(__mmask32(0xAAAAAAAA), se, _mm512_slli_epi32(so, 16));
            acc[t] = _mm512_dpwssd_epi32(first ? zero : acc[t], both, _mm512_sllv_epi16(sc2, _mm512_set1_epi16(int16_t(x.up32[tg]))));
          }
        } else {
          // each row's two sixteens' scales: quads 0, 1 of the even and odd elements hold the
          // first sixteen (elements 0-15), quads 2, 3 the second
          const __m512i ia = _mm512_cvtepi8_epi32(bytes16(w.sc + 2 * (ua + 8 * g))), ib = _mm512_cvtepi8_epi32(bytes16(w.sc + 2 * (ub + 8 * g)));
          const __m512i sc0 = _mm512_permutex2var_epi32(ia, evens, ib), sc1 = _mm512_permutex2var_epi32(ia, odds, ib);
          for (int t = 0; t < TB; ++t) {
            const int64_t tg = x.at(t0 + t, g);
            const int32_t* xq = reinterpret_cast<const int32_t*>(x.q.data() + 32 * tg);
            __m512i s0 = _mm512_set1_epi32(x.bias16[2 * tg]), s1 = _mm512_set1_epi32(x.bias16[2 * tg + 1]);
            for (int k : {0, 1, 4, 5}) s0 = dpbusd_x4(s0, wq[k], xq + k);
            for (int k : {2, 3, 6, 7}) s1 = dpbusd_x4(s1, wq[k], xq + k);
            const __m512i up = _mm512_set1_epi32(x.up32[tg]);
            acc[t] = _mm512_add_epi32(first ? zero : acc[t], _mm512_add_epi32(_mm512_mullo_epi32(s0, _mm512_sllv_epi32(sc0, up)),
                                                               _mm512_mullo_epi32(s1, _mm512_sllv_epi32(sc1, up))));
          }
        }
      }
    }
    for (int t = 0; t < TB; ++t)
      _mm512_store_ps(f[t], _mm512_fmadd_ps(_mm512_add_ps(_mm512_cvtepi32_ps(halves[0][t]), _mm512_cvtepi32_ps(halves[1][t])),
                                            _mm512_mul_ps(d, _mm512_set1_ps(x.d[(t0 + t) * S + j])),
                                            j ? _mm512_load_ps(f[t]) : _mm512_setzero_ps()));
  }
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < 16; ++r)
      y[(t0 + t) * w.stride() + n0 + r] = F == kQ4 ? f[t][r] + offsets[t][r] : f[t][r];
}
#if IGNIS_QGEMM_AMX
#include "quant_gemm_amx.h"
#endif
#endif

// Rows [n0, n1) (whole blocks of eight, from an even block with VNNI: pairs of blocks take
// many16_vnni, 32 rows of x at a time, then 16, 8, 4, 2, 1; a last block alone many_vnni;
// with AMX's tiles, pairs of blocks take many16_amx for each chunk's whole sixteens first)
// against every row of x, six rows of x at a time (8-10% faster than four on a Zen 3; eight
// no more), in chunks of kChunkRows rows of x (a prefill chunk's x would not stay in the
// second-level cache over a block's rows: 1024 rows of a 2048-wide x ran at 150 GFLOP/s
// against 220 for 256).
constexpr int64_t kChunkRows = 64;

template <Format F>
inline void many_rows_of(const Weights& w, const Split8& x, int64_t n0, int64_t n1, float* y) {
  for (int64_t c = 0; c < x.T; c += kChunkRows) {
    const int64_t c1 = std::min(x.T, c + kChunkRows);
    int64_t tiled = c;  // rows [c, tiled) of x: through AMX's tiles below
#if IGNIS_QGEMM_AMX
    if (!x.xh.empty()) {  // whole sixteens of rows through the tiles, pairs of blocks, spans of K
      tiled = c + (c1 - c) / 16 * 16;
      for (int64_t j0 = 0; j0 < x.S; j0 += kAmxSpan)
        for (int64_t n = n0; n + 16 <= n1; n += 16) {
          const int64_t j1 = std::min(x.S, j0 + kAmxSpan);
          switch ((tiled - c) / 16) {
            case 4: many16_amx<F, 4>(w, x, n, c, j0, j1, y); break;
            case 3: many16_amx<F, 3>(w, x, n, c, j0, j1, y); break;
            case 2: many16_amx<F, 2>(w, x, n, c, j0, j1, y); break;
            case 1: many16_amx<F, 1>(w, x, n, c, j0, j1, y); break;
          }
        }
    }
#endif
    for (int64_t n = n0; n + 8 <= n1; n += 8) {
      int64_t t = c;
#if IGNIS_QGEMM_VNNI
#define IGNIS_MANY many_vnni
      if (n + 16 <= n1) {  // two blocks at once
        t = tiled;
        for (; t + 32 <= c1; t += 32) many16_vnni<F, 32>(w, x, n, t, y);
        if (c1 - t >= 16) many16_vnni<F, 16>(w, x, n, t, y), t += 16;
        if (c1 - t >= 8) many16_vnni<F, 8>(w, x, n, t, y), t += 8;
        if (c1 - t >= 4) many16_vnni<F, 4>(w, x, n, t, y), t += 4;
        if (c1 - t >= 2) many16_vnni<F, 2>(w, x, n, t, y), t += 2;
        if (c1 - t >= 1) many16_vnni<F, 1>(w, x, n, t, y);
        n += 8;
        continue;
      }
#else
#define IGNIS_MANY many_avx2
#endif
      for (; t + 6 <= c1; t += 6) IGNIS_MANY<F, 6>(w, x, n, t, y);
      switch (c1 - t) {
        case 5: IGNIS_MANY<F, 5>(w, x, n, t, y); break;
        case 4: IGNIS_MANY<F, 4>(w, x, n, t, y); break;
        case 3: IGNIS_MANY<F, 3>(w, x, n, t, y); break;
        case 2: IGNIS_MANY<F, 2>(w, x, n, t, y); break;
        case 1: IGNIS_MANY<F, 1>(w, x, n, t, y); break;
      }
#undef IGNIS_MANY
    }
  }
}
