// Shardings in the Scaling Book's notation.
//
//   Mesh mesh = Mesh::parse("X=2,Y=2");
//   Spec a = parse_spec("A[I_X, J_Y]", mesh);     // I over X, J over Y
//   Spec c = parse_spec("C[I, K]{U_X}", mesh);    // unreduced (partial sums) over X
//   parse_spec("A[I_{XY}, J]", mesh);             // I over X then Y (X major)
//   parse_spec("A[IX, JY]", mesh);                // the compact form, underscores omitted
//   format_spec(a, mesh);                         // "A[I_X, J_Y]"
//
// Canonical printing (parse(format(s)) == s):
//   * dimensions separated by ", "; a replicated dimension is its bare name;
//   * one axis: I_X, I_dp; several axes: I_XY when every mesh axis name is one
//     character, otherwise I_{dp,tp};
//   * unreduced axes last, in mesh order: {U_X}, {U_XY}, {U_{dp,tp}}; omitted when none.
//
// Rules (checked by parse_spec and validate_spec): a mesh axis appears at most once in a
// spec ("a mesh axis can shard only one dimension"), an axis is not both sharding and
// unreduced, axes exist in the mesh, dimension names are distinct.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/mesh.h"

namespace shardmm {

// A dimension name: one letter, optionally followed by digits (I, J, D2).
struct DimSpec {
  std::string name;
  AxisList axes;  // mesh axes sharding this dimension, major to minor; empty = replicated
  bool operator==(const DimSpec&) const = default;
};

// Whether two letters (or names) are the same, comparing characters inline: the planners and
// the symbolic tape compare letters millions of times, and a letter is a character or a few,
// not worth a call to memcmp.
inline bool same_letter(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t c = 0; c < a.size(); ++c) {
    if (a[c] != b[c]) return false;
  }
  return true;
}

struct Spec {
  std::string tensor;  // may be empty ("[I_X, J]")
  std::vector<DimSpec> dims;
  AxisList unreduced;  // kept sorted in mesh order

  int rank() const { return static_cast<int>(dims.size()); }
  // Index of the dimension named `name`, or -1 (inline: looked up millions of times).
  int find_dim(std::string_view name) const {
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (same_letter(dims[i].name, name)) return static_cast<int>(i);
    }
    return -1;
  }
  // Index of the dimension that `axis` shards, or -1.
  int dim_of_axis(int axis) const;
  bool is_unreduced(int axis) const;
  // True when `axis` shards a dimension or is unreduced.
  bool uses(int axis) const { return dim_of_axis(axis) >= 0 || is_unreduced(axis); }

  bool operator==(const Spec& other) const {
    return dims == other.dims && unreduced == other.unreduced;  // the tensor name is a label
  }
};

Spec parse_spec(std::string_view text, const Mesh& mesh);
std::string format_spec(const Spec& spec, const Mesh& mesh);
// `spec` appended to a memo key: its letters and axis numbers, then its pending sums; not its
// name, nor the mesh's axis names (format_spec looks them up, the planners' memos look specs up
// by the thousand). A key for specs on one mesh.
void append_spec_key(std::string& key, const Spec& spec);
void append_axes_key(std::string& key, const AxisList& axes);
// For specs built in code; throws InputError naming the rule.
void validate_spec(const Spec& spec, const Mesh& mesh);

// Dimension sizes by name: "I=8192,J=4096".
using DimSizes = std::map<std::string, std::int64_t>;
DimSizes parse_dims(std::string_view text);
// The global shape of `spec` under `sizes`; throws InputError when a size is missing
// or the element count overflows 64 bits.
std::vector<std::int64_t> global_shape(const Spec& spec, const DimSizes& sizes);

// Checks every caller makes of sizes the user gave, before planning (InputError naming the
// field "dims"):
// a size that no tensor in `specs` names (a likely typo),
void check_dims_used(const DimSizes& sizes, const std::vector<const Spec*>& specs);
// and a tensor whose bytes do not fit in a signed 64-bit count (and, through global_shape,
// a dimension without a size).
void check_tensor_bytes(const Spec& spec, const DimSizes& sizes, DType dtype);

}  // namespace shardmm
