// A local einsum as batched GEMMs, planned without touching memory: which operands GEMM reads
// in place and which are copied (permuted, or reduced over their summed dimensions) into a
// workspace, and that workspace's size. The runtime's LocalEinsum (runtime/kernels.h) runs
// such a plan; the planner counts its workspace in a plan's peak (plan/memory.h): one
// formula for both.
//
//   // C[K, I] = sum_J A[I, J] * B[J, K]: GEMM computes C^T = B^T A^T in place, no copy
//   EinsumPlan p = plan_local_einsum({{"I", "J"}, {"J", "K"}, {"K", "I"}},
//                                    {{"I", 64}, {"J", 32}, {"K", 16}}, DType::f32);
//   p.workspace_bytes;  // 0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardmm/core/dtype.h"

namespace shardmm {

using Shape = std::vector<std::int64_t>;

// Each dimension's stride in a row-major buffer of `shape`, in elements.
Shape row_major_strides(const Shape& shape);

// The dimension names of an einsum's operands, each in its buffer's (row-major) order.
struct EinsumLayout {
  std::vector<std::string> a, b, c;
};

// "einsum [I, J], [J, K] -> [K, I]", for messages.
std::string describe(const EinsumLayout& layout);

// Where operands A and B lie when each is a box of a larger row-major buffer (a chunk of a
// contracted dimension, say): per name, the buffer's extent, at least the einsum's own; a
// name left out (or an empty map) has the einsum's extent. GEMM reads a box in place where
// the buffer's order lets it (the buffer's leading dimension is GEMM's); otherwise the box is
// copied as any operand whose order GEMM cannot read.
struct OperandBuffers {
  std::map<std::string, std::int64_t> a, b;
};

// A buffer as a GEMM matrix [g1 x g2] (see plan_local_einsum).
struct MatrixView {
  bool ok = false;
  bool trans = false;  // stored [g2, g1]
  std::int64_t ld = 1;
};

// The plan: each batch index is one GEMM of [free_a x contracted] @ [contracted x free_b].
// An operand is copied into the workspace only when its own order cannot serve as a strided,
// possibly transposed, GEMM operand; the plan picks the orders that copy the fewest elements.
struct EinsumPlan {
  // An operand as GEMM sees it: a buffer (the caller's, or a copy in the workspace).
  struct Operand {
    std::vector<std::string> names;  // the buffer's order
    Shape shape;
    Shape strides;  // of `shape` in the buffer GEMM reads
    Shape caller_shape;
    Shape caller_strides;  // row-major in the caller's buffer, which may be larger (OperandBuffers)
    bool copied = false;
    std::int64_t offset = 0;  // in the workspace, in elements
    std::int64_t elements = 0;
    std::vector<int> perm;  // A, B: buffer dim i = caller dim perm[i]; C: the reverse
    bool reduce = false;    // A, B with summed dimensions: reduced, not permuted
    Shape reduce_strides;   // per caller dim: buffer stride, 0 for summed
    MatrixView view;
    Shape batch_strides;
  };

  EinsumLayout layout;
  DType dtype = DType::f32;
  double flops = 1;
  bool empty = false;  // some extent is 0: C is all zeros
  std::int64_t c_elements = 1;
  std::int64_t m = 1, n = 1, k = 1;
  bool swap = false;  // C is stored [N, M]: GEMM computes C^T = B^T A^T
  Shape batch_extents;
  Operand a, b, c;
  // The copies, each starting on a 64-byte line, in `dtype`'s elements.
  std::int64_t workspace_bytes = 0;
};

// `extents` maps every name of the layout to its local extent (other names are ignored). Any
// dtype: the workspace is counted in its element size. Throws UsageError for: a name repeated
// within an operand, an output name in neither input, a missing or negative extent, a buffer
// extent smaller than the einsum's.
EinsumPlan plan_local_einsum(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents, DType dtype,
                             const OperandBuffers& buffers = {});

}  // namespace shardmm
