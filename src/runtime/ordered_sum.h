// The one summation every backend uses, so that they agree to the bit (private).
#pragma once

#include <cstdint>
#include <vector>

#include "shardmm/plan/step.h"

namespace shardmm::detail {

// out = ((s0 + s1) + s2) + ... over `count` elements of each source, in source (group-rank)
// order. A block at a time, held in registers while each source adds into it: the sources
// stream side by side, and `out` may alias a source (all_reduce sums into its own chunk), as a
// block is read from every source before it is written.
template <class T>
[[gnu::always_inline]] inline void sum_blocks(const void* const* sources, std::size_t n, std::int64_t count,
                                              void* out) {
  constexpr std::int64_t block = 256 / sizeof(T);
  std::int64_t base = 0;
  for (; base + block <= count; base += block) {
    T acc[block];
    const T* first = static_cast<const T*>(sources[0]) + base;
    for (std::int64_t i = 0; i < block; ++i) acc[i] = first[i];
    for (std::size_t s = 1; s < n; ++s) {
      const T* src = static_cast<const T*>(sources[s]) + base;
      for (std::int64_t i = 0; i < block; ++i) acc[i] += src[i];
    }
    T* dst = static_cast<T*>(out) + base;
    for (std::int64_t i = 0; i < block; ++i) dst[i] = acc[i];
  }
  for (; base < count; ++base) {
    T acc = static_cast<const T*>(sources[0])[base];
    for (std::size_t s = 1; s < n; ++s) acc += static_cast<const T*>(sources[s])[base];
    static_cast<T*>(out)[base] = acc;
  }
}

using SumKernel = void (*)(const void* const* sources, std::size_t n, std::int64_t count, void* out);

template <class T>
void sum_baseline(const void* const* sources, std::size_t n, std::int64_t count, void* out) {
  sum_blocks<T>(sources, n, count, out);
}

// On x86-64 the same loop is also compiled for AVX2 and AVX-512, and the widest the CPU has
// runs: with the baseline's SSE2 a 2-source sum ran up to 2x slower than Open MPI's AVX
// reduction, with AVX-512 as fast beyond L2 (MPI_Allreduce was faster than our all_reduce for
// that alone). The result does not depend on the width: every element gets the same IEEE
// additions in the same order.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
template <class T>
[[gnu::target("avx2")]] void sum_avx2(const void* const* sources, std::size_t n, std::int64_t count, void* out) {
  sum_blocks<T>(sources, n, count, out);
}
template <class T>
[[gnu::target("avx512f")]] void sum_avx512(const void* const* sources, std::size_t n, std::int64_t count,
                                           void* out) {
  sum_blocks<T>(sources, n, count, out);
}
#endif

template <class T>
SumKernel sum_kernel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512f")) return &sum_avx512<T>;
  if (__builtin_cpu_supports("avx2")) return &sum_avx2<T>;
#endif
  return &sum_baseline<T>;
}

// f32 or f64 (the callers reject other dtypes first).
inline void sum_in_order(DType dtype, const std::vector<const void*>& sources, std::int64_t count, void* out) {
  static const SumKernel f32 = sum_kernel<float>();
  static const SumKernel f64 = sum_kernel<double>();
  (dtype == DType::f32 ? f32 : f64)(sources.data(), sources.size(), count, out);
}

}  // namespace shardmm::detail
