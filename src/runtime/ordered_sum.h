// The one summation every backend uses, so that they agree to the bit (private).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SHARDMM_X86_KERNELS 1
#endif

#include "shardmm/core/dtype.h"

namespace shardmm::detail {

// Writes a block of sums to the output: plainly, or (Stream) with non-temporal stores that
// skip the read-for-ownership a plain store to an uncached line costs. Summing into a
// separate output that does not fit in cache moves 3 streams of bytes instead of 2 for a
// `y += x`; streaming brings it back to 2 (reduce_scatter on 2 ranks: 0.55-0.64 of a
// `y += x` pass with plain stores, 0.82-0.86 streamed, at 8 MiB on the 2-core dev VM).
template <class T>
struct PlainStore {
  static constexpr std::int64_t alignment = 1;
  static void store(T* dst, const T* acc, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = acc[i];
  }
};

// out = ((s0 + s1) + s2) + ... over `count` elements of each source, in source (group-rank)
// order. A block at a time, held in registers while each source adds into it: the sources
// stream side by side, and `out` may alias a source (all_reduce sums into its own chunk), as a
// block is read from every source before it is written. `Store` writes a finished block to an
// address aligned to Store::alignment bytes: the first elements up to that alignment and
// the tail are summed one at a time.
template <class T, class Store>
inline void sum_blocks(const void* const* sources, std::size_t n, std::int64_t count, void* out) {
  constexpr std::int64_t block = 256 / sizeof(T);
  const auto one = [&](std::int64_t i) {
    T acc = static_cast<const T*>(sources[0])[i];
    for (std::size_t s = 1; s < n; ++s) acc += static_cast<const T*>(sources[s])[i];
    static_cast<T*>(out)[i] = acc;
  };
  const auto misalignment = reinterpret_cast<std::uintptr_t>(out) % Store::alignment;
  std::int64_t base = 0;
  if (misalignment != 0) {
    const auto head = static_cast<std::int64_t>((Store::alignment - misalignment) / sizeof(T));
    for (; base < head && base < count; ++base) one(base);
  }
  for (; base + block <= count; base += block) {
    const T* first = static_cast<const T*>(sources[0]) + base;
    if constexpr (std::is_same_v<Store, PlainStore<T>>) {
      // Two sources with plain stores, the common case, straight to the output: 15-25% faster
      // in L2 than through the block (on its address, `out` may alias either source).
      if (n == 2) {
        const T* second = static_cast<const T*>(sources[1]) + base;
        for (std::int64_t i = 0; i < block; ++i) static_cast<T*>(out)[base + i] = first[i] + second[i];
        continue;
      }
    }
    T acc[block];
    for (std::int64_t i = 0; i < block; ++i) acc[i] = first[i];
    for (std::size_t s = 1; s < n; ++s) {
      const T* src = static_cast<const T*>(sources[s]) + base;
      for (std::int64_t i = 0; i < block; ++i) acc[i] += src[i];
    }
    Store::store(static_cast<T*>(out) + base, acc, block);
  }
  for (; base < count; ++base) one(base);
}

using SumKernel = void (*)(const void* const* sources, std::size_t n, std::int64_t count, void* out);

template <class T>
void sum_baseline(const void* const* sources, std::size_t n, std::int64_t count, void* out) {
  sum_blocks<T, PlainStore<T>>(sources, n, count, out);
}

// On x86-64 the same loop is also compiled (flattened: everything inlined into a kernel is
// compiled for its target) for AVX2 and AVX-512, and the widest the CPU has
// runs: with the baseline's SSE2 a 2-source sum ran up to 2x slower than Open MPI's AVX
// reduction, with AVX-512 as fast beyond L2 (MPI_Allreduce was faster than our all_reduce for
// that alone). The result does not depend on the width or the stores: every element gets the
// same IEEE additions in the same order.
#ifdef SHARDMM_X86_KERNELS
template <class T>
struct StreamStore512 {
  static constexpr std::int64_t alignment = 64;
  [[gnu::target("avx512f")]] static void store(T* dst, const T* acc, std::int64_t n) {
    constexpr std::int64_t lanes = 64 / sizeof(T);
    for (std::int64_t i = 0; i < n; i += lanes) {
      if constexpr (sizeof(T) == 4) _mm512_stream_ps(dst + i, _mm512_loadu_ps(acc + i));
      else _mm512_stream_pd(dst + i, _mm512_loadu_pd(acc + i));
    }
  }
};
template <class T>
struct StreamStore256 {
  static constexpr std::int64_t alignment = 32;
  [[gnu::target("avx2")]] static void store(T* dst, const T* acc, std::int64_t n) {
    constexpr std::int64_t lanes = 32 / sizeof(T);
    for (std::int64_t i = 0; i < n; i += lanes) {
      if constexpr (sizeof(T) == 4) _mm256_stream_ps(dst + i, _mm256_loadu_ps(acc + i));
      else _mm256_stream_pd(dst + i, _mm256_loadu_pd(acc + i));
    }
  }
};

template <class T>
[[gnu::target("avx2"), gnu::flatten]] void sum_avx2(const void* const* sources, std::size_t n, std::int64_t count,
                                                    void* out) {
  sum_blocks<T, PlainStore<T>>(sources, n, count, out);
}
template <class T>
[[gnu::target("avx512f"), gnu::flatten]] void sum_avx512(const void* const* sources, std::size_t n, std::int64_t count,
                                                         void* out) {
  sum_blocks<T, PlainStore<T>>(sources, n, count, out);
}
// Non-temporal stores are weakly ordered: the fence makes them visible before the caller's
// synchronization tells the peers that the output is ready.
template <class T>
[[gnu::target("avx2"), gnu::flatten]] void sum_avx2_streamed(const void* const* sources, std::size_t n,
                                                             std::int64_t count, void* out) {
  sum_blocks<T, StreamStore256<T>>(sources, n, count, out);
  _mm_sfence();
}
template <class T>
[[gnu::target("avx512f"), gnu::flatten]] void sum_avx512_streamed(const void* const* sources, std::size_t n,
                                                                  std::int64_t count, void* out) {
  sum_blocks<T, StreamStore512<T>>(sources, n, count, out);
  _mm_sfence();
}
#endif

struct SumKernels {
  SumKernel cached = nullptr;    // the output stays in cache for whoever reads it next
  SumKernel streamed = nullptr;  // the output goes past the cache
};

template <class T>
SumKernels sum_kernels() {
#ifdef SHARDMM_X86_KERNELS
  if (__builtin_cpu_supports("avx512f")) return {&sum_avx512<T>, &sum_avx512_streamed<T>};
  if (__builtin_cpu_supports("avx2")) return {&sum_avx2<T>, &sum_avx2_streamed<T>};
#endif
  return {&sum_baseline<T>, &sum_baseline<T>};
}

// This core's L2 in bytes (2 MiB where the system does not say).
inline std::int64_t l2_cache_bytes() {
  static const std::int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<std::int64_t>(l2) : std::int64_t{1} << 21;
  }();
  return bytes;
}

// f32 or f64 (the callers reject other dtypes first). `peers_read_out`: other cores read `out`
// straight after (the threads backend's all_reduce gathers each member's summed chunk from its
// buffer).
inline void sum_in_order(DType dtype, const std::vector<const void*>& sources, std::int64_t count, void* out,
                         bool peers_read_out = false) {
  static const SumKernels f32 = sum_kernels<float>();
  static const SumKernels f64 = sum_kernels<double>();
  const SumKernels& kernels = dtype == DType::f32 ? f32 : f64;
  bool out_is_a_source = false;
  for (const void* s : sources) out_is_a_source = out_is_a_source || s == out;
  const auto arrays = static_cast<std::int64_t>(sources.size() + (out_is_a_source ? 0 : 1));
  const std::int64_t working_set = count * dtype_bytes(dtype) * arrays;
  // Beyond the core's L2, a sum into a separate output streams its stores: the output would
  // evict the sources anyway. Measured crossover on the dev VM (2 MiB L2 per core): plain stores
  // win up to 0.5 MiB of output from 2 sources, streamed ones from 1 MiB. Summed in place, the
  // lines are this core's already and a plain store costs no extra read; but a peer that reads
  // them next must then fetch each modified line out of this core's cache, which took longer
  // than from memory beyond L2 (threads all_reduce, 2 ranks, 1 MiB L2: at 2 / 4 MiB 358-383 /
  // 718-751 us plain, 241-249 / 430-524 streamed; at 1 MiB, within L2, 82-92 plain and 120
  // streamed; a 2-vCPU AMD EPYC VM, 2026-12-01).
  const bool stream = (!out_is_a_source || peers_read_out) && working_set > l2_cache_bytes();
  (stream ? kernels.streamed : kernels.cached)(sources.data(), sources.size(), count, out);
}

// out = max(max(s0, s1), s2) ... elementwise, in source order; a NaN in any source wins (as
// torch.amax). `out` may alias a source: each element is read from every source before it is
// written. A plain loop: maxima reduce small arrays (row statistics), not gradients.
template <class T>
void max_in_order(const std::vector<const void*>& sources, std::int64_t count, void* out) {
  for (std::int64_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(sources[0])[i];
    for (std::size_t s = 1; s < sources.size(); ++s) {
      const T v = static_cast<const T*>(sources[s])[i];
      if (v > acc || v != v) acc = v;
    }
    static_cast<T*>(out)[i] = acc;
  }
}

// sum_in_order, or max_in_order for ReduceOp::max: the reductions all_reduce offers.
inline void reduce_in_order(ReduceOp op, DType dtype, const std::vector<const void*>& sources, std::int64_t count,
                            void* out, bool peers_read_out = false) {
  if (op == ReduceOp::sum) return sum_in_order(dtype, sources, count, out, peers_read_out);
  if (dtype == DType::f32) {
    max_in_order<float>(sources, count, out);
  } else {
    max_in_order<double>(sources, count, out);
  }
}

}  // namespace shardmm::detail
