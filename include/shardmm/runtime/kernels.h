// Local compute kernels: strided box copies, permutes and a two-operand einsum over BLAS.
// All arrays are dense and row-major; a shape is a plain vector of extents.
//
//   // dst[0:2, 3:5] = src[1:3, 0:2]
//   copy_box(src, {4, 2}, {1, 0}, dst, {2, 5}, {0, 3}, {2, 2});
//   // C[K, I] = sum_J A[I, J] * B[J, K], in f32
//   LocalEinsum mm({{"I", "J"}, {"J", "K"}, {"K", "I"}}, {{"I", 64}, {"J", 32}, {"K", 16}},
//                  DType::f32);
//   mm.run(a, b, c);  // no copy of A, B or C here: mm.workspace_bytes() == 0
//
// Sizes are in elements; shapes, offsets and extents of one call have the same rank
// (rank 0 is one element). A call whose box does not fit, or whose ranks differ, throws
// UsageError (the caller computed them wrong). The kernels are instantiated for float and double.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/plan/local_einsum.h"  // EinsumLayout, OperandBuffers: the einsum planned here

namespace shardmm {

// Copies the box of `extent` at `src_offset` in src into dst at `dst_offset`.
// A zero extent copies nothing.
template <class T>
void copy_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst, const Shape& dst_shape,
              const Shape& dst_offset, const Shape& extent);
// As copy_box, but dst += src over the box (the local half of a reduction).
template <class T>
void add_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst, const Shape& dst_shape,
             const Shape& dst_offset, const Shape& extent);

// dst = src with its dimensions reordered: dst dimension i is src dimension perm[i],
// so dst's shape is {shape[perm[0]], shape[perm[1]], ...}. src and dst must not overlap.
template <class T>
void permute(const T* src, const Shape& shape, const std::vector<int>& perm, T* dst);

// C = A (x) B for one fixed layout, extents and dtype, planned once and run many times.
// A name in a, b and c is a batch dimension; in a and b only, contracted; in one input
// and c, free; in one input only, summed over that input before the product.
// Each batch index is one GEMM of [free_a x contracted] @ [contracted x free_b]. An
// operand is copied (permuted, or reduced over its summed dimensions) into the
// workspace only when its own order cannot serve as a strided, possibly transposed,
// GEMM operand; the plan picks the orders that copy the fewest elements.
// Not safe to run() one object from two threads at once: the workspace is shared.
class LocalEinsum {
 public:
  // `extents` maps every name of the layout to its local extent (other names are ignored).
  // Throws UsageError for: a name repeated within an operand, an output name in neither
  // input, a missing or negative extent, a buffer extent smaller than the einsum's; and
  // InputError for a dtype other than f32 and f64.
  LocalEinsum(EinsumLayout layout, std::map<std::string, std::int64_t> extents, DType dtype,
              const OperandBuffers& buffers = {});
  ~LocalEinsum();
  LocalEinsum(LocalEinsum&&) noexcept;
  LocalEinsum& operator=(LocalEinsum&&) noexcept;

  // Overwrites c (never reads it). Buffers hold the dtype's elements, row-major in the
  // order of their layout's names; a, b, c must not overlap.
  void run(const void* a, const void* b, void* c);
  // c += A (x) B: GEMM's beta = 1 where c is GEMM's output in place, else the product is
  // added from the workspace. An einsum with an extent 0 leaves c as it was.
  void accumulate(const void* a, const void* b, void* c);

  const EinsumLayout& layout() const;
  DType dtype() const;
  // 2 * the product of the extents of all distinct names: one multiply and one add per
  // term of the sum that defines C (what a naive einsum does).
  double flops() const;
  std::int64_t workspace_bytes() const;
  // What workspace_bytes() would be, worked out without allocating: memory checks
  // before a run (runner.h). Throws as the constructor does.
  static std::int64_t workspace_bytes_for(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents,
                                          DType dtype, const OperandBuffers& buffers = {});
  // Whether run() copies that operand through the workspace (A and B: permuted, or
  // reduced over their summed dimensions; C: written there, then permuted into c).
  bool copies_a() const;
  bool copies_b() const;
  bool copies_c() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardmm
