// Each row's k largest values of an fp32 matrix (the LM head's logits: [rows, vocabulary]),
// for the refined head's candidates (ignis/model/lm_head.py). torch.topk over a 128k-word
// vocabulary at 64 rows took ~4.8 ms of a ~320 ms decode step on a 2-core Zen 4; here one
// pass per row compares sixteen (AVX-512) or eight (AVX2) logits at a time with the k-th
// largest so far and touches only those above it, which after the first few thousand are
// rare. Included by decode.cpp.
//
// The k largest by value, sorted descending, the earlier index first among equal values; NaN
// only where a row has fewer than k other values.

#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace topk {

// One row: its k largest (value, index), sorted descending, into vals / ids (k <= n).
inline void row(const float* v, int64_t n, int64_t k, float* vals, int64_t* ids) {
  if (k <= 0) return;
  using Entry = std::pair<float, int64_t>;
  // the best k so far, the worst at the front: by value, then the earlier index first
  const auto better = [](const Entry& a, const Entry& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::vector<Entry> heap;
  heap.reserve(k);
  float bar = -std::numeric_limits<float>::infinity();  // the k-th largest once the heap is full
  const auto offer = [&](int64_t i) {
    const float x = v[i];
    if (!(x >= bar)) return;  // (NaN never passes)
    if (int64_t(heap.size()) < k) {
      heap.emplace_back(x, i);
      std::push_heap(heap.begin(), heap.end(), better);
      if (int64_t(heap.size()) == k) bar = heap.front().first;
    } else if (x > bar) {  // an equal value comes later: the earlier index stays
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = {x, i};
      std::push_heap(heap.begin(), heap.end(), better);
      bar = heap.front().first;
    }
  };
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), _mm512_set1_ps(bar), _CMP_GE_OQ);
    for (; m; m &= m - 1) offer(i + __builtin_ctz(m));
  }
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(bar), _CMP_GE_OQ));
    for (; m; m &= m - 1) offer(i + __builtin_ctz(m));
  }
#endif
  for (; i < n; ++i) offer(i);
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  int64_t j = 0;
  for (; j < int64_t(heap.size()); ++j) vals[j] = heap[j].first, ids[j] = heap[j].second;
  for (int64_t i = 0; j < k && i < n; ++i)  // fewer than k besides NaN: the first NaNs after them
    if (v[i] != v[i]) vals[j] = v[i], ids[j++] = i;
}

}  // namespace topk
