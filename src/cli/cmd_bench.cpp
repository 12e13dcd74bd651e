// shardmm bench collectives --mesh X=4 [--axes X] [--backend threads|mpi] [--sizes 1KiB:64MiB] [--dtype f32] [--check] [--json]
// shardmm bench matmul EXPR --mesh X=2 [--sizes 512,1024] [--dims I=64] [--backend] [--dtype] [--hw] [--all] [--json]
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/execution.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/collective_bench.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/matmul_bench.h"
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

// `bench collectives`: its flags on `app`, and what it does.
std::function<int(std::ostream&)> add_collectives(CLI::App& bench) {
  struct Flags {
    std::string mesh, axes, backend = "threads", sizes = "1KiB:64MiB";
    std::optional<std::string> dtype;  // unset: f32
    int trials = 5;
    bool json = false;
    bool check = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app =
      bench.add_subcommand("collectives",
                           "time all_gather, reduce_scatter, all_reduce and all_to_all over a mesh axis group, with "
                           "memcpy and y += x references measured in the same run");
  add_mesh_flag(*app, flags->mesh);
  app->add_option("--axes", flags->axes,
                  "the mesh axes to run over, major to minor (default: all), e.g. --axes X or --axes XY");
  app->add_option("--backend", flags->backend, "threads (default) or mpi (under mpirun), e.g. --backend mpi");
  app->add_option("--sizes", flags->sizes,
                  "array sizes per rank: LO:HI doubles from LO to HI, or a list, e.g. --sizes 1MiB:64MiB, --sizes "
                  "16MiB,64MiB (default 1KiB:64MiB)");
  add_dtype_flag(*app, flags->dtype, "f32");
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
  return [flags](std::ostream& out) {
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
    o.progress = [](const CollectiveBenchProgress& p) {
      std::cerr << "shardmm: bench " + std::to_string(p.index) + " of " + std::to_string(p.total) + ": " + p.op + " " +
                       format_bytes(static_cast<double>(p.bytes)) + "\n";
    };
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
                               {"busbw_bytes_per_s", row.busbw},
                               {"min_time_s", row.min_time_s},
                               {"max_time_s", row.max_time_s}});
      }
      out << doc.dump(2) << "\n";
      return 0;
    }
    out << "collectives over " << (o.group.empty() ? "no axes" : o.mesh.axis_names(o.group)) << " (" << r.group_size
        << " ranks) of mesh " << o.mesh.to_string() << ", " << o.backend << " backend, " << to_string(o.dtype)
        << ", median of " << o.trials << " trials (and the fastest - slowest)\n";
    Table t({"size", "count", "op", "time", "min - max", "algbw", "busbw", "busbw / reference"});
    double memcpy_bw = 0, add_bw = 0;
    // Rows come per size: the collectives, then memcpy and y += x; ratios need the references first.
    std::vector<std::vector<std::string>> pending;
    std::vector<std::string> pending_ops;
    std::vector<double> pending_bus;
    const auto flush = [&] {
      for (std::size_t i = 0; i < pending.size(); ++i) {
        const std::string& op = pending_ops[i];
        const double ref = op == "all_gather" || op == "all_to_all" || op == "memcpy" ? memcpy_bw : add_bw;
        pending[i].push_back(op == "memcpy" || op == "y += x" ? "(reference)" : format_sig3(pending_bus[i] / ref));
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
                         format_time(row.time_s), format_time(row.min_time_s) + " - " + format_time(row.max_time_s),
                         format_bandwidth(row.algbw), format_bandwidth(row.busbw)});
      pending_ops.push_back(row.op);
      pending_bus.push_back(row.busbw);
    }
    flush();
    for (std::size_t c : {0, 1, 3, 4, 5, 6, 7}) t.right_align(c);
    t.print(out);
    out << "  (all_gather and all_to_all are compared with memcpy, reduce_scatter and all_reduce with y += x)\n";
    return 0;
  };
}

// "512,1024,2048": the size every dimension without a --dims entry takes, one point each.
std::vector<std::int64_t> parse_dimension_sizes(const std::string& text) {
  std::vector<std::int64_t> sizes;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string piece = text.substr(at, comma - at);
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (piece.empty() || used != piece.size() || value < 1) {
      throw InputError("bad --sizes '" + text + "': '" + piece +
                       "' is not a positive whole number; write dimension sizes separated by commas, e.g. "
                       "--sizes 512,1024,2048");
    }
    sizes.push_back(value);
    at = comma + 1;
  }
  return sizes;
}

double flop_rate(double flops, double seconds) { return seconds > 0 ? flops / seconds : 0; }

// The planner's choice among a point's runs, and whether it is within 5% of the fastest (judged
// on the runoff between the two where the fastest was another candidate).
const MatmulBenchRun& chosen_run(const MatmulBenchPoint& p) {
  return *std::find_if(p.runs.begin(), p.runs.end(), [&](const MatmulBenchRun& r) { return r.candidate == p.chosen; });
}
constexpr double kChoiceSlack = 1.05;
bool choice_within_slack(const MatmulBenchPoint& p) {
  if (p.runoff) return p.runoff->chosen_time_s <= kChoiceSlack * p.runoff->candidate_time_s;
  return chosen_run(p).measured_time_s <= kChoiceSlack * fastest_run(p).measured_time_s;
}

// A run's plan's confidence with what the bench knows beside it (add_run_confidence): the
// reference GEMM has min(ranks, cores) threads, so fewer threads than ranks means fewer cores.
// The text's header names the profile; the JSON says on every run that it is another machine's.
Confidence bench_confidence(const MatmulBenchOptions& o, const MatmulBenchReport& r, const MatmulBenchRun& run,
                            bool other_hardware) {
  Confidence c = run.confidence;
  add_run_confidence(c, r.ranks, r.gemm_threads, o.hw, other_hardware, run.predicted_time_s);
  return c;
}

Json matmul_bench_json(const MatmulBenchOptions& o, const std::string& expr, const MatmulBenchReport& r) {
  Json doc;
  doc["expression"] = expr;
  doc["mesh"] = mesh_json(o.mesh);
  doc["backend"] = o.backend;
  doc["dtype"] = to_string(o.dtype);
  doc["hw"] = o.hw.name;
  doc["ranks"] = r.ranks;
  doc["gemm_threads"] = r.gemm_threads;
  doc["warmup"] = o.warmup;
  doc["warmup_time_s"] = o.warmup_min_s;
  doc["repeat"] = o.repeat;
  doc["rounds"] = o.rounds;
  doc["all_candidates"] = o.all;
  doc["points"] = Json::array();
  int within = 0;
  for (const MatmulBenchPoint& p : r.points) {
    Json point;
    point["dims"] = dims_json(p.sizes);
    point["flops"] = p.flops;
    point["gemm"] = {{"m", p.gemm_m},
                     {"n", p.gemm_n},
                     {"k", p.gemm_k},
                     {"time_s", p.gemm_time_s},
                     {"flop_rate", flop_rate(p.flops, p.gemm_time_s)}};
    point["speed_check"] = nullptr;
    if (const auto& sc = p.speed_check) {
      point["speed_check"] = {{"m", sc->calibrated.m},        {"n", sc->calibrated.n},
                              {"k", sc->calibrated.k},        {"profile_flop_rate", sc->calibrated.flops_per_s},
                              {"flop_rate", sc->flops_per_s}, {"now_over_profile", sc->ratio()}};
    }
    point["chosen"] = p.chosen;
    point["runs"] = Json::array();
    for (const MatmulBenchRun& run : p.runs) {
      Json weak;
      add_confidence_json(weak, bench_confidence(o, r, run, true));
      point["runs"].push_back({{"candidate", run.candidate},
                               {"description", run.description},
                               {"chosen", run.candidate == p.chosen},
                               {"predicted_time_s", run.predicted_time_s},
                               {"predicted_comm_s", run.predicted_comm_s},
                               {"predicted_compute_s", run.predicted_compute_s},
                               {"measured_time_s", run.measured_time_s},
                               {"measured_over_predicted", run.measured_time_s / run.predicted_time_s},
                               {"flop_rate", flop_rate(p.flops, run.measured_time_s)},
                               {"vs_gemm", p.gemm_time_s / run.measured_time_s},
                               {"verified", run.verified},
                               {"max_rel_error", run.max_rel_error}});
      if (!weak.is_null()) point["runs"].back().update(weak);
    }
    if (o.all) {
      point["fastest"] = fastest_run(p).candidate;
      if (p.runoff) {
        point["runoff"] = {{"candidate", p.runoff->candidate},
                           {"chosen_time_s", p.runoff->chosen_time_s},
                           {"candidate_time_s", p.runoff->candidate_time_s},
                           {"chosen_over_candidate", p.runoff->chosen_time_s / p.runoff->candidate_time_s}};
      }
      point["chosen_within_5pct"] = choice_within_slack(p);
      within += choice_within_slack(p) ? 1 : 0;
    }
    doc["points"].push_back(point);
  }
  if (o.all) doc["choice"] = {{"points", r.points.size()}, {"chosen_within_5pct", within}};
  return doc;
}

// One line for the points' speed checks, where the profile was calibrated on this mesh and backend.
void print_speed_checks(std::ostream& out, const MatmulBenchReport& r) {
  std::string line;
  const GemmRate* calibrated = nullptr;
  for (const MatmulBenchPoint& p : r.points) {
    if (!p.speed_check) continue;
    calibrated = &p.speed_check->calibrated;
    line += (line.empty() ? "" : ", ") + format_sizes(p.sizes) + " " + format_sig3(p.speed_check->ratio());
  }
  if (!calibrated) return;
  out << "speed now / at calibration: " << line << "\n  (the calibration's " << calibrated->m << "x" << calibrated->n
      << "x" << calibrated->k << " GEMM again on every rank at once, against its "
      << format_flop_rate(calibrated->flops_per_s)
      << " a rank then; below 1 the machine runs slower than when calibrated, and meas/pred rises by 1 / that)\n";
}

void print_matmul_bench(std::ostream& out, const MatmulBenchOptions& o, const std::string& expr,
                        const MatmulBenchReport& r) {
  out << expr << " on mesh " << o.mesh.to_string() << ", " << o.backend << " backend, " << to_string(o.dtype)
      << ", median of " << o.repeat << " (after " << o.warmup << " warm-up"
      << (o.warmup_min_s > 0 ? ", at least " + format_time(o.warmup_min_s) : std::string()) << "); predictions on "
      << o.hw.name << "\n";
  out << "reference: one OpenBLAS GEMM of the same FLOPs with " << r.gemm_threads << " thread"
      << (r.gemm_threads == 1 ? "" : "s") << " (the cores the " << r.ranks << " ranks share)\n";
  Table t({"dims", "#", "plan", "predicted", "measured", "meas/pred", "rate", "GEMM rate", "vs GEMM", "comm/compute",
           "verified"});
  int within = 0;
  for (const MatmulBenchPoint& p : r.points) {
    for (const MatmulBenchRun& run : p.runs) {
      const bool chosen = run.candidate == p.chosen;
      const std::string mark = !o.all                              ? ""
                               : chosen && &run == &fastest_run(p) ? " (chosen, fastest)"
                               : chosen                            ? " (chosen)"
                               : &run == &fastest_run(p)           ? " (fastest)"
                                                                   : "";
      const double ratio = run.predicted_compute_s > 0 ? run.predicted_comm_s / run.predicted_compute_s : 0;
      t.add({format_sizes(p.sizes), std::to_string(run.candidate + 1), run.description + mark,
             format_time(run.predicted_time_s), format_time(run.measured_time_s),
             format_sig3(run.measured_time_s / run.predicted_time_s) + "x",
             format_flop_rate(flop_rate(p.flops, run.measured_time_s)),
             format_flop_rate(flop_rate(p.flops, p.gemm_time_s)), format_sig3(p.gemm_time_s / run.measured_time_s),
             format_sig3(ratio), run.verified ? "yes" : "NO"});
    }
    if (o.all) within += choice_within_slack(p) ? 1 : 0;
  }
  for (std::size_t c : {1, 3, 4, 5, 6, 7, 8, 9}) t.right_align(c);
  t.print(out);
  out << "  (vs GEMM = GEMM time / measured time, 1 = as fast as the one GEMM; comm/compute is the model's)\n";
  int weak = 0, runs = 0;
  for (const MatmulBenchPoint& p : r.points) {
    for (const MatmulBenchRun& run : p.runs) {
      ++runs;
      weak += bench_confidence(o, r, run, false).low() ? 1 : 0;
    }
  }
  if (weak > 0) {
    out << "  (" << weak << " of " << runs
        << " predictions are of low confidence, a step's figures being weak on this profile or machine: --json "
           "says why; docs/cost-model.md, 'Confidence')\n";
  }
  print_speed_checks(out, r);
  if (!o.all) return;
  for (const MatmulBenchPoint& p : r.points) {
    if (!p.runoff) continue;
    out << "runoff at " << format_sizes(p.sizes) << ": chosen #" << p.chosen + 1 << " "
        << format_time(p.runoff->chosen_time_s) << ", fastest #" << p.runoff->candidate + 1 << " "
        << format_time(p.runoff->candidate_time_s) << " (chosen / fastest "
        << format_sig3(p.runoff->chosen_time_s / p.runoff->candidate_time_s) << ")\n";
  }
  out << "chosen plan within 5% of the fastest measured candidate at " << within << " of " << r.points.size()
      << " points (where another was fastest, judged on a runoff of the two)\n";
}

// `bench matmul`: its flags on `app`, and what it does.
std::function<int(std::ostream&)> add_matmul(CLI::App& bench) {
  struct Flags {
    std::string expr, sizes = "512,1024,2048,4096";
    PlanningFlags common;
    ExecutionFlags exec;
    int rounds = 1;
    bool all = false;
  };
  auto flags = std::make_shared<Flags>();
  // Execution computes in f32 or f64; the predictions need a profile with those peaks.
  flags->common.dtype = "f32";
  flags->common.fallback_hw = "h100";
  flags->exec.repeat = 7;
  flags->exec.check = false;
  CLI::App* app = bench.add_subcommand(
      "matmul",
      "run a sharded contraction's plan (or every candidate) against one OpenBLAS GEMM of the same FLOPs "
      "on the same cores, measured in the same run; verified against the dense reference");
  app->add_option("EXPR", flags->expr, "the contraction, e.g. 'A[I_X, J] @ B[J_X, K] -> C[I_X, K]'")->required();
  add_mesh_flag(*app, flags->common.mesh);
  app->add_option("--sizes", flags->sizes,
                  "the size every dimension not in --dims takes, one point each, e.g. --sizes 512,1024,2048 "
                  "(default 512,1024,2048,4096)");
  add_dims_flag(*app, flags->common.dims, false);
  add_dtype_flag(*app, flags->common.dtype);
  add_hw_flag(*app, flags->common.hw);
  app->add_option("--backend", flags->exec.backend,
                  "threads (default) or mpi (under mpirun -n <devices>), e.g. --backend mpi");
  app->add_option("--repeat", flags->exec.repeat,
                  "timed runs of each plan and of the GEMM; medians are reported, "
                  "e.g. --repeat 9 (default 7)");
  app->add_option("--warmup", flags->exec.warmup, "untimed runs before them, e.g. --warmup 2 (default 1)");
  add_warmup_time_flag(*app, flags->exec.warmup_time_s);
  app->add_option("--rounds", flags->rounds,
                  "run the reference GEMM and the plans in turn this many times, --repeat runs each per round, and "
                  "report the median of all of each one's runs: a change in the machine's load then falls on all "
                  "of them alike, e.g. --rounds 3 (default 1)");
  app->add_flag("--all", flags->all,
                "run every candidate plan, not only the chosen one, and count how often the chosen one is within "
                "5% of the fastest; where another was fastest, the two run again in turn for --rounds more rounds "
                "and the choice is judged on that runoff (the least of many noisy times is low by chance), e.g. "
                "--all");
  app->add_flag("--check", flags->exec.check,
                "run with the mpi backend's agreement check on, as `run` has it (off here, to time the plan alone), "
                "e.g. --check");
  add_json_flag(*app, flags->common.json);
  app->footer(
      std::string(kNotationHint) +
      "\n\nEvery dimension without a --dims entry takes each --sizes value in turn. The reference is\n"
      "C[m,n] = A[m,k] @ B[k,n] with m = A's free and batch dimensions, n = B's free ones, k = the contracted\n"
      "ones: the same FLOPs, as one OpenBLAS GEMM with min(ranks, cores) threads (under mpirun, on rank 0\n"
      "while the other ranks sleep). Every run is verified; exit status 3 when one is wrong.\n"
      "With a --hw profile calibrated on this backend and mesh, each round also times the calibration's largest\n"
      "GEMM again: 'speed now / at calibration' below the table (below 1 the machine runs slower than when it\n"
      "was calibrated, and every prediction is that much too fast).\n"
      "The defaults here are --dtype f32 and --hw calibrated when 'shardmm calibrate' has written a profile, else\n"
      "h100 (the planner's profile: it picks the plan and predicts).\n\n"
      "Examples:\n"
      "  shardmm bench matmul 'A[I_X, J] @ B[J_X, K] -> C[I_X, K]' --mesh X=2 --sizes 1024,2048\n"
      "  shardmm bench matmul 'A[I_X, J] @ B[J, K_X]' --mesh X=2 --dims I=256,J=256 --sizes 64,1024,4096 "
      "--all --json\n"
      "  mpirun --bind-to none -n 2 shardmm bench matmul 'A[I_X, J] @ B[J_X, K] -> C[I_X, K]' --mesh X=2 "
      "--backend mpi --dtype f64 --sizes 512,1024\n\n" +
      kDocsHint);
  return [flags](std::ostream& out) {
    Planning p = make_planning(flags->common);
    MatmulBenchOptions o;
    o.backend = flags->exec.backend;
    o.mesh = p.mesh;
    o.contraction = parse_contraction(flags->expr, p.mesh);
    o.fixed = p.sizes;
    o.sizes = parse_dimension_sizes(flags->sizes);
    o.dtype = p.options.dtype;
    o.hw = p.options.hw;
    o.all = flags->all;
    o.warmup = flags->exec.warmup;
    o.warmup_min_s = flags->exec.warmup_time_s;
    o.repeat = flags->exec.repeat;
    o.rounds = flags->rounds;
    if (o.rounds < 1) throw InputError("--rounds " + std::to_string(o.rounds) + ": at least one round is needed");
    o.check = flags->exec.check;
    check_execution(flags->exec, p);
    check_dims_used(o.fixed, {&o.contraction.a, &o.contraction.b});
    o.progress = [](const std::string& what) { std::cerr << "shardmm: bench " + what + "\n"; };
    const MatmulBenchReport r = bench_matmul(o);
    bool verified = true;
    for (const MatmulBenchPoint& point : r.points) {
      for (const MatmulBenchRun& run : point.runs) verified = verified && run.verified;
    }
    const int status = verified ? 0 : 3;
    if (!r.is_root) return status;
    if (flags->common.json) {
      out << matmul_bench_json(o, format_contraction(o.contraction, o.mesh), r).dump(2) << "\n";
    } else {
      print_matmul_bench(out, o, format_contraction(o.contraction, o.mesh), r);
    }
    if (!verified) std::cerr << "shardmm: error: a run does not match the dense reference (see 'verified')\n";
    return status;
  };
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  CLI::App* bench = root.add_subcommand("bench",
                                        "measure this machine: collectives (nccl-tests style), sharded "
                                        "matmuls against one GEMM");
  bench->require_subcommand(1);
  const auto run_collectives = add_collectives(*bench);
  CLI::App* collectives = bench->get_subcommand("collectives");
  const auto run_matmul = add_matmul(*bench);
  return {bench, [=](std::ostream& out) { return collectives->parsed() ? run_collectives(out) : run_matmul(out); }};
}

}  // namespace shardmm::cli
