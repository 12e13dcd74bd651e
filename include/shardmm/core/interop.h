// A spec in the forms the Python frameworks write shardings: a JAX PartitionSpec and a
// PyTorch DTensor's placements.
//
//   Mesh mesh = Mesh::parse("X=4,Y=2");
//   Spec s = parse_spec("A[I_XY, J]", mesh);
//   to_partition_spec(s, mesh);                      // "P(('X', 'Y'), None)"
//   to_placements(s, mesh);                          // "[Shard(0), Shard(0)]"
//   from_partition_spec("P('X', None)", {"I", "J"}, mesh);         // [I_X, J]
//   from_placements("[Replicate(), Partial()]", {"I", "J"}, mesh);  // [I, J]{U_Y}
//   parse_spec("A[I, J] = P('X', None)", mesh);      // A[I_X, J]: the letters, then the form
//
// PartitionSpec: one entry per dimension, in order (missing trailing entries are replicated):
// None, an axis name in quotes, or a tuple of them major to minor; unreduced axes as JAX
// writes them, `unreduced={'X'}`. Printed with every dimension's entry: P('X', None).
//
// Placements: one per MESH AXIS, in mesh order: Shard(d) (the axis splits dimension d),
// Replicate(), Partial() (partial sums over the axis: {U_X}). Several Shard(d) of one
// dimension nest in mesh order, as DTensor applies them, so I_XY is [Shard(0), Shard(0)]
// and I_YX has no placements form (placements_problem says why).
//
// Every parser here throws InputError quoting the text with a caret under the culprit.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

std::string to_partition_spec(const Spec& spec, const Mesh& mesh);
// "" when `spec` has a placements form, else why not (one line).
std::string placements_problem(const Spec& spec, const Mesh& mesh);
// Throws InputError with placements_problem when there is no form.
std::string to_placements(const Spec& spec, const Mesh& mesh);

// `letters` names the tensor's dimensions in order (I, J): a PartitionSpec or placements
// says nothing of them. The result has no tensor name.
Spec from_partition_spec(std::string_view text, const std::vector<std::string>& letters, const Mesh& mesh);
Spec from_placements(std::string_view text, const std::vector<std::string>& letters, const Mesh& mesh);

namespace detail {
// parse_spec's "A[I, J] = FORM": reads the form in src[from, end) (a PartitionSpec, or
// placements when it opens with '[' or '('), errors quoting all of `src` as a spec.
Spec parse_interop_form(std::string_view src, std::size_t from, const Spec& letters, const Mesh& mesh);
}  // namespace detail

}  // namespace shardmm
