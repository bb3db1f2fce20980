// The decoder's decode step on the CPU in one call: every layer of a Llama-family model
// for T rows that each add one token to their own sequence (one user's decode, or a few).
//
// Why native: at one row the eager forward is ~40 ATen calls per layer at 2-3 us each
// plus Python around them, as much time as the matrix work (RESULTS.md, session 6).
// Here the GEMMs are still torch's (weight-only int4 / int8, or oneDNN bf16 for the mixed
// form's wider steps; four per layer); everything between them (RMSNorm, biases, rotary, q/k norms, the KV
// write, paged attention, SiLU-and-multiply, residuals, the bf16 casts) is plain loops
// over a few thousand floats, and attention is split over keys across torch's threads.
//
// Arithmetic follows ignis/model/layers.py: fp32 activations, each GEMM fed bf16 (round
// to nearest even) and read back as fp32, biases added in fp32. The KV cache is fp32 or
// bf16 (engine.kv_cache_dtype): bf16 K/V are rounded as torch's .to(bfloat16) rounds them
// and read back as fp32, so attention computes in fp32 either way. The reductions' order
// differs from torch's, so results agree to float rounding, not bits.
//
// Built and loaded by kernels/cpu_native.py; registers torch.ops.ignis_cpu.decode_layers,
// and paged_decode_attention (the same attention alone, for steps that stay eager).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
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
// ~1 ulp, and written so that loops over arrays vectorize (libm's expf does not).
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>(uint32_t(int32_t(n) + 127) << 23);
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

// oneDNN's bf16 GEMM over a weight it reordered (ignis/model/packed.py's Bf16Linear): the
// op is registered by torch's Python side only, so it is looked up once and called boxed.
at::Tensor onednn_linear(const at::Tensor& xb, const at::Tensor& packed) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  static const auto typed = op.typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                                c10::string_view, c10::List<std::optional<c10::Scalar>>,
                                                std::optional<c10::string_view>)>();
  return typed.call(xb, packed, std::nullopt, "none", c10::List<std::optional<c10::Scalar>>(), "");
}

// The step's GEMMs: y [T, N] bf16 = x [T, K] bf16 @ W^T by torch's weight-only kernels
// (`narrow`: per projection (w, s), int4 with s the [K/group, N, 2] scales and zeros, or
// int8 with s the [N] row scales), or by oneDNN bf16 (`wide`: per projection the packed
// weight; the mixed form's GEMM for steps of more than narrow_rows rows).
struct Gemms {
  at::TensorList narrow, wide;
  at::IntArrayRef int4;  // per projection: 1 = int4, 0 = int8 (a file mixes them, e.g. Q4_K_M's Q6_K)
  bool use_wide;
  int64_t group;

  // Projection `proj` (0 qkv, 1 o, 2 gate_up, 3 down) of `layer`, whose output has n columns.
  at::Tensor operator()(const at::Tensor& xb, int64_t layer, int64_t proj, int64_t n) const {
    at::Tensor y;
    if (use_wide) {
      y = onednn_linear(xb, wide[4 * layer + proj]);
    } else {
      const at::Tensor& w = narrow[8 * layer + 2 * proj];
      const at::Tensor& s = narrow[8 * layer + 2 * proj + 1];
      y = int4[4 * layer + proj] ? at::_weight_int4pack_mm_for_cpu(xb, w, group, s) : at::_weight_int8pack_mm(xb, w, s);
    }
    TORCH_CHECK(y.is_contiguous() && y.scalar_type() == at::kBFloat16 && y.size(0) == xb.size(0) && y.size(1) == n,
                "decode_layers: a GEMM's output is not [T, ", n, "]");
    return y;
  }
};

// Element i of a bf16 GEMM output row read as fp32, plus an optional bias: the eager
// Linear's `y.float() + bias`.
inline float out_at(const uint16_t* y, const float* bias, int64_t i) {
  const float v = bf16_to_float(y[i]);
  return bias ? v + bias[i] : v;
}

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

// One work unit of decode attention: keys [lo, hi) of one row (its blocks in `table`), for
// all its query heads q [heads, D] (head h reads kv head h / G). Writes each head's running
// max, sum and unnormalised output to out [heads][D + 2]. Keys are walked block by block
// (one table lookup per block, no division per key), each token's K (then V) row of all
// kv heads read contiguously and widened to fp32 once into `row`, then serving its G query
// heads. DC > 0 fixes the head dim at compile time (64 and 128: the inner loops unroll);
// 0 reads it from `a`.
template <typename KV, int DC>
void attend_unit(const float* q, const KV* kc, const KV* vc, const int32_t* table, int64_t lo, int64_t hi,
                 const AttnShape& a, float* scores, float* row, float* out) {
  const int64_t D = DC > 0 ? DC : a.dim, G = a.heads / a.kv_heads, BS = a.block_size, H = a.heads;
  const int64_t stride = a.kv_heads * D;  // one token's K (or V) row in the cache
  const int64_t n = hi - lo;
  // Calls f(j, the j-th key's row [kv_heads, D] in `cache`) for j in [0, n).
  auto walk = [&](const KV* cache, auto&& f) {
    for (int64_t pos = lo, j = 0; pos < hi;) {
      const int64_t off = pos % BS, take = std::min(BS - off, hi - pos);
      const KV* r = cache + (int64_t(table[pos / BS]) * BS + off) * stride;
      for (int64_t i = 0; i < take; ++i, ++j, r += stride) f(j, r);
      pos += take;
    }
  };
  for (int64_t h = 0; h < H; ++h) out[h * (D + 2)] = -std::numeric_limits<float>::infinity();
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
      out[h * (D + 2)] = std::max(out[h * (D + 2)], s);
    }
  });
  for (int64_t h = 0; h < H; ++h) {
    float* sh = scores + h * kKeysPerUnit;
    const float m = out[h * (D + 2)];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      sh[j] = exp_approx(sh[j] - m);
      sum += sh[j];
    }
    out[h * (D + 2) + 1] = sum;
    std::fill(out + h * (D + 2) + 2, out + (h + 1) * (D + 2), 0.0f);
  }
  walk(vc, [&](int64_t j, const KV* vr) {
#pragma omp simd
    for (int64_t d = 0; d < stride; ++d) row[d] = kv_load(vr[d]);
    for (int64_t h = 0; h < H; ++h) {
      const float p = scores[h * kKeysPerUnit + j];
      const float* vh = row + (h / G) * D;
      float* acc = out + h * (D + 2) + 2;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += p * vh[d];
    }
  });
}

// Paged decode attention for T rows (one query token each): o [T, heads, dim] from q of
// the same shape, over the first seq_lens[t] keys of row t (the last `window` of them
// when window > 0). Each row's keys split into units of kKeysPerUnit, spread over torch's
// threads (attend_unit); a row's units are merged afterwards (flash-decoding's split-K).
// KV is the cache's element type (float or bf16 bits).
template <typename KV>
void attention(const float* q, const KV* kc, const KV* vc, const int32_t* tables, const int32_t* seq_lens,
               int64_t T, int64_t window, const AttnShape& a, float* o) {
  const int64_t D = a.dim, H = a.heads;
  struct Unit { int64_t t, lo, hi; };
  std::vector<Unit> units;
  std::vector<int64_t> first_unit(T + 1, 0);
  int64_t keys = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = seq_lens[t];
    const int64_t lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
    for (int64_t k = lo; k < n; k += kKeysPerUnit) units.push_back({t, k, std::min(n, k + kKeysPerUnit)});
    first_unit[t + 1] = int64_t(units.size());
    keys += n - lo;
  }
  const int64_t U = int64_t(units.size());
  const int64_t stride = H * (D + 2);  // per unit and query head: max, sum, then dim outputs
  // Every unit writes its whole part (max, sum, zeroed outputs) before the merge reads it.
  std::unique_ptr<float[]> part(new float[U * stride]);
  const auto unit = D == 64 ? attend_unit<KV, 64> : D == 128 ? attend_unit<KV, 128> : attend_unit<KV, 0>;

  // A short context is a few microseconds of work: not worth waking the other threads.
  at::parallel_for(0, U, keys * H < 4096 ? U : 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kKeysPerUnit * H), row(a.kv_heads * D);
    for (int64_t u = begin; u < end; ++u) {
      const Unit& w = units[u];
      unit(q + w.t * H * D, kc, vc, tables + w.t * a.blocks_per_row, w.lo, w.hi, a, scores.data(), row.data(),
           part.get() + u * stride);
    }
  });

  for (int64_t t = 0; t < T; ++t) {
    const int64_t u0 = first_unit[t], u1 = first_unit[t + 1];
    for (int64_t h = 0; h < H; ++h) {
      float* oh = o + (t * H + h) * D;
      std::fill(oh, oh + D, 0.0f);
      if (u0 == u1) continue;  // no keys (cannot happen: the row's own key is written)
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t u = u0; u < u1; ++u) m = std::max(m, part[u * stride + h * (D + 2)]);
      float total = 0.0f;
      for (int64_t u = u0; u < u1; ++u) {
        const float* p = part.get() + u * stride + h * (D + 2);
        const float c = exp_approx(p[0] - m);
        total += p[1] * c;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) oh[d] += p[2 + d] * c;
      }
      const float inv = 1.0f / total;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) oh[d] *= inv;
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
                  const int32_t* seq_lens, int64_t T, int64_t window, const AttnShape& a, float* o) {
  if (k_cache.scalar_type() == at::kBFloat16) {
    attention(q, static_cast<const uint16_t*>(k_cache.data_ptr()), static_cast<const uint16_t*>(v_cache.data_ptr()),
              tables, seq_lens, T, window, a, o);
  } else {
    attention(q, static_cast<const float*>(k_cache.data_ptr()), static_cast<const float*>(v_cache.data_ptr()), tables,
              seq_lens, T, window, a, o);
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

at::Tensor decode_layers(
    const at::Tensor& x_in,           // [T, H] fp32: the embedded tokens
    const at::Tensor& cos,            // [T, D] fp32: cat(cos, cos) of each row's position
    const at::Tensor& sin,            // [T, D] fp32: cat(-sin, sin)
    const at::Tensor& slots,          // [T] int64: where each row's K/V go (block * block_size + offset)
    const at::Tensor& block_tables,   // [T, W] int32
    const at::Tensor& seq_lens,       // [T] int32: context length including the new token
    at::TensorList k_caches,          // per layer [blocks, block_size, kv_heads, D], all fp32 or all bf16
    at::TensorList v_caches,
    at::TensorList norms,             // per layer input and post-attention norm, then the final norm
    at::TensorList weights,           // per layer (w, s) for qkv, o, gate_up, down: int4 or int8
    at::TensorList wide,              // per layer oneDNN bf16 qkv, o, gate_up, down, or empty
    const c10::List<c10::optional<at::Tensor>>& biases,     // per layer qkv, o, gate_up, down
    const c10::List<c10::optional<at::Tensor>>& qk_norms,   // per layer q_norm, k_norm (Qwen3), or empty
    at::IntArrayRef windows,          // per layer sliding window, 0 = none
    int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
    double eps, double scale, at::IntArrayRef int4, int64_t group, int64_t narrow_rows) {
  const int64_t L = int64_t(k_caches.size());
  const int64_t T = x_in.size(0), H = x_in.size(1), D = head_dim, I = intermediate;
  const int64_t Q = heads * D, KV = kv_heads * D, QKV = Q + 2 * KV;
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.is_contiguous(), "decode_layers: x must be contiguous fp32");
  TORCH_CHECK(int64_t(v_caches.size()) == L && int64_t(norms.size()) == 2 * L + 1 && int64_t(weights.size()) == 8 * L &&
                  int64_t(biases.size()) == 4 * L && int64_t(windows.size()) == L && int64_t(int4.size()) == 4 * L &&
                  (wide.size() == 0 || int64_t(wide.size()) == 4 * L) &&
                  (qk_norms.size() == 0 || int64_t(qk_norms.size()) == 2 * L),
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
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(k_caches[l].sizes() == k_caches[0].sizes() && v_caches[l].sizes() == k_caches[0].sizes(),
                "decode_layers: the layers' caches differ in shape");
  check_indices(block_tables, seq_lens, &slots, k_caches[0].size(0), k_caches[0].size(1), T);

  at::Tensor x = x_in.clone();
  float* xp = x.data_ptr<float>();
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  // The GEMMs' bf16 inputs: normed hidden rows, attention outputs, SiLU(gate) * up.
  at::Tensor h_in = at::empty({T, H}, bf16), o_in = at::empty({T, Q}, bf16), a_in = at::empty({T, I}, bf16);
  std::vector<float> tmp(std::max({H, QKV, I}));  // one row at a time
  std::vector<float> qbuf(T * Q), kbuf(T * KV), vbuf(T * KV), obuf(T * Q);
  const float* C = cos.data_ptr<float>();
  const float* S = sin.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const AttnShape shape{heads, kv_heads, D, k_caches[0].size(1), block_tables.size(1), float(scale)};

  const Gemms gemm{weights, wide, int4, wide.size() > 0 && T > narrow_rows, group};
  auto bias_of = [&](int64_t i) -> const float* {
    const c10::optional<at::Tensor> b = biases.get(i);
    return b.has_value() ? b->data_ptr<float>() : nullptr;
  };
  auto norm_in = [&](const at::Tensor& w) {  // rows of x, normed, as the next GEMM's bf16 input
    uint16_t* hp = reinterpret_cast<uint16_t*>(h_in.data_ptr());
    for (int64_t t = 0; t < T; ++t) {
      rms_norm(xp + t * H, w.data_ptr<float>(), float(eps), H, tmp.data());
      to_bf16(tmp.data(), H, hp + t * H);
    }
    return h_in;
  };

  for (int64_t l = 0; l < L; ++l) {
    // Attention block: qkv, rotary, the KV write, attention, o_proj.
    at::Tensor qkv = gemm(norm_in(norms[2 * l]), l, 0, QKV);
    const uint16_t* y = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
    const float* bqkv = bias_of(4 * l);
    for (int64_t t = 0; t < T; ++t) {
      float* row = tmp.data();
      for (int64_t i = 0; i < QKV; ++i) row[i] = out_at(y + t * QKV, bqkv, i);
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
    attend_cache(qbuf.data(), k_caches[l], v_caches[l], block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
                 T, windows[l], shape, obuf.data());
    to_bf16(obuf.data(), T * Q, reinterpret_cast<uint16_t*>(o_in.data_ptr()));
    at::Tensor o = gemm(o_in, l, 1, H);
    const uint16_t* oy = reinterpret_cast<const uint16_t*>(o.data_ptr());
    const float* bo = bias_of(4 * l + 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) xp[t * H + i] += out_at(oy + t * H, bo, i);

    // MLP block: gate|up, SiLU(gate) * up, down.
    at::Tensor gu = gemm(norm_in(norms[2 * l + 1]), l, 2, 2 * I);
    const uint16_t* gy = reinterpret_cast<const uint16_t*>(gu.data_ptr());
    const float* bgu = bias_of(4 * l + 2);
    uint16_t* ap = reinterpret_cast<uint16_t*>(a_in.data_ptr());
    for (int64_t t = 0; t < T; ++t) {
      const uint16_t* r = gy + t * 2 * I;
      float* act = tmp.data();
#pragma omp simd
      for (int64_t i = 0; i < I; ++i) {
        const float g = bgu ? bf16_to_float(r[i]) + bgu[i] : bf16_to_float(r[i]);
        const float u = bgu ? bf16_to_float(r[I + i]) + bgu[I + i] : bf16_to_float(r[I + i]);
        act[i] = g / (1.0f + exp_approx(-g)) * u;
      }
      to_bf16(act, I, ap + t * I);
    }
    at::Tensor d = gemm(a_in, l, 3, H);
    const uint16_t* dy = reinterpret_cast<const uint16_t*>(d.data_ptr());
    const float* bd = bias_of(4 * l + 3);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) xp[t * H + i] += out_at(dy + t * H, bd, i);
  }
  const float* fw = norms[2 * L].data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) rms_norm(xp + t * H, fw, float(eps), H, xp + t * H);
  return x;
}

// Decode rows' paged attention alone, for steps the eager forward runs (wider batches):
// o [T, heads, dim] for q [T, heads, dim], row t one new token of a sequence of seq_lens[t]
// keys in the blocks of block_tables[t]; read in place, no gather and no mask.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t window) {
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
  check_indices(block_tables, seq_lens, nullptr, k_cache.size(0), k_cache.size(1), T);
  at::Tensor o = at::empty_like(q);
  const AttnShape shape{heads, kv_heads, D, k_cache.size(1), block_tables.size(1), float(scale)};
  attend_cache(q.data_ptr<float>(), k_cache, v_cache, block_tables.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), T,
               window, shape, o.data_ptr<float>());
  return o;
}

}  // namespace

// Catch-all kernels: the mixed form's oneDNN weights are MkldnnCPU tensors, which would
// otherwise send the call to a backend with no kernel.
TORCH_LIBRARY(ignis_cpu, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
      "float scale, int window) -> Tensor",
      TORCH_FN(paged_decode_attention));
  m.def(
      "decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor slots, Tensor block_tables, Tensor seq_lens, "
      "Tensor[] k_caches, Tensor[] v_caches, Tensor[] norms, Tensor[] weights, Tensor[] wide, Tensor?[] biases, "
      "Tensor?[] qk_norms, int[] windows, int heads, int kv_heads, int head_dim, int intermediate, "
      "float eps, float scale, int[] int4, int group, int narrow_rows) -> Tensor",
      TORCH_FN(decode_layers));
}

