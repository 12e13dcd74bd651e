// shardmm bench collectives --mesh X=4 [--axes X] [--backend threads|mpi] [--sizes 1KiB:64MiB] [--dtype f32] [--check] [--json]
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/collective_bench.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {

namespace {

// "1KiB:64MiB" (every power of two from one to the other), "1MiB,4MiB" or "16MiB".
std::vector<std::int64_t> parse_sizes(const std::string& text) {
  const auto size = [&text](const std::string& piece) {
    if (piece.find_first_not_of(' ') == std::string::npos) {
      throw InputError("bad --sizes '" + text + "': a size is missing (a stray ',' or ':'?); write a range LO:HI, " +
                       "e.g. 1KiB:64MiB, or a list, e.g. 1MiB,4MiB");
    }
    return parse_byte_size(piece, "--sizes");
  };
  std::vector<std::int64_t> sizes;
  const std::size_t colon = text.find(':');
  if (colon != std::string::npos) {
    const std::int64_t lo = size(text.substr(0, colon));
    const std::int64_t hi = size(text.substr(colon + 1));
    if (hi < lo) throw InputError("bad --sizes '" + text + "': a range LO:HI needs LO <= HI, e.g. 1KiB:64MiB");
    // Doubling stops before it could pass HI, so it never overflows.
    for (std::int64_t s = lo;; s *= 2) {
      sizes.push_back(s);
      if (s > hi / 2) break;
    }
    return sizes;
  }
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    sizes.push_back(size(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return sizes;
}

// "X", "XY" (one-character axis names), "dp,tp" or "{dp,tp}": mesh axes, major to minor.
AxisList parse_axes(const std::string& text, const Mesh& mesh) {
  std::string inner = text;
  if (inner.size() >= 2 && inner.front() == '{' && inner.back() == '}') inner = inner.substr(1, inner.size() - 2);
  std::vector<std::string> names;
  if (inner.find(',') != std::string::npos || !mesh.single_char_names()) {
    for (std::size_t at = 0; at <= inner.size();) {
      const std::size_t comma = std::min(inner.find(',', at), inner.size());
      names.push_back(inner.substr(at, comma - at));
      at = comma + 1;
    }
  } else {
    for (char c : inner) names.emplace_back(1, c);
  }
  std::vector<std::string> known;
  for (const MeshAxis& a : mesh.axes()) known.push_back(a.name);
  AxisList axes;
  for (const std::string& name : names) {
    const std::optional<int> axis = mesh.find(name);
    if (!axis) {
      const std::string several = mesh.single_char_names() || known.size() < 2
                                      ? ""
                                      : "; write several with commas, e.g. --axes " + known[0] + "," + known[1];
      throw InputError("bad --axes '" + text + "': unknown mesh axis '" + name + "'; the mesh " + mesh.to_string() +
                       " has axes " + join(known, ", ") + several);
    }
    if (std::find(axes.begin(), axes.end(), *axis) != axes.end()) {
      throw InputError("bad --axes '" + text + "': mesh axis '" + name + "' is named twice; name each axis once");
    }
    axes.push_back(*axis);
  }
  return axes;
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  struct Flags {
    std::string mesh, axes, backend = "threads", sizes = "1KiB:64MiB";
    std::optional<std::string> dtype;  // unset: f32
    int trials = 5;
    bool json = false;
    bool check = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* bench = root.add_subcommand("bench", "measure this machine: collectives (nccl-tests style)");
  bench->require_subcommand(1);
  CLI::App* app = bench->add_subcommand(
      "collectives", "time all_gather, reduce_scatter, all_reduce and all_to_all over a mesh axis group, with "
                     "memcpy and y += x references measured in the same run");
  add_mesh_flag(*app, flags->mesh);
  app->add_option("--axes", flags->axes,
                  "the mesh axes to run over, major to minor (default: all), e.g. --axes X or --axes XY");
  app->add_option("--backend", flags->backend, "threads (default) or mpi (under mpirun), e.g. --backend mpi");
  app->add_option("--sizes", flags->sizes,
                  "array sizes per rank: LO:HI doubles from LO to HI, or a list, e.g. --sizes 1MiB:64MiB, --sizes "
                  "16MiB,64MiB (default 1KiB:64MiB)");
  add_dtype_flag(*app, flags->dtype);
  app->add_option("--trials", flags->trials, "timed trials per size; the median is reported, e.g. --trials 9");
  app->add_flag("--check", flags->check,
                "time the collectives with the mpi backend's agreement check on, as `run` has it (off by default "
                "here, to time the collectives alone; the threads backend always checks), e.g. --check");
  add_json_flag(*app, flags->json);
  app->footer(
      "Columns follow nccl-tests: size is the whole array per rank (all_gather: the output, reduce_scatter: the\n"
      "input, all_to_all: the send buffer); algbw = size / time; busbw = algbw x (n-1)/n (all_reduce: 2(n-1)/n).\n"
      "References, all ranks at once: 'memcpy' copies the bytes an all_gather delivers per rank, 'y += x' sums\n"
      "the bytes a reduce_scatter reduces per rank; their busbw column is those bytes / time.\n\n"
      "Examples:\n"
      "  shardmm bench collectives --mesh X=2 --sizes 1MiB:64MiB\n"
      "  mpirun -n 4 shardmm bench collectives --mesh X=4 --backend mpi --sizes 16MiB --json\n\n" +
      std::string(kDocsHint));
  // `bench` is the command; `collectives` is its one subcommand for now.
  return {bench, [flags](std::ostream& out) {
            CollectiveBenchOptions o;
            o.backend = flags->backend;
            o.mesh = parse_mesh(flags->mesh);
            if (flags->axes.empty()) {
              for (int a = 0; a < o.mesh.rank(); ++a) o.group.push_back(a);
            } else {
              o.group = parse_axes(flags->axes, o.mesh);
            }
            o.sizes = parse_sizes(flags->sizes);
            o.dtype = flags->dtype ? parse_dtype(*flags->dtype) : DType::f32;
            o.trials = flags->trials;
            o.check = flags->check;
            if (o.trials < 1) throw InputError("--trials " + std::to_string(o.trials) + ": at least one trial is needed");
            check_backend(o.backend, o.mesh);
            o.progress = [](const std::string& what) { std::cerr << "shardmm: bench " << what << "\n"; };
            const CollectiveBenchReport r = bench_collectives(o);
            if (!r.is_root) return 0;
            if (flags->json) {
              Json doc;
              doc["mesh"] = mesh_json(o.mesh);
              doc["axes"] = Json::array();
              for (int a : o.group) doc["axes"].push_back(o.mesh.axis(a).name);
              doc["group_size"] = r.group_size;
              doc["backend"] = o.backend;
              doc["dtype"] = to_string(o.dtype);
              doc["rows"] = Json::array();
              for (const CollectiveBenchRow& row : r.rows) {
                doc["rows"].push_back({{"op", row.op},
                                       {"size_bytes", row.bytes},
                                       {"count", row.count},
                                       {"time_s", row.time_s},
                                       {"algbw_bytes_per_s", row.algbw},
                                       {"busbw_bytes_per_s", row.busbw}});
              }
              out << doc.dump(2) << "\n";
              return 0;
            }
            out << "collectives over " << (o.group.empty() ? "no axes" : o.mesh.axis_names(o.group)) << " ("
                << r.group_size << " ranks) of mesh " << o.mesh.to_string() << ", " << o.backend << " backend, "
                << to_string(o.dtype) << ", median of " << o.trials << " trials\n";
            Table t({"size", "count", "op", "time", "algbw", "busbw", "busbw / reference"});
            double memcpy_bw = 0, add_bw = 0;
            // Rows come per size: the collectives, then memcpy and y += x; ratios need the references first.
            std::vector<std::vector<std::string>> pending;
            std::vector<std::string> pending_ops;
            std::vector<double> pending_bus;
            const auto flush = [&] {
              for (std::size_t i = 0; i < pending.size(); ++i) {
                const std::string& op = pending_ops[i];
                const double ref = op == "all_gather" || op == "all_to_all" || op == "memcpy" ? memcpy_bw : add_bw;
                pending[i].push_back(op == "memcpy" || op == "y += x" ? "(reference)"
                                                                       : format_sig3(pending_bus[i] / ref));
                t.add(pending[i]);
              }
              pending.clear();
              pending_ops.clear();
              pending_bus.clear();
            };
            std::int64_t current = -1;
            for (const CollectiveBenchRow& row : r.rows) {
              if (row.bytes != current && current >= 0) flush();
              current = row.bytes;
              if (row.op == "memcpy") memcpy_bw = row.busbw;
              if (row.op == "y += x") add_bw = row.busbw;
              pending.push_back({format_bytes(static_cast<double>(row.bytes)), std::to_string(row.count), row.op,
                                 format_time(row.time_s), format_bandwidth(row.algbw), format_bandwidth(row.busbw)});
              pending_ops.push_back(row.op);
              pending_bus.push_back(row.busbw);
            }
            flush();
            for (std::size_t c : {0, 1, 3, 4, 5, 6}) t.right_align(c);
            t.print(out);
            out << "  (all_gather and all_to_all are compared with memcpy, reduce_scatter and all_reduce with y += x)\n";
            return 0;
          }};
}

}  // namespace shardmm::cli
