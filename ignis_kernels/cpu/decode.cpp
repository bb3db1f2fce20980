// The decoder's decode step on the CPU in one call: every layer of a dense decoder (the
// Llama, Qwen and Gemma 3 blocks: pre or sandwich norms, SwiGLU or GeGLU, per-head q/k
// norms, sliding windows with their own RoPE table) or of a mixture of experts (Mixtral,
// Qwen3-MoE, gpt-oss: an fp32 router, top-k routing, each chosen expert's GEMMs over its
// rows, attention sinks, the clamped SwiGLU) for T rows that each add one token to their
// own sequence (one user's decode, or a few).
//
// Why native: at one row the eager forward is ~40 ATen calls per layer at 2-3 us each
// plus Python around them, as much time as the matrix work (RESULTS.md); a mixture's
// layer, with its routing and per-expert gathers, is ~100.
// Here the GEMMs are ignis's own over the file's 4-, 5- and 8-bit block values and MXFP4
// (quant_gemm.h), torch's int8 weight-only one (types those do not hold), or the mixed
// form's kept wide copy for wider steps (oneDNN bf16, fbgemm fp16 or oneDNN fp32); four per
// dense layer, two plus two per chosen expert in a mixture's;
// everything between them (RMSNorm, biases, rotary, q/k norms, the KV write, paged
// attention, SiLU-and-multiply, residuals, the casts) is plain loops over a few thousand
// floats, and attention is split over keys across torch's threads. Attention has AVX-512
// and AVX2+FMA forms beside portable loops; ignis_kernels/cpu_native.py compiles for the tier
// ignis_kernels/cpu_platform.py chose, never for more than the host has.
//
// Arithmetic follows ignis/model/layers.py: fp32 activations, each GEMM fed what its
// kernel takes (bf16, rounded to nearest even, for torch's int8 and oneDNN bf16 GEMMs;
// fp32 for fp16/fp32 ones) and read back as fp32, biases added in fp32. The KV cache is fp32 or
// bf16 (engine.kv_cache_dtype): bf16 K/V are rounded as torch's .to(bfloat16) rounds them
// and read back as fp32, so attention computes in fp32 either way. The reductions' order
// differs from torch's, so results agree to float rounding, not bits.
//
// Built and loaded by ignis_kernels/cpu_native.py; registers torch.ops.ignis_cpu.decode_layers,
// paged_decode_attention (the same attention alone, for steps that stay eager), quant_gemm
// (one GEMM of quant_gemm.h), top_k_rows (top_k.h: the LM head's candidates) and q6_rows
// (those candidates' exact weights where the head is Q6_K).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/fbgemm_linear_fp16_weight.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "quant_gemm.h"
#include "top_k.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// Keys one attention work unit reads: enough to keep a thread busy, small enough that a
// 4k context splits over every thread even at one row and one kv head.
constexpr int64_t kKeysPerUnit = 256;

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch's cast (finite inputs)
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// exp(x) for x in [-87, 88]: Cephes' polynomial after a power-of-two range reduction,
// ~1 ulp, and written so that loops over arrays vectorize (libm's expf does not; and with
// -fno-trapping-math: cpu_native.FLAGS). The floor is a truncation stepped down where it
// rounded up, exactly std::floor's for |y| < 2^31, with no call into libm (a call to floorf
// kept every loop over exp_approx scalar: SiLU over a 1B model's 8192 features, each layer).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float y = x * 1.44269504088896341f + 0.5f;
  const int32_t i = int32_t(y), k = i - int32_t(float(i) > y);  // floor(y)
  const float n = float(k);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>(uint32_t(k + 127) << 23);
}

// y = x * rsqrt(mean(x^2) + eps) * w over n floats (x and y may alias).
inline void rms_norm(const float* x, const float* w, float eps, int64_t n, float* y) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

inline void to_bf16(const float* x, int64_t n, uint16_t* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

// KV-cache elements: fp32, or bf16 held as its bits (what a kBFloat16 tensor stores).
inline float kv_load(float x) { return x; }
inline float kv_load(uint16_t x) { return bf16_to_float(x); }
inline void kv_store(const float* x, int64_t n, float* y) { std::memcpy(y, x, n * sizeof(float)); }
inline void kv_store(const float* x, int64_t n, uint16_t* y) { to_bf16(x, n, y); }

// oneDNN's GEMM over a weight it reordered (ignis/model/packed.py's Bf16Linear, bf16 in and
// out, or Fp32Linear, fp32): the op is registered by torch's Python side only, so it is
// looked up once and called boxed.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  static const auto typed = op.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                                c10::string_view, c10::List<std::optional<c10::Scalar>>,
                                                std::optional<c10::string_view>)>();
  return typed.call(x, packed, std::nullopt, "none", c10::List<std::optional<c10::Scalar>>(), "");
}

// The mixed form's kept wide GEMMs (the `wide_kind` argument), and what each takes in.
enum WideKind : int64_t { kWideBf16 = 0, kWideFp16 = 1, kWideFp32 = 2 };

// An fp32 tensor's values as bf16 (round to nearest even), for the kernels that take bf16.
at::Tensor as_bf16(const at::Tensor& x) {
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  to_bf16(x.data_ptr<float>(), x.numel(), reinterpret_cast<uint16_t*>(y.data_ptr()));
  return y;
}

// Per projection, the kind of its narrow GEMM (the `kinds` argument); a file mixes them
// (Q4_K_M keeps some tensors at Q6_K, Gemma's files Q5_0 and Q8_0 beside Q4_K; gpt-oss's
// experts MXFP4 beside Q8_0 attention).
enum NarrowKind : int64_t {
  kInt8 = 0, kInt4 = 1, kInt4Pair = 2, kInt5 = 3, kQ8 = 4, kMx4 = 5, kInt4K = 6, kInt5K = 7, kQ6 = 8, kStack = 9
};

// How many tensors of `narrow` each kind takes.
inline int64_t tensors_of(int64_t kind) {
  return kind == kInt4Pair || kind == kInt5K || kind == kQ6 ? 4 : kind == kInt5 || kind == kInt4K ? 3 : 2;
}

// The step's GEMMs: y [T, N] = x [T, K] @ W^T, x fp32. `narrow`, per projection in order
// (quant_gemm.h's layouts; fp32 in and out): int4 (nibbles [N, K/2], (scale, offset)
// [N, K/32, 2] fp32), int5 (the same nibbles, their fifth bits [N, K/32] int32, the pairs),
// q8 (int8 values [N, K], fp16 scales [N, K/32]), an int4 pair (four: the low then the high
// nibbles' int4 weights, whose sum is the block weight exactly: packed.py's Int4PairLinear)
// torch's int8 weight-only GEMM (two: w [N, K] int8, s [N] row scales; bf16 in and out) or
// MXFP4 (e2m1 nibbles [N, K/2], e8m0 exponents [N, K/32] uint8). int4 and int5 from Q4_K /
// Q5_K hold the file's scales in place of the pairs (kInt4K, kInt5K: uint8 (sc, m)
// [N, K/32, 2] and fp32 (d, -dmin) [N, K/256, 2], the pairs' values exactly). Q6_K (kQ6, four:
// nibbles, high bits [N, K/32, 8], int8 scales [N, K/32, 2], fp32 d [N, K/256]). A stack
// (kStack: packed.py's StackedLinear): [P, 2] int64 (kind, rows) per part, then each part's
// tensors in order, every part a kind of its own above but kInt8 and kInt4Pair.
// Projections are numbered across the layers: a dense layer has four (qkv, o, gate_up,
// down), a mixture's 2 + 2E (qkv, o, then each expert's gate_up and down).
// `wide`, per dense projection (qkv and o only, in a mixture's layer: its experts have no
// wide copy) the kept copy for steps of more than narrow_rows rows: oneDNN bf16 (bf16 in
// and out), fbgemm fp16 or oneDNN fp32 (fp32); an empty tensor where a projection has none.
struct Gemms {
  at::TensorList narrow, wide;
  at::IntArrayRef kinds;  // per projection, a NarrowKind
  bool use_wide;
  int64_t wide_kind;
  std::vector<int64_t> first;  // per projection, its first tensor in `narrow`

  Gemms(at::TensorList narrow_, at::TensorList wide_, at::IntArrayRef kinds_, bool use_wide_, int64_t wide_kind_)
      : narrow(narrow_), wide(wide_), kinds(kinds_), use_wide(use_wide_), wide_kind(wide_kind_) {
    int64_t i = 0;
    for (const int64_t k : kinds) {
      TORCH_CHECK(k >= kInt8 && k <= kStack, "decode_layers: unknown GEMM kind ", k);
      first.push_back(i);
      if (k != kStack) {
        i += tensors_of(k);
        continue;
      }
      // a stack: [P, 2] int64 (kind, rows) per part, then the parts' tensors
      TORCH_CHECK(i < int64_t(narrow.size()) && narrow[i].dim() == 2 && narrow[i].size(1) == 2 &&
                      narrow[i].scalar_type() == at::kLong && narrow[i].is_contiguous(),
                  "decode_layers: a stack starts with its parts' (kind, rows) [P, 2] int64");
      const at::Tensor parts = narrow[i++];
      const int64_t* meta = parts.data_ptr<int64_t>();
      for (int64_t p = 0; p < parts.size(0); ++p) {
        const int64_t pk = meta[2 * p];
        TORCH_CHECK(pk != kInt8 && pk != kInt4Pair && pk >= kInt4 && pk <= kQ6, "decode_layers: kind ", pk, " in a stack");
        i += tensors_of(pk);
      }
    }
    TORCH_CHECK(i == int64_t(narrow.size()), "decode_layers: ", narrow.size(), " weight tensors for kinds needing ", i);
  }

  // Projection p (numbered as above), whose output has n columns; w: its wide copy's index
  // in `wide`, used on steps of more than narrow_rows rows when the model has them (-1:
  // it has none, the narrow GEMM serves every step).
  at::Tensor operator()(const at::Tensor& x, int64_t p, int64_t n, int64_t w = -1) const {
    at::Tensor y;
    // an empty entry: this projection keeps no copy (its narrow GEMM's many-row body is the faster)
    const bool copy = use_wide && w >= 0 && wide[w].numel() > 0;
    if (copy && wide_kind == kWideFp16) {
      y = at::fbgemm_linear_fp16_weight(x, wide[w], at::zeros({n}, x.options()));
    } else if (copy) {
      y = onednn_linear(wide_kind == kWideBf16 ? as_bf16(x) : x, wide[w]);
    } else {
      const int64_t i = first[p], kind = kinds[p];
      if (kind == kInt8) {
        y = at::_weight_int8pack_mm(as_bf16(x), narrow[i], narrow[i + 1]);
      } else if (kind == kStack) {  // each part writes its columns of y in place
        y = at::empty({x.size(0), n}, x.options());
        const at::Tensor parts = narrow[i];
        const int64_t* meta = parts.data_ptr<int64_t>();
        int64_t j = i + 1, r0 = 0;
        for (int64_t p = 0; p < parts.size(0); ++p) {
          qgemm::Weights wp = weights(j, meta[2 * p], meta[2 * p + 1], x.size(1));
          wp.ldy = n;
          qgemm::gemm(wp, x.data_ptr<float>(), x.size(0), y.data_ptr<float>() + r0);
          r0 += meta[2 * p + 1], j += tensors_of(meta[2 * p]);
        }
        TORCH_CHECK(r0 == n, "decode_layers: a stack of ", r0, " rows for ", n, " outputs");
      } else {
        y = at::empty({x.size(0), n}, x.options());
        qgemm::gemm(weights(i, kind, n, x.size(1)), x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
        if (kind == kInt4Pair) {  // + the high nibbles' GEMM: lo + hi, as Int4PairLinear sums them
          at::Tensor hi = at::empty({x.size(0), n}, x.options());
          qgemm::gemm(weights(i + 2, kInt4, n, x.size(1)), x.data_ptr<float>(), x.size(0), hi.data_ptr<float>());
          float* yp = y.data_ptr<float>();
          const float* hp = hi.data_ptr<float>();
#pragma omp simd
          for (int64_t j = 0; j < x.size(0) * n; ++j) yp[j] += hp[j];
        }
      }
    }
    TORCH_CHECK(y.is_contiguous() && y.size(0) == x.size(0) && y.size(1) == n, "decode_layers: a GEMM's output is not [T, ", n,
                "]");
    return y;
  }

  // quant_gemm.h's view of the tensors of `narrow` from i (any kind but kInt8).
  qgemm::Weights weights(int64_t i, int64_t kind, int64_t n, int64_t k) const {
    if (kind == kMx4)
      return {qgemm::kMX4, narrow[i].data_ptr<uint8_t>(), nullptr, nullptr, nullptr, narrow[i + 1].data_ptr<uint8_t>(), n, k};
    if (kind == kQ8)
      return {qgemm::kQ8, reinterpret_cast<const uint8_t*>(narrow[i].data_ptr()), nullptr, nullptr,
              reinterpret_cast<const uint16_t*>(narrow[i + 1].data_ptr()), nullptr, n, k};
    if (kind == kInt5)
      return {qgemm::kQ5, narrow[i].data_ptr<uint8_t>(), reinterpret_cast<const uint32_t*>(narrow[i + 1].data_ptr()),
              narrow[i + 2].data_ptr<float>(), nullptr, nullptr, n, k};
    if (kind == kInt5K)
      return {qgemm::kQ5, narrow[i].data_ptr<uint8_t>(), reinterpret_cast<const uint32_t*>(narrow[i + 1].data_ptr()),
              nullptr, nullptr, nullptr, n, k, narrow[i + 2].data_ptr<uint8_t>(), narrow[i + 3].data_ptr<float>()};
    if (kind == kQ6) {
      qgemm::Weights w{qgemm::kQ6, narrow[i].data_ptr<uint8_t>(), nullptr, nullptr, nullptr, nullptr, n, k};
      w.hb = narrow[i + 1].data_ptr<uint8_t>(), w.sc = narrow[i + 2].data_ptr<int8_t>(), w.ds = narrow[i + 3].data_ptr<float>();
      return w;
    }
    if (kind == kInt4K)
      return {qgemm::kQ4, narrow[i].data_ptr<uint8_t>(), nullptr, nullptr, nullptr, nullptr, n, k,
              narrow[i + 1].data_ptr<uint8_t>(), narrow[i + 2].data_ptr<float>()};
    return {qgemm::kQ4, narrow[i].data_ptr<uint8_t>(), nullptr, narrow[i + 1].data_ptr<float>(), nullptr, nullptr, n, k};
  }
};

// A GEMM's output rows [T, n] (bf16 or fp32) read as fp32, plus an optional bias: the eager
// Linear's `y.float() + bias`.
struct Rows {
  at::Tensor y;  // held: the pointers below are into it
  const uint16_t* b16 = nullptr;
  const float* f32 = nullptr;
  int64_t n = 0;
  const float* bias = nullptr;

  Rows(at::Tensor out, const float* b) : y(std::move(out)), n(y.size(1)), bias(b) {
    if (y.scalar_type() == at::kBFloat16) b16 = reinterpret_cast<const uint16_t*>(y.data_ptr());
    else f32 = y.data_ptr<float>();
  }
  // Row t as fp32 plus the bias into out [n]: one loop per case, so each vectorizes.
  void row(int64_t t, float* out) const {
    if (b16) {
      const uint16_t* src = b16 + t * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(src[i]);
    } else {
      std::memcpy(out, f32 + t * n, n * sizeof(float));
    }
    if (bias) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] += bias[i];
    }
  }
};


struct AttnShape {
  int64_t heads, kv_heads, dim, block_size, blocks_per_row;
  float scale;
};

// The step's indices are pointer offsets here (eager torch would raise on a bad one):
// every row's context must fit its block table, its blocks lie in the cache, and each
// new K/V slot (when given) lies in the cache.
void check_indices(const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor* slots,
                   int64_t num_blocks, int64_t block_size, int64_t T) {
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == T && seq_lens.numel() == T &&
                  (slots == nullptr || slots->numel() == T),
              "block_tables [T, W], seq_lens [T] and slots [T] must have one row per token");
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t W = block_tables.size(1);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(lens[t] >= 1 && lens[t] <= W * block_size, "seq_lens[", t, "] = ", lens[t], " outside its block table");
    for (int64_t b = 0; b < (lens[t] + block_size - 1) / block_size; ++b)
      TORCH_CHECK(tables[t * W + b] >= 0 && tables[t * W + b] < num_blocks, "block_tables[", t, ", ", b, "] = ",
                  tables[t * W + b], " is not a block of the cache");
    if (slots != nullptr)
      TORCH_CHECK(slots->data_ptr<int64_t>()[t] >= 0 && slots->data_ptr<int64_t>()[t] < num_blocks * block_size,
                  "slots[", t, "] is not a slot of the cache");
  }
}

// A work unit's result per query head: its scores' max, their exp-sum, then (from
// kPartOut on, 64-byte aligned in the part buffer) its unnormalised output [D].
constexpr int64_t kPartOut = 16;
inline int64_t part_stride(int64_t D) { return kPartOut + D; }

// Where keys [lo, hi) of a row (its blocks in `table`) lie: rows[j] = the offset, in
// elements, of key lo + j's row (width elements: every kv head) in its cache. Walked
// block by block: one table lookup per block, no division per key.
inline void key_rows(const int32_t* table, int64_t lo, int64_t hi, int64_t BS, int64_t width, int64_t* rows) {
  for (int64_t pos = lo, j = 0; pos < hi;) {
    const int64_t off = pos % BS, take = std::min(BS - off, hi - pos);
    const int64_t first = (int64_t(table[pos / BS]) * BS + off) * width;
    for (int64_t i = 0; i < take; ++i) rows[j++] = first + i * width;
    pos += take;
  }
}

// One work unit of decode attention: keys [lo, hi) of one row (its blocks in `table`), for
// all its query heads q [heads, D] (head h reads kv head h / G). Writes each head's part
// (above) to out [heads][part_stride(D)]. Portable loops; each token's K (then V) row of all
// kv heads read contiguously and widened to fp32 once into `row`, then serving its G query
// heads. DC > 0 fixes the head dim at compile time (64 and 128: the inner loops unroll);
// 0 reads it from `a`.
template <typename KV, int DC>
void attend_unit(const float* q, const KV* kc, const KV* vc, const int32_t* table, int64_t lo, int64_t hi,
                 const AttnShape& a, float* scores, float* row, float* out) {
  const int64_t D = DC > 0 ? DC : a.dim, G = a.heads / a.kv_heads, BS = a.block_size, H = a.heads;
  const int64_t stride = a.kv_heads * D;  // one token's K (or V) row in the cache
  const int64_t P = part_stride(D);
  const int64_t n = hi - lo;
  int64_t rows[kKeysPerUnit];
  key_rows(table, lo, hi, BS, stride, rows);
  // Calls f(j, the j-th key's row [kv_heads, D] in `cache`) for j in [0, n).
  auto walk = [&](const KV* cache, auto&& f) {
    for (int64_t j = 0; j < n; ++j) f(j, cache + rows[j]);
  };
  for (int64_t h = 0; h < H; ++h) out[h * P] = -std::numeric_limits<float>::infinity();
  walk(kc, [&](int64_t j, const KV* kr) {
#pragma omp simd
    for (int64_t d = 0; d < stride; ++d) row[d] = kv_load(kr[d]);
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + h * D;
      const float* kh = row + (h / G) * D;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < D; ++d) s += qh[d] * kh[d];
      s *= a.scale;
      scores[h * kKeysPerUnit + j] = s;
      out[h * P] = std::max(out[h * P], s);
    }
  });
  for (int64_t h = 0; h < H; ++h) {
    float* sh = scores + h * kKeysPerUnit;
    const float m = out[h * P];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      sh[j] = exp_approx(sh[j] - m);
      sum += sh[j];
    }
    out[h * P + 1] = sum;
    std::fill(out + h * P + kPartOut, out + (h + 1) * P, 0.0f);
  }
  walk(vc, [&](int64_t j, const KV* vr) {
#pragma omp simd
    for (int64_t d = 0; d < stride; ++d) row[d] = kv_load(vr[d]);
    for (int64_t h = 0; h < H; ++h) {
      const float p = scores[h * kKeysPerUnit + j];
      const float* vh = row + (h / G) * D;
      float* acc = out + h * P + kPartOut;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += p * vh[d];
    }
  });
}

#if defined(__AVX512F__)
// The same unit with AVX-512, for head dims of 64 and 128. The portable loops above pay
// a horizontal sum per key and query head, keep the outputs in memory (a load and a
// store per key and head) and leave exp scalar (gcc does not vectorize it there): at 8k
// keys they read a bf16 cache at ~6 GB/s, a fifth of the memory's bandwidth. Here keys
// go in tiles of 16, widened once into `tile` [kv_heads][16][D] fp32 while the next
// tile is prefetched; per query head, 16 dot products are vector FMAs summed across
// lanes together (sum_lanes16), exp is 16 lanes wide, and the output stays in registers
// across a tile. ~17 GB/s on the same keys (experiments/RESULTS.md). As on AVX2 (below), the R
// rows of a run share each widened tile, each row over its own [begin, end) of the keys.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // bf16 bits: widened exactly, as bf16_to_float
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// Lane i: the sum of v[i]'s 16 lanes. A transpose-and-add tree: pairs within 128-bit
// lanes, then quads, then across the four 128-bit blocks (45 instructions for 16 sums).
inline __m512 sum_lanes16(const __m512* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3]
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit block: keys 4i .. 4i+3, each summed over that block
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp_approx on 16 lanes (gcc leaves the scalar one's loops unvectorized here). 2^n is
// applied by scalef, exact like the scalar's exponent bits.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

template <typename KV, int D>
void attend_unit_avx512(const float* q, int64_t R, const int64_t* begin, const int64_t* end, const KV* kc,
                        const KV* vc, const int32_t* table, int64_t lo, int64_t hi, const AttnShape& a, float* scores,
                        float* tile, float* out) {
  static_assert(D % 16 == 0);
  constexpr int C = D / 16;
  constexpr int64_t P = kPartOut + D;
  const int64_t G = a.heads / a.kv_heads, KVH = a.kv_heads, BS = a.block_size, H = a.heads, n = hi - lo;
  const int64_t width = KVH * D;  // one token's K (or V) row: every kv head
  const int64_t lines = (width * int64_t(sizeof(KV)) + 63) / 64;
  int64_t rows[kKeysPerUnit];
  key_rows(table, lo, hi, BS, width, rows);
  // Keys [j0, j0 + 16) into tile [kv_heads][16][D] as fp32 (rows past the unit's end: zeros),
  // each token's row read whole and in order; the next tile's rows are requested from
  // memory meanwhile (the blocks lie anywhere in the cache: no prefetcher foresees them).
  auto widen = [&](const KV* cache, int64_t j0) {
    // The next tile: this cache's next 16 keys, or after the last keys the values' first.
    const bool last = j0 + 16 >= n;
    const KV* ahead = last ? (cache == kc ? vc : nullptr) : cache;
    const int64_t a0 = last ? 0 : j0 + 16;
    for (int64_t i = 0; i < 16; ++i) {
      if (ahead && a0 + i < n) {
        const char* next = reinterpret_cast<const char*>(ahead + rows[a0 + i]);
        for (int64_t l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
      }
      for (int64_t g = 0; g < KVH; ++g) {
        float* t = tile + (g * 16 + i) * D;
        if (j0 + i < n) {
          const KV* r = cache + rows[j0 + i] + g * D;
          for (int c = 0; c < C; ++c) _mm512_storeu_ps(t + 16 * c, load16(r + 16 * c));
        } else {
          for (int c = 0; c < C; ++c) _mm512_storeu_ps(t + 16 * c, _mm512_setzero_ps());
        }
      }
    }
  };
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {  // scores [j0, j0 + 16), the tile widened once for every row
    widen(kc, j0);
    for (int64_t r = 0; r < R; ++r) {
      if (j0 + 16 <= begin[r] || j0 >= end[r]) continue;
      const float* qr = q + r * H * D;
      float* sr = scores + r * H * kKeysPerUnit;
      for (int64_t h = 0; h < H; ++h) {
        const float* t = tile + (h / G) * 16 * D;
        __m512 qh[C], acc[16];
        for (int c = 0; c < C; ++c) qh[c] = _mm512_loadu_ps(qr + h * D + 16 * c);
        for (int i = 0; i < 16; ++i) {
          acc[i] = _mm512_mul_ps(qh[0], _mm512_loadu_ps(t + i * D));
          for (int c = 1; c < C; ++c) acc[i] = _mm512_fmadd_ps(qh[c], _mm512_loadu_ps(t + i * D + 16 * c), acc[i]);
        }
        _mm512_storeu_ps(sr + h * kKeysPerUnit + j0, _mm512_mul_ps(sum_lanes16(acc), scale));
      }
    }
  }
  // The lanes of keys [j0, j0 + 16) in [b, e).
  auto live = [](int64_t j0, int64_t b, int64_t e) {
    const int64_t i0 = std::max<int64_t>(0, b - j0), i1 = std::min<int64_t>(16, e - j0);
    return i1 <= i0 ? __mmask16(0) : __mmask16(((1u << i1) - 1) & ~((1u << i0) - 1));
  };
  for (int64_t r = 0; r < R; ++r) {  // softmax numerators; lanes outside [begin, end) are left out
    const int64_t b = begin[r], e = end[r], first = b / 16 * 16;
    for (int64_t h = 0; h < H; ++h) {
      float* sh = scores + (r * H + h) * kKeysPerUnit;
      float* oh = out + (r * H + h) * P;
      __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), vsum = _mm512_setzero_ps();
      for (int64_t j0 = first; j0 < e; j0 += 16) vmax = _mm512_mask_max_ps(vmax, live(j0, b, e), vmax, _mm512_loadu_ps(sh + j0));
      const float m = _mm512_reduce_max_ps(vmax);  // -inf where the row sees none of the unit's keys
      for (int64_t j0 = first; j0 < e; j0 += 16) {
        const __m512 x = exp16(_mm512_sub_ps(_mm512_loadu_ps(sh + j0), _mm512_set1_ps(m)));
        _mm512_storeu_ps(sh + j0, x);
        vsum = _mm512_mask_add_ps(vsum, live(j0, b, e), vsum, x);
      }
      oh[0] = m;
      oh[1] = _mm512_reduce_add_ps(vsum);
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(oh + kPartOut + 16 * c, _mm512_setzero_ps());
    }
  }
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    widen(vc, j0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i0 = std::max<int64_t>(0, begin[r] - j0), i1 = std::min<int64_t>(16, end[r] - j0);
      if (i1 <= i0) continue;
      for (int64_t h = 0; h < H; ++h) {
        const float* t = tile + (h / G) * 16 * D;
        float* oh = out + (r * H + h) * P + kPartOut;
        const float* p = scores + (r * H + h) * kKeysPerUnit + j0;
        __m512 acc[C];
        for (int c = 0; c < C; ++c) acc[c] = _mm512_loadu_ps(oh + 16 * c);
        for (int64_t i = i0; i < i1; ++i) {
          const __m512 pi = _mm512_set1_ps(p[i]);
          for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(t + i * D + 16 * c), acc[c]);
        }
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(oh + 16 * c, acc[c]);
      }
    }
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// The same unit with AVX2 and FMA (8 lanes), for head dims of 64 and 128: keys in tiles of
// 8 widened once into `tile` [kv_heads][8][D] fp32 while the next tile is prefetched, 8 dot
// products per query head summed across lanes together (sum_lanes8), an 8-lane exp, and
// the outputs in registers across a tile, 8 vectors (64 dims) at a time. AVX2 has no lane
// masks: lanes past the unit's end are blended out. The R rows of a run (one sequence's
// draft: the same keys, each row seeing its own [begin, end) of them) share each widened
// tile, so a 9-row check reads and widens its keys once, not nine times.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {  // bf16 bits: widened exactly, as bf16_to_float
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Lane i: the sum of v[i]'s 8 lanes.
inline __m256 sum_lanes8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // a: [s0 s1 s2 s3 | s0' s1' s2' s3'] (low and high halves of v0..v3), b: the same for v4..v7.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// exp_approx on 8 lanes; 2^n is built in the exponent bits, as the scalar one does.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

inline float hsum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps(m, m, 1)));
}

template <typename KV, int D>
void attend_unit_avx2(const float* q, int64_t R, const int64_t* begin, const int64_t* end, const KV* kc,
                      const KV* vc, const int32_t* table, int64_t lo, int64_t hi, const AttnShape& a, float* scores,
                      float* tile, float* out) {
  static_assert(D % 64 == 0);
  constexpr int C = D / 8;
  constexpr int64_t P = kPartOut + D;
  const int64_t G = a.heads / a.kv_heads, KVH = a.kv_heads, BS = a.block_size, H = a.heads, n = hi - lo;
  const int64_t width = KVH * D;
  const int64_t lines = (width * int64_t(sizeof(KV)) + 63) / 64;
  int64_t rows[kKeysPerUnit];
  key_rows(table, lo, hi, BS, width, rows);
  // Keys [j0, j0 + 8) into tile [kv_heads][8][D] as fp32 (rows past the unit's end: zeros);
  // the next tile's rows are requested from memory meanwhile.
  auto widen = [&](const KV* cache, int64_t j0) {
    const bool last = j0 + 8 >= n;
    const KV* ahead = last ? (cache == kc ? vc : nullptr) : cache;
    const int64_t a0 = last ? 0 : j0 + 8;
    for (int64_t i = 0; i < 8; ++i) {
      if (ahead && a0 + i < n) {
        const char* next = reinterpret_cast<const char*>(ahead + rows[a0 + i]);
        for (int64_t l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
      }
      for (int64_t g = 0; g < KVH; ++g) {
        float* t = tile + (g * 8 + i) * D;
        if (j0 + i < n) {
          const KV* r = cache + rows[j0 + i] + g * D;
          for (int c = 0; c < C; ++c) _mm256_storeu_ps(t + 8 * c, load8(r + 8 * c));
        } else {
          for (int c = 0; c < C; ++c) _mm256_storeu_ps(t + 8 * c, _mm256_setzero_ps());
        }
      }
    }
  };
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t j0 = 0; j0 < n; j0 += 8) {  // scores [j0, j0 + 8), the tile widened once for every row
    widen(kc, j0);
    for (int64_t r = 0; r < R; ++r) {
      if (j0 + 8 <= begin[r] || j0 >= end[r]) continue;
      const float* qr = q + r * H * D;
      float* sr = scores + r * H * kKeysPerUnit;
      for (int64_t h = 0; h < H; ++h) {
        const float* t = tile + (h / G) * 8 * D;
        const float* qh = qr + h * D;
        __m256 acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
        for (int c = 0; c < C; ++c) {  // q's chunk once, against the 8 keys
          const __m256 qc = _mm256_loadu_ps(qh + 8 * c);
          for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(t + i * D + 8 * c), acc[i]);
        }
        _mm256_storeu_ps(sr + h * kKeysPerUnit + j0, _mm256_mul_ps(sum_lanes8(acc), scale));
      }
    }
  }
  // The lanes of keys [j0, j0 + 8) in [b, e) (all ones or zeros per lane).
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto live = [&](int64_t j0, int64_t b, int64_t e) {
    const __m256i j = _mm256_add_epi32(lane, _mm256_set1_epi32(int32_t(j0)));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(e)), j),
                                                _mm256_cmpgt_epi32(j, _mm256_set1_epi32(int32_t(b) - 1))));
  };
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < R; ++r) {  // softmax numerators; lanes outside [begin, end) are left out
    const int64_t b = begin[r], e = end[r], first = b / 8 * 8;
    for (int64_t h = 0; h < H; ++h) {
      float* sh = scores + (r * H + h) * kKeysPerUnit;
      float* oh = out + (r * H + h) * P;
      __m256 vmax = ninf, vsum = _mm256_setzero_ps();
      for (int64_t j0 = first; j0 < e; j0 += 8) vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_loadu_ps(sh + j0), live(j0, b, e)));
      const float m = hmax8(vmax);  // -inf where the row sees none of the unit's keys
      for (int64_t j0 = first; j0 < e; j0 += 8) {
        const __m256 x = exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + j0), _mm256_set1_ps(m)));
        _mm256_storeu_ps(sh + j0, x);
        vsum = _mm256_add_ps(vsum, _mm256_and_ps(x, live(j0, b, e)));
      }
      oh[0] = m;
      oh[1] = hsum8(vsum);
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(oh + kPartOut + 8 * c, _mm256_setzero_ps());
    }
  }
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    widen(vc, j0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i0 = std::max<int64_t>(0, begin[r] - j0), i1 = std::min<int64_t>(8, end[r] - j0);
      if (i1 <= i0) continue;
      for (int64_t h = 0; h < H; ++h) {
        const float* t = tile + (h / G) * 8 * D;
        float* oh = out + (r * H + h) * P + kPartOut;
        const float* p = scores + (r * H + h) * kKeysPerUnit + j0;
        for (int c0 = 0; c0 < C; c0 += 8) {  // 8 output vectors (64 dims) in registers at a time
          __m256 acc[8];
          for (int c = 0; c < 8; ++c) acc[c] = _mm256_loadu_ps(oh + 8 * (c0 + c));
          for (int64_t i = i0; i < i1; ++i) {
            const __m256 pi = _mm256_set1_ps(p[i]);
            for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(t + i * D + 8 * (c0 + c)), acc[c]);
          }
          for (int c = 0; c < 8; ++c) _mm256_storeu_ps(oh + 8 * (c0 + c), acc[c]);
        }
      }
    }
  }
}
#endif

// A unit's part for R rows of a run through a body that takes one row (the portable one):
// each row over its own keys, or an empty part (max -inf, sum 0) if it sees none.
template <typename KV, int DC, auto Unit>
void attend_rows(const float* q, int64_t R, const int64_t* begin, const int64_t* end, const KV* kc, const KV* vc,
                 const int32_t* table, int64_t lo, int64_t hi, const AttnShape& a, float* scores, float* tile,
                 float* out) {
  const int64_t H = a.heads, D = a.dim, P = part_stride(D);
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * H * P;
    if (end[r] > begin[r]) {
      Unit(q + r * H * D, kc, vc, table, lo + begin[r], lo + end[r], a, scores, tile, o);
    } else {
      for (int64_t h = 0; h < H; ++h) {
        o[h * P] = -std::numeric_limits<float>::infinity();
        std::fill(o + h * P + 1, o + (h + 1) * P, 0.0f);
      }
    }
  }
}

// The most rows one run holds (a draft is 1 + engine.num_speculative_tokens rows).
constexpr int64_t kMaxRun = 16;

// Paged decode attention for T rows (one query token each): o [T, heads, dim] from q of
// the same shape, over the first seq_lens[t] keys of row t (the last `window` of them
// when window > 0). Consecutive rows that read the same blocks (a speculated sequence's
// 1 + k rows: one table, lengths n, n + 1, ...) form a run whose keys are read once for
// all of them. Each run's keys split into units of kKeysPerUnit, spread over torch's
// threads (attend_unit); a row's units are merged afterwards (flash-decoding's split-K).
// KV is the cache's element type (float or bf16 bits). sinks (gpt-oss; nullptr: none): one
// logit per query head that joins each row's softmax denominator, carrying no value.
template <typename KV>
void attention(const float* q, const KV* kc, const KV* vc, const int32_t* tables, const int32_t* seq_lens,
               int64_t T, int64_t window, const AttnShape& a, float* o, const float* sinks = nullptr) {
  const int64_t D = a.dim, H = a.heads, BS = a.block_size, W = a.blocks_per_row;
  const int64_t P = part_stride(D), stride = H * P;  // per unit and row: each query head's part
  auto first_key = [&](int64_t t) { return window > 0 ? std::max<int64_t>(0, seq_lens[t] - window) : int64_t(0); };
  // Row t joins the run before it if it reads at least as far and its table agrees on
  // every block the previous row reads (so the run's last table serves all its rows).
  struct Run { int64_t t0, R; };
  std::vector<Run> runs;
  for (int64_t t = 0; t < T; ++t) {
    if (!runs.empty() && runs.back().R < kMaxRun && seq_lens[t] >= seq_lens[t - 1]) {
      const int64_t used = (int64_t(seq_lens[t - 1]) + BS - 1) / BS;
      if (std::equal(tables + (t - 1) * W, tables + (t - 1) * W + used, tables + t * W)) {
        ++runs.back().R;
        continue;
      }
    }
    runs.push_back({t, 1});
  }
  struct Unit { int64_t run, lo, hi, part; };
  std::vector<Unit> units;
  std::vector<int64_t> first_unit(runs.size() + 1, 0);
  int64_t keys = 0, parts = 0, widest = 1;
  for (size_t g = 0; g < runs.size(); ++g) {
    const Run& run = runs[g];
    int64_t lo = first_key(run.t0), hi = seq_lens[run.t0];
    for (int64_t r = 0; r < run.R; ++r) {
      lo = std::min(lo, first_key(run.t0 + r));
      hi = std::max<int64_t>(hi, seq_lens[run.t0 + r]);
      keys += seq_lens[run.t0 + r] - first_key(run.t0 + r);
    }
    for (int64_t k = lo; k < hi; k += kKeysPerUnit) {
      units.push_back({int64_t(g), k, std::min(hi, k + kKeysPerUnit), parts});
      parts += run.R * stride;
    }
    first_unit[g + 1] = int64_t(units.size());
    widest = std::max(widest, run.R);
  }
  const int64_t U = int64_t(units.size());
  // Every unit writes its rows' whole parts (max, sum, outputs) before the merge reads them.
  at::Tensor part_buffer = at::empty({std::max<int64_t>(parts, 1)}, at::kFloat);  // 64-byte aligned
  float* part = part_buffer.data_ptr<float>();
#if defined(__AVX512F__)
  const auto unit = D == 64    ? attend_unit_avx512<KV, 64>
                    : D == 128 ? attend_unit_avx512<KV, 128>
                    : D == 256 ? attend_unit_avx512<KV, 256>  // Gemma
                               : attend_rows<KV, 0, attend_unit<KV, 0>>;
  const int64_t scratch = 16 * a.kv_heads * D;  // the tile (or the portable unit's row)
#elif defined(__AVX2__) && defined(__FMA__)
  const auto unit = D == 64    ? attend_unit_avx2<KV, 64>
                    : D == 128 ? attend_unit_avx2<KV, 128>
                    : D == 256 ? attend_unit_avx2<KV, 256>
                               : attend_rows<KV, 0, attend_unit<KV, 0>>;
  const int64_t scratch = 8 * a.kv_heads * D;
#else
  const auto unit = D == 64    ? attend_rows<KV, 64, attend_unit<KV, 64>>
                    : D == 128 ? attend_rows<KV, 128, attend_unit<KV, 128>>
                               : attend_rows<KV, 0, attend_unit<KV, 0>>;
  const int64_t scratch = a.kv_heads * D;
#endif

  // A short context is a few microseconds of work: not worth waking the other threads.
  at::parallel_for(0, U, keys * H < 4096 ? U : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kKeysPerUnit * H * widest), row(scratch);
    int64_t from[kMaxRun], to[kMaxRun];
    for (int64_t u = begin; u < end; ++u) {
      const Unit& w = units[u];
      const Run& run = runs[w.run];
      for (int64_t r = 0; r < run.R; ++r) {  // the row's keys within the unit, relative to its start
        const int64_t n = w.hi - w.lo;
        from[r] = std::clamp<int64_t>(first_key(run.t0 + r) - w.lo, 0, n);
        to[r] = std::clamp<int64_t>(seq_lens[run.t0 + r] - w.lo, 0, n);
      }
      unit(q + run.t0 * H * D, run.R, from, to, kc, vc, tables + (run.t0 + run.R - 1) * W, w.lo, w.hi, a,
           scores.data(), row.data(), part + w.part);
    }
  });

  for (size_t g = 0; g < runs.size(); ++g) {
    const Run& run = runs[g];
    const int64_t u0 = first_unit[g], u1 = first_unit[g + 1];
    for (int64_t r = 0; r < run.R; ++r) {
      const int64_t t = run.t0 + r;
      for (int64_t h = 0; h < H; ++h) {
        float* oh = o + (t * H + h) * D;
        std::fill(oh, oh + D, 0.0f);
        if (u0 == u1) continue;  // no keys (cannot happen: the row's own key is written)
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t u = u0; u < u1; ++u) m = std::max(m, part[units[u].part + r * stride + h * P]);
        if (sinks) m = std::max(m, sinks[h]);
        float total = sinks ? exp_approx(sinks[h] - m) : 0.0f;  // the sink enters once per row
        for (int64_t u = u0; u < u1; ++u) {
          const float* p = part + units[u].part + r * stride + h * P;
          if (p[1] == 0.0f) continue;  // a unit of the run this row sees no key of
          const float c = exp_approx(p[0] - m);
          total += p[1] * c;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) oh[d] += p[kPartOut + d] * c;
        }
        const float inv = 1.0f / total;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) oh[d] *= inv;
      }
    }
  }
}

// The rows' new K and V (k, v [T, kv_heads * dim] fp32) into their slots of a layer's
// caches, rounded as the cache holds them.
template <typename KV>
void write_kv(const float* k, const float* v, const int64_t* slots, const at::Tensor& k_cache,
              const at::Tensor& v_cache, int64_t T, int64_t n) {
  KV* kc = reinterpret_cast<KV*>(k_cache.data_ptr());
  KV* vc = reinterpret_cast<KV*>(v_cache.data_ptr());
  for (int64_t t = 0; t < T; ++t) {
    kv_store(k + t * n, n, kc + slots[t] * n);
    kv_store(v + t * n, n, vc + slots[t] * n);
  }
}

// attention() over a layer's caches, for the element type they hold (fp32 or bf16).
void attend_cache(const float* q, const at::Tensor& k_cache, const at::Tensor& v_cache, const int32_t* tables,
                  const int32_t* seq_lens, int64_t T, int64_t window, const AttnShape& a, float* o,
                  const float* sinks = nullptr) {
  if (k_cache.scalar_type() == at::kBFloat16) {
    attention(q, static_cast<const uint16_t*>(k_cache.data_ptr()), static_cast<const uint16_t*>(v_cache.data_ptr()),
              tables, seq_lens, T, window, a, o, sinks);
  } else {
    attention(q, static_cast<const float*>(k_cache.data_ptr()), static_cast<const float*>(v_cache.data_ptr()), tables,
              seq_lens, T, window, a, o, sinks);
  }
}

// Rotate each head of x [heads, D] in place: x*C + roll(x, D/2)*S with C = cat(cos, cos)
// and S = cat(-sin, sin), the tables ignis/model/rope.py builds.
inline void rotate(float* x, int64_t heads, int64_t D, const float* C, const float* S) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* xh = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * C[i] + b * S[i];
      xh[i + half] = b * C[i + half] + a * S[i + half];
    }
  }
}

// The gated MLP's activation (ignis_kernels/moe_ref.py's glu): SiLU, GeLU (tanh) or gpt-oss's
// clamped SwiGLU.
enum Act : int64_t { kSilu = 0, kGeluTanh = 1, kSwigluOai = 2 };
// Where the norms sit (ignis/model/decoder.py): pre (input, post-attention norm per layer)
// or sandwich (input, post-attention, pre-feedforward, post-feedforward).
enum Layout : int64_t { kPre = 0, kSandwich = 1 };
// How a mixture weighs each row's top k experts (ignis_kernels/moe_ref.py's route): softmax over
// every expert then the top k renormalised (Mixtral, Qwen3-MoE) or not, or (gpt-oss) the
// top k logits softmaxed.
enum Routing : int64_t { kSoftmaxRenorm = 0, kSoftmaxRaw = 1, kTopKSoftmax = 2 };

struct Glu {
  int64_t act;
  float alpha, limit;  // kSwigluOai's
};

// out [n] = act(gate) * up for one row's gate|up outputs g [2n] (biases already added).
inline void glu_row(const Glu& f, const float* g, int64_t n, float* out) {
  const float* up = g + n;
  if (f.act == kSilu) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + exp_approx(-g[i])) * up[i];
  } else if (f.act == kGeluTanh) {  // torch's gelu(approximate="tanh")
    constexpr float kAlpha = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t i = 0; i < n; ++i) {
      const float v = g[i];
      out[i] = 0.5f * v * (1.0f + std::tanh(kAlpha * (v + 0.044715f * v * v * v))) * up[i];
    }
  } else {  // the gate clamped above at limit, up to +-limit and offset by 1, the sigmoid sharpened by alpha
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float v = std::min(g[i], f.limit);
      const float u = std::min(std::max(up[i], -f.limit), f.limit);
      out[i] = (u + 1.0f) * (v / (1.0f + exp_approx(-f.alpha * v)));
    }
  }
}

// One row's k experts (ids, largest logit first; a tie goes to the lower index) and their
// weights, from its router logits [E], as `routing` says; fp32 with libm's exp, as torch.
inline void route_row(const float* logits, int64_t E, int64_t k, int64_t routing, int64_t* ids, float* weights) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    ids[j] = best;
  }
  const float top = logits[ids[0]];
  if (routing == kTopKSoftmax) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[j] = std::exp(logits[ids[j]] - top);
    for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
    return;
  }
  float all = 0.0f;  // softmax over every expert, then the chosen ones' probabilities
  for (int64_t e = 0; e < E; ++e) all += std::exp(logits[e] - top);
  for (int64_t j = 0; j < k; ++j) weights[j] = std::exp(logits[ids[j]] - top) / all;
  if (routing == kSoftmaxRenorm) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += weights[j];
    for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
  }
}

at::Tensor decode_layers(
    const at::Tensor& x_in,           // [T, H] fp32: the embedded tokens
    const at::Tensor& cos,            // [T, D] fp32: cat(cos, cos) of each row's position
    const at::Tensor& sin,            // [T, D] fp32: cat(-sin, sin)
    const at::Tensor& cos_local,      // the same from the windowed layers' table, or empty
    const at::Tensor& sin_local,
    const at::Tensor& slots,          // [T] int64: where each row's K/V go (block * block_size + offset)
    const at::Tensor& block_tables,   // [T, W] int32
    const at::Tensor& seq_lens,       // [T] int32: context length including the new token
    at::TensorList k_caches,          // per layer [blocks, block_size, kv_heads, D], all fp32 or all bf16
    at::TensorList v_caches,
    at::TensorList norms,             // per layer its layout's norms (2 or 4), then the final norm
    at::TensorList weights,           // per projection (Gemms: a dense layer's 4, a mixture's 2 + 2E) as `kinds` says
    at::TensorList wide,              // per dense projection its kept wide copy (Gemms), or empty
    const c10::List<c10::optional<at::Tensor>>& biases,     // per projection
    const c10::List<c10::optional<at::Tensor>>& qk_norms,   // per layer q_norm, k_norm (per head), or empty
    at::IntArrayRef windows,          // per layer sliding window, 0 = none
    at::IntArrayRef rope_local,       // per layer 1: rotate with the local table, or empty
    int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
    double eps, double scale, at::IntArrayRef kinds, int64_t group, int64_t narrow_rows, int64_t wide_kind,
    int64_t layout, int64_t act, double residual_scale,
    const c10::List<c10::optional<at::Tensor>>& sinks,          // per layer fp32 [heads] (gpt-oss), or empty
    const c10::List<c10::optional<at::Tensor>>& routers,        // per layer a mixture's router fp32 [E, H]
                                                                // (None: a dense layer), or empty
    const c10::List<c10::optional<at::Tensor>>& router_biases,  // per layer its bias fp32 [E], or empty
    int64_t top_k, int64_t routing, int64_t moe_intermediate, double swiglu_alpha, double swiglu_limit) {
  const int64_t L = int64_t(k_caches.size());
  const int64_t T = x_in.size(0), H = x_in.size(1), D = head_dim, I = intermediate, MI = moe_intermediate;
  const int64_t Q = heads * D, KV = kv_heads * D, QKV = Q + 2 * KV;
  TORCH_CHECK(layout == kPre || layout == kSandwich, "decode_layers: unknown norm layout ", layout);
  TORCH_CHECK(act >= kSilu && act <= kSwigluOai, "decode_layers: unknown activation ", act);
  TORCH_CHECK(routing >= kSoftmaxRenorm && routing <= kTopKSoftmax, "decode_layers: unknown routing ", routing);
  const Glu glu{act, float(swiglu_alpha), float(swiglu_limit)};
  const int64_t NL = layout == kSandwich ? 4 : 2;  // norms per layer
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.is_contiguous(), "decode_layers: x must be contiguous fp32");
  TORCH_CHECK((routers.size() == 0 || int64_t(routers.size()) == L) &&
                  (router_biases.size() == 0 || router_biases.size() == routers.size()) &&
                  (sinks.size() == 0 || int64_t(sinks.size()) == L),
              "decode_layers: per-layer lists of the wrong length");
  // Each layer's experts (0: dense), its projections' and wide copies' count.
  std::vector<int64_t> experts(L, 0);
  int64_t projections = 0, wides = 0;
  for (int64_t l = 0; l < L; ++l) {
    if (routers.size() && routers.get(l).has_value()) {
      const at::Tensor r = *routers.get(l);
      TORCH_CHECK(r.dim() == 2 && r.size(1) == H && r.scalar_type() == at::kFloat && r.is_contiguous() &&
                      top_k >= 1 && top_k <= r.size(0) && MI > 0,
                  "decode_layers: a router must be contiguous fp32 [E, hidden], top_k within E");
      const c10::optional<at::Tensor> b = router_biases.size() ? router_biases.get(l) : c10::nullopt;
      TORCH_CHECK(!b.has_value() || (b->numel() == r.size(0) && b->scalar_type() == at::kFloat && b->is_contiguous()),
                  "decode_layers: a router's bias must be contiguous fp32 [E]");
      experts[l] = r.size(0);
    }
    projections += experts[l] ? 2 + 2 * experts[l] : 4;
    wides += experts[l] ? 2 : 4;
    if (sinks.size() && sinks.get(l).has_value()) {
      const at::Tensor k = *sinks.get(l);
      TORCH_CHECK(k.numel() == heads && k.scalar_type() == at::kFloat && k.is_contiguous(),
                  "decode_layers: sinks must be contiguous fp32 [heads]");
    }
  }
  TORCH_CHECK(int64_t(v_caches.size()) == L && int64_t(norms.size()) == NL * L + 1 &&
                  int64_t(biases.size()) == projections && int64_t(windows.size()) == L &&
                  int64_t(kinds.size()) == projections && (wide.size() == 0 || int64_t(wide.size()) == wides) &&
                  (qk_norms.size() == 0 || int64_t(qk_norms.size()) == 2 * L) &&
                  (rope_local.size() == 0 || int64_t(rope_local.size()) == L),
              "decode_layers: per-layer lists of the wrong length");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && slots.is_contiguous() && block_tables.is_contiguous() &&
                  seq_lens.is_contiguous() && heads % kv_heads == 0,
              "decode_layers: bad step tensors");
  const at::ScalarType kv_type = k_caches[0].scalar_type();
  TORCH_CHECK(kv_type == at::kFloat || kv_type == at::kBFloat16, "decode_layers: the KV cache must be fp32 or bf16");
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(k_caches[l].is_contiguous() && v_caches[l].is_contiguous() && k_caches[l].scalar_type() == kv_type &&
                    v_caches[l].scalar_type() == kv_type,
                "decode_layers: the KV caches must be contiguous and of one dtype");
  const auto write = kv_type == at::kBFloat16 ? write_kv<uint16_t> : write_kv<float>;
  TORCH_CHECK(cos.numel() == T * D && sin.numel() == T * D && slots.scalar_type() == at::kLong &&
                  block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  k_caches[0].dim() == 4 && k_caches[0].size(2) == kv_heads && k_caches[0].size(3) == D,
              "decode_layers: step tensors or cache shaped unlike the model");
  bool any_local = false;
  for (const int64_t r : rope_local) any_local = any_local || r != 0;
  TORCH_CHECK(!any_local || (cos_local.is_contiguous() && sin_local.is_contiguous() && cos_local.numel() == T * D &&
                             sin_local.numel() == T * D && cos_local.scalar_type() == at::kFloat &&
                             sin_local.scalar_type() == at::kFloat),
              "decode_layers: local RoPE tables shaped unlike the step");
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(k_caches[l].sizes() == k_caches[0].sizes() && v_caches[l].sizes() == k_caches[0].sizes(),
                "decode_layers: the layers' caches differ in shape");
  check_indices(block_tables, seq_lens, &slots, k_caches[0].size(0), k_caches[0].size(1), T);

  at::Tensor x = x_in.clone();
  float* xp = x.data_ptr<float>();
  TORCH_CHECK(wide_kind >= kWideBf16 && wide_kind <= kWideFp32, "decode_layers: unknown wide GEMM kind");
  TORCH_CHECK(group == qgemm::kGroup, "decode_layers: groups of ", qgemm::kGroup, " only");
  const Gemms gemm(weights, wide, kinds, wide.size() > 0 && T > narrow_rows, wide_kind);
  // The GEMMs' fp32 inputs: normed hidden rows, attention outputs, act(gate) * up.
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor h_in = at::empty({T, H}, f32), o_in = at::empty({T, Q}, f32), a_in = at::empty({T, I}, f32);
  std::vector<float> tmp(std::max({H, QKV, I}));  // one row at a time
  std::vector<float> qbuf(T * Q), kbuf(T * KV), vbuf(T * KV), obuf(T * Q), gbuf(2 * I);
  const float* rope_tables[2][2] = {{cos.data_ptr<float>(), sin.data_ptr<float>()},
                                    {any_local ? cos_local.data_ptr<float>() : nullptr,
                                     any_local ? sin_local.data_ptr<float>() : nullptr}};
  const int64_t* slot = slots.data_ptr<int64_t>();
  const AttnShape shape{heads, kv_heads, D, k_caches[0].size(1), block_tables.size(1), float(scale)};
  const float r = float(residual_scale);

  auto bias_of = [&](int64_t i) -> const float* {
    const c10::optional<at::Tensor> b = biases.get(i);
    return b.has_value() ? b->data_ptr<float>() : nullptr;
  };
  auto norm_in = [&](const at::Tensor& w) {  // rows of x, normed, as the next GEMM's input
    for (int64_t t = 0; t < T; ++t) {
      rms_norm(xp + t * H, w.data_ptr<float>(), float(eps), H, h_in.data_ptr<float>() + t * H);
    }
    return h_in;
  };
  // x += a block's output rows: scaled by the residual multiplier (pre layout) or normed
  // first (sandwich layout's post norms), as decoder.py's DecoderLayer adds them.
  auto add_block = [&](const Rows& y, const at::Tensor* post_norm) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = tmp.data();
      y.row(t, row);
      if (post_norm) rms_norm(row, post_norm->data_ptr<float>(), float(eps), H, row);
      if (r == 1.0f) {
        for (int64_t i = 0; i < H; ++i) xp[t * H + i] += row[i];
      } else {
        for (int64_t i = 0; i < H; ++i) xp[t * H + i] += row[i] * r;
      }
    }
  };

  // A mixture's block over h [T, H] (layer l, its experts' projections from p0: expert e's
  // gate_up p0 + 2e, down p0 + 2e + 1): the router's logits (fp32, plus its bias), each
  // row's top k experts and weights (route_row), then each expert some row chose, over just
  // those rows, in expert order; out[t] = sum_j w_j * (down_j(glu(gate_up_j(h_t))) + bias),
  // summed as layers.py's index_add_ sums them.
  auto moe_block = [&](const at::Tensor& h, int64_t l, int64_t p0) {
    const int64_t E = experts[l];
    const float* wr = routers.get(l)->data_ptr<float>();
    const c10::optional<at::Tensor> rb = router_biases.size() ? router_biases.get(l) : c10::nullopt;
    const float* br = rb.has_value() ? rb->data_ptr<float>() : nullptr;
    const float* hp = h.data_ptr<float>();
    std::vector<float> logits(E), weight(top_k);
    std::vector<int64_t> ids(top_k);
    std::vector<std::vector<std::pair<int64_t, float>>> rows(E);  // per expert: (row, weight)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        const float* w = wr + e * H;
        const float* x = hp + t * H;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < H; ++i) s += x[i] * w[i];
        logits[e] = br ? s + br[e] : s;
      }
      route_row(logits.data(), E, top_k, routing, ids.data(), weight.data());
      for (int64_t j = 0; j < top_k; ++j) rows[ids[j]].push_back({t, weight[j]});
    }
    at::Tensor out = at::zeros({T, H}, f32);
    float* op = out.data_ptr<float>();
    std::vector<float> gate_up(2 * MI), down(H);  // one expert output row at a time
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = int64_t(rows[e].size());
      if (m == 0) continue;
      at::Tensor xe = at::empty({m, H}, f32), ae = at::empty({m, MI}, f32);
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(xe.data_ptr<float>() + r * H, hp + rows[e][r].first * H, H * sizeof(float));
      const Rows g(gemm(xe, p0 + 2 * e, 2 * MI), bias_of(p0 + 2 * e));
      for (int64_t r = 0; r < m; ++r) {
        g.row(r, gate_up.data());
        glu_row(glu, gate_up.data(), MI, ae.data_ptr<float>() + r * MI);
      }
      const Rows y(gemm(ae, p0 + 2 * e + 1, H), bias_of(p0 + 2 * e + 1));
      for (int64_t r = 0; r < m; ++r) {
        float* o = op + rows[e][r].first * H;
        const float w = rows[e][r].second;
        y.row(r, down.data());
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) o[i] += down[i] * w;
      }
    }
    return out;
  };

  int64_t p = 0, w = 0;  // layer l's first projection and first wide copy
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* n = &norms[NL * l];  // this layer's norms
    const bool sandwich = layout == kSandwich;
    const float* C = rope_tables[rope_local.size() && rope_local[l]][0];
    const float* S = rope_tables[rope_local.size() && rope_local[l]][1];
    // Attention block: qkv, rotary, the KV write, attention, o_proj.
    const Rows y(gemm(norm_in(n[0]), p, QKV, w), bias_of(p));
    for (int64_t t = 0; t < T; ++t) {
      float* row = tmp.data();
      y.row(t, row);
      if (qk_norms.size()) {
        const float* qn = qk_norms.get(2 * l)->data_ptr<float>();
        const float* kn = qk_norms.get(2 * l + 1)->data_ptr<float>();
        for (int64_t h = 0; h < heads; ++h) rms_norm(row + h * D, qn, float(eps), D, row + h * D);
        for (int64_t h = 0; h < kv_heads; ++h) rms_norm(row + Q + h * D, kn, float(eps), D, row + Q + h * D);
      }
      rotate(row, heads + kv_heads, D, C + t * D, S + t * D);  // q and k heads are adjacent
      std::memcpy(qbuf.data() + t * Q, row, Q * sizeof(float));
      std::memcpy(kbuf.data() + t * KV, row + Q, KV * sizeof(float));
      std::memcpy(vbuf.data() + t * KV, row + Q + KV, KV * sizeof(float));
    }
    write(kbuf.data(), vbuf.data(), slot, k_caches[l], v_caches[l], T, KV);
    const c10::optional<at::Tensor> sink = sinks.size() ? sinks.get(l) : c10::nullopt;
    attend_cache(qbuf.data(), k_caches[l], v_caches[l], block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
                 T, windows[l], shape, obuf.data(), sink.has_value() ? sink->data_ptr<float>() : nullptr);
    std::memcpy(o_in.data_ptr<float>(), obuf.data(), T * Q * sizeof(float));
    add_block(Rows(gemm(o_in, p + 1, H, w + 1), bias_of(p + 1)), sandwich ? &n[1] : nullptr);

    const at::Tensor& mlp_in = norm_in(n[sandwich ? 2 : 1]);
    if (experts[l]) {  // the mixture's block
      add_block(Rows(moe_block(mlp_in, l, p + 2), nullptr), sandwich ? &n[3] : nullptr);
      p += 2 + 2 * experts[l];
      w += 2;
      continue;
    }
    // MLP block: gate|up, act(gate) * up, down.
    const Rows gy(gemm(mlp_in, p + 2, 2 * I, w + 2), bias_of(p + 2));
    for (int64_t t = 0; t < T; ++t) {
      float* g = gbuf.data();
      gy.row(t, g);
      glu_row(glu, g, I, a_in.data_ptr<float>() + t * I);
    }
    add_block(Rows(gemm(a_in, p + 3, H, w + 3), bias_of(p + 3)), sandwich ? &n[3] : nullptr);
    p += 4;
    w += 4;
  }
  const float* fw = norms[NL * L].data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) rms_norm(xp + t * H, fw, float(eps), H, xp + t * H);
  return x;
}

// Decode rows' paged attention alone, for steps the eager forward runs (wider batches):
// o [T, heads, dim] for q [T, heads, dim], row t one new token of a sequence of seq_lens[t]
// keys in the blocks of block_tables[t]; read in place, no gather and no mask. sinks: None,
// or fp32 [heads] (attention() above).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t window, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be contiguous fp32 [T, heads, dim]");
  const auto kv_type = k_cache.scalar_type();
  TORCH_CHECK(k_cache.dim() == 4 && (kv_type == at::kFloat || kv_type == at::kBFloat16) && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == kv_type && v_cache.is_contiguous(),
              "the KV cache must be contiguous fp32 or bf16 [blocks, block_size, kv_heads, dim]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous() && seq_lens.scalar_type() == at::kInt &&
                  seq_lens.is_contiguous() && block_tables.size(0) == q.size(0) && seq_lens.size(0) == q.size(0),
              "block_tables [T, W] and seq_lens [T] must be contiguous int32");
  const int64_t T = q.size(0), heads = q.size(1), kv_heads = k_cache.size(2), D = q.size(2);
  TORCH_CHECK(k_cache.size(3) == D && heads % kv_heads == 0, "head shapes do not match");
  if (sinks)
    TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == heads && sinks->scalar_type() == at::kFloat &&
                    sinks->is_contiguous(),
                "sinks must be contiguous fp32 [heads]");
  check_indices(block_tables, seq_lens, nullptr, k_cache.size(0), k_cache.size(1), T);
  at::Tensor o = at::empty_like(q);
  const AttnShape shape{heads, kv_heads, D, k_cache.size(1), block_tables.size(1), float(scale)};
  attend_cache(q.data_ptr<float>(), k_cache, v_cache, block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), T,
               window, shape, o.data_ptr<float>(), sinks ? sinks->data_ptr<float>() : nullptr);
  return o;
}

// One of quant_gemm.h's GEMMs alone, for the eager forward: y [T, N] fp32 = x [T, K] fp32 @ W^T
// over `q` with `qh` (bits 5 only) and `scales` ((s, o) pairs fp32 [N, K/32, 2] for bits 4
// and 5; fp16 [N, K/32] for bits 8).
at::Tensor quant_gemm_op(const at::Tensor& x, const at::Tensor& q, const std::optional<at::Tensor>& qh,
                         const at::Tensor& scales, int64_t bits, const std::optional<at::Tensor>& supers) {
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "quant_gemm: bits must be 4, 5, 6 or 8");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(1) % qgemm::kGroup == 0,
              "quant_gemm: x must be contiguous fp32 [T, K], K a multiple of 32");
  const int64_t K = x.size(1), G = K / qgemm::kGroup, N = q.size(0);
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && q.element_size() == 1 && q.size(1) == (bits == 8 ? K : K / 2),
              "quant_gemm: values must be contiguous bytes [N, K] (bits 8) or [N, K/2] (nibbles)");
  // bits 4 with uint8 scales: MXFP4 (e2m1 nibbles, one e8m0 exponent per 32 inputs); with
  // `supers`, the K types' scales (uint8 (sc, m) [N, K/32, 2], fp32 (d, -dmin) [N, K/256, 2])
  const bool k_scales = supers.has_value();
  const bool mx4 = bits == 4 && scales.scalar_type() == at::kByte && !k_scales;
  if (bits == 6) {  // Q6_K: nibbles, high bits (qh) [N, K/32, 8], int8 scales [N, K/32, 2], supers d [N, K/256]
    TORCH_CHECK(K % (8 * qgemm::kGroup) == 0 && qh && qh->dim() == 3 && qh->scalar_type() == at::kByte &&
                    qh->is_contiguous() && qh->size(0) == N && qh->size(1) == G && qh->size(2) == 8,
                "quant_gemm: bits 6 takes the high bits uint8 [N, K/32, 8], K a multiple of 256");
    TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kChar && scales.is_contiguous() && scales.size(0) == N &&
                    scales.size(1) == G && scales.size(2) == 2,
                "quant_gemm: bits 6 takes int8 scales per 16 inputs [N, K/32, 2]");
    TORCH_CHECK(k_scales && supers->dim() == 2 && supers->scalar_type() == at::kFloat && supers->is_contiguous() &&
                    supers->size(0) == N && supers->size(1) == G / 8,
                "quant_gemm: bits 6 takes fp32 super-block scales d [N, K/256]");
    at::Tensor y = at::empty({x.size(0), N}, x.options());
    qgemm::Weights w{qgemm::kQ6, q.data_ptr<uint8_t>(), nullptr, nullptr, nullptr, nullptr, N, K};
    w.ds = supers->data_ptr<float>(), w.hb = qh->data_ptr<uint8_t>(), w.sc = scales.data_ptr<int8_t>();
    qgemm::gemm(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
    return y;
  }
  if (k_scales) {
    TORCH_CHECK(bits != 8 && K % (8 * qgemm::kGroup) == 0 && scales.dim() == 3 && scales.scalar_type() == at::kByte &&
                    scales.is_contiguous() && scales.size(0) == N && scales.size(1) == G && scales.size(2) == 2,
                "quant_gemm: the K types' scales are uint8 (sc, m) [N, K/32, 2], K a multiple of 256, bits 4 or 5");
    TORCH_CHECK(supers->dim() == 3 && supers->scalar_type() == at::kFloat && supers->is_contiguous() &&
                    supers->size(0) == N && supers->size(1) == G / 8 && supers->size(2) == 2,
                "quant_gemm: the K types' super-block scales are fp32 (d, -dmin) [N, K/256, 2]");
  } else if (bits == 8) {
    TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == N &&
                    scales.size(1) == G,
                "quant_gemm: bits 8 takes fp16 scales [N, K/32]");
  } else if (mx4) {
    TORCH_CHECK(scales.dim() == 2 && scales.is_contiguous() && scales.size(0) == N && scales.size(1) == G,
                "quant_gemm: MXFP4 (bits 4, uint8 scales) takes e8m0 exponents [N, K/32]");
  } else {
    TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.size(0) == N &&
                    scales.size(1) == G && scales.size(2) == 2,
                "quant_gemm: bits 4 and 5 take fp32 (scale, offset) pairs [N, K/32, 2] (or bits 4 uint8 exponents)");
  }
  TORCH_CHECK((bits == 5) == qh.has_value(), "quant_gemm: fifth bits with bits 5, and only then");
  if (qh)
    TORCH_CHECK(qh->dim() == 2 && qh->scalar_type() == at::kInt && qh->is_contiguous() && qh->size(0) == N && qh->size(1) == G,
                "quant_gemm: fifth bits must be contiguous int32 [N, K/32]");
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  const qgemm::Weights w{mx4 ? qgemm::kMX4 : qgemm::Format(bits), reinterpret_cast<const uint8_t*>(q.data_ptr()),
                         qh ? reinterpret_cast<const uint32_t*>(qh->data_ptr()) : nullptr,
                         bits == 8 || mx4 || k_scales ? nullptr : scales.data_ptr<float>(),
                         bits == 8 ? reinterpret_cast<const uint16_t*>(scales.data_ptr()) : nullptr,
                         mx4 ? scales.data_ptr<uint8_t>() : nullptr, N, K,
                         k_scales ? scales.data_ptr<uint8_t>() : nullptr, k_scales ? supers->data_ptr<float>() : nullptr};
  qgemm::gemm(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
  return y;
}

// Rows `ids` of a Q6_K weight in quant_gemm's kQ6 layout (nibbles [N, K/2], high bits
// [N, K/32, 8], sixteens' scales [N, K/32, 2] int8, d [N, K/256] fp32) as fp32 [n, K]:
// (d * sc) * (q - 32), Q6Linear.rows' values (the LM head's refined candidates: a 1B shape's
// 1,024 rows of 2,048 at 64 rows of 16 candidates, 5.4 ms through torch's ops, 1.0 here).
at::Tensor q6_rows(const at::Tensor& q, const at::Tensor& hb, const at::Tensor& sc, const at::Tensor& d,
                   const at::Tensor& ids) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous() && q.size(1) % 128 == 0,
              "q6_rows: nibbles must be contiguous uint8 [N, K/2], K a multiple of 256");
  const int64_t N = q.size(0), K = 2 * q.size(1), G = K / qgemm::kGroup;
  TORCH_CHECK(hb.scalar_type() == at::kByte && hb.is_contiguous() && hb.numel() == N * G * 8,
              "q6_rows: high bits must be contiguous uint8 [N, K/32, 8]");
  TORCH_CHECK(sc.scalar_type() == at::kChar && sc.is_contiguous() && sc.numel() == N * G * 2,
              "q6_rows: scales must be contiguous int8 [N, K/32, 2]");
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() && d.numel() == N * (G / 8),
              "q6_rows: d must be contiguous fp32 [N, K/256]");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "q6_rows: ids must be int64");
  const at::Tensor rows = ids.contiguous();
  const int64_t n = rows.numel();
  const int64_t* id = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < N, "q6_rows: id ", id[i], " out of [0, ", N, ")");
  qgemm::Weights w{};
  w.format = qgemm::kQ6, w.q = q.data_ptr<uint8_t>(), w.N = N, w.K = K;
  w.hb = hb.data_ptr<uint8_t>(), w.sc = sc.data_ptr<int8_t>(), w.ds = d.data_ptr<float>();
  at::Tensor out = at::empty({n, K}, q.options().dtype(at::kFloat));
  float* y = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t u = w.unit(id[r], g);
        const float dg = w.ds[w.super(id[r], g / 8)], s[2] = {dg * float(w.sc[2 * u]), dg * float(w.sc[2 * u + 1])};
        const uint8_t *b = w.q + 16 * u, *h = w.hb + 8 * u;
        float* o = y + r * K + g * qgemm::kGroup;
        // byte i: elements 2i (low nibble) and 2i + 1; their high bits in byte i % 8 of h at
        // 4 and 0 (i < 8) or 6 and 2 (i >= 8): Weights' kQ6 layout
        for (int i = 0; i < 16; ++i) {
          const int hi = h[i % 8] >> (2 * (i / 8));
          o[2 * i] = s[i / 8] * float(((b[i] & 15) | (((hi >> 4) & 3) << 4)) - 32);
          o[2 * i + 1] = s[i / 8] * float(((b[i] >> 4) | ((hi & 3) << 4)) - 32);
        }
      }
  });
  return out;
}

// Each row's k largest values of x [M, N] fp32 and their indices, sorted descending
// (top_k.h): torch.topk's (values, indices) for k <= N, rows split over torch's threads.
std::tuple<at::Tensor, at::Tensor> top_k_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "top_k_rows: x is contiguous fp32 [M, N]");
  const int64_t M = x.size(0), N = x.size(1);
  TORCH_CHECK(k >= 0 && k <= N, "top_k_rows: k must be in [0, N]");
  at::Tensor vals = at::empty({M, k}, x.options()), ids = at::empty({M, k}, x.options().dtype(at::kLong));
  const float* v = x.data_ptr<float>();
  float* out = vals.data_ptr<float>();
  int64_t* idx = ids.data_ptr<int64_t>();
  at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) topk::row(v + r * N, N, k, out + r * k, idx + r * k);
  });
  return {vals, ids};
}

// Whether many-row Q4_K / Q6_K GEMMs take AMX's tiles (quant_gemm_amx.h): mode -1 asks, 0
// turns them off, 1 back on where the build has them and the kernel grants them. The outputs
// are the same either way (benchmarks and tests compare the two in one process).
bool amx_op(int64_t mode) {
#if IGNIS_QGEMM_AMX
  if (mode >= 0) qgemm::amx_wanted().store(mode != 0);
  return qgemm::amx_ready();
#else
  (void)mode;
  return false;
#endif
}

// The fewest rows of x from which quant_gemm's Q4_K / Q6_K GEMMs take their many-row body
// (quant_gemm_many.h: 8-bit x per 256, as fast as a dense GEMM at any row count), or 0 where
// this build has none (AVX-512 and non-x86 CPUs).
int64_t many_rows_op() {
#if IGNIS_QGEMM_MANY
  return qgemm::kManyRows;
#else
  return 0;
#endif
}

}  // namespace

// Catch-all kernels: the mixed form's oneDNN weights are MkldnnCPU tensors, which would
// otherwise send the call to a backend with no kernel.
TORCH_LIBRARY(ignis_cpu, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
      "float scale, int window, Tensor? sinks=None) -> Tensor",
      TORCH_FN(paged_decode_attention));
  m.def("quant_gemm_many_rows() -> int", TORCH_FN(many_rows_op));
  m.def("quant_gemm_amx(int mode=-1) -> bool", TORCH_FN(amx_op));
  m.def("top_k_rows(Tensor x, int k) -> (Tensor, Tensor)", TORCH_FN(top_k_rows));
  m.def("q6_rows(Tensor nibbles, Tensor high_bits, Tensor sixteens, Tensor supers, Tensor ids) -> Tensor",
        TORCH_FN(q6_rows));
  m.def("quant_gemm(Tensor x, Tensor q, Tensor? qh, Tensor scales, int bits, Tensor? supers=None) -> Tensor",
        TORCH_FN(quant_gemm_op));
  m.def(
      "decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor cos_local, Tensor sin_local, Tensor slots, "
      "Tensor block_tables, Tensor seq_lens, Tensor[] k_caches, Tensor[] v_caches, Tensor[] norms, Tensor[] weights, "
      "Tensor[] wide, Tensor?[] biases, Tensor?[] qk_norms, int[] windows, int[] rope_local, int heads, int kv_heads, "
      "int head_dim, int intermediate, float eps, float scale, int[] kinds, int group, int narrow_rows, "
      "int wide_kind, int layout, int act, float residual_scale, Tensor?[] sinks, Tensor?[] routers, "
      "Tensor?[] router_biases, int top_k, int routing, int moe_intermediate, float swiglu_alpha, "
      "float swiglu_limit) -> Tensor",
      TORCH_FN(decode_layers));
}

