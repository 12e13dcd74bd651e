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
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/plan/step.h"

namespace shardmm {

struct HardwareProfile {
  std::string name;
  std::string description;              // what the profile models, with its sources
  std::map<DType, double> peak_flops;   // FLOP/s per device, by dtype
  double hbm_bandwidth = 0;             // bytes/s per device
  double link_bandwidth = 0;            // bytes/s, one direction of one link
  bool bidirectional = true;            // links carry link_bandwidth each way at once
  double hop_latency_s = 0;             // fixed cost of one hop (one ring step)
  // "torus": each mesh axis is a ring of direct links, axes use disjoint links.
  // "switch": all devices share a non-blocking switch (NVLink within a node).
  std::string topology = "torus";

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

double collective_time(const HardwareProfile& hw, const Mesh& mesh, OpKind op,
                       const AxisList& group, std::int64_t array_bytes);
// Roofline: max(flops / peak, bytes / HBM bandwidth).
double einsum_time(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes);
// A local copy (slice) reads and writes `bytes`.
double local_copy_time(const HardwareProfile& hw, std::int64_t bytes);

// Collective matmuls (docs/cost-model.md, "Collective matmul"). One hop of a ring: the hop
// latency plus `bytes` over one link in one direction.
double ring_hop_time(const HardwareProfile& hw, std::int64_t bytes);
// The chunks each step of an all_gather_einsum ring multiplies on a group of `members`:
// one per step one way round ({1, 1, ..., 1}, `members` steps), or, both ways round, the
// own shard first and then the two that arrived from either side ({1, 2, .., 2[, 1]}).
std::vector<int> ring_chunks(std::int64_t members, bool bidirectional);
// A ring whose step s multiplies chunks[s] chunks of `chunk_compute_s` each while the next
// hop (`hop_s`) is in flight, nothing being in flight during the last step:
//   sum over s < last of max(hop_s, chunks[s] * chunk_compute_s) + chunks[last] * chunk_compute_s.
double overlapped_ring_time(const std::vector<int>& chunks, double chunk_compute_s, double hop_s);

}  // namespace shardmm
