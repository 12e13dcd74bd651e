// The one summation every backend uses, so that they agree to the bit (private).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shardmm/plan/step.h"

namespace shardmm::detail {

// out = ((s0 + s1) + s2) + ... over `count` elements of each source, in source (group-
// rank) order. A tile at a time: each source streams through memory once, and `out` may
// alias a source (all_reduce sums into its own chunk).
template <class T>
void sum_in_order(const std::vector<const void*>& sources, std::int64_t count, void* out) {
  constexpr std::int64_t tile_elements = 16384 / sizeof(T);
  alignas(64) T tile[tile_elements];
  for (std::int64_t base = 0; base < count; base += tile_elements) {
    const std::int64_t n = std::min(tile_elements, count - base);
    const T* first = static_cast<const T*>(sources[0]) + base;
    std::copy(first, first + n, tile);
    for (std::size_t s = 1; s < sources.size(); ++s) {
      const T* src = static_cast<const T*>(sources[s]) + base;
      for (std::int64_t i = 0; i < n; ++i) tile[i] += src[i];
    }
    std::memcpy(static_cast<T*>(out) + base, tile, static_cast<std::size_t>(n) * sizeof(T));
  }
}

// f32 or f64 (the callers reject other dtypes first).
inline void sum_in_order(DType dtype, const std::vector<const void*>& sources, std::int64_t count, void* out) {
  if (dtype == DType::f32) {
    sum_in_order<float>(sources, count, out);
  } else {
    sum_in_order<double>(sources, count, out);
  }
}

}  // namespace shardmm::detail
