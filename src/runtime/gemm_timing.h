// One GEMM shape timed per call on every rank at once (private): how `calibrate` measures its
// GEMM rates, and how `bench matmul` measures the calibration's largest one again to tell how
// fast the machine runs now against then.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/bench_timing.h"
#include "shardmm/core/dtype.h"
#include "shardmm/runtime/blas.h"

namespace shardmm::detail {

template <typename T>
double gemm_seconds(const BenchTimer& timer, std::int64_t m, std::int64_t n, std::int64_t k) {
  std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
      c(static_cast<std::size_t>(m * n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(static_cast<double>(i % 7) / 7 - 0.5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(static_cast<double>(i % 5) / 5 - 0.5);
  return timer.per_call([&] { blas::gemm(false, false, m, n, k, T(1), a.data(), k, b.data(), n, T(0), c.data(), n); });
}

// Seconds per call of C[m,n] = A[m,k] @ B[k,n] in f32 or f64, every rank at once.
inline double gemm_seconds(const BenchTimer& timer, DType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  return dtype == DType::f32 ? gemm_seconds<float>(timer, m, n, k) : gemm_seconds<double>(timer, m, n, k);
}

}  // namespace shardmm::detail
