// The cost model: predicted time of collectives and local einsums on a hardware profile.
//
//   HardwareProfile hw = builtin_profile("tpu-v5e");
//   Mesh mesh = Mesh::parse("X=4");
//   collective_time(hw, mesh, OpKind::all_gather, {0}, 64 << 20);   // seconds
//
// The formulas are the JAX Scaling Book's (chapter 3), documented with sources in
// docs/cost-model.md. `array_bytes` is the per-device size of the full array the
// collective works on:
//   all_gather      the gathered (output) array
//   reduce_scatter  the unreduced (input) array
//   all_reduce      the array
//   all_to_all      the per-device shard (input and output are the same size)
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/plan/step.h"

namespace shardmm {

// `time = alpha_s + beta_s_per_byte * array_bytes` for one collective on one group size
// over one range of sizes, fitted by `shardmm calibrate` (docs/calibration.md), with the
// fit's worst relative residual over the measured sizes. A collective may have two fits on
// disjoint ranges (in cache and out of it); sizes between or beyond them take the fit of
// the range that starts at or below them (the lowest range below them all).
struct CollectiveFit {
  OpKind op = OpKind::all_gather;
  int group_size = 2;
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  std::int64_t min_bytes = 0;  // the sizes the fit was made on
  std::int64_t max_bytes = 0;
  double max_rel_residual = 0;  // max |fit - measured| / measured
};

// The GEMM shapes calibration measures: "skinny", "small", "square" (rates by arithmetic
// intensity) and kThinGemm, a few rows against a large operand (rates by rows).
inline constexpr const char* kThinGemm = "thin";
// A measured local GEMM rate: one dtype, one shape class ("square", "skinny", kThinGemm), at
// the arithmetic intensity 2mnk / (bytes of A, B and C) of the shape measured.
struct GemmRate {
  DType dtype = DType::f32;
  std::string shape;
  std::int64_t m = 0, n = 0, k = 0;
  double intensity = 0;  // FLOP per byte
  double flops_per_s = 0;
};

// What `shardmm calibrate` measured on one machine: collectives per backend and group
// size, GEMM rates and memory bandwidth, measured on every rank of `mesh` at once.
struct Calibration {
  std::string backend;  // threads or mpi
  std::string mesh;     // the mesh measured on, e.g. "X=2"
  std::string host;
  std::string measured_at;    // UTC, ISO 8601
  double copy_bandwidth = 0;  // memcpy: bytes read + written per second, per rank (the largest size's)
  double add_bandwidth = 0;   // y += x: bytes read + written per second, per rank
  // memcpy by the bytes one copy moves, ascending: a copy the caches hold runs several times
  // faster than copy_bandwidth. Empty where a profile predates it (every copy then takes
  // copy_bandwidth).
  struct SizedRate {
    std::int64_t bytes = 0;
    double bandwidth = 0;  // as copy_bandwidth
  };
  std::vector<SizedRate> copy_bandwidths;
  // The share of a collective matmul ring's hops that moves while the rank multiplies (0..1),
  // fitted so that the model's ring / serialized ratio is the one measured on this backend
  // (docs/calibration.md, "Ring overlap"): threads lends its buffers and hides nearly all,
  // mpi without a helper thread copies inside its calls and hides little. 1 where a profile
  // predates the measurement.
  double gather_ring_overlap = 1;   // all_gather_einsum
  double scatter_ring_overlap = 1;  // einsum_reduce_scatter
  // Fixed costs of the executor's steps that no rate or fit holds, measured on steps so small
  // that their FLOPs and bytes cost next to nothing (docs/calibration.md, "Fixed costs"); 0
  // where a profile predates them.
  double einsum_call_s = 0;  // one local GEMM call through the executor: BLAS dispatch, the step's
                             // allocation and bookkeeping (a ring pays it per chunk)
  // One hop of a collective matmul ring beyond what its hop time holds: handing the chunk to the
  // neighbour and waiting for the neighbour's, which no GEMM hides (on the threads backend a
  // rank that waits sleeps, and its wake-up takes tens of microseconds on a VM).
  double ring_handoff_s = 0;
  std::vector<CollectiveFit> collectives;
  std::vector<GemmRate> gemm;
  // Each local function's compute time per element it reads or writes, by dtype and
  // local_rate_key ("gelu", "gelu backward"), measured on its real kernel (docs/calibration.md,
  // "Local functions"); empty where a profile predates the measurement.
  std::map<DType, std::map<std::string, double>> local_seconds_per_element;

  // The overlap share of `ring` (all_gather_einsum or einsum_reduce_scatter).
  const double& ring_overlap(OpKind ring) const {
    return ring == OpKind::all_gather_einsum ? gather_ring_overlap : scatter_ring_overlap;
  }
  double& ring_overlap(OpKind ring) { return const_cast<double&>(std::as_const(*this).ring_overlap(ring)); }
};

struct HardwareProfile {
  std::string name;
  std::string description;             // what the profile models, with its sources
  std::map<DType, double> peak_flops;  // FLOP/s per device, by dtype
  double hbm_bandwidth = 0;            // bytes/s per device
  double link_bandwidth = 0;           // bytes/s, one direction of one link
  bool bidirectional = true;           // links carry link_bandwidth each way at once
  double hop_latency_s = 0;            // fixed cost of one hop (one ring step)
  // "torus": each mesh axis is a ring of direct links, axes use disjoint links.
  // "switch": all devices share a non-blocking switch (NVLink within a node).
  std::string topology = "torus";
  // A switch profile's node: the devices one switch joins (device ids row-major, so device d
  // sits in node d / node_devices), the nodes joined by a scale-out network (InfiniBand) in
  // which each device has its own NIC: scaleout_bandwidth bytes/s each way, scaleout_latency_s
  // per hop. 0: every device behind the one switch, the scale-out figures unused.
  std::int64_t node_devices = 0;
  double scaleout_bandwidth = 0;
  double scaleout_latency_s = 0;
  // Set in calibrated profiles: their collective fits and GEMM rates replace the formulas
  // where they apply (docs/calibration.md, "How the cost model uses a profile").
  std::optional<Calibration> calibration;

  double flops_for(DType dtype) const;  // throws InputError when the dtype has no entry
};

// The built-in profiles: tpu-v5e, tpu-v5p, tpu-v6e, h100.
std::vector<std::string> builtin_profile_names();
// Throws InputError naming the known profiles when `name` is not one of them.
HardwareProfile builtin_profile(std::string_view name);
// A name of a built-in profile or the path of a JSON profile file (schema in
// docs/cost-model.md); throws InputError with the file, key and rule on bad input.
HardwareProfile load_profile(std::string_view name_or_path);
HardwareProfile parse_profile_json(std::string_view json_text, std::string_view origin);
// The profile as a JSON document that parse_profile_json reads back unchanged.
std::string profile_to_json(const HardwareProfile& hw);

// The name `load_profile` resolves to the calibrated profile's file.
inline constexpr const char* kCalibratedProfileName = "calibrated";
// Where `shardmm calibrate` writes and `--hw calibrated` reads: $SHARDMM_PROFILE, else
// $XDG_CONFIG_HOME/shardmm/calibrated.json, else $HOME/.config/shardmm/calibrated.json
// (empty when none of these variables is set).
std::string calibrated_profile_path();

// The least-squares line `seconds = alpha + beta * bytes` through measured points,
// weighted by 1 / seconds^2 so that every size counts by its relative error (the sizes
// span decades); a negative alpha (noise at small sizes) is refitted as alpha = 0.
// Needs at least two distinct sizes and positive times (else UsageError).
struct AlphaBetaFit {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double max_rel_residual = 0;
  double rms_rel_residual = 0;
};
AlphaBetaFit fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds);

// The sweep as one line, or split into up to kMaxSegments lines between sizes: more lines
// are taken when they at least halve the sum of squared relative residuals of the best fit
// with fewer (the best split for each count; each line fitted on kMinSegmentPoints sizes or
// more). Caches make small messages cheaper per byte than large ones, in steps
// (a private cache, the shared one, memory), which one line cannot follow. A fit within
// kOneLineIsExact (rms relative residual) is kept: timers resolve no better. Sizes must be
// distinct and ascending.
inline constexpr std::size_t kMinSegmentPoints = 3;
inline constexpr std::size_t kMaxSegments = 3;
inline constexpr double kOneLineIsExact = 1e-3;
struct AlphaBetaSegment {
  double min_bytes = 0;  // the first and last size the line was fitted on
  double max_bytes = 0;
  AlphaBetaFit fit;
};
std::vector<AlphaBetaSegment> fit_alpha_beta_segments(const std::vector<double>& bytes,
                                                      const std::vector<double>& seconds);

// One of the four collectives (an exchange is timed from its traffic, as the all_to_all that
// moves as much). A calibrated profile with a fit for `op` on the group's size uses it (the
// fit for the size range of `array_bytes`); otherwise the formulas of docs/cost-model.md: on a
// switch profile with nodes, a group whose members sit in more than one node pays the
// scale-out network as well ("Collectives across nodes").
double collective_time(const HardwareProfile& hw, const Mesh& mesh, OpKind op, const AxisList& group,
                       std::int64_t array_bytes);
// The same time with its two terms: the fixed per-hop costs (hops x hop latency; a fit's
// alpha) and the bytes' time on the links (a fit's beta x bytes). The formulas take the
// larger of the two (the Scaling Book's max(latency, bandwidth) bound), a fit their sum.
struct CollectiveCost {
  double latency_s = 0;
  double bandwidth_s = 0;
  double time_s = 0;
  // On a calibrated profile: low where no fit covers the group's size, where the fit used misses
  // its own samples by more than kModelBand, or where array_bytes lies outside the sizes measured.
  Confidence confidence;
  Bound bound() const;  // latency where latency_s >= bandwidth_s; none when time_s is 0
};
CollectiveCost collective_cost(const HardwareProfile& hw, const Mesh& mesh, OpKind op, const AxisList& group,
                               std::int64_t array_bytes);
// Roofline: max(flops / peak, bytes / HBM bandwidth). A calibrated profile with GEMM
// rates for `dtype` takes the rate at this einsum's intensity (flops / bytes) instead of
// the peak: interpolated in log(intensity) between the measured shapes, clamped at the ends;
// and it adds its einsum_call_s to every einsum that computes (flops > 0). `rows`, where
// known, is the smaller of the GEMM's two free extents on the device (its M and N): a GEMM
// of no more rows than the profile's "thin" shapes measured takes their rate at its rows,
// interpolated linearly between the row counts measured (a BLAS's kernels for a few rows
// change with each row count, not with the intensity).
double einsum_time(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes, std::int64_t rows = 0);
// On a calibrated profile: low where the dtype has no measured GEMM rate, or where the einsum's
// intensity lies below the shapes measured (the rate is then the lowest shape's, clamped)
// and no thin shape covers its rows.
Confidence einsum_confidence(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes,
                             std::int64_t rows = 0);
// Which term sets an einsum's time `time_s` (einsum_time's) of `bytes` read and written:
// memory when the bytes' term is the larger, else compute; none for an einsum that takes no
// time.
Bound einsum_bound(const HardwareProfile& hw, double time_s, std::int64_t bytes);
// A local copy (slice) reads and writes `bytes`: at the HBM bandwidth, or on a calibrated
// profile at the copy bandwidth measured for that size (interpolated in log(bytes) between the
// sizes measured, the end ones beyond them).
double local_copy_time(const HardwareProfile& hw, std::int64_t bytes);
// The rate of a local op's memory traffic, bytes read plus written per second per device:
// a calibrated profile's measured y += x (add_bandwidth; its memcpy rate where that is
// missing), else hbm_bandwidth.
double local_op_bandwidth(const HardwareProfile& hw);
// A local op's memory traffic alone: `bytes` it reads plus writes / local_op_bandwidth.
double local_op_time(const HardwareProfile& hw, std::int64_t bytes);
// The name a local function's per-element rate goes by: `function` in the forward pass and
// the update, "<function> backward" in the backward pass.
std::string local_rate_key(std::string_view function, bool backward);
// A local op (OpKind::local: an activation, a norm, the optimizer's update), reading plus
// writing `bytes` in elements of `dtype`, is bound by its memory traffic or by its
// arithmetic, whichever is slower (docs/cost-model.md, "Local ops"):
//   max(bytes / local_op_bandwidth, bytes / dtype size x seconds per element)
// the rate the profile's calibration measured for `dtype` and `key` (local_rate_key); where it
// has none (built-in profiles, older calibrated files) the traffic alone. Its bound is compute
// when the per-element term is the larger, memory otherwise (none when it moves no bytes).
struct LocalOpCost {
  double memory_s = 0;
  double compute_s = 0;
  double time_s = 0;
  Bound bound = Bound::none;
};
LocalOpCost local_op_cost(const HardwareProfile& hw, DType dtype, std::string_view key, std::int64_t bytes);

// Whether some group over `group`'s axes has members in more than one node of `hw` (always
// false without nodes: a torus, or a switch profile whose node_devices is 0).
bool group_spans_nodes(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group);

// Collective matmuls (docs/cost-model.md, "Collective matmul"). One hop of a ring over `group`:
// the hop latency plus `bytes` over one link in one direction; where the ring crosses nodes
// (group_spans_nodes), the hops between nodes set the pace: the scale-out latency plus `bytes`
// over one device's NIC.
double ring_hop_time(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group, std::int64_t bytes);
// latency when the hop latency is at least the bytes' time on the link (the Scaling Book's
// rule: below about 45 kB per hop on a TPU v5e, the latency dominates), else bandwidth.
Bound ring_hop_bound(const HardwareProfile& hw, const Mesh& mesh, const AxisList& group, std::int64_t bytes);
// The chunks each step of an all_gather_einsum ring multiplies on a group of `members`:
// one per step one way round ({1, 1, ..., 1}, `members` steps), or, both ways round, the
// own shard first and then the two that arrived from either side ({1, 2, .., 2[, 1]}).
std::vector<int> ring_chunks(std::int64_t members, bool bidirectional);
// A ring whose step s multiplies chunks[s] chunks of `chunk_compute_s` each while the next
// hop (`hop_s`) is in flight, nothing being in flight during the last step; the share
// `overlap` (0..1) of each hop moves during the GEMMs, the rest after them:
//   sum over s < last of max(overlap * hop_s, chunks[s] * chunk_compute_s) + (1 - overlap) * hop_s
//   + chunks[last] * chunk_compute_s.
double overlapped_ring_time(const std::vector<int>& chunks, double chunk_compute_s, double hop_s, double overlap = 1);

}  // namespace shardmm
