// Runs a plan on a backend with generated inputs, times it, traces it and verifies it:
// what `shardmm run` and `shardmm reshard --run` do, for any program that wants the same.
//
//   RunRequest req{"threads", mesh, plan, sizes, DType::f32};
//   req.contraction = &contraction;          // or req.reshard_from = &spec
//   req.repeat = 5;
//   RunReport r = run_plan(req);
//   if (r.is_root) std::cout << r.measured_time_s << " " << r.verification.verified;
//
// On the threads backend every rank is a thread of this process and the report is
// complete here. Under mpirun each process is one rank: the figures are gathered on
// device 0 and `is_root` is true in that process only; the verdict is known everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/plan/step.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {

struct RunRequest {
  std::string backend = "threads";
  Mesh mesh;
  Plan plan;
  DimSizes sizes;
  DType dtype = DType::f32;
  const Contraction* contraction = nullptr;  // a matmul plan's expression
  const Spec* reshard_from = nullptr;        // or a reshard plan's source layout
  int warmup = 1;                            // untimed runs first (page faults, caches)
  int repeat = 5;                            // timed runs
  bool verify = true;
  // Called on device 0 as the run moves on ("repeat 3 of 5", "verifying"), for long runs.
  std::function<void(const std::string&)> progress;
};

struct StepMeasurement {
  OpKind op = OpKind::einsum;
  AxisList axes;
  std::string tensor;
  std::int64_t bytes_sent = 0;      // the most any rank sent
  std::int64_t bytes_received = 0;  // the most any rank received
  double measured_time_s = 0;       // median over repeats of the slowest rank's time
};

struct RunReport {
  bool is_root = true;              // this process holds the gathered figures
  int ranks = 0;
  double measured_time_s = 0;       // median over repeats, barrier to barrier
  std::vector<double> repeat_times_s;
  std::vector<StepMeasurement> steps;
  Verification verification;        // verified = true and zero errors when verify is off
  bool verified_run = false;        // whether verification ran
};

// Throws InputError for a request that does not fit (no operand given, bad repeat).
RunReport run_plan(const RunRequest& request);

// The rank of this process in its backend's job: 0 for threads, the MPI world rank
// under mpirun (known before MPI starts). Lets a program print on one process only.
int process_rank(std::string_view backend);

}  // namespace shardmm
