// Measuring this machine for the cost model: what `shardmm calibrate` does.
//
//   CalibrateOptions o;
//   o.backend = "threads"; o.mesh = Mesh::parse("X=2"); o.quick = true;
//   CalibrationResult r = calibrate(o);
//   if (r.is_root) write(profile_to_json(r.profile));  // plan/cost.h reads it back
//
// Every measurement runs on all ranks of the mesh at once, each rank on its own buffers,
// so the rates are what one rank gets while the others work too:
//   - GEMM FLOP/s per dtype (f32, f64) and shape class: "square" (large), "small"
//     (square, cache-sized) and "skinny" (a matrix times a few columns);
//   - memory bandwidth, memcpy and y += x (the collective benchmark's references);
//   - per group size (each mesh axis alone and all axes together) every collective over a
//     size sweep, fitted to time = alpha + beta * bytes (fit_alpha_beta, plan/cost.h);
//   - last, with the profile built from the above, both collective matmul rings against
//     their serialized twins on the mesh's widest axis, and the share of a ring's hops that
//     the model may hide behind its GEMMs so that it predicts the ratio measured.
// docs/calibration.md gives the sizes, the fit and what the figures mean.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardmm/core/spec.h"
#include "shardmm/core/mesh.h"
#include "shardmm/plan/cost.h"

namespace shardmm {

struct CalibrateOptions {
  std::string backend = "threads";
  Mesh mesh;
  bool quick = false;  // fewer sizes and trials, smaller GEMMs: seconds instead of a minute
  // A third GEMM pass when the first two are this far apart or more (gemm_spread; 0: always).
  double gemm_steady_spread = 0.10;
  // Called on the root process before each measurement ("gemm f32 square 1024^3").
  std::function<void(const std::string&)> progress;
};

// One point of a collective's size sweep and the fit's value there.
struct CollectiveSample {
  OpKind op = OpKind::all_gather;
  int group_size = 2;
  std::int64_t bytes = 0;  // cost.h's array_bytes
  double measured_s = 0;   // median of trials
  double fit_input_s = 0;  // what the fit saw: the least measured_s at this size or larger
  double fitted_s = 0;     // alpha + beta * bytes
};

// One collective matmul ring against its serialized twin (Calibration::*_ring_overlap).
struct RingOverlapSample {
  OpKind ring = OpKind::all_gather_einsum;
  std::string expression;        // the contraction, canonical form
  DimSizes sizes;                // chosen so the serialized plan's GEMMs take ~2x its transfer
  double ring_s = 0;             // measured, median over every timed run
  double serialized_s = 0;       // likewise
  double predicted_hidden = 0;   // the model's ring / serialized with every hop hidden
  double predicted_exposed = 0;  // ... and with none hidden
  double overlap = 1;            // the share whose prediction is ring_s / serialized_s
};

// One tiny step run through the executor for a fixed cost (Calibration::einsum_call_s,
// ring_handoff_s; docs/calibration.md, "Fixed costs").
struct FixedCostSample {
  OpKind op = OpKind::einsum;  // einsum, all_gather_einsum or einsum_reduce_scatter
  std::string expression;      // the contraction, canonical form
  DimSizes sizes;              // small enough that its FLOPs and bytes cost next to nothing
  double measured_s = 0;       // the plan's time, median over every timed run
  double predicted_s = 0;      // the model's time for it without the cost measured here
  int calls = 1;               // what the difference is divided by: 1 call, or the ring's hops
  double per_call_s = 0;       // max(0, measured - predicted) / calls
};

struct CalibrationResult {
  bool is_root = true;      // under mpirun only world rank 0 holds the figures
  HardwareProfile profile;  // calibration set, and the analytic fields derived from it
  std::vector<CollectiveSample> samples;
  std::vector<RingOverlapSample> rings;
  std::vector<FixedCostSample> fixed_costs;  // the local einsum, then each ring
  // The GEMMs are measured before and after the collectives; this is the largest
  // |first - second| / mean over the shapes: how much the machine's speed moved during the
  // calibration (a shared VM's can move by tens of %). From CalibrateOptions::
  // gemm_steady_spread on, a third pass follows at once (combine_gemm_passes).
  double gemm_drift = 0;
  int gemm_passes = 2;
};

// The largest |a - b| / mean(a, b) of the rates of the same shapes in two passes.
double gemm_spread(const std::vector<GemmRate>& a, const std::vector<GemmRate>& b);

// The rates a profile holds from two or three passes over the same shapes: per shape, the
// mean of two, or the median of three (a pass taken in a slow or fast stretch of a shared
// machine is outvoted by the two that agree).
std::vector<GemmRate> combine_gemm_passes(const std::vector<std::vector<GemmRate>>& passes);

// The sizes a sweep measures (bytes per rank, cost.h's convention).
std::vector<std::int64_t> calibration_sizes(bool quick);

// Throws InputError for a mesh of one device (nothing to communicate) or a bad backend.
CalibrationResult calibrate(const CalibrateOptions& options);

}  // namespace shardmm
