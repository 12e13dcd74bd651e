// A sharded matmul against the physical limit: one OpenBLAS GEMM of the same FLOPs on the
// same cores, measured in the same run (what `shardmm bench matmul` prints).
//
//   MatmulBenchOptions o;
//   o.mesh = Mesh::parse("X=2");
//   o.contraction = parse_contraction("A[I_X, J] @ B[J_X, K] -> C[I_X, K]", o.mesh);
//   o.sizes = {1024, 2048};            // every dimension not in o.fixed takes each size
//   o.hw = builtin_profile("h100");
//   for (const MatmulBenchPoint& p : bench_matmul(o).points)
//     p.gemm_time_s / p.runs[0].measured_time_s;   // 1.0 = as fast as the one GEMM
//
// Each point plans the contraction, runs the chosen plan (or every candidate, `all`),
// verifies each run against the dense reference, and times the reference GEMM: C[m,n] =
// A[m,k] @ B[k,n] where m is the product of A's free and batch dimensions, n of B's free
// ones and k of the contracted ones, so its FLOPs equal the contraction's. The GEMM runs
// with min(ranks, cores) OpenBLAS threads: the cores the ranks share. Under mpirun it
// runs on rank 0 while the others sleep (an MPI wait would poll and take the GEMM's cores).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/plan/cost.h"

namespace shardmm {

struct MatmulBenchOptions {
  std::string backend = "threads";
  Mesh mesh;
  Contraction contraction;
  DimSizes fixed;                   // dimensions with a size of their own
  std::vector<std::int64_t> sizes;  // the size of every other dimension, one point each
  DType dtype = DType::f32;         // f32 or f64
  HardwareProfile hw;               // the planner's profile (predictions and the choice)
  bool all = false;                 // run every candidate, not only the chosen one
  int warmup = 1;
  // Each plan's warm-up lasts at least this long (RunRequest::warmup_min_s), as `run`'s does:
  // a step of microseconds timed after one warm-up run measures the machine waking up.
  double warmup_min_s = 0.2;
  int repeat = 7;      // the times are medians of `repeat` runs
  int rounds = 1;      // the reference GEMM and the candidates run in turn, `repeat`
                       // runs each per round; each time is the median of all its runs
  bool check = false;  // BackendOptions::check: off, to time the plan alone
  // Called on the root process before each measurement ("N=1024: candidate 2 of 4").
  std::function<void(const std::string&)> progress;
};

struct MatmulBenchRun {
  int candidate = 0;  // index into the planner's candidates (cheapest first)
  std::string description;
  double predicted_time_s = 0;  // serialized: comm + compute
  double predicted_comm_s = 0;
  double predicted_compute_s = 0;
  double measured_time_s = 0;  // median, first rank's start to last rank's finish
  bool verified = false;
  double max_rel_error = 0;
  Confidence confidence;  // the plan's steps' (Step::confidence), their uncertainties summed
};

// With every candidate run, the chosen one against the fastest of the others, both run again in
// turn for `rounds` more rounds. The least of many noisy times is low by chance (the more
// candidates, the lower), so the choice is judged on this second measurement of the two alone.
struct MatmulBenchRunoff {
  int candidate = -1;        // the other: the fastest candidate of all the runs
  double chosen_time_s = 0;  // medians of the runoff's runs
  double candidate_time_s = 0;
};

// How fast the machine runs now against when its profile was calibrated: the calibration's
// largest GEMM in this dtype (its "square" shape) timed again on every rank at once, as
// `calibrate` times it, once per round just before the reference. Below 1 the machine is
// slower than it was then, and the predictions made from the profile are that much too fast.
struct MatmulBenchSpeedCheck {
  GemmRate calibrated;     // the shape and its rate per rank, as the profile has them
  double flops_per_s = 0;  // now, per rank: the median over the rounds
  double ratio() const { return flops_per_s / calibrated.flops_per_s; }
};

struct MatmulBenchPoint {
  DimSizes sizes;
  double flops = 0;  // 2 x the product of every dimension's size
  std::int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
  double gemm_time_s = 0;                   // the reference, median of `repeat` x `rounds`
  int chosen = -1;                          // the planner's choice (candidate index)
  std::vector<MatmulBenchRun> runs;         // the chosen plan, or every candidate in order
  std::optional<MatmulBenchRunoff> runoff;  // where every candidate ran and another was fastest
  // Where the profile was calibrated on this backend and mesh with a GEMM rate in this dtype.
  std::optional<MatmulBenchSpeedCheck> speed_check;
};

// The run with the least measured time (on the root process; `runs` must not be empty).
const MatmulBenchRun& fastest_run(const MatmulBenchPoint& point);

struct MatmulBenchReport {
  bool is_root = true;  // this process holds the figures (rank 0 under mpirun)
  int ranks = 0;
  int gemm_threads = 0;
  std::vector<MatmulBenchPoint> points;
};

// Throws InputError for a contraction that leaves no dimension to size, an empty size
// list, a dtype other than f32/f64, repeat < 1, rounds < 1 or warmup < 0.
MatmulBenchReport bench_matmul(const MatmulBenchOptions& options);

}  // namespace shardmm
