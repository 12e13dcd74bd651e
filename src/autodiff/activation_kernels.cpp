// The activations' loops. Compiled (src/CMakeLists.txt) with -fno-trapping-math: GCC if-converts
// the kernels' selects, and so vectorizes the loops, only when it may evaluate both sides of
// each, which a trapping floating-point operation forbids (nothing reads the exception flags);
// and with -ffp-contract=off, so that no clone below contracts a product and a sum into an FMA.
#include "autodiff/activation_kernels.h"

// With GCC on x86-64 each loop is also compiled for AVX2 and for AVX-512, and the widest the CPU
// has is chosen at load time: gelu in f64 at 4x the baseline's (SSE2) rate (AMD EPYC,
// 2026-12-05). Every clone does the same IEEE operations in the same order, so their results
// are the same to the bit (nan's sign aside).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SHARDMM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SHARDMM_VECTOR_CLONES
#endif

namespace shardmm::autodiff::kernels {

template <class F, class T>
SHARDMM_VECTOR_CLONES void forward(const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(F::value(x[i]));
}

template <class F, class T>
SHARDMM_VECTOR_CLONES void backward(const T* g, const T* x, T* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(g[i] * F::slope(x[i]));
}

template <class F, class T>
SHARDMM_VECTOR_CLONES void gated(const T* x, const T* z, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(F::value(x[i]) * z[i]);
}

#define SHARDMM_ACTIVATION_LOOPS(F, T)                                \
  template void forward<F, T>(const T*, T*, std::int64_t);            \
  template void backward<F, T>(const T*, const T*, T*, std::int64_t); \
  template void gated<F, T>(const T*, const T*, T*, std::int64_t);
#define SHARDMM_ACTIVATION_TYPES(F)  \
  SHARDMM_ACTIVATION_LOOPS(F, float) \
  SHARDMM_ACTIVATION_LOOPS(F, double)

SHARDMM_ACTIVATION_TYPES(Relu)
SHARDMM_ACTIVATION_TYPES(Gelu)
SHARDMM_ACTIVATION_TYPES(Silu)
SHARDMM_ACTIVATION_TYPES(Tanh)
SHARDMM_ACTIVATION_TYPES(Exp)

}  // namespace shardmm::autodiff::kernels
