// Three ops that attention needs beside tape.h's: renaming a dimension (keys and values
// index positions with a letter of their own), scaling by a constant (1/sqrt(head width))
// and the causal mask. None moves data between devices.
//
//   Var k = rename(einsum(x, wk, {"B", "T", "H", "A"}), "T", "S");  // [B, S, H, A]
//   Var s = scale(einsum(q, k, {"B", "H", "T", "S"}), 1 / std::sqrt(a));
//   Var p = softmax(causal_mask(s, "T", "S"));                       // S > T masked out
#pragma once

#include <string_view>

#include "shardmm/autodiff/tape.h"

namespace shardmm::autodiff {

// The same tensor with dimension `from` called `to` (which x must not have already).
Var rename(Var x, std::string_view from, std::string_view to);
// factor * x; x may be unreduced (the product of a partial sum is a partial sum).
Var scale(Var x, double factor);
// x where the global index of `col` <= that of `row`, -infinity elsewhere, so that a
// softmax over `col` gives those entries weight 0. x must be whole (no unreduced axes).
Var causal_mask(Var x, std::string_view row, std::string_view col);

}  // namespace shardmm::autodiff
