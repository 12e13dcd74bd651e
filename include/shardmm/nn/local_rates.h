// Each local function's compute time per element on this machine, measured on its real kernel
// (docs/calibration.md, "Local functions"): what `shardmm calibrate` stores in the profile's
// Calibration::local_seconds_per_element, and what a local step's arithmetic term multiplies
// (plan/cost.h: local_op_cost).
//
//   std::map<std::string, double> f32 = nn::measure_local_rates(DType::f32, {});
//   f32.at("gelu");            // seconds per element gelu reads or writes, forward
//   f32.at("gelu backward");   // and in its backward pass
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "shardmm/core/dtype.h"

namespace shardmm::nn {

struct LocalRateOptions {
  // Each block the functions read or write. A function reads one and writes another at least,
  // more than a CPU's last-level cache (32 MiB here) between them, so that it streams from
  // memory as a program's large activations do; each block stays below glibc's largest mmap
  // threshold (32 MiB), so that after the warm-up its buffers come from the heap, as a
  // program's do, rather than as fresh pages each time.
  std::int64_t block_bytes = std::int64_t{24} << 20;
  int repeats = 3;  // timed passes over every function after a warm-up; each rate is their median
};
// `calibrate --quick`'s blocks: in cache, so a memory-bound function's rate reads low (the
// bandwidth term, which the step takes the max with, still holds it), a transcendental one's
// about as in memory; a sixth of the time.
inline constexpr std::int64_t kQuickLocalRateBlockBytes = std::int64_t{4} << 20;

// Every function of autodiff::local_functions(), in each pass it runs in, keyed by
// local_rate_key ("gelu", "gelu backward", "accumulate backward", "sgd"): the seconds its
// steps took over the elements they read plus wrote (Step::elements), on a one-device tape in
// `dtype` (f32 or f64). Each function runs as a program op would (nn's own ops, the tape's
// swiglu), forward, backward from a sum, and the update.
std::map<std::string, double> measure_local_rates(DType dtype, const LocalRateOptions& options);

}  // namespace shardmm::nn
