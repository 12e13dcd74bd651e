// The sharding `shardmm solve` chooses, executed: its measured step time beside each named
// strategy's (a role per mesh axis: dp, fsdp, tp, sp, ep; the rest of the program solved within
// those roles by the same model), with each one's prediction on the profile. Issue 27's goal:
// the chosen sharding never slower than the fastest named one by more than 5%.
//
//   build/bench/solve_measured_bench --program examples/programs/block.prog --mesh X=2
//       [--dims B=4,T=256,...] [--hw PROFILE] [--backend threads|mpi] [--dtype f32] [--repeat 7]
//       [--function gelu]
//   mpirun -n 4 build/bench/solve_measured_bench ... --mesh X=2,Y=2 --backend mpi
//
// Every rank solves the program (the solve is deterministic), then each distinct sharding (the
// optimum, and the named strategies that apply; named ones that solve to the same specs are one
// row) runs one verified step at small dims (each letter at most kVerifyDim: the dense reference is
// plain loops; exit 3 on a wrong result), a warm-up step at the given dims, and
// then --repeat timed steps, the shardings taking turns in each repeat so that the machine's drift
// moves them alike. A step's time is the slowest rank's, from the start of its first op to the
// end of its update: what the prediction covers. Making the leaves' values before (random
// params and inputs: about 19 ms of a 245 ms step at the default dims on the 2-core VM, one
// measurement) and freeing the tape after are not a training step's work.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_flags.h"
#include "bench_ranks.h"
#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/solve/solve.h"

namespace {

using namespace shardmm;

constexpr std::int64_t kVerifyDim = 12;

struct Candidate {
  std::string names;  // "optimum", or the named strategies that give this sharding
  bool optimum = false;
  program::Graph pinned;
  program::Graph verified;       // the same specs at small dims
  double predicted = 0;          // seconds: the solver's cost of the step
  std::vector<double> measured;  // seconds, per repeat
  // --function's local steps on device 0, per repeat: their predicted and measured seconds.
  std::vector<double> function_predicted, function_measured;
};

// The optimum first, then each distinct step of the named strategies that apply: a named
// strategy whose regathered params gather nothing again runs the optimum's step when its specs
// are the optimum's (fsdp beside pinned Megatron weights), and is the optimum's row.
std::vector<Candidate> candidates(const program::Graph& g, const program::Graph& small, const solve::SolveResult& r,
                                  const nn::ProgramOptions& options) {
  std::vector<Candidate> out;
  std::map<std::string, std::size_t> by_layout;  // the pinned program's text -> row
  const auto add = [&](const std::string& name, const solve::SolveOutcome& o) {
    if (o.best.empty()) return;
    const std::vector<Spec> specs = solve::specs_of(r.choices, o.best);
    const std::vector<char> chosen = solve::regathered_of(r.choices, o.best);
    const std::vector<char> regathered = solve::regathering_that_gathers(
        g, r.choices, chosen, nn::predict_program(solve::pinned_graph(g, specs, chosen), options).events);
    std::string layout;
    for (std::size_t t = 0; t < specs.size(); ++t)
      layout += format_spec(specs[t], g.mesh) + (regathered[t] ? "r" : "") + ";";
    const auto [it, fresh] = by_layout.emplace(layout, out.size());
    if (!fresh) {
      out[it->second].names += (out[it->second].optimum && out[it->second].names == "optimum" ? " = " : ", ") + name;
      return;
    }
    Candidate c;
    c.names = name;
    c.optimum = out.empty();
    c.pinned = solve::pinned_graph(g, specs, regathered);
    c.verified = solve::pinned_graph(small, specs, regathered);
    c.predicted = o.value.time;
    out.push_back(std::move(c));
  };
  add("optimum", r.outcome);
  for (const solve::NamedStrategy& n : r.named) add(n.name, n.outcome);
  return out;
}

constexpr const char* kUsage =
    "usage: solve_measured_bench --program FILE [--mesh M] [--dims L=n,...] [--hw PROFILE]\n"
    "                            [--backend threads|mpi] [--dtype f32|f64] [--optimizer sgd|adam] [--repeat N]\n"
    "                            [--function NAME] [--json]\n"
    "Solves the program's training step on the mesh (the file's, or --mesh) with the profile (--hw: a\n"
    "built-in name or a JSON file; default the calibrated one, else h100), then runs the optimum and\n"
    "every named strategy that applies: one step each verified at small dims (each letter at most 12;\n"
    "exit 3 on a wrong result), a warm-up,\n"
    "and --repeat (7) timed steps taking turns. Prints, per sharding, the predicted step time, the\n"
    "measured median with its lowest and highest, measured/predicted, and measured against the fastest\n"
    "named strategy's median (--json: one JSON document). --function NAME (gelu, layer_norm, ...) adds\n"
    "that local function's steps on device 0, forward and backward: predicted and measured per step\n"
    "(medians); a step kind (einsum, all_gather, reduce_scatter, all_reduce, ...) adds its steps.\n"
    "Under mpirun give --backend mpi with as many ranks as devices.\n"
    "Exit 2 on a bad flag or program, 3 on a wrong result.\n";

// The span of a rank's executed step: from its first op's start to its last op's end.
double step_span(const autodiff::Tape& tape) {
  double first = 0, last = 0;
  bool any = false;
  for (const autodiff::TapeEvent& e : tape.events()) {
    if (!e.executed) continue;
    first = any ? std::min(first, e.measured.start_s) : e.measured.start_s;
    last = any ? std::max(last, e.measured.end_s) : e.measured.end_s;
    any = true;
  }
  return last - first;
}

// The predicted and measured seconds of the executed steps on this rank that are local steps of
// `function`, or steps of that kind (einsum, all_gather, ...).
std::pair<double, double> function_time(const autodiff::Tape& tape, const std::string& function) {
  double predicted = 0, measured = 0;
  for (const autodiff::TapeEvent& e : tape.events()) {
    const bool named = e.step.op == OpKind::local ? e.step.function == function : to_string(e.step.op) == function;
    if (!e.executed || !named) continue;
    predicted += e.step.time_s;
    measured += e.measured.end_s - e.measured.start_s;
  }
  return {predicted, measured};
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, mesh_text, dims_text, hw = "calibrated", backend = "threads", dtype_text = "f32",
                                          optimizer_text = "sgd", function;
  int repeat = 7;
  bool json = false;
  const std::optional<int> stop = bench::parse_flags("solve_measured_bench", kUsage, [&] {
    bench::FlagReader flags(argc, argv);
    for (std::string flag; flags.next(flag);) {
      if (flag == "--program") file = flags.value();
      else if (flag == "--mesh") mesh_text = flags.value();
      else if (flag == "--dims") dims_text = flags.value();
      else if (flag == "--hw") hw = flags.value();
      else if (flag == "--backend") backend = flags.value();
      else if (flag == "--dtype") dtype_text = flags.value();
      else if (flag == "--optimizer") optimizer_text = flags.value();
      else if (flag == "--repeat") repeat = flags.count(1);
      else if (flag == "--function") function = flags.value();
      else if (flag == "--json") json = true;
      else flags.unknown("--program --mesh --dims --hw --backend --dtype --optimizer --repeat --function --json");
    }
    if (file.empty()) throw InputError("--program is required (a program file, e.g. examples/programs/block.prog)");
    if (!function.empty()) {
      std::string known;
      for (const autodiff::LocalFunction& f : autodiff::local_functions()) {
        if (f.name == function) return;
        known += known.empty() ? "" : ", ";
        known += f.name;
      }
      std::string kinds;
      for (int k = 0; k <= static_cast<int>(OpKind::local); ++k) {
        if (static_cast<OpKind>(k) == OpKind::local) continue;
        if (to_string(static_cast<OpKind>(k)) == function) return;
        kinds += std::string(kinds.empty() ? "" : ", ") + to_string(static_cast<OpKind>(k));
      }
      throw InputError("--function " + function + " is no local function nor step kind; the tape's functions are " +
                       known + "; the step kinds " + kinds);
    }
  });
  if (stop) return *stop;
  try {
    std::ifstream in(file);
    if (!in) throw InputError("--program: cannot read '" + file + "'");
    std::stringstream text;
    text << in.rdbuf();
    program::BindOptions bind;
    if (!mesh_text.empty()) bind.mesh = Mesh::parse(mesh_text);
    if (!dims_text.empty()) bind.dims = parse_dims(dims_text);
    const program::Program p = program::parse_program(text.str(), file);
    const program::Graph g = program::bind(p, bind);
    program::BindOptions small_bind = bind;
    small_bind.dims = g.dims;
    for (auto& [letter, n] : *small_bind.dims) n = std::min(n, kVerifyDim);
    const program::Graph small = program::bind(p, small_bind);
    nn::ProgramOptions options;
    options.dtype = parse_dtype(dtype_text);
    const bool calibrated = !calibrated_profile_path().empty() && std::ifstream(calibrated_profile_path()).good();
    options.hw = load_profile(hw == kCalibratedProfileName && !calibrated ? "h100" : hw);
    options.optimizer = nn::parse_optimizer(optimizer_text);
    solve::SolveOptions solve_options;
    solve_options.program = options;
    const solve::SolveResult r = solve::solve_program(g, solve_options);
    std::vector<Candidate> rows = candidates(g, small, r, options);

    bool verified = true;  // device 0's verdict (every rank gets the same one)
    run_backend(backend, g.mesh, [&](Communicator& comm) {
      bench::RankClock clock(comm);
      bool all_verified = true;
      for (Candidate& c : rows) {
        const nn::ProgramRun run = nn::run_program(comm, c.verified, options);
        if (!run.verification.verified) {
          if (comm.rank() == 0)
            std::fprintf(stderr, "solve_measured_bench: %s: wrong result: %s\n", c.names.c_str(),
                         run.verification.detail.c_str());
          all_verified = false;
        }
      }
      if (comm.rank() == 0) verified = all_verified;  // one writer: the threads backend's ranks share `verified`
      if (!all_verified) return;
      for (int k = 0; k <= repeat; ++k) {
        for (Candidate& c : rows) {
          clock.line_up();
          autodiff::Tape tape(comm, {options.dtype, options.hw, 0});
          nn::execute_program_step(tape, c.pinned, options);
          const double seconds = clock.slowest(step_span(tape));
          if (k > 0 && comm.rank() == 0) {  // repeat 0 warms up
            c.measured.push_back(seconds);
            const auto [predicted, measured] = function_time(tape, function);
            c.function_predicted.push_back(predicted);
            c.function_measured.push_back(measured);
          }
        }
      }
    });
    if (!verified) return 3;
    if (!rows.empty() && rows.front().measured.empty()) return 0;  // not device 0 under mpirun
    // The fastest named strategy's median (the optimum's row counts when a named one gives it too).
    double fastest_named = 0;
    for (const Candidate& c : rows) {
      if (c.names == "optimum") continue;
      const double m = median(c.measured);
      fastest_named = fastest_named == 0 ? m : std::min(fastest_named, m);
    }
    const auto vs_named = [&](const Candidate& c) {
      return fastest_named > 0 ? median(c.measured) / fastest_named : 0;
    };
    if (json) {
      nlohmann::ordered_json doc = {{"program", file},
                                    {"mesh", g.mesh.to_string()},
                                    {"ranks", g.mesh.device_count()},
                                    {"backend", backend},
                                    {"dtype", to_string(options.dtype)},
                                    {"optimizer", nn::to_string(options.optimizer)},
                                    {"hardware", options.hw.name},
                                    {"repeat", repeat},
                                    {"shardings", nlohmann::ordered_json::array()}};
      for (const Candidate& c : rows) {
        const auto [low, high] = std::minmax_element(c.measured.begin(), c.measured.end());
        doc["shardings"].push_back({{"names", c.names},
                                    {"optimum", c.optimum},
                                    {"predicted_s", c.predicted},
                                    {"measured_s", median(c.measured)},
                                    {"low_s", *low},
                                    {"high_s", *high},
                                    {"vs_fastest_named", vs_named(c)}});
        if (!function.empty()) {
          doc["shardings"].back()["function"] = {{"name", function},
                                                 {"predicted_s", median(c.function_predicted)},
                                                 {"measured_s", median(c.function_measured)}};
        }
      }
      std::printf("%s\n", doc.dump().c_str());
      return 0;
    }
    std::printf("%s on %s (%s, %s), %s, %s; median of %d steps; times in ms\n", file.c_str(),
                g.mesh.to_string().c_str(), backend.c_str(), to_string(options.dtype), nn::to_string(options.optimizer),
                options.hw.name.c_str(), repeat);
    std::printf("%-44s %9s %9s %13s %9s %9s\n", "sharding", "predicted", "measured", "range", "meas/pred", "vs named");
    for (const Candidate& c : rows) {
      const double m = median(c.measured);
      const auto [low, high] = std::minmax_element(c.measured.begin(), c.measured.end());
      char range[32];
      std::snprintf(range, sizeof range, "%.2f-%.2f", *low * 1e3, *high * 1e3);
      std::printf("%-44s %9.3f %9.3f %13s %9.3f %9.3f\n", c.names.c_str(), c.predicted * 1e3, m * 1e3, range,
                  m / c.predicted, vs_named(c));
      if (function.empty()) continue;
      const double fp = median(c.function_predicted), fm = median(c.function_measured);
      std::printf("  %-42s %9.3f %9.3f %13s %9.3f\n", (function + "'s steps").c_str(), fp * 1e3, fm * 1e3, "",
                  fp > 0 ? fm / fp : 0.0);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solve_measured_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
