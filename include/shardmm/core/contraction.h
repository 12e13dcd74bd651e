// A sharded contraction (einsum of two operands) named by dimension letters.
//
//   Mesh mesh = Mesh::parse("X=4");
//   Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
//   c.role("J");   // DimRole::contracted
//   c.out;         // the requested output spec, if one was written
//
// A letter in both inputs and not in the output is contracted; in both inputs and in
// the output it is a batch dimension; in one input and the output it is free. The
// output spec is optional: without it the output's dimensions are A's non-contracted
// letters in A's order followed by B's free letters in B's order, and the planner may
// choose its sharding.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

enum class DimRole { batch, contracted, free_a, free_b };
const char* to_string(DimRole role);

struct Contraction {
  Spec a, b;
  std::optional<Spec> out;  // as written, when written
  std::string out_tensor = "C";
  std::vector<std::string> out_dims;  // output dimension names, in order

  DimRole role(std::string_view dim) const;
  std::vector<std::string> contracted() const;  // in A's order
  // All dimension names: A's, then B's that A lacks.
  std::vector<std::string> all_dims() const;
};

Contraction parse_contraction(std::string_view text, const Mesh& mesh);
// "A[I, J_X] @ B[J_X, K] -> C[I, K]" (the output part only when `out` is set).
std::string format_contraction(const Contraction& c, const Mesh& mesh);

}  // namespace shardmm
