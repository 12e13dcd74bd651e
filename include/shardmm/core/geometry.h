// Shard geometry: which block of the global tensor each device holds.
//
//   Mesh mesh = Mesh::parse("X=4");
//   split_range(10, 4, 1, SplitRule::array);     // {offset 3, extent 3}: 3,3,2,2
//   split_range(10, 4, 3, SplitRule::chunk);     // {offset 9, extent 1}: 3,3,3,1
//   Spec a = parse_spec("A[I_X, J]", mesh);
//   shard_box(mesh, a, {10, 5}, 3);              // {{8, 2}, {0, 5}}: the mesh's rule, array
//
// Uneven sizes follow the mesh's SplitRule (mesh.h). array (the default) is
// numpy.array_split: n split p ways gives the first n mod p shards one extra element.
// chunk is torch.chunk, as PyTorch DTensor's Shard places a tensor: shard i holds
// [min(i*c, n), min((i+1)*c, n)) with c = ceil(n/p). Under either rule shards may be empty
// and no shard is larger than the first.
//
// A dimension sharded over several axes (I_{XY}) is split hierarchically: split over X,
// then each piece over Y (as PyTorch DTensor nests placements on one tensor dimension),
// under either rule. For sizes divisible by |X|*|Y| this equals a flat split into |X|*|Y|
// pieces; for uneven sizes it is what makes the cheap collectives exact: gathering the
// minor-most axis of a dimension, slicing a new minor-most axis, and moving the
// minor-most axis to another dimension each touch one group's data only.
#pragma once

#include <cstdint>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

struct Range {
  std::int64_t offset = 0;
  std::int64_t extent = 0;
  std::int64_t end() const { return offset + extent; }
  bool operator==(const Range&) const = default;
};

// Piece `index` of [0, n) split `parts` ways under `rule`.
Range split_range(std::int64_t n, std::int64_t parts, std::int64_t index, SplitRule rule);
// Piece `index` of `whole` split `parts` ways under `rule`.
Range split_range(Range whole, std::int64_t parts, std::int64_t index, SplitRule rule);
// The index of the piece of [0, n) split `parts` ways under `rule` that holds element
// `position` (0 <= position < n): the inverse of split_range.
std::int64_t split_index(std::int64_t n, std::int64_t parts, std::int64_t position, SplitRule rule);

// The functions below split by mesh.split_rule().

// The range of a dimension of global size `n` sharded over `axes` that `device` holds.
Range shard_range(const Mesh& mesh, std::int64_t n, const AxisList& axes, std::int64_t device);

// One range per dimension.
std::vector<Range> shard_box(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                             std::int64_t device);
std::vector<std::int64_t> local_shape(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                                      std::int64_t device);
std::int64_t local_elements(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                            std::int64_t device);
// The largest local element count over all devices.
std::int64_t max_local_elements(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape);

// Elements of the intersection of two ranges (0 if disjoint).
std::int64_t overlap_extent(const Range& a, const Range& b);
// Elements of the intersection of two boxes (0 if disjoint).
std::int64_t overlap_elements(const std::vector<Range>& a, const std::vector<Range>& b);
// The intersection of two boxes of the same rank, with offsets relative to `within`'s
// (where it lies in `within`); every extent 0 if they are disjoint.
std::vector<Range> intersect_boxes(const std::vector<Range>& a, const std::vector<Range>& within);

}  // namespace shardmm
