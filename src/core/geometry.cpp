#include "shardmm/core/geometry.h"

#include <algorithm>

#include "shardmm/core/error.h"

namespace shardmm {

namespace {

// torch.chunk's piece length: ceil(n / parts), written so that it cannot overflow.
std::int64_t chunk_length(std::int64_t n, std::int64_t parts) { return n / parts + (n % parts != 0 ? 1 : 0); }

}  // namespace

Range split_range(std::int64_t n, std::int64_t parts, std::int64_t index, SplitRule rule) {
  if (rule == SplitRule::chunk) {
    const std::int64_t c = chunk_length(n, parts);
    // index * c < n + parts (c < n / parts + 1): no overflow for any size that fits.
    const std::int64_t begin = std::min(index * c, n);
    return {begin, std::min(begin + c, n) - begin};
  }
  const std::int64_t base = n / parts, extra = n % parts;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

Range split_range(Range whole, std::int64_t parts, std::int64_t index, SplitRule rule) {
  Range r = split_range(whole.extent, parts, index, rule);
  r.offset += whole.offset;
  return r;
}

std::int64_t split_index(std::int64_t n, std::int64_t parts, std::int64_t position, SplitRule rule) {
  if (rule == SplitRule::chunk) return position / chunk_length(n, parts);
  // array: the first `extra` pieces are base + 1 long, the rest base.
  const std::int64_t base = n / parts, extra = n % parts;
  const std::int64_t long_part = extra * (base + 1);
  return position < long_part ? position / (base + 1) : extra + (position - long_part) / base;
}

Range shard_range(const Mesh& mesh, std::int64_t n, const AxisList& axes, std::int64_t device) {
  Range r{0, n};
  for (int a : axes) r = split_range(r, mesh.size(a), mesh.coord(device, a), mesh.split_rule());
  return r;
}

std::vector<Range> shard_box(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                             std::int64_t device) {
  std::vector<Range> box;
  box.reserve(spec.dims.size());
  for (std::size_t d = 0; d < spec.dims.size(); ++d)
    box.push_back(shard_range(mesh, shape[d], spec.dims[d].axes, device));
  return box;
}

std::vector<std::int64_t> local_shape(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                                      std::int64_t device) {
  std::vector<std::int64_t> out;
  for (const Range& r : shard_box(mesh, spec, shape, device)) out.push_back(r.extent);
  return out;
}

std::int64_t local_elements(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                            std::int64_t device) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < spec.dims.size(); ++d) n *= shard_range(mesh, shape[d], spec.dims[d].axes, device).extent;
  return n;
}

std::int64_t max_local_elements(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape) {
  // The largest shard of each dimension is its first one (both rules put the longer pieces
  // first, and a longer piece's first piece is no shorter, at every level of a nested
  // split), and the dimensions vary independently, so the product of the first shards'
  // extents is the maximum.
  std::int64_t n = 1;
  for (std::size_t d = 0; d < spec.dims.size(); ++d) n *= shard_range(mesh, shape[d], spec.dims[d].axes, 0).extent;
  return n;
}

std::int64_t overlap_extent(const Range& a, const Range& b) {
  return std::max<std::int64_t>(0, std::min(a.end(), b.end()) - std::max(a.offset, b.offset));
}

std::int64_t overlap_elements(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::int64_t extent = overlap_extent(a[d], b[d]);
    if (extent == 0) return 0;
    n *= extent;
  }
  return n;
}

std::vector<Range> intersect_boxes(const std::vector<Range>& a, const std::vector<Range>& within) {
  if (a.size() != within.size()) throw UsageError("intersect_boxes: the boxes differ in rank");
  std::vector<Range> box;
  box.reserve(a.size());
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::int64_t lo = std::max(a[d].offset, within[d].offset), hi = std::min(a[d].end(), within[d].end());
    if (hi <= lo) return std::vector<Range>(a.size(), Range{});
    box.push_back({lo - within[d].offset, hi - lo});
  }
  return box;
}

}  // namespace shardmm
