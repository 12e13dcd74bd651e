#include "shardmm/runtime/blas.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string>

#include "shardmm/core/error.h"

namespace shardmm::blas {
namespace {

CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

void cblas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void cblas_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b, int ldb,
                double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void check_ld(const char* name, std::int64_t ld, std::int64_t row) {
  if (ld < std::max<std::int64_t>(1, row)) {
    throw UsageError("gemm: " + std::string(name) + " = " + std::to_string(ld) + " is shorter than a stored row of " +
                     std::to_string(row) + " elements: a leading dimension must be >= max(1, row length)");
  }
}

}  // namespace

namespace detail {

template <class T>
void gemm_split(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc, std::int64_t limit) {
  if (m < 0 || n < 0 || k < 0) {
    throw UsageError("gemm: negative size m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + ": sizes must be >= 0");
  }
  if (limit < 1) throw UsageError("gemm: split limit " + std::to_string(limit) + " must be >= 1");
  check_ld("lda", lda, trans_a ? m : k);
  check_ld("ldb", ldb, trans_b ? k : n);
  check_ld("ldc", ldc, n);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // No products to add: the split loop below would make no call at all.
    for (std::int64_t i = 0; i < m; ++i) {
      T* row = c + i * ldc;
      if (beta == T(0)) {
        std::fill(row, row + n, T(0));
      } else {
        for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    }
    return;
  }

  // A leading dimension cblas cannot hold is never passed: the pieces along that
  // operand's stored rows are one row tall, where the leading dimension is unused.
  std::int64_t mstep = std::min(m, limit), nstep = std::min(n, limit), kstep = std::min(k, limit);
  if (lda > limit) (trans_a ? kstep : mstep) = 1;
  if (ldb > limit) (trans_b ? nstep : kstep) = 1;
  if (ldc > limit) mstep = 1;
  auto fit = [limit](std::int64_t ld, std::int64_t row) {
    return static_cast<int>(ld > limit ? std::max<std::int64_t>(1, row) : ld);
  };

  for (std::int64_t i0 = 0; i0 < m; i0 += mstep) {
    const std::int64_t mp = std::min(mstep, m - i0);
    for (std::int64_t j0 = 0; j0 < n; j0 += nstep) {
      const std::int64_t np = std::min(nstep, n - j0);
      for (std::int64_t p0 = 0; p0 < k; p0 += kstep) {
        const std::int64_t kp = std::min(kstep, k - p0);
        const T* ap = a + (trans_a ? p0 * lda + i0 : i0 * lda + p0);
        const T* bp = b + (trans_b ? j0 * ldb + p0 : p0 * ldb + j0);
        cblas_gemm(trans_a, trans_b, static_cast<int>(mp), static_cast<int>(np), static_cast<int>(kp), alpha, ap,
                   fit(lda, trans_a ? mp : kp), bp, fit(ldb, trans_b ? kp : np), p0 == 0 ? beta : T(1),
                   c + i0 * ldc + j0, fit(ldc, np));
      }
    }
  }
}

template void gemm_split<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                                const float*, std::int64_t, float, float*, std::int64_t, std::int64_t);
template void gemm_split<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                                 std::int64_t, const double*, std::int64_t, double, double*, std::int64_t,
                                 std::int64_t);

}  // namespace detail

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  detail::gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, INT_MAX);
}

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  detail::gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, INT_MAX);
}

void set_threads(int n) {
  if (n < 1) {
    throw UsageError("blas thread count " + std::to_string(n) + " must be >= 1");
  }
  openblas_set_num_threads(n);
}

int threads() { return openblas_get_num_threads(); }

int threads_per_rank(int cores, int ranks_on_node) {
  if (cores < 1 || ranks_on_node < 1) {
    throw UsageError("threads_per_rank: cores=" + std::to_string(cores) +
                     " ranks_on_node=" + std::to_string(ranks_on_node) + ": both must be >= 1");
  }
  return std::max(1, cores / ranks_on_node);
}

}  // namespace shardmm::blas
