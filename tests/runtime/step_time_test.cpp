// How run_plan turns every rank's step spans into one step time (runner.h, step_time_s), and
// the median the reports take over repeats.
#include <gtest/gtest.h>

#include "shardmm/core/error.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {
namespace {

// Rank 0 reaches the all_reduce at 1.0 s and waits for rank 1, which arrives at 3.0 s; both
// leave at 3.5 s. The collective took 0.5 s; rank 0's 2.5 s span is the einsum's imbalance.
TEST(StepTime, ACollectiveCountsFromItsLastArrival) {
  EXPECT_DOUBLE_EQ(step_time_s(OpKind::all_reduce, {1.0, 3.0}, {2.5, 0.5}), 0.5);
  EXPECT_DOUBLE_EQ(step_time_s(OpKind::all_gather, {1.0, 3.0, 2.0}, {2.5, 0.5, 1.75}), 0.75);
  for (OpKind op : {OpKind::reduce_scatter, OpKind::all_to_all}) {
    EXPECT_DOUBLE_EQ(step_time_s(op, {0.0, 0.0}, {0.25, 0.5}), 0.5) << to_string(op);
  }
}

// Local steps and the collective matmul rings (compute and transfers interleaved): the
// slowest rank's span.
TEST(StepTime, OtherStepsTakeTheSlowestRank) {
  for (OpKind op :
       {OpKind::einsum, OpKind::slice, OpKind::to_partial, OpKind::all_gather_einsum, OpKind::einsum_reduce_scatter}) {
    EXPECT_DOUBLE_EQ(step_time_s(op, {1.0, 3.0}, {2.5, 0.5}), 2.5) << to_string(op);
  }
}

TEST(StepTime, NeedsOneStartAndDurationPerRank) {
  EXPECT_THROW(step_time_s(OpKind::einsum, {}, {}), InputError);
  EXPECT_THROW(step_time_s(OpKind::all_reduce, {1.0}, {1.0, 2.0}), InputError);
}

// The one median every report and benchmark quotes.
TEST(Median, MiddleValueOrTheMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({5}), 5);
  EXPECT_EQ(median({}), 0);
}

}  // namespace
}  // namespace shardmm
