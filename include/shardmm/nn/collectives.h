// A step's collectives tallied per phase, collective and mesh axes (the reports' tables).
//
//   for (const nn::CollectiveTally& t : nn::tally_collectives(prediction.events))
//     t.count;  // e.g. 1 forward all_reduce over X, then 1 backward
#pragma once

#include <cstdint>
#include <vector>

#include "shardmm/autodiff/tape.h"

namespace shardmm::nn {

// Per phase, collective and mesh axes: how many and their bytes (the most any device sends).
// A collective matmul ring counts as its own collective, its time the ring's (einsum included).
struct CollectiveTally {
  autodiff::Phase phase = autodiff::Phase::forward;
  OpKind op = OpKind::all_reduce;
  AxisList axes;
  int count = 0;
  std::int64_t bytes = 0;
  double time_s = 0;                // predicted
  ReduceOp reduce = ReduceOp::sum;  // all_reduce: sums, or the max of a softmax's or max's rows
};
// One per phase, collective, axes and (all_reduce) reduction, in order of first appearance.
// `bytes` (same length as events, optional) overrides the events' own predicted bytes (a
// run's measured figures).
std::vector<CollectiveTally> tally_collectives(const std::vector<autodiff::TapeEvent>& events,
                                               const std::vector<std::int64_t>* bytes = nullptr);

}  // namespace shardmm::nn
