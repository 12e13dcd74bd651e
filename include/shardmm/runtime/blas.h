// The one BLAS entry point of shardmm: row-major GEMM over OpenBLAS's cblas.
//
//   // C[m,n] = A[m,k] @ B[k,n], all row-major and dense
//   shardmm::blas::gemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
//   // C[m,n] = A^T @ B where A is stored [k,m]
//   shardmm::blas::gemm(true, false, m, n, k, 1.0, a, m, b, n, 0.0, c, n);
//
// Threads. OpenBLAS's thread count is process-global. The rule:
//   - threads backend: every rank is already a thread, so call set_threads(1) once,
//     before the rank threads start; each rank's GEMM then runs on its caller's thread
//     (OpenBLAS with one thread is safe to call from several threads at once; the
//     kernels test checks that it also gives the same bits as sequential calls).
//   - mpi backend: each process uses threads_per_rank(cores on the node, ranks on the
//     node) threads (equivalently OPENBLAS_NUM_THREADS in the job's environment), which
//     is 1 as soon as the node runs at least as many ranks as it has cores.
#pragma once

#include <cstdint>

namespace shardmm::blas {

// C = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X^T when trans_x.
// op(A) is m x k (A stored [m,k], or [k,m] when trans_a), op(B) is k x n, C is m x n;
// ldX is the distance between consecutive stored rows of X, in elements.
// m, n or k == 0 is legal: k == 0 gives C = beta * C. beta == 0 overwrites C without
// reading it (NaN there does not propagate). Sizes or leading dimensions beyond what
// cblas's int can hold are split into several calls.
// Throws UsageError for negative sizes or a leading dimension shorter than a row.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c, std::int64_t ldc);

// Sets OpenBLAS's (process-global) thread count; n >= 1, else UsageError.
void set_threads(int n);
// OpenBLAS's current thread count.
int threads();
// The MPI rule above: max(1, cores / ranks_on_node). Both must be >= 1 (UsageError).
int threads_per_rank(int cores, int ranks_on_node);

namespace detail {
// gemm with `limit` in place of cblas's INT_MAX as the largest size or leading dimension
// one cblas call may take: lets tests exercise the splitting with small matrices.
template <class T>
void gemm_split(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc, std::int64_t limit);
}  // namespace detail

}  // namespace shardmm::blas
