// Timing for the benchmarks (private): one operation run back to back by every rank of a
// communicator, from the group's start to its finish, the median of several trials. Shared by
// the collective benchmark, `calibrate`, run_plan's repeats and the ScaLAPACK bench; and how
// the benchmarks share rank 0's figures, which under mpirun only it has.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <string_view>
#include <vector>

#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs `work` on every rank from a common start (a barrier) and returns the time from the
// first rank's start to the last rank's finish, the same figure on every rank, where the ranks
// share a clock (Communicator::clock_is_shared). Ranks that share cores do not start together:
// one may get a core only after the others have worked for milliseconds, and its own span then
// misses their work (a 4-rank GEMM on 2 cores measured 3.8x too fast on rank 0). Elsewhere
// (mpi across machines, each rank on its own core) this rank's span to the closing barrier.
// `start_lag_s`, if given, gets how long after the first rank this one started (0 without a
// shared clock).
inline double group_span_s(Communicator& comm, const std::function<void()>& work, double* start_lag_s = nullptr) {
  comm.barrier();
  const double start = now_s();
  work();
  const double finish = now_s();
  if (!comm.clock_is_shared()) {
    if (start_lag_s) *start_lag_s = 0;
    comm.barrier();
    return now_s() - start;
  }
  const auto n = static_cast<std::size_t>(comm.mesh().device_count());
  const double mine[2] = {start, finish};
  std::vector<double> all(2 * n);
  comm.all_gather(mine, all.data(), Counts(n, 2), DType::f64, comm.mesh().all_axes());
  double first = all[0], last = all[1];
  for (std::size_t r = 1; r < n; ++r) {
    first = std::min(first, all[2 * r]);
    last = std::max(last, all[2 * r + 1]);
  }
  if (start_lag_s) *start_lag_s = start - first;
  return last - first;
}

// Rank 0's `value` on every rank: the others add zeros.
inline double rank0_value(Communicator& comm, double value) {
  if (comm.rank() != 0) value = 0;
  comm.all_reduce(&value, 1, DType::f64, comm.mesh().all_axes());
  return value;
}

// Rank 0's `value` in every process (under mpirun; with threads, the one process has it).
inline double from_root(std::string_view backend, const Mesh& mesh, double value) {
  double out = 0;
  std::mutex lock;  // the threads backend's ranks share `out`; under mpirun each process has its own
  run_backend(backend, mesh, [&](Communicator& comm) {
    const double v = rank0_value(comm, value);
    std::lock_guard hold(lock);
    out = v;
  });
  return out;
}

// Every trial is a group_span_s, so the root's figure stands for the group. `iterations` 0
// picks enough calls for ~20 ms per trial.
struct BenchTimer {
  Communicator& comm;
  int iterations = 0;
  int trials = 5;

  // Per call: the fastest, the median and the slowest trial (a shared machine's trials of
  // one size can differ by 30x; the median alone hides that).
  struct Trials {
    double min_s = 0, median_s = 0, max_s = 0;
  };

  double per_call(const std::function<void()>& op) const { return per_call_trials(op).median_s; }

  Trials per_call_trials(const std::function<void()>& op) const {
    int calls = iterations;
    if (calls <= 0) {
      // Calibrate on one call: aim at ~20 ms per trial, between 1 and 1000 calls. All ranks
      // must agree on the count, so the root's choice is summed over the mesh (others add 0):
      // without a shared clock each rank has its own span.
      const double once = group_span_s(comm, op);
      calls = static_cast<int>(rank0_value(comm, std::clamp(0.02 / std::max(once, 1e-9), 1.0, 1000.0)));
    }
    std::vector<double> times;
    for (int t = 0; t < trials; ++t) {
      times.push_back(group_span_s(comm,
                                   [&] {
                                     for (int i = 0; i < calls; ++i) op();
                                   }) /
                      calls);
    }
    const auto [fastest, slowest] = std::minmax_element(times.begin(), times.end());
    return {*fastest, median(times), *slowest};
  }
};

}  // namespace shardmm::detail
