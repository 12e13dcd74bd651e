// Collective benchmarks in the nccl-tests convention, with same-run references.
//
//   CollectiveBenchOptions o;
//   o.backend = "threads"; o.mesh = Mesh::parse("X=2"); o.group = {0};
//   o.sizes = {1 << 20, 16 << 20};
//   for (const CollectiveBenchRow& r : bench_collectives(o)) ...  // size, time, algbw, busbw
//
// Sizes are nccl-tests' "size": the bytes of the whole array per rank (all_gather: the
// gathered output; reduce_scatter: the input; all_reduce: the array; all_to_all: the
// send buffer). algbw = size / time; busbw = algbw * factor, factor = (n-1)/n for
// all_gather, reduce_scatter and all_to_all and 2(n-1)/n for all_reduce, so busbw is the
// rate each rank's links move data at, comparable across group sizes.
//
// References measured in the same run on every rank at once (each rank its own
// buffers): `memcpy` copies the bytes an all_gather delivers per rank, `y += x` streams
// the bytes a reduce_scatter sums per rank. busbw / reference says how close a
// collective gets to the machine's memory bandwidth.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/plan/step.h"

namespace shardmm {

// A measurement about to start: the `index`-th (from 1) of `total`, of `op` (a collective
// or a reference) on `bytes` per rank.
struct CollectiveBenchProgress {
  std::string op;
  std::int64_t bytes = 0;
  int index = 0;
  int total = 0;
};

struct CollectiveBenchOptions {
  std::string backend = "threads";
  Mesh mesh;
  AxisList group;                   // the axes to run each collective over
  std::vector<std::int64_t> sizes;  // bytes
  DType dtype = DType::f32;
  int iterations = 0;  // per trial; 0 picks enough for ~20 ms per trial
  int trials = 5;      // the reported time is the median trial
  bool check = false;  // BackendOptions::check: off, to time the collectives alone
  std::vector<OpKind> ops = {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all};
  // Called on the root process before each measurement.
  std::function<void(const CollectiveBenchProgress&)> progress;
};

struct CollectiveBenchRow {
  std::string op;  // all_gather, ..., or a reference: memcpy, "y += x"
  std::int64_t bytes = 0;
  std::int64_t count = 0;  // elements per rank in the array
  double time_s = 0;       // per call, median of trials
  double min_time_s = 0;   // per call, the fastest trial
  double max_time_s = 0;   // per call, the slowest trial
  double algbw = 0;        // bytes/s
  double busbw = 0;        // bytes/s
};

struct CollectiveBenchReport {
  bool is_root = true;
  int group_size = 1;
  std::vector<CollectiveBenchRow> rows;
};

CollectiveBenchReport bench_collectives(const CollectiveBenchOptions& options);

}  // namespace shardmm
