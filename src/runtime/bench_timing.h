// Timing for the benchmarks (private): one operation run back to back by every rank of a
// communicator, barrier to barrier, the median of several trials. Shared by the
// collective benchmark and `calibrate`.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every rank measures the same barrier-to-barrier span, so the root's figure stands for
// the group. `iterations` 0 picks enough calls for ~20 ms per trial.
struct BenchTimer {
  Communicator& comm;
  int iterations = 0;
  int trials = 5;

  double per_call(const std::function<void()>& op) const {
    int calls = iterations;
    if (calls <= 0) {
      // Calibrate on one call: aim at ~20 ms per trial, between 1 and 1000 calls. All ranks
      // must agree on the count, so the root's choice is summed over the mesh (others add 0).
      comm.barrier();
      const double t0 = now_s();
      op();
      comm.barrier();
      const double once = now_s() - t0;
      double n = comm.rank() == 0 ? std::clamp(0.02 / std::max(once, 1e-9), 1.0, 1000.0) : 0.0;
      comm.all_reduce(&n, 1, DType::f64, comm.mesh().all_axes());
      calls = static_cast<int>(n);
    }
    std::vector<double> times;
    for (int t = 0; t < trials; ++t) {
      comm.barrier();
      const double t0 = now_s();
      for (int i = 0; i < calls; ++i) op();
      comm.barrier();
      times.push_back((now_s() - t0) / calls);
    }
    return median(times);
  }
};

}  // namespace shardmm::detail
