// The causal mask of attention scores, beside tape.h's ops: position t sees positions <= t.
//
//   Var s = scale(einsum(q, k, {"B", "H", "T", "S"}), 1 / std::sqrt(a));
//   Var p = softmax(causal_mask(s, "T", "S"));  // entries with S > T get weight 0
#pragma once

#include <string_view>

#include "shardmm/autodiff/tape.h"

namespace shardmm::autodiff {

// x where the global index of `col` <= that of `row`, -infinity elsewhere, so that a
// softmax over `col` gives those entries weight 0; their gradient is 0. No data moves;
// x must be whole (no unreduced axes), its dimensions sharded or not.
Var causal_mask(Var x, std::string_view row, std::string_view col);

}  // namespace shardmm::autodiff
