// A named device mesh: axes with sizes, in declared order.
//
//   Mesh mesh = Mesh::parse("X=4,Y=2");   // 8 devices
//   mesh.device_count();                 // 8
//   mesh.coord(5, 0);                    // device 5 = (x=2, y=1): 2
//
// Device ids are row-major over the axes in declared order (first axis major), as
// jax.make_mesh does: device = x * size(Y) + y.
//
// A mesh also says how it splits a dimension that its axes do not divide evenly (geometry.h):
//   Mesh::parse("X=4", SplitRule::chunk);   // 10 over 4: 3, 3, 3, 1 (torch.chunk)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/axis_list.h"

namespace shardmm {

// How n elements split p ways when p does not divide n (core/geometry.h). Both give the
// larger pieces first.
enum class SplitRule {
  array,  // numpy.array_split: the first n mod p pieces one longer (10 over 4: 3, 3, 2, 2)
  chunk,  // torch.chunk, PyTorch DTensor's Shard: pieces of ceil(n/p), the last ones short
          // or empty (10 over 4: 3, 3, 3, 1; 5 over 4: 2, 2, 1, 0)
};

std::string_view to_string(SplitRule rule);
// "array" or "chunk"; anything else throws InputError naming the choices.
SplitRule parse_split_rule(std::string_view text);

struct MeshAxis {
  std::string name;  // a letter followed by letters or digits: X, dp, tp2
  std::int64_t size = 1;
  bool operator==(const MeshAxis&) const = default;
};

class Mesh {
 public:
  Mesh() = default;
  // Validates names and sizes; throws InputError.
  explicit Mesh(std::vector<MeshAxis> axes, SplitRule split = SplitRule::array);
  // "X=4,Y=2" (spaces allowed around tokens). The text holds no rule: "X=4" round trips.
  static Mesh parse(std::string_view text, SplitRule split = SplitRule::array);

  int rank() const { return static_cast<int>(axes_.size()); }
  const std::vector<MeshAxis>& axes() const { return axes_; }
  const MeshAxis& axis(int index) const { return axes_.at(static_cast<std::size_t>(index)); }
  std::int64_t size(int axis) const { return axes_[static_cast<std::size_t>(axis)].size; }
  std::int64_t device_count() const { return device_count_; }
  // How every shard geometry on this mesh splits uneven dimensions.
  SplitRule split_rule() const { return split_; }

  std::optional<int> find(std::string_view name) const;
  // True when every axis name is one character, so that axis lists can be written
  // by concatenation (I_XY) without ambiguity.
  bool single_char_names() const;

  // Coordinate of `device` along `axis`.
  std::int64_t coord(std::int64_t device, int axis) const {
    return (device / strides_[static_cast<std::size_t>(axis)]) % axes_[static_cast<std::size_t>(axis)].size;
  }
  std::int64_t stride(int axis) const { return strides_[static_cast<std::size_t>(axis)]; }
  std::vector<std::int64_t> coords(std::int64_t device) const;
  std::int64_t device(const std::vector<std::int64_t>& coords) const;

  // Every axis, major to minor: the group of the whole mesh.
  AxisList all_axes() const;
  // Product of the sizes of `axes` (1 for none).
  std::int64_t group_size(const AxisList& axes) const;
  // Index of `device` within the group spanned by `axes` (mixed radix, first axis major).
  std::int64_t group_rank(std::int64_t device, const AxisList& axes) const;
  // The devices sharing `device`'s coordinates on every axis not in `axes`, ordered by
  // group_rank.
  std::vector<std::int64_t> group_members(std::int64_t device, const AxisList& axes) const;

  // Axis names of `axes`, written the canonical way: "X", "XY" (single-character
  // names) or "dp,tp".
  std::string axis_names(const AxisList& axes) const;
  // "X=4,Y=2" (without the split rule)
  std::string to_string() const;

  // Meshes that split differently place uneven shards differently: they are not equal.
  bool operator==(const Mesh& other) const { return axes_ == other.axes_ && split_ == other.split_; }

 private:
  std::vector<MeshAxis> axes_;
  std::vector<std::int64_t> strides_;
  std::int64_t device_count_ = 1;
  SplitRule split_ = SplitRule::array;
};

}  // namespace shardmm
