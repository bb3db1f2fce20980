// many16_vnni's integer sums through AMX's tiles, for Q4_K and Q6_K on CPUs with AMX-INT8
// (Sapphire Rapids and later). Included by quant_gemm_many.h inside namespace qgemm where the
// compiler targets AMX (-march=native on such a host; never a capped tier) and VNNI.
//
// many16_vnni multiplies a group's 32 bytes of x by its weights' bytes (vpdpbusd), then the
// sums by the row's integer scale shifted by x's power, in int32 over half a super-block: ten
// 512-bit operations per group, row of x and sixteen weight rows for Q4_K, which bound it
// (~150 GMAC/s a Xeon core, a third of vpdpbusd's peak). A tile product (16 rows of x by 16
// weight rows by 64 bytes) does a K of 64 at once, but sums across groups (and Q6_K's
// sixteens), so their scales have to be in the operands first:
//   x's side: q << up (|.| <= 127 * 2^7: 15 bits) as hi * 128 + lo, hi signed and lo in
//     [0, 128) unsigned (Split8's xh, xl);
//   Q4_K's weights: q * sc with sc = 8 sc_hi + sc_lo as two planes of bytes, a = q * sc_lo and
//     b = q * sc_hi (each <= 15 * 7: vpmullw of a word's two bytes does not carry between
//     them); the half super-block's sum is 1024 (hi . b) + 128 (hi . a) + 8 (lo . b) + (lo . a);
//   Q6_K's: (q - 32) * sc (|.| <= 4096) as hi * 128 + lo likewise; the sum is
//     16384 (hi . hi) + 128 (hi . lo + lo . hi) + (lo . lo), the cross terms in one tile.
// Four tile products a K-step (tdpbssd, tdpbsud, tdpbusd, tdpbuud as the signs go) into int32
// tiles, taken together by shifts and adds in int32 (wrapping: the true sum is within 2^31,
// quant_gemm_many.h's bound, so the wrapped one is it). The same integers as many16_vnni's
// halves, and from them the same fp32 steps in the same order: a row's outputs are bit for bit
// many16_vnni's, so which rows of a step go through the tiles (whole sixteens) and which
// through VNNI (the rest) does not change any row.

#pragma once

// Whether this process may use the tiles: Linux grants AMX's 8 KB of state on request (the
// first use otherwise dies of SIGILL); a kernel or VM that refuses keeps the VNNI body, as does
// IGNIS_AMX=0.
inline bool amx_granted() {
  static const bool granted = [] {
    const char* env = std::getenv("IGNIS_AMX");
    if (env != nullptr && env[0] == '0') return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return granted;
}

// Whether GEMMs take the tiles now: granted, and not turned off for a comparison
// (ignis_cpu.quant_gemm_amx: the outputs are the same either way, only the speed differs).
inline std::atomic<bool>& amx_wanted() {
  static std::atomic<bool> wanted{true};
  return wanted;
}
inline bool amx_ready() { return amx_wanted().load(std::memory_order_relaxed) && amx_granted(); }

// Super-blocks of K a pass of many_rows_of takes through every block of weight rows before the
// next: the chunk's x planes of that span (64 rows of 4096: 512 KB) stay in the second-level
// cache meanwhile, where the tile loads wait on them, and each block's fp32 sums wait in y.
// Whole, a K of 14336 (1.8 MB at 64 rows) ran no faster than VNNI on a Xeon's two cores.
constexpr int64_t kAmxSpan = 16;

// Tiles 0-3 the four products' int32 sums, 4-5 x's hi and lo, 6-7 the weights' planes a and b:
// each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The weights' planes of group g of sixteen rows (two blocks of eight, units ua and ub), into
// its half super-block's planes[p][s]: K-step s's 16 x 64 B tile of plane p (a, b) in B's layout,
// byte 4k + i of lane r row r's element 4k + i of its two groups' Split8 order (the sixteen even
// elements, then the odd ones; as many16_vnni's wq).
template <Format F>
inline void amx_planes(const Weights& w, int64_t ua, int64_t ub, int64_t g, __m512i (&planes)[2][2][16]) {
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), seven = _mm512_set1_epi32(7);
  const auto bytes16 = [](const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  __m512i wq[8];
  group_bytes16<F>(w, ua, ub, g, wq);
  const int s = int(g % 4) / 2, r0 = 8 * int(g % 2);
  if constexpr (F == kQ6) {
    // each byte's (q - 32) * sc in int16 (|.| <= 4096), as lo = its low seven bits (plane 0,
    // unsigned) and hi = the rest (plane 1, signed, in [-32, 32])
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    const __m512i ia = _mm512_cvtepi8_epi32(bytes16(w.sc + 2 * (ua + 8 * g))), ib = _mm512_cvtepi8_epi32(bytes16(w.sc + 2 * (ub + 8 * g)));
    const __m512i word = _mm512_set1_epi32(0xFFFF);
    const auto words = [&](__m512i v) { return _mm512_or_si512(_mm512_and_si512(v, word), _mm512_slli_epi32(v, 16)); };
    // each row's two sixteens' scales in both words: quads 0, 1 of the even and odd elements
    // hold the first sixteen (elements 0-15), quads 2, 3 the second
    const __m512i sc[2] = {words(_mm512_permutex2var_epi32(ia, evens, ib)), words(_mm512_permutex2var_epi32(ia, odds, ib))};
    const __m512i low8 = _mm512_set1_epi16(0xFF), thirty_two = _mm512_set1_epi16(32), seven_bits = _mm512_set1_epi8(0x7F);
    const __mmask64 odd_bytes = 0xAAAAAAAAAAAAAAAAull;
    for (int k = 0; k < 8; ++k) {  // wq[k]: row r0 + k of the K-step's tile
      const __m512i scale = sc[k % 4 / 2];
      const __m512i pe = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_and_si512(wq[k], low8), thirty_two), scale);
      const __m512i po = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_srli_epi16(wq[k], 8), thirty_two), scale);
      planes[0][s][r0 + k] = _mm512_and_si512(_mm512_mask_blend_epi8(odd_bytes, pe, _mm512_slli_epi16(po, 8)), seven_bits);
      planes[1][s][r0 + k] = _mm512_mask_blend_epi8(odd_bytes, _mm512_srai_epi16(pe, 7), _mm512_slli_epi16(_mm512_srai_epi16(po, 7), 8));
    }
    return;
  }
  const __m512i sc = _mm512_permutex2var_epi32(_mm512_cvtepu8_epi32(bytes16(w.sm + 2 * (ua + 8 * g))), evens,
                                               _mm512_cvtepu8_epi32(bytes16(w.sm + 2 * (ub + 8 * g))));
  // each of a lane's two words times sc's low (high) three bits
  const __m512i lo3 = _mm512_and_si512(sc, seven), hi3 = _mm512_srli_epi32(sc, 3);
  const __m512i by_lo = _mm512_or_si512(lo3, _mm512_slli_epi32(lo3, 16)), by_hi = _mm512_or_si512(hi3, _mm512_slli_epi32(hi3, 16));
  for (int k = 0; k < 8; ++k) {
    planes[0][s][r0 + k] = _mm512_mullo_epi16(wq[k], by_lo);
    planes[1][s][r0 + k] = _mm512_mullo_epi16(wq[k], by_hi);
  }
}

// Sixteen weight rows (two blocks of eight from n0) against 16 * MT rows of x from t0, over
// super-blocks [j0, j1) of K (kAmxSpan), with many16_vnni's outputs (above) once j1 is the
// last. The tiles run beside the vector units: each item (a half super-block by sixteen rows
// of x) issues its tile products, and while they run the vector units take the previous
// item's tiles to int32 sums (and the fp32 step) and make a slice of the next half's planes.
// Q4_K's offsets go first, on their own: in the items they made a burst longer than the
// reorder buffer holds, so that the next item's tile products waited for it (a 28672 x 4096
// GEMM at 64 rows on a Xeon core: 47 -> 37 ms).
template <Format F, int MT>
inline void many16_amx(const Weights& w, const Split8& x, int64_t n0, int64_t t0, int64_t j0, int64_t j1, float* y) {
  constexpr int TB = 16 * MT;
  static const TileConfig config;
  _tile_loadconfig(&config);
  const int64_t S = x.S, ua = w.unit(n0, 0), ub = w.unit(n0 + 8, 0), va = w.super(n0, 0), vb = w.super(n0 + 8, 0);
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  alignas(64) float offsets[TB][16];
  alignas(64) float f[TB][16];
  alignas(64) __m512i planes[2][2][2][16];  // [half super-block's parity][a, b][K-step][row of B]
  alignas(64) int32_t sums[2][4][16][16];   // [item's parity][tile][row of x][weight row] (Q6_K: 3 tiles)
  __m512i first[TB];                        // the first half super-block's int32 sums
  const auto dw = [&](int64_t j) {  // super-block j's d of each row
    if constexpr (F == kQ6) return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w.ds + va + 8 * j)), _mm256_loadu_ps(w.ds + vb + 8 * j), 1);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(w.ds + 2 * (va + 8 * j)), evens, _mm512_loadu_ps(w.ds + 2 * (vb + 8 * j)));
  };
  // item i: half super-block 2 j0 + i / MT, rows of x 16 (i % MT)
  const int64_t items = 2 * (j1 - j0) * MT;
  if (j0 > 0)  // the sums so far, which the previous span left in y
    for (int t = 0; t < TB; ++t) _mm512_store_ps(f[t], _mm512_loadu_ps(y + (t0 + t) * w.stride() + n0));
  const auto finish = [&](int64_t i) {  // item i's tiles (in sums[i % 2]) into its halves, and its fp32 step
    const int64_t h = 2 * j0 + i / MT, j = h / 2;
    const int m = int(i % MT);
    const auto sum = [&](int r) {
      const auto at = [&](int k) { return _mm512_load_si512(sums[i % 2][k][r]); };
      if constexpr (F == kQ6)  // 16384 (hi . hi) + 128 (hi . lo + lo . hi) + lo . lo
        return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(at(0), 14), _mm512_slli_epi32(at(1), 7)), at(2));
      // 1024 (hi . b) + 128 (hi . a) + 8 (lo . b) + (lo . a)
      return _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(at(0), 10), _mm512_slli_epi32(at(1), 7)),
                              _mm512_add_epi32(_mm512_slli_epi32(at(2), 3), at(3)));
    };
    if (h % 2 == 0) {
      for (int r = 0; r < 16; ++r) first[16 * m + r] = sum(r);
      return;
    }
    const __m512 d = dw(j);  // both halves of these sixteen rows: the super-block's fp32 step, as many16_vnni's
    for (int r = 0; r < 16; ++r) {
      const int t = 16 * m + r;
      _mm512_store_ps(f[t], _mm512_fmadd_ps(_mm512_add_ps(_mm512_cvtepi32_ps(first[t]), _mm512_cvtepi32_ps(sum(r))),
                                            _mm512_mul_ps(d, _mm512_set1_ps(x.d[(t0 + t) * S + j])),
                                            j ? _mm512_load_ps(f[t]) : _mm512_setzero_ps()));
    }
  };
  for (int64_t g = 8 * j0; g < 8 * j0 + 4; ++g) amx_planes<F>(w, ua, ub, g, planes[0]);
  if (F == kQ4 && j1 == S) many_offsets16<TB>(w, x, n0, t0, offsets);
  for (int64_t i = 0; i < items; ++i) {
    const int64_t h = 2 * j0 + i / MT;
    const int m = int(i % MT);
    const int64_t g0 = 4 * h;
    int32_t(&out)[4][16][16] = sums[i % 2];
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int s = 0; s < 2; ++s) {
      const int64_t at = x.tile(t0 + 16 * m, g0 + 2 * s);
      _tile_loadd(4, x.xh.data() + at, 64);
      _tile_loadd(5, x.xl.data() + at, 64);
      _tile_loadd(6, planes[h % 2][0][s], 64);
      _tile_loadd(7, planes[h % 2][1][s], 64);
      if constexpr (F == kQ6) {
        _tile_dpbssd(0, 4, 7);  // x's hi . w's hi
        _tile_dpbsud(1, 4, 6);  // hi . lo
        _tile_dpbusd(1, 5, 7);  // lo . hi
        _tile_dpbuud(2, 5, 6);  // lo . lo
      } else {
        _tile_dpbsud(0, 4, 7);  // hi . b
        _tile_dpbsud(1, 4, 6);  // hi . a
        _tile_dpbuud(2, 5, 7);  // lo . b
        _tile_dpbuud(3, 5, 6);  // lo . a
      }
    }
    // the vector units' share while those run: before this item's tile stores, which the
    // loads of the previous item's sums would otherwise wait for (not knowing their addresses
    // differ), so that the tiles and the vector units would take turns
    if (i > 0) finish(i - 1);
    if (h + 1 < 2 * j1)  // the next half's planes, 4 / MT groups an item
      for (int64_t g = g0 + 4 + 4 * m / MT; g < g0 + 4 + 4 * (m + 1) / MT; ++g) amx_planes<F>(w, ua, ub, g, planes[(h + 1) % 2]);
    _tile_stored(0, out[0], 64);
    _tile_stored(1, out[1], 64);
    _tile_stored(2, out[2], 64);
    if constexpr (F == kQ4) _tile_stored(3, out[3], 64);
  }
  finish(items - 1);
  _tile_release();
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < 16; ++r) y[(t0 + t) * w.stride() + n0 + r] = F == kQ4 && j1 == S ? f[t][r] + offsets[t][r] : f[t][r];
}
