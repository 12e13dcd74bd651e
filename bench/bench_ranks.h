// Timing a step on every rank of a communicator: all ranks start together, and a step's time is
// the slowest rank's.
#pragma once

#include "shardmm/runtime/communicator.h"

namespace shardmm::bench {

class RankClock {
 public:
  explicit RankClock(Communicator& comm) : comm_(comm) {
    for (int a = 0; a < comm.mesh().rank(); ++a) all_.push_back(a);
  }
  // Returns when every rank has called it.
  void line_up() {
    double nothing = 0;
    comm_.all_reduce(&nothing, 1, DType::f64, all_);
  }
  // The most `seconds` any rank passed (every rank gets it).
  double slowest(double seconds) { return latest(seconds); }
  // The latest of the ranks' `time`s, on a clock they share (in-process ranks'; every rank gets it).
  double latest(double time) {
    comm_.all_reduce(&time, 1, DType::f64, all_, ReduceOp::max);
    return time;
  }

 private:
  Communicator& comm_;
  AxisList all_;
};

}  // namespace shardmm::bench
