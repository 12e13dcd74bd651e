// Reductions and normalizations over one dimension of a tape value, named by its letter,
// sharded or not. A dimension sharded over mesh axes G leaves each rank part of every row:
// sums stay partial ({U_G}, no communication); the nonlinear ops complete their row
// statistics with an all_reduce over G (a recorded, costed step, forward and backward), so
// their results equal the unsharded ones.
//
//   Var s = reduce_sum(x, "J");                  // x[I, J_X] -> [I]{U_X}: partial sums
//   Var m = reduce_max(x, "J");                  // [I], replicated over X: all_reduce(max) over X
//   Var p = softmax(scores, "S");                // [B, T, S_Y] -> [B, T, S_Y]: two all_reduces over Y
//   Var h = rms_norm(x, "D");                    // x / sqrt(mean(x^2) + eps) over D
//
// docs/autodiff.md's op table gives each op's layouts and collectives.
#pragma once

#include <string_view>

#include "shardmm/autodiff/tape.h"

namespace shardmm::autodiff {

// Sum over `dim`: x without dim. dim sharded over G: unreduced over G (each rank's part of
// each row's sum). x's own unreduced axes are kept (the sum is linear).
Var reduce_sum(Var x, std::string_view dim);
// reduce_sum / the global extent of dim (InputError when it is 0).
Var reduce_mean(Var x, std::string_view dim);
// Maximum over `dim`: x without dim, whole. x must be whole (no unreduced axes). dim sharded
// over G: each rank's row maxima (-infinity where its block of dim is empty), then all_reduce
// with max over G. Backward (torch.amax's rule): the gradient goes to the elements equal to
// their row's maximum, split evenly among ties, counted over the whole row (an all_reduce sum
// over G when sharded).
Var reduce_max(Var x, std::string_view dim);
// exp(x - max) / sum(exp(x - max)) over `dim`; x whole. dim sharded over G: all_reduce max
// of the row maxima and all_reduce sum of the row sums forward, all_reduce sum of the rows'
// sum(g * y) backward.
Var softmax(Var x, std::string_view dim);
// (x - mean) / sqrt(var + eps) over `dim` (biased variance, no scale or bias); x whole.
// dim sharded over G: all_reduce sums of the rows' sums and then of their squared
// deviations forward, of sum(g) and sum(g * normalized) backward.
Var layer_norm(Var x, std::string_view dim, double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) over `dim`; x whole. dim sharded over G: one all_reduce sum of
// the rows' sums of squares forward, one of sum(g * y) backward.
Var rms_norm(Var x, std::string_view dim, double eps = 1e-6);

}  // namespace shardmm::autodiff
