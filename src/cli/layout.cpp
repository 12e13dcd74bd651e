#include "cli/layout.h"

#include <algorithm>
#include <ostream>
#include <sstream>
#include <string>

#include "cli/common.h"
#include "shardmm/core/geometry.h"

namespace shardmm::cli {
namespace {

// Cells wider than this, summed over a row, switch the grid to block indices.
constexpr std::size_t kMaxGridWidth = 100;
// Block lists longer than this show their first and last entries only.
constexpr std::int64_t kMaxListedBlocks = 8;

std::string range_text(const Range& r) { return "[" + std::to_string(r.offset) + ":" + std::to_string(r.end()) + ")"; }

// Block `k` of a dimension of `n` elements split over `axes` (nested, first axis major;
// core/geometry.h), i.e. the block of the devices whose group rank over `axes` is k.
Range block_range(const Mesh& mesh, std::int64_t n, const AxisList& axes, std::int64_t k) {
  std::vector<std::int64_t> index(axes.size());
  for (std::size_t i = axes.size(); i-- > 0;) {
    index[i] = k % mesh.size(axes[i]);
    k /= mesh.size(axes[i]);
  }
  Range r{0, n};
  for (std::size_t i = 0; i < axes.size(); ++i) r = split_range(r, mesh.size(axes[i]), index[i], mesh.split_rule());
  return r;
}

std::string full_block(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                       std::int64_t device) {
  const std::vector<Range> box = shard_box(mesh, spec, shape, device);
  std::vector<std::string> parts;
  for (std::size_t d = 0; d < box.size(); ++d) parts.push_back(spec.dims[d].name + range_text(box[d]));
  return join(parts, " ");
}

// Only the sharded dimensions, by block index: "I2 K0".
std::string compact_block(const Mesh& mesh, const Spec& spec, std::int64_t device) {
  std::vector<std::string> parts;
  for (const DimSpec& d : spec.dims) {
    if (!d.axes.empty()) parts.push_back(d.name + std::to_string(mesh.group_rank(device, d.axes)));
  }
  return parts.empty() ? "whole" : join(parts, " ");
}

// "[0:2048) [2048:4096) ... [6144:8192)"
std::string block_list(const Mesh& mesh, std::int64_t n, const AxisList& axes, bool with_index,
                       const std::string& name) {
  const std::int64_t count = mesh.group_size(axes);
  std::vector<std::string> parts;
  const auto item = [&](std::int64_t k) {
    return (with_index ? name + std::to_string(k) + "=" : std::string()) + range_text(block_range(mesh, n, axes, k));
  };
  if (count <= kMaxListedBlocks) {
    for (std::int64_t k = 0; k < count; ++k) parts.push_back(item(k));
  } else {
    for (std::int64_t k = 0; k < 3; ++k) parts.push_back(item(k));
    parts.push_back("...");
    parts.push_back(item(count - 1));
  }
  return join(parts, " ");
}

// "2048 each" or "uneven: 2 to 3" (either split rule puts the larger blocks first).
std::string extents(const Mesh& mesh, std::int64_t n, const AxisList& axes) {
  const std::int64_t count = mesh.group_size(axes);
  const std::int64_t first = block_range(mesh, n, axes, 0).extent;
  std::int64_t smallest = first;
  for (std::int64_t k = 1; k < count; ++k) smallest = std::min(smallest, block_range(mesh, n, axes, k).extent);
  if (smallest == first) return std::to_string(first) + " each";
  return "uneven: " + std::to_string(smallest) + " to " + std::to_string(first);
}

void describe_dims(std::ostream& out, const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                   bool with_index) {
  for (std::size_t d = 0; d < spec.dims.size(); ++d) {
    const DimSpec& dim = spec.dims[d];
    out << "    " << dim.name << ": ";
    if (dim.axes.empty()) {
      out << "replicated, " << range_text({0, shape[d]}) << " on every device\n";
      continue;
    }
    const std::string text = std::to_string(mesh.group_size(dim.axes)) + " blocks over " + mesh.axis_names(dim.axes) +
                             (dim.axes.size() > 1 ? " (nested, first axis major)" : "") + ", " +
                             extents(mesh, shape[d], dim.axes) + ": " +
                             block_list(mesh, shape[d], dim.axes, with_index, dim.name);
    out << wrap(text, 90, "      ") << "\n";
  }
}

std::string coord_label(const Mesh& mesh, int axis, std::int64_t c) {
  return mesh.axis(axis).name + "=" + std::to_string(c);
}

void draw_grids(std::ostream& out, const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape,
                bool compact) {
  const int rows_axis = 0;
  const bool has_cols = mesh.rank() > 1;
  const std::int64_t rows = mesh.size(rows_axis), cols = has_cols ? mesh.size(1) : 1;
  const std::int64_t grids = mesh.device_count() / (rows * cols);
  for (std::int64_t g = 0; g < grids; ++g) {
    // The further axes' coordinates of grid g (first axis major), as device-id offsets.
    std::int64_t offset = 0, rest = g;
    std::vector<std::string> labels;
    for (int a = mesh.rank() - 1; a >= 2; --a) {
      const std::int64_t c = rest % mesh.size(a);
      rest /= mesh.size(a);
      offset += c * mesh.stride(a);
      labels.insert(labels.begin(), coord_label(mesh, a, c));
    }
    if (!labels.empty()) out << "   " << join(labels, ", ") << ":\n";
    std::vector<std::string> header{""};
    for (std::int64_t c = 0; c < cols; ++c) header.push_back(has_cols ? coord_label(mesh, 1, c) : "");
    Table table(header, "    ");
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<std::string> row{coord_label(mesh, rows_axis, r)};
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t device = offset + r * mesh.stride(rows_axis) + (has_cols ? c * mesh.stride(1) : 0);
        row.push_back(std::to_string(device) + " " +
                      (compact ? compact_block(mesh, spec, device) : full_block(mesh, spec, shape, device)));
      }
      table.add(row);
    }
    std::ostringstream text;
    table.print(text);
    std::string s = text.str();
    // A 1-D mesh has no column header: drop its empty first line.
    if (!has_cols) s.erase(0, s.find('\n') + 1);
    out << s;
  }
}

std::size_t widest_row(const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape) {
  const std::int64_t cols = mesh.rank() > 1 ? mesh.size(1) : 1;
  std::size_t widest = 0, row = 0;
  for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
    row += full_block(mesh, spec, shape, d).size() + 6;
    if ((d + 1) % cols == 0) {
      widest = std::max(widest, row);
      row = 0;
    }
  }
  return widest;
}

}  // namespace

void draw_layout(std::ostream& out, const Mesh& mesh, const Spec& spec, const std::vector<std::int64_t>& shape) {
  std::vector<std::string> extents_text;
  for (std::int64_t n : shape) extents_text.push_back(std::to_string(n));
  out << "  " << format_spec(spec, mesh) << "  global shape [" << join(extents_text, ", ") << "]";
  const bool drawn = mesh.device_count() <= kMaxDrawnDevices;
  if (drawn) {
    out << "; device ids by " << mesh.axis(0).name << " (rows)";
    if (mesh.rank() > 1) out << " and " << mesh.axis(1).name << " (columns)";
    if (mesh.rank() > 2) {
      std::vector<std::string> further;
      for (int a = 2; a < mesh.rank(); ++a) further.push_back(mesh.axis(a).name);
      out << ", one grid per coordinate of " << join(further, ", ");
    }
  }
  out << "\n";
  if (!spec.unreduced.empty()) {
    out << "    {U_" << mesh.axis_names(spec.unreduced) << "}: every device holds a partial sum; the value is the sum "
        << "over the " << mesh.axis_names(spec.unreduced) << " group of the blocks shown\n";
  }
  if (!drawn) {
    out << "    " << mesh.device_count() << " devices: too many to draw (grids go up to " << kMaxDrawnDevices
        << "); per dimension:\n";
    describe_dims(out, mesh, spec, shape, false);
    const std::int64_t last = mesh.device_count() - 1;
    out << "    e.g. device 0: " << full_block(mesh, spec, shape, 0)
        << "; device 1: " << full_block(mesh, spec, shape, 1) << "; device " << last << ": "
        << full_block(mesh, spec, shape, last) << "\n";
    return;
  }
  const bool compact = widest_row(mesh, spec, shape) > kMaxGridWidth;
  if (compact) {
    out << "    cells name blocks by index (I2: block 2 of I, counting from 0):\n";
    describe_dims(out, mesh, spec, shape, true);
  }
  draw_grids(out, mesh, spec, shape, compact);
}

}  // namespace shardmm::cli
