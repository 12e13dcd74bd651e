// `--show`: how a tensor's blocks lie on the mesh devices, for meshes of any rank.
//
//   draw_layout(std::cout, Mesh::parse("X=2,Y=2"), parse_spec("A[I_X, J]", mesh), {8, 4});
//
// prints a grid of device ids by the first two mesh axes (rows: the first axis, columns:
// the second), one grid per coordinate of the further axes ("Z=0", "Z=1"), each cell
// naming the device's block ("0 I[0:4) J[0:4)"). Cells too wide for a terminal switch to
// block indices with a legend; meshes of more than kMaxDrawnDevices devices get a summary
// per dimension instead of grids.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm::cli {

inline constexpr std::int64_t kMaxDrawnDevices = 16;

void draw_layout(std::ostream& out, const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape);

}  // namespace shardmm::cli
