// shardmm check SPEC --mesh M [--split array|chunk] [--dims ...] [--dtype ...] [--json]
#include <map>
#include <memory>
#include <ostream>

#include "cli/check.h"
#include "cli/commands.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/interop.h"

namespace shardmm::cli {
namespace {

std::string axis_list(const Mesh& mesh, const AxisList& axes) {
  std::vector<std::string> names;
  for (int a : axes) names.push_back(mesh.axis(a).name);
  return names.empty() ? "none" : join(names, ", ");
}

AxisList unused_axes(const Mesh& mesh, const Spec& spec) {
  AxisList out;
  for (int a = 0; a < mesh.rank(); ++a) {
    if (!spec.uses(a)) out.push_back(a);
  }
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::vector<std::string> parts;
  for (std::int64_t n : shape) parts.push_back(std::to_string(n));
  return "[" + join(parts, ", ") + "]";
}

std::int64_t bytes_of(const std::vector<std::int64_t>& shape, DType dtype) {
  std::int64_t n = dtype_bytes(dtype);
  for (std::int64_t e : shape) n = checked_mul(n, e, "the tensor's bytes");
  return n;
}

void print_text(std::ostream& out, const Checked& c) {
  const Mesh& mesh = c.mesh;
  out << "valid: " << format_spec(c.spec, mesh) << "\n";
  const std::string no_placements = placements_problem(c.spec, mesh);
  out << "  jax       " << to_partition_spec(c.spec, mesh) << "\n";
  out << "  dtensor   " << (no_placements.empty() ? to_placements(c.spec, mesh) : "none: " + no_placements) << "\n";
  out << "  mesh      " << describe_mesh(mesh) << "\n";
  for (const DimSpec& d : c.spec.dims) {
    out << "  " << d.name << std::string(d.name.size() < 8 ? 8 - d.name.size() : 0, ' ') << "  ";
    if (d.axes.empty()) {
      out << "replicated (whole on every device)\n";
    } else {
      out << "split over " << mesh.axis_names(d.axes) << " into " << mesh.group_size(d.axes) << " blocks"
          << (d.axes.size() > 1 ? " (nested: over " + mesh.axis(d.axes[0]).name + " first, then each piece further)"
                                : "")
          << "\n";
    }
  }
  const AxisList unused = unused_axes(mesh, c.spec);
  out << "  copies    "
      << (unused.empty() ? std::string("none: every mesh axis shards a dimension or holds partial sums")
                         : "identical over " + axis_list(mesh, unused) + " (the axes the spec does not use)")
      << "\n";
  out << "  partial   "
      << (c.spec.unreduced.empty() ? std::string("none")
                                   : "sums over " + axis_list(mesh, c.spec.unreduced) +
                                         ": each device holds a partial sum; the value is the sum over that group")
      << "\n";
  if (!c.sizes) {
    std::vector<std::string> example;
    for (const DimSpec& d : c.spec.dims) example.push_back(d.name + "=1024");
    out << "  (add --dims, e.g. --dims " << join(example, ",") << ", for the local shape and bytes on each device)\n";
    return;
  }
  const std::int64_t global = bytes_of(c.shape, c.dtype);
  out << "  global    shape " << shape_text(c.shape) << ", " << format_bytes(static_cast<double>(global)) << " in "
      << to_string(c.dtype) << (c.default_dtype ? " (the default; choose another with --dtype)" : "") << "\n";
  std::int64_t largest = 0;
  double total = 0;
  std::map<std::vector<std::int64_t>, std::int64_t> by_shape;
  for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
    const std::vector<std::int64_t> local = local_shape(mesh, c.spec, c.shape, d);
    const std::int64_t b = bytes_of(local, c.dtype);
    largest = std::max(largest, b);
    total += static_cast<double>(b);
    ++by_shape[local];
  }
  if (mesh.device_count() <= 16) {
    std::vector<std::string> header{"device"};
    for (const MeshAxis& a : mesh.axes()) header.push_back(a.name);
    for (const char* h : {"block", "local shape", "bytes"}) header.push_back(h);
    Table table(header);
    for (std::size_t col = 0; col <= mesh.axes().size(); ++col) table.right_align(col);
    table.right_align(header.size() - 1);
    for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
      std::vector<std::string> row{std::to_string(d)};
      for (int a = 0; a < mesh.rank(); ++a) row.push_back(std::to_string(mesh.coord(d, a)));
      const std::vector<Range> box = shard_box(mesh, c.spec, c.shape, d);
      std::vector<std::string> block;
      for (std::size_t i = 0; i < box.size(); ++i) {
        block.push_back(c.spec.dims[i].name + "[" + std::to_string(box[i].offset) + ":" + std::to_string(box[i].end()) +
                        ")");
      }
      const std::vector<std::int64_t> local = local_shape(mesh, c.spec, c.shape, d);
      row.push_back(join(block, " "));
      row.push_back(shape_text(local));
      row.push_back(format_bytes(static_cast<double>(bytes_of(local, c.dtype))));
      table.add(row);
    }
    table.print(out);
  } else {
    out << "  local shapes (" << mesh.device_count() << " devices; the table per device is printed up to 16):\n";
    Table table({"local shape", "devices", "bytes each"});
    table.right_align(1);
    table.right_align(2);
    for (const auto& [shape, count] : by_shape) {
      table.add(
          {shape_text(shape), std::to_string(count), format_bytes(static_cast<double>(bytes_of(shape, c.dtype)))});
    }
    table.print(out);
  }
  out << "  per device at most " << format_bytes(static_cast<double>(largest)) << "; all devices together "
      << format_bytes(total) << " = " << format_sig3(global > 0 ? total / static_cast<double>(global) : 0)
      << "x the tensor\n";
}

// Past this many devices `check --json` lists no shard per device, only the distinct local
// shapes (docs/json-schema.md): 65,536 devices' entries would be 12 MB of JSON.
constexpr std::int64_t kMaxShardsInJson = 4096;

}  // namespace

Checked check_spec(const CheckArgs& args) {
  Checked c;
  c.mesh = parse_mesh(args.mesh, args.split);
  c.spec = parse_spec(args.spec, c.mesh);
  c.dtype = args.dtype ? parse_dtype(*args.dtype) : kDefaultDType;
  c.default_dtype = !args.dtype;
  if (args.dims) {
    c.sizes = parse_dims(*args.dims);
    check_dims_used(*c.sizes, {&c.spec});
    check_tensor_bytes(c.spec, *c.sizes, c.dtype);
    c.shape = global_shape(c.spec, *c.sizes);
  }
  return c;
}

Json check_json(const Checked& c) {
  const Mesh& mesh = c.mesh;
  Json j;
  j["valid"] = true;
  j["spec"] = format_spec(c.spec, mesh);
  j["partition_spec"] = to_partition_spec(c.spec, mesh);
  const std::string no_placements = placements_problem(c.spec, mesh);
  j["placements"] = no_placements.empty() ? Json(to_placements(c.spec, mesh)) : Json(nullptr);
  j["placements_problem"] = no_placements.empty() ? Json(nullptr) : Json(no_placements);
  add_mesh_json(j, mesh);
  j["device_count"] = mesh.device_count();
  j["tensor"] = c.spec.tensor;
  j["dimensions"] = Json::array();
  for (const DimSpec& d : c.spec.dims) {
    Json axes = Json::array();
    for (int a : d.axes) axes.push_back(mesh.axis(a).name);
    j["dimensions"].push_back({{"name", d.name}, {"axes", axes}, {"blocks", mesh.group_size(d.axes)}});
  }
  const auto names = [&](const AxisList& list) {
    Json out = Json::array();
    for (int a : list) out.push_back(mesh.axis(a).name);
    return out;
  };
  j["unreduced"] = names(c.spec.unreduced);
  j["replicated_over"] = names(unused_axes(mesh, c.spec));
  j["dims"] = c.sizes ? dims_json(*c.sizes) : Json(nullptr);
  j["dtype"] = to_string(c.dtype);
  if (!c.sizes) {
    j["global_shape"] = nullptr;
    j["global_bytes"] = nullptr;
    j["max_bytes_per_device"] = nullptr;
    j["shards"] = nullptr;
    j["local_shapes"] = nullptr;
    return j;
  }
  j["global_shape"] = c.shape;
  j["global_bytes"] = bytes_of(c.shape, c.dtype);
  std::int64_t largest = 0;
  const bool listed = mesh.device_count() <= kMaxShardsInJson;
  Json shards = listed ? Json::array() : Json(nullptr);
  std::map<std::vector<std::int64_t>, std::int64_t> by_shape;
  for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
    const std::vector<std::int64_t> local = local_shape(mesh, c.spec, c.shape, d);
    largest = std::max(largest, bytes_of(local, c.dtype));
    ++by_shape[local];
    if (!listed) continue;
    Json coords = Json::object();
    for (int a = 0; a < mesh.rank(); ++a) coords[mesh.axis(a).name] = mesh.coord(d, a);
    Json block = Json::array();
    for (const Range& r : shard_box(mesh, c.spec, c.shape, d)) block.push_back({r.offset, r.end()});
    shards.push_back({{"device", d},
                      {"coords", coords},
                      {"block", block},
                      {"local_shape", local},
                      {"bytes", bytes_of(local, c.dtype)}});
  }
  j["max_bytes_per_device"] = largest;
  j["shards"] = shards;
  Json shapes = Json::array();
  for (const auto& [shape, devices] : by_shape) {
    shapes.push_back({{"local_shape", shape}, {"devices", devices}, {"bytes", bytes_of(shape, c.dtype)}});
  }
  j["local_shapes"] = shapes;
  return j;
}

Command add_check_command(CLI::App& root) {
  struct Flags {
    CheckArgs args;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("check", "validate a spec on a mesh; with --dims, each device's block and bytes");
  app->add_option("SPEC", flags->args.spec,
                  "the sharding to check, e.g. 'A[I_X, J_Y]', 'A[I_{XY}, J]' or 'C[I, K]{U_X}'; or the tensor's "
                  "letters and a JAX PartitionSpec or DTensor placements, e.g. 'A[I, J] = P(\"X\", None)' or "
                  "'A[I, J] = [Shard(0), Replicate()]'")
      ->required();
  add_mesh_flag(*app, flags->args.mesh);
  add_split_flag(*app, flags->args.split);
  add_dims_flag(*app, flags->args.dims, false);
  add_dtype_flag(*app, flags->args.dtype, "bf16");
  add_json_flag(*app, flags->json);
  app->footer(std::string(kNotationHint) +
              "\n\nExamples:\n"
              "  shardmm check 'A[I_X, J_Y]' --mesh X=4,Y=2\n"
              "  shardmm check 'A[I_XY, J]' --mesh X=2,Y=2 --dims I=10,J=4 --dtype f32 --json\n"
              "  shardmm check 'A[I, J] = P((\"X\", \"Y\"), None)' --mesh X=2,Y=2\n\n" +
              kDocsHint);
  return {app, [flags](std::ostream& out) {
            const Checked c = check_spec(flags->args);
            if (flags->json) {
              out << check_json(c).dump(2) << "\n";
            } else {
              print_text(out, c);
            }
            return 0;
          }};
}

}  // namespace shardmm::cli
