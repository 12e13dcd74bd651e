// shardmm solve FILE [--mesh M] [--split array|chunk] [--dims ...] [--mem-limit BYTES] [--train|--infer]
//                    [--optimizer sgd|adam] [--pin NAME=SPEC ...] [--top K] [--explain]
//                    [--emit FILE] [--run] [--backend] [--time-limit S] [--dtype] [--hw] [--json]
// The fastest sharding of a whole program within a memory limit (solve/solve.h), said to be
// optimal or with its proven gap, costed as `shardmm program` costs it, beside the named
// strategies; --emit writes the program with every spec pinned; --run executes and verifies it.
#include <cmath>
#include <iomanip>
#include <map>
#include <iostream>
#include <locale>
#include <memory>
#include <ostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/program_common.h"
#include "shardmm/core/error.h"
#include "shardmm/core/files.h"
#include "shardmm/core/geometry.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/solve/solve.h"

namespace shardmm::cli {
namespace {

double serialized(const std::vector<autodiff::TapeEvent>& events) {
  double s = 0;
  for (const autodiff::TapeEvent& e : events) s += e.step.time_s;
  return s;
}

double serialized_measured(const std::vector<autodiff::TapeEvent>& events) {
  double s = 0;
  for (const autodiff::TapeEvent& e : events) s += e.measured.end_s - e.measured.start_s;
  return s;
}

std::string status_text(const solve::SolveOutcome& o, const std::optional<solve::NeighbourhoodSearch>& search) {
  if (o.status == solve::SolveStatus::optimal) return "optimal";
  const double gap = o.value.time > 0 ? (o.value.time - o.lower_bound) / o.value.time : 0;
  // The gap as a ratio where it is large: "within 95% of the bound" reads as close.
  const auto against_bound = [&](const std::string& note) {
    const std::string percent = format_sig3(100 * gap) + "%";
    if (gap < 0.5 || o.lower_bound <= 0)
      return "within " + percent + " of the proven bound " + format_time(o.lower_bound) +
             (note.empty() ? "" : " (" + note + ")");
    return format_sig3(o.value.time / o.lower_bound) + " times the proven bound " + format_time(o.lower_bound) +
           " (a gap of " + percent + (note.empty() ? "" : "; " + note) + ")";
  };
  const std::string within = against_bound("");
  // A search's bound is the compute bound: no sharding computes faster than every device
  // busy with an even share and nothing communicated.
  const std::string compute = against_bound("every device computing an even share, nothing communicated");
  if (search && search->converged_axes == 2)
    return "no change of one or two axes' places improves it: a local optimum, " + compute;
  if (search && search->converged_axes == 1)
    return "no change of one axis's places improves it (the time limit ended the search of two axes' changes): a "
           "local optimum, " +
           compute;
  if (search) return "the best found before the time limit ended the search, " + compute;
  return "feasible, " + within;
}

// The tensors a user reads: each statement once (a repeat's first copy), no nested expressions.
std::vector<int> shown_tensors(const program::Graph& g, const solve::ProgramChoices& c) {
  std::vector<int> out;
  for (std::size_t v = 0; v < c.tensor_of_var.size(); ++v) {
    const int t = c.tensor_of_var[v];
    if (!g.tensors[static_cast<std::size_t>(t)].temporary) out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// How the answer came by tensor t's layout; a param it regathers (FSDP) says so.
std::string how_text(const program::Graph& g, const solve::SolveResult& r, int t) {
  const solve::ProgramChoices& c = r.choices;
  const auto v = static_cast<std::size_t>(c.var_of_tensor[static_cast<std::size_t>(t)]);
  const std::string regathered = r.regathered[static_cast<std::size_t>(t)] ? ", regathered" : "";
  if (g.tensors[static_cast<std::size_t>(t)].pinned) return "pinned" + regathered;
  return (c.chosen[v] ? "chosen (of " + std::to_string(c.values[v].size()) + ")" : "follows from its op") + regathered;
}

}  // namespace

void print_solve_report(std::ostream& out, const SolveRequest& request, const SolveReport& report) {
  const ProgramInput& f = request.input;
  const Planning& p = report.bound.planning;
  const program::Graph& g = report.bound.graph;
  const bool train = report.bound.train;
  const solve::SolveOptions& o = report.options;
  const solve::SolveResult& r = report.result;
  const nn::ProgramRun* run = report.run ? &*report.run : nullptr;
  const solve::ProgramChoices& c = r.choices;
  out << "shardmm solve " << f.file << ": the fastest sharding of one "
      << (train ? std::string("training step (forward, backward, ") + nn::to_string(o.program.optimizer) + ")"
                : std::string("inference step (forward)"))
      << " on mesh " << describe_mesh(g.mesh) << "\n\n";
  out << "  dims      " << format_sizes(g.dims) << "\n";
  out << "  dtype     " << to_string(p.options.dtype) << "\n";
  print_hardware(out, p);
  out << "  memory    "
      << (o.memory_limit ? format_bytes_exact(*o.memory_limit) + " per device" : std::string("no limit")) << "\n";
  std::size_t chosen = 0, entries = 0;
  for (char x : c.chosen) chosen += x ? 1 : 0;
  for (const solve::Factor& fac : c.problem.factors) entries += fac.entries.size();
  out << "\nSearch: " << chosen << " tensors to choose (inputs, params, einsum results; a repeat's copies choose "
      << "together), " << (r.search ? r.search->recordings : c.evaluations) << " op recordings, " << entries
      << " costed combinations.\n";
  if (r.search) {
    out << (o.search == solve::SolveOptions::Search::neighbourhoods
                ? std::string("Searched (--search neighbourhoods)")
                : "The whole space is too large to build on " +
                      std::to_string(std::popcount(static_cast<unsigned>(solve::placed_axes(g.mesh)))) +
                      " axes: searched")
        << " from the best named strategy by neighbourhoods (every tensor's places of one axis, then two, open and the "
           "others kept; each "
           "solved exactly), "
        << r.search->builds << " of them in " << format_time(r.search->seconds)
        << " (one axis at a time: " << format_time(r.search->one_axis_seconds) << ")"
        << "; the costed combinations and the table's choices are the last one's.\n";
  }
  out << "Solved by " << r.outcome.method << " in " << format_time(r.outcome.seconds) << " ("
      << (r.search ? "its problems built in " + format_time(r.search->build_seconds)
                   : "its problem built in " + format_time(c.build_seconds))
      << "): " << status_text(r.outcome, r.search) << ".\n";

  out << "\nChosen sharding:\n";
  Table tensors({"tensor", "role", "sharding", "how", "device 0"});
  for (int t : shown_tensors(g, c)) {
    const program::Tensor& tensor = g.tensors[static_cast<std::size_t>(t)];
    const Spec& s = r.specs[static_cast<std::size_t>(t)];
    tensors.add({tensor.source_name, program::to_string(tensor.role), format_spec(s, g.mesh), how_text(g, r, t),
                 "[" +
                     join(
                         [&] {
                           std::vector<std::string> parts;
                           for (std::int64_t n : local_shape(g.mesh, s, tensor.shape, 0))
                             parts.push_back(std::to_string(n));
                           return parts;
                         }(),
                         ", ") +
                     "]"});
  }
  tensors.print(out);

  const nn::ProgramPrediction& pred = r.prediction;
  out << "\nThe step, as `shardmm program` costs it (" << p.options.hw.name << "):\n";
  // The solver's objective is this figure (tests/solve: the factors add up to the program's cost).
  out << "  time      " << format_time(serialized(pred.events)) << " serialized\n";
  // The peak of the step's timeline: what --mem-limit bounds, and the solver's memory figure.
  const nn::ProgramMemoryPoint& peak = pred.memory.timeline.at(pred.memory.peak_point);
  const auto bytes = [](std::int64_t b) { return format_bytes(static_cast<double>(b)); };
  out << "  memory    peak " << bytes(peak.total()) << " per device, during " << memory_point_text(g, peak)
      << " (params " << bytes(peak.params) << ", inputs " << bytes(peak.inputs);
  if (train) out << ", gradients " << bytes(peak.gradients) << ", optimizer state " << bytes(peak.optimizer_state);
  out << ", activations " << bytes(peak.activations) << ", transient " << bytes(peak.transient) << ")\n";
  if (o.memory_limit && r.unconstrained) {
    const bool binds = r.unconstrained->value.time < r.outcome.value.time;
    out << "  limit     "
        << (binds ? "binds: the fastest sharding without it takes " + format_time(r.unconstrained->value.time) +
                        " and needs " + format_bytes(static_cast<double>(r.unconstrained->value.memory))
                  : std::string("does not bind: the fastest sharding fits"))
        << "\n";
  }

  print_collectives(out, g.mesh, pred.events);

  if (!r.named.empty()) {
    out << "\nNamed strategies (each axis's role fixes the leaves' shardings; the rest solved the same way):\n";
    Table table({"strategy", "time", "memory", "vs the optimum"});
    for (const solve::NamedStrategy& s : r.named) {
      if (s.outcome.best.empty()) {
        table.add({s.name, "-", "-",
                   s.outcome.status == solve::SolveStatus::infeasible ? s.why_not : "not found within --time-limit"});
        continue;
      }
      table.add({s.name, format_time(s.outcome.value.time), format_bytes(static_cast<double>(s.outcome.value.memory)),
                 "x" + format_sig3(r.outcome.value.time > 0 ? s.outcome.value.time / r.outcome.value.time : 1)});
    }
    table.right_align(1);
    table.right_align(2);
    table.print(out);
  }

  if (!r.alternatives.empty()) {
    out << "\nEach choice's runner-up (the best sharding with that tensor laid out otherwise):\n";
    Table table({"tensor", "chosen", "runner-up", "adds time", "adds memory"});
    for (const solve::Alternative& a : r.alternatives) {
      const program::Tensor& t = g.tensors[static_cast<std::size_t>(a.tensor)];
      table.add({t.source_name, format_spec(r.specs[static_cast<std::size_t>(a.tensor)], g.mesh),
                 a.exists ? format_spec(a.spec, g.mesh) : "none (the only layout that works)",
                 a.exists ? format_time(a.extra_time) : "-",
                 a.exists ? (a.extra_memory < 0 ? "-" + format_bytes(static_cast<double>(-a.extra_memory))
                                                : format_bytes(static_cast<double>(a.extra_memory)))
                          : "-"});
    }
    table.print(out);
  }

  if (r.top.size() > 1) {
    out << "\nThe " << r.top.size() << " best distinct shardings (by the solver's objective):\n";
    for (std::size_t k = 0; k < r.top.size(); ++k) {
      const std::vector<Spec> specs = solve::specs_of(c, r.top[k].best);
      std::vector<std::string> parts;
      for (std::size_t v = 0; v < c.chosen.size(); ++v) {
        if (c.chosen[v]) parts.push_back(format_spec(specs[static_cast<std::size_t>(c.tensor_of_var[v])], g.mesh));
      }
      out << "  " << k + 1 << ". " << format_time(r.top[k].value.time) << ", "
          << format_bytes(static_cast<double>(r.top[k].value.memory)) << ": " << join(parts, " ") << "\n";
    }
  }
  if (request.emit)
    out << "\nWrote " << *request.emit << ": the program with every spec pinned (shardmm program " << *request.emit
        << ").\n";
  if (run) {
    const Verification& v = run->verification;
    out << "\nRun (" << f.backend << ", " << g.mesh.device_count()
        << (g.mesh.device_count() == 1 ? " rank): " : " ranks): ") << (v.verified ? "verified" : "WRONG")
        << " against the dense f64 step of the program (max abs error " << format_error(v.max_abs_error)
        << ", tolerance " << format_error(v.tolerance) << ")\n";
    out << "  measured " << format_time(serialized_measured(run->events)) << " on device 0 vs "
        << format_time(serialized(pred.events)) << " predicted\n"
        << prediction_profile_note(p);
  }
}

namespace {

// An outcome and `all` (by graph tensor; empty when none was found): its chosen tensors' specs.
// With none found its figures are null, not zeros (a named strategy that does not apply).
Json outcome_json(const solve::ProgramChoices& c, const program::Graph& g, const solve::SolveOutcome& o,
                  const std::vector<Spec>& all) {
  const bool found = !all.empty();
  Json j = {{"status", solve::to_string(o.status)},
            {"method", o.method.empty() ? Json(nullptr) : Json(o.method)},
            {"time_s", found ? Json(o.value.time) : Json(nullptr)},
            {"memory_bytes", found ? Json(o.value.memory) : Json(nullptr)},
            {"lower_bound_s", found ? Json(o.lower_bound) : Json(nullptr)},
            {"solve_seconds", o.seconds}};
  Json specs = Json::object();
  if (!all.empty()) {
    for (std::size_t v = 0; v < c.chosen.size(); ++v) {
      const int t = c.tensor_of_var[v];
      if (c.chosen[v])
        specs[g.tensors[static_cast<std::size_t>(t)].source_name] =
            format_spec(all[static_cast<std::size_t>(t)], g.mesh);
    }
  }
  j["specs"] = specs;
  return j;
}

// An outcome of the problem `c`.
Json outcome_json(const solve::ProgramChoices& c, const program::Graph& g, const solve::SolveOutcome& o) {
  return outcome_json(c, g, o, o.best.empty() ? std::vector<Spec>{} : solve::specs_of(c, o.best));
}

}  // namespace

Json solve_json(const SolveRequest& request, const SolveReport& report) {
  const ProgramInput& f = request.input;
  const Planning& p = report.bound.planning;
  const program::Graph& g = report.bound.graph;
  const bool train = report.bound.train;
  const solve::SolveOptions& o = report.options;
  const solve::SolveResult& r = report.result;
  const nn::ProgramRun* run = report.run ? &*report.run : nullptr;
  const solve::ProgramChoices& c = r.choices;
  Json doc = Json::object();
  doc["command"] = "solve";
  doc["file"] = f.file;
  add_mesh_json(doc, g.mesh);
  doc["dims"] = dims_json(g.dims);
  doc["train"] = train;
  doc["optimizer"] = train ? Json(nn::to_string(o.program.optimizer)) : Json(nullptr);
  doc["rings"] = o.program.rings;
  doc["dtype"] = to_string(p.options.dtype);
  doc["hardware"] = p.options.hw.name;
  doc["memory_limit_bytes"] = o.memory_limit ? Json(*o.memory_limit) : Json(nullptr);
  doc["status"] = solve::to_string(r.outcome.status);
  doc["method"] = r.outcome.method;
  doc["objective_s"] = r.outcome.value.time;
  doc["lower_bound_s"] = r.outcome.lower_bound;
  doc["solve_seconds"] = r.outcome.seconds;
  doc["search"] = r.search ? Json{{"neighbourhoods", r.search->builds},
                                  {"converged_axes", r.search->converged_axes},
                                  {"seconds", r.search->seconds},
                                  {"one_axis_seconds", r.search->one_axis_seconds}}
                           : Json(nullptr);
  doc["op_recordings"] = r.search ? r.search->recordings : c.evaluations;
  doc["build_seconds"] = r.search ? r.search->build_seconds : c.build_seconds;
  Json tensors = Json::array();
  for (int t : shown_tensors(g, c)) {
    const program::Tensor& tensor = g.tensors[static_cast<std::size_t>(t)];
    const Spec& s = r.specs[static_cast<std::size_t>(t)];
    tensors.push_back({{"name", tensor.source_name},
                       {"role", program::to_string(tensor.role)},
                       {"spec", format_spec(s, g.mesh)},
                       {"how", how_text(g, r, t)},
                       {"shape", tensor.shape},
                       {"device0_shape", local_shape(g.mesh, s, tensor.shape, 0)}});
  }
  doc["tensors"] = tensors;
  const nn::ProgramMemory& m = r.prediction.memory;
  doc["predicted"] = {{"time_s", serialized(r.prediction.events)}, {"memory", memory_json(g, m)}};
  doc["unconstrained"] = r.unconstrained ? outcome_json(c, g, *r.unconstrained) : Json(nullptr);
  doc["collectives"] = collectives_json(g.mesh, r.prediction.events);
  Json named = Json::array();
  for (const solve::NamedStrategy& s : r.named) {
    Json row = outcome_json(c, g, s.outcome, s.specs);
    row["name"] = s.name;
    row["why_not"] = s.why_not.empty() ? Json(nullptr) : Json(s.why_not);
    named.push_back(row);
  }
  doc["named_strategies"] = named;
  Json alternatives = Json::array();
  for (const solve::Alternative& a : r.alternatives) {
    alternatives.push_back({{"tensor", g.tensors[static_cast<std::size_t>(a.tensor)].source_name},
                            {"chosen", format_spec(r.specs[static_cast<std::size_t>(a.tensor)], g.mesh)},
                            {"runner_up", a.exists ? Json(format_spec(a.spec, g.mesh)) : Json(nullptr)},
                            {"extra_time_s", a.exists ? Json(a.extra_time) : Json(nullptr)},
                            {"extra_memory_bytes", a.exists ? Json(a.extra_memory) : Json(nullptr)}});
  }
  doc["alternatives"] = alternatives;
  Json top = Json::array();
  for (const solve::SolveOutcome& t : r.top) top.push_back(outcome_json(c, g, t));
  doc["top"] = top;
  doc["emitted"] = request.emit ? Json(*request.emit) : Json(nullptr);
  doc["run"] = nullptr;
  if (run) {
    const Verification& v = run->verification;
    doc["run"] = {{"backend", f.backend},
                  {"verified", v.verified},
                  {"max_abs_error", v.max_abs_error},
                  {"tolerance", v.tolerance},
                  {"measured_s", serialized_measured(run->events)},
                  {"detail", v.detail}};
  }
  return doc;
}

SolveReport evaluate_solve(const SolveRequest& request) {
  const ProgramInput& in = request.input;
  if (request.top < 1 || request.top > kMaxTop) {
    throw InputError(field("top") + " " + std::to_string(request.top) + ": lists 1 to " + std::to_string(kMaxTop) +
                     " shardings, e.g. " + field("top") + " 3");
  }
  if (!(request.seconds > 0) || !std::isfinite(request.seconds)) {
    throw InputError(field("time_limit") + " " + format_given(request.seconds) +
                     ": the search's time limit is a positive number of seconds, e.g. " + field("time_limit") + " 10");
  }
  const std::map<std::string, solve::SolveOptions::Search> searches = {
      {"auto", solve::SolveOptions::Search::automatic},
      {"whole", solve::SolveOptions::Search::whole},
      {"neighbourhoods", solve::SolveOptions::Search::neighbourhoods}};
  const auto search = searches.find(request.search);
  if (search == searches.end()) {
    throw InputError(field("search") + " '" + request.search +
                     "': searches auto (the whole space where it can be built, else by neighbourhoods), whole or "
                     "neighbourhoods, e.g. " +
                     field("search") + " whole");
  }
  BoundProgram b = bind_program(in, "pin");
  solve::SolveOptions o;
  o.program.dtype = b.planning.options.dtype;
  o.program.hw = b.planning.options.hw;
  o.program.train = b.train;
  o.program.optimizer = b.optimizer;
  o.program.rings = in.rings;
  if (request.mem_limit) o.memory_limit = parse_byte_size(*request.mem_limit, field("mem_limit"));
  o.top = request.top;
  o.explain = request.explain;
  o.seconds = request.seconds;
  o.search = search->second;
  o.progress = request.progress;
  o.leave_caches_to_exit = request.leave_caches_to_exit;
  solve::SolveResult r = solve::solve_program(b.graph, o);
  std::optional<nn::ProgramRun> run;
  if (in.run) {
    check_run_size(b.graph, r.prediction, o.program.dtype);
    run = run_program_step(in.backend, solve::pinned_graph(b.graph, r.specs, r.regathered), o.program);
  }
  return {std::move(b), std::move(o), std::move(r), std::move(run)};
}

std::string pinned_program_text(const SolveReport& report) {
  return program::format_program(
      solve::pinned_program(report.bound.parsed, report.bound.graph, report.result.specs, report.result.regathered));
}

Command add_solve_command(CLI::App& root) {
  auto flags = std::make_shared<SolveRequest>();
  ProgramInput& input = flags->input;
  CLI::App* app = root.add_subcommand(
      "solve",
      "the fastest sharding of a whole program within a memory limit, proven optimal (or with its gap), "
      "beside the named strategies; --emit writes it pinned, --run executes and verifies it");
  app->add_option("FILE", input.file, "the program (docs/programs.md), e.g. examples/programs/mlp.prog")->required();
  app->add_option("--mesh", input.mesh, "the device mesh, replacing the file's mesh line, e.g. --mesh X=4,Y=2");
  add_split_flag(*app, input.common.split);
  app->add_option("--dims", input.common.dims, "letter sizes, each replacing the file's, e.g. --dims B=4,T=16");
  app->add_option("--mem-limit", flags->mem_limit,
                  "the most memory a device may hold at any point of the step (params, gradients, optimizer "
                  "state, live activations and transients: docs/programs.md's timeline), "
                  "e.g. --mem-limit 16GiB (also 512MiB, 1.5GB, 1e9 = bytes)");
  app->add_option("--pin", input.pins,
                  "fix a tensor's sharding, replacing the file's pin (a repeat block's tensor: every copy); "
                  "repeatable, e.g. --pin x='x[B_X, T, D]'");
  app->add_flag("--train", input.train,
                "solve a training step (the default when the program has a loss), e.g. --train");
  app->add_flag("--infer", input.infer, "solve an inference step: forward only, e.g. --infer");
  app->add_option("--optimizer", input.optimizer,
                  "the update: sgd (default) or adam (two moments per param "
                  "element count against memory), e.g. --optimizer adam");
  add_rings_flag(*app, input.rings);
  app->add_option("--top", flags->top, "also list the K best distinct shardings (1 to 100), e.g. --top 3");
  app->add_flag("--explain", flags->explain,
                "for each chosen tensor, the runner-up layout and the time and memory it would add, e.g. --explain");
  app->add_option("--emit", flags->emit,
                  "write the program with every spec pinned (shardmm program accepts it as is; a program file has no "
                  "split line: give --split chunk again), e.g. --emit best.prog");
  app->add_flag("--run", input.run,
                "execute the chosen sharding on real ranks and verify it against the dense f64 "
                "step (small --dims), e.g. --run");
  app->add_option("--backend", input.backend, "where --run executes: threads (default) or mpi, e.g. --backend mpi");
  app->add_option("--time-limit", flags->seconds,
                  "the whole solve's time limit in seconds (default 60): building the problem (on up to two axes "
                  "a search that cannot finish in it is refused, exit 2; past two, the neighbourhood search "
                  "answers with the best it found), then each integer program with what is left (past it the "
                  "answer says its proven gap), e.g. --time-limit 10");
  app->add_option("--search", flags->search,
                  "auto (default): the whole space where it can be built (always on up to two axes; past two, "
                  "within a quarter of --time-limit), else by neighbourhoods; whole: only the whole space (a proven "
                  "optimum or a refusal); neighbourhoods: the neighbourhood search, e.g. --search neighbourhoods");
  add_dtype_flag(*app, input.common.dtype, kProgramDTypeRule);
  add_hw_flag(*app, input.common.hw);
  add_json_flag(*app, input.common.json);
  app->footer(
      "The search: a spec for every input, param and einsum result (each mesh axis shards one letter, holds an\n"
      "einsum's partial sums, or is unused; uneven splits legal); every other tensor follows from its op. Each op is\n"
      "costed forward and backward by the same planner and duals as `shardmm program`; the objective is the\n"
      "serialized step time, subject to the per-device memory of --mem-limit. Dynamic programming solves it exactly;\n"
      "when the memory limit binds an integer program (CBC) does, and says 'optimal' or its proven gap. Past two\n"
      "mesh axes the whole space is too large to build but for small programs: it is then searched by\n"
      "neighbourhoods (one axis's places, then two axes', open in every tensor; each solved exactly), and the\n"
      "answer is a local optimum, said so (--search), with the compute bound no sharding beats (every device\n"
      "computing an even share, nothing communicated).\n"
      "Exit status: 0, 2 bad input or nothing fits, 3 wrong result (--run).\n\n"
      "Examples:\n"
      "  shardmm solve examples/programs/mlp_free.prog\n"
      "  shardmm solve examples/programs/mlp_free.prog --pin x='x[B_X, T, D]' --explain\n"
      "  shardmm solve examples/programs/mlp_free.prog --mesh X=2,Y=2 --dims B=8,T=64,D=256,F=1024\n"
      "  shardmm solve examples/programs/mlp_free.prog --mesh a=2,b=2,c=2 --dims B=8,T=64,D=256,F=1024\n"
      "  shardmm solve examples/programs/mlp_free.prog --mem-limit 700MiB --optimizer adam --top 3\n"
      "  shardmm solve examples/programs/tp_ffn.prog --run --emit /tmp/tp_ffn.solved.prog\n\n" +
      std::string(kDocsHint) + " docs/solve.md.");
  return {app, [flags](std::ostream& out) {
            const SolveRequest& f = *flags;
            if (f.emit) check_writable_file(*f.emit, "--emit '" + *f.emit + "'");
            SolveRequest request = f;
            request.leave_caches_to_exit = true;
            ProgressLine progress(1.0, /*terminal_only=*/true);
            if (process_rank(f.input.backend) == 0) {
              request.progress = [&progress](const solve::BuildProgress& p) {
                std::ostringstream what;
                what.imbue(std::locale::classic());
                what << "recording " << p.recorded << " op costs (" << std::fixed << std::setprecision(1) << p.seconds
                     << " s): `" << p.op << "`";
                progress.show(what.str());
              };
            }
            const SolveReport report = evaluate_solve(request);
            progress.clear();
            if (f.emit) write_file_atomically(*f.emit, pinned_program_text(report), "--emit '" + *f.emit + "'", false);
            const nn::ProgramRun* r = report.run ? &*report.run : nullptr;
            if (r && process_rank(f.input.backend) != 0) return r->verification.verified ? 0 : 3;
            if (f.input.common.json) {
              out << solve_json(f, report).dump(2) << "\n";
            } else {
              print_solve_report(out, f, report);
            }
            if (r && !r->verification.verified) {
              std::cerr << "shardmm: error: the step does not match the dense reference: " + r->verification.detail +
                               "\n";
              return 3;
            }
            return 0;
          }};
}

}  // namespace shardmm::cli
