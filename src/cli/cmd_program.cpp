// shardmm program FILE [--mesh M] [--split array|chunk] [--dims ...] [--spec NAME=SPEC ...] [--train|--infer]
//                      [--optimizer sgd|adam] [--run] [--backend] [--seed] [--dtype] [--hw] [--json]
// A whole program (docs/programs.md): every tensor's sharding and where it came from, each
// op's collectives forward and backward with the reason for every reshard, bytes, predicted
// times per op and per phase, memory per device; with --run the same step executed on real
// ranks and verified against a dense f64 step of the program.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/program_common.h"
#include "shardmm/core/error.h"
#include "shardmm/core/files.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/npy.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/nn/program.h"
#include "shardmm/runtime/chrome_trace.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {
namespace {

// --input arrays: --run's sizes are small (kMaxReferenceFlops), so is what it reads.
inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 30;

struct ProgramFlags {
  ProgramRequest request;
  std::optional<std::string> save;   // a directory
  std::optional<std::string> trace;  // a Chrome trace file
  bool backend_given = false;
};

// --input NAME=FILE: the arrays, read and checked against the program's leaves.
std::map<std::string, nn::DenseTensor> read_inputs(const ProgramRequest& r, const program::Graph& g) {
  std::map<std::string, nn::DenseTensor> out;
  for (const std::string& item : r.inputs) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      throw InputError("--input '" + item + "': expected NAME=FILE.npy, e.g. --input x=x.npy");
    }
    const std::string name = item.substr(0, eq), file = item.substr(eq + 1);
    const std::string label = "--input " + name + " '" + file + "'";
    const NpyArray a = parse_npy(read_small_file(file, kMaxInputBytes, label, "is larger than 1 GiB"), label);
    if (!out.emplace(name, nn::DenseTensor{a.shape, a.values}).second) {
      throw InputError("--input " + name + " is given twice; give each tensor one array");
    }
  }
  nn::check_program_inputs(g, out);
  return out;
}

void save_results(const std::string& dir, const nn::ProgramRun& run) {
  for (const auto& [name, t] : run.results) {
    const std::filesystem::path path = std::filesystem::path(dir) / (name + ".npy");
    write_file_atomically(path, format_npy(t.shape, t.values), "--save '" + path.string() + "'", true);
  }
}

// Device 0's step as Chrome trace spans: with a run its measured spans, else the predicted
// ones laid end to end (the serialized timeline). Args: the program line and op, the phase,
// the predicted time (and the measured one).
std::vector<ChromeTraceEvent> trace_events(const program::Graph& g, const nn::ProgramPrediction& pred,
                                           const nn::ProgramRun* run) {
  std::vector<ChromeTraceEvent> out;
  double clock = 0;
  for (std::size_t i = 0; i < pred.events.size(); ++i) {
    const autodiff::TapeEvent& e = pred.events[i];
    ChromeTraceEvent t;
    t.name = op_name(e.step) + " " + e.step.tensor;
    t.start_s = clock;
    t.duration_s = e.step.time_s;
    clock += e.step.time_s;
    if (run && i < run->events.size()) {
      t.start_s = run->events[i].measured.start_s;
      t.duration_s = run->events[i].measured.end_s - run->events[i].measured.start_s;
      t.args.emplace_back("measured_time_s", t.duration_s);
    }
    t.args.emplace_back("phase", std::string(autodiff::to_string(e.phase)));
    if (e.scope >= 0) {
      const program::GraphOp& op = g.ops[static_cast<std::size_t>(e.scope)];
      t.args.emplace_back("line", static_cast<std::int64_t>(op.where.line));
      t.args.emplace_back("op", op.expression);
    }
    t.args.emplace_back("predicted_time_s", e.step.time_s);
    t.args.emplace_back("bytes_sent", e.step.bytes_sent);
    if (e.step.op == OpKind::local) {
      t.args.emplace_back("memory_bytes", e.step.memory_bytes);
      t.args.emplace_back("bound", std::string(to_string(e.step.bound)));
    }
    for (int lane : trace_lanes(e.step.op)) {
      t.tid = lane;
      t.category = lane == kCommunicationLane ? "communication" : "compute";
      out.push_back(t);
    }
  }
  // The memory timeline as a counter track: each point from the start of its op's first step
  // (its steps run in the timeline's order; an op without steps starts where the last ended).
  std::size_t next = 0;
  double at = 0;
  const auto start = [&](std::size_t i) {
    return run && i < run->events.size() ? run->events[i].measured.start_s : 0.0;
  };
  const auto end = [&](std::size_t i) { return run && i < run->events.size() ? run->events[i].measured.end_s : 0.0; };
  double clock_at = 0;  // the predicted clock at event `next`
  for (const nn::ProgramMemoryPoint& m : pred.memory.timeline) {
    const auto belongs = [&](const autodiff::TapeEvent& e) {
      return e.phase == m.phase && e.scope == m.op &&
             (m.op >= 0 || m.phase == autodiff::Phase::update || e.step.tensor == "d" + m.tensor);
    };
    if (next < pred.events.size() && belongs(pred.events[next])) at = run ? start(next) : clock_at;
    ChromeTraceEvent c;
    c.name = "memory (bytes)";
    c.counter = true;
    c.start_s = at;
    c.args = {{"params", m.params},           {"inputs", m.inputs},
              {"gradients", m.gradients},     {"optimizer_state", m.optimizer_state},
              {"activations", m.activations}, {"transient", m.transient}};
    out.push_back(std::move(c));
    while (next < pred.events.size() && belongs(pred.events[next])) {
      clock_at += pred.events[next].step.time_s;
      at = run ? end(next) : clock_at;
      ++next;
    }
  }
  return out;
}

std::string shape_text(const Shape& s) {
  std::vector<std::string> parts;
  for (std::int64_t x : s) parts.push_back(std::to_string(x));
  return "[" + join(parts, ", ") + "]";
}

std::string axes_text(const Mesh& mesh, const Step& step) {
  return step.axes.empty() ? "" : " over " + mesh.axis_names(step.axes);
}

// An event as one line: "all_reduce y over X, 64.0 MiB, 1.20 ms", "gelu h, 96.0 MiB read+written, 32 µs".
std::string event_text(const Mesh& mesh, const autodiff::TapeEvent& e) {
  std::string what = op_name(e.step) + " " + e.step.tensor + axes_text(mesh, e.step);
  if (is_collective(e.step.op)) what += ", " + format_bytes(static_cast<double>(e.step.bytes_sent));
  if (e.step.op == OpKind::local)
    what += ", " + format_bytes(static_cast<double>(e.step.memory_bytes)) + " read+written";
  if (e.step.flops > 0) what += ", " + format_flops(e.step.flops);
  what += ", " + format_time(e.step.time_s);
  const Confidence& c = e.step.confidence;
  return c.low() ? what + " (low confidence, ±" + format_time(c.uncertainty_s) + ": " + join(c.why, "; ") + ")" : what;
}

std::map<autodiff::Phase, EventTimes> phase_times(const std::vector<autodiff::TapeEvent>& events) {
  std::map<autodiff::Phase, EventTimes> out;
  for (const autodiff::TapeEvent& e : events) out[e.phase].add(e.step);
  return out;
}

// A phase's name as a column: "forward   ", "backward  ".
std::string pad(const std::string& word) { return word + std::string(word.size() < 10 ? 10 - word.size() : 1, ' '); }

std::string role_text(const program::Tensor& t) { return t.temporary ? "(nested)" : program::to_string(t.role); }

}  // namespace

void print_program_report(std::ostream& out, const ProgramRequest& request, const ProgramReport& report) {
  const ProgramInput& f = request.input;
  const Planning& p = report.bound.planning;
  const program::Graph& g = report.bound.graph;
  const bool train = report.bound.train;
  const nn::ProgramPrediction& pred = report.prediction;
  const nn::ProgramRun* run = report.run ? &*report.run : nullptr;
  out << "shardmm program " << f.file << ": one "
      << (train ? std::string("training step (forward, backward, ") + nn::to_string(report.bound.optimizer) + ")"
                : std::string("inference step (forward)"))
      << " on mesh " << describe_mesh(g.mesh) << "\n\n";
  out << "  dims      " << format_sizes(g.dims) << "\n";
  out << "  dtype     " << to_string(p.options.dtype) << "\n";
  print_hardware(out, p);

  out << "\nTensors (device 0's shard):\n";
  Table tensors({"tensor", "role", "sharding", "how", "global", "device 0"});
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    const program::Tensor& t = g.tensors[i];
    const Spec& s = pred.record.specs[i];
    tensors.add({t.name, role_text(t), format_spec(s, g.mesh), pred.record.origin[i], shape_text(t.shape),
                 shape_text(local_shape(g.mesh, s, t.shape, 0))});
  }
  tensors.print(out);

  // Each op with what it ran, forward and backward; then the leaves' gradients.
  std::map<int, std::vector<const autodiff::TapeEvent*>> by_op;
  for (const autodiff::TapeEvent& e : pred.events) by_op[e.scope].push_back(&e);
  out << "\nOps, with every step they run (bytes: the most any device sends, or moves in memory; times predicted):\n";
  for (std::size_t k = 0; k < g.ops.size(); ++k) {
    const program::GraphOp& op = g.ops[k];
    out << "  line " << op.where.line << "  "
        << format_spec(pred.record.specs[static_cast<std::size_t>(op.result)], g.mesh) << " = " << op.expression
        << "\n";
    for (const std::string& note : pred.record.notes[k]) out << "      reshard " << note << "\n";
    for (const autodiff::TapeEvent* e : by_op[static_cast<int>(k)]) {
      out << "      " << autodiff::to_string(e->phase) << "  " << event_text(g.mesh, *e) << "\n";
    }
  }
  // Scope -1: the leaves' gradient reductions (backward), then the update.
  for (const autodiff::Phase phase : {autodiff::Phase::backward, autodiff::Phase::update}) {
    bool any = false;
    for (const autodiff::TapeEvent* e : by_op[-1]) {
      if (e->phase != phase) continue;
      if (!any) {
        out << (phase == autodiff::Phase::update
                    ? "  the update (" + std::string(nn::to_string(report.bound.optimizer)) + ")\n"
                    : std::string("  gradients delivered in the leaves' specs\n"));
      }
      any = true;
      out << "      " << autodiff::to_string(e->phase) << "  " << event_text(g.mesh, *e) << "\n";
    }
  }

  print_collectives(out, g.mesh, pred.events);

  const nn::ProgramMemory& m = pred.memory;
  const auto bytes = [](std::int64_t b) { return format_bytes(static_cast<double>(b)); };
  out << "\nMemory per device (device 0, the largest shards):\n";
  out << "  params            " << bytes(m.params) << "\n";
  out << "  inputs            " << bytes(m.inputs) << "\n";
  if (train) {
    out << "  gradients         " << bytes(m.gradients) << " (every leaf's, in its spec)\n";
    out << "  optimizer state   " << bytes(m.optimizer_state) << " ("
        << (m.optimizer_state ? "adam: two moments per param element" : "sgd keeps none") << ")\n";
    out << "  activations       " << bytes(m.activations) << " kept for the backward pass\n";
  }
  // The peak of the step's timeline (docs/programs.md: what is live when), and what it holds.
  if (!m.timeline.empty()) {
    const nn::ProgramMemoryPoint& peak = m.timeline[m.peak_point];
    out << "  peak              " << bytes(peak.total()) << " during " << memory_point_text(g, peak) << "\n";
    out << "                    = params " << bytes(peak.params) << " + inputs " << bytes(peak.inputs);
    if (train) {
      out << " + gradients " << bytes(peak.gradients) << " + optimizer state " << bytes(peak.optimizer_state);
    }
    out << " + activations " << bytes(peak.activations) << " + transient " << bytes(peak.transient) << "\n";
  }

  const auto times = phase_times(pred.events);
  out << "\nPredicted time on " << p.options.hw.name
      << " (local: elementwise ops, norms, copies and the update, by memory traffic or measured arithmetic):\n";
  double comm = 0, compute = 0;
  for (const auto& [phase, t] : times) {
    out << "  " << pad(autodiff::to_string(phase)) << event_times_text(t) << "\n";
    comm += t.comm;
    compute += t.compute();
  }
  out << "  " << pad("step") << format_time(comm + compute) << " serialized, " << format_time(std::max(comm, compute))
      << " if every collective hid under compute (a lower bound)\n";
  if (run) {
    const Verification& v = run->verification;
    out << "\nRun (" << f.backend << ", " << g.mesh.device_count()
        << (g.mesh.device_count() == 1 ? " rank): " : " ranks): ") << (v.verified ? "verified" : "WRONG")
        << " against the dense f64 step of the program (every computed tensor"
        << (train ? ", every leaf's gradient, every param after the update" : "") << "; max abs error "
        << format_error(v.max_abs_error) << ", tolerance " << format_error(v.tolerance) << ")\n";
    const auto measured = [&](autodiff::Phase phase) {
      double s = 0;
      for (const autodiff::TapeEvent& e : run->events) {
        if (e.phase == phase) s += e.measured.end_s - e.measured.start_s;
      }
      return s;
    };
    for (const auto& [phase, t] : times) {
      out << "  " << pad(autodiff::to_string(phase)) << "measured " << format_time(measured(phase))
          << " on device 0 vs " << format_time(t.comm + t.compute()) << " predicted\n";
    }
    out << prediction_profile_note(p);
  }
}

namespace {

Json event_json(const Mesh& mesh, const autodiff::TapeEvent& e) {
  Json j = {{"phase", autodiff::to_string(e.phase)},
            {"op", to_string(e.step.op)},
            {"tensor", e.step.tensor},
            {"axes", Json::array()},
            {"bytes", e.step.bytes_sent},
            {"flops", e.step.flops},
            {"time_s", e.step.time_s}};
  for (int a : e.step.axes) j["axes"].push_back(mesh.axis(a).name);
  if (e.step.op == OpKind::local) {
    j["function"] = e.step.function;
    j["memory_bytes"] = e.step.memory_bytes;
    j["elements"] = e.step.elements;
    j["bound"] = e.step.bound == Bound::none ? Json(nullptr) : Json(to_string(e.step.bound));
  }
  add_confidence_json(j, e.step.confidence);
  return j;
}

}  // namespace

Json program_json(const ProgramRequest& request, const ProgramReport& report) {
  const ProgramInput& f = request.input;
  const Planning& p = report.bound.planning;
  const program::Graph& g = report.bound.graph;
  const bool train = report.bound.train;
  const nn::ProgramPrediction& pred = report.prediction;
  const nn::ProgramRun* run = report.run ? &*report.run : nullptr;
  Json doc = Json::object();
  doc["command"] = "program";
  doc["file"] = f.file;
  add_mesh_json(doc, g.mesh);
  doc["dims"] = dims_json(g.dims);
  doc["train"] = train;
  doc["optimizer"] = train ? Json(nn::to_string(report.bound.optimizer)) : Json(nullptr);
  doc["rings"] = request.input.rings;
  doc["dtype"] = to_string(p.options.dtype);
  doc["hardware"] = p.options.hw.name;
  Json tensors = Json::array();
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    const program::Tensor& t = g.tensors[i];
    const Spec& s = pred.record.specs[i];
    tensors.push_back({{"name", t.name},
                       {"role", role_text(t)},
                       {"spec", format_spec(s, g.mesh)},
                       {"how", pred.record.origin[i]},
                       {"shape", t.shape},
                       {"device0_shape", local_shape(g.mesh, s, t.shape, 0)}});
  }
  doc["tensors"] = tensors;
  Json ops = Json::array();
  std::map<int, Json> events;  // by scope; the update's apart (scope -1, as the leaves' reductions)
  Json update = Json::array();
  for (const autodiff::TapeEvent& e : pred.events) {
    if (e.phase == autodiff::Phase::update) {
      update.push_back(event_json(g.mesh, e));
      continue;
    }
    Json& list = events[e.scope];
    if (list.is_null()) list = Json::array();
    list.push_back(event_json(g.mesh, e));
  }
  for (std::size_t k = 0; k < g.ops.size(); ++k) {
    const program::GraphOp& op = g.ops[k];
    const Json& ev = events[static_cast<int>(k)];
    ops.push_back({{"line", op.where.line},
                   {"expression", op.expression},
                   {"result", g.tensors[static_cast<std::size_t>(op.result)].name},
                   {"reshards", pred.record.notes[k]},
                   {"steps", ev.is_null() ? Json::array() : ev}});
  }
  doc["ops"] = ops;
  doc["leaf_gradient_steps"] = events[-1].is_null() ? Json::array() : events[-1];
  doc["update_steps"] = update;
  doc["collectives"] = collectives_json(g.mesh, pred.events);
  const nn::ProgramMemory& m = pred.memory;
  doc["memory"] = memory_json(g, m);
  Json time = Json::object();
  double comm = 0, compute = 0;
  for (const auto& [phase, t] : phase_times(pred.events)) {
    time[autodiff::to_string(phase)] = {
        {"communication", t.comm}, {"compute", t.compute()}, {"einsum", t.einsum}, {"local", t.local}};
    comm += t.comm;
    compute += t.compute();
  }
  time["serialized"] = comm + compute;
  time["overlapped"] = std::max(comm, compute);
  doc["predicted_time_s"] = time;
  doc["run"] = nullptr;
  if (run) {
    const Verification& v = run->verification;
    doc["run"] = {{"backend", f.backend},
                  {"verified", v.verified},
                  {"max_abs_error", v.max_abs_error},
                  {"tolerance", v.tolerance},
                  {"detail", v.detail}};
  }
  return doc;
}

ProgramReport evaluate_program(const ProgramRequest& request) {
  const ProgramInput& in = request.input;
  if (!request.inputs.empty() && !in.run) throw InputError("--input works with --run; add --run");
  BoundProgram b = bind_program(in, "spec");
  const program::Graph& g = b.graph;
  nn::ProgramOptions options;
  options.dtype = b.planning.options.dtype;
  options.hw = b.planning.options.hw;
  options.train = b.train;
  options.optimizer = b.optimizer;
  options.rings = in.rings;
  options.seed = request.seed;
  options.inputs = read_inputs(request, g);
  nn::ProgramPrediction pred = nn::predict_program(g, options);
  std::optional<nn::ProgramRun> run;
  if (in.run) {
    check_run_size(g, pred, options.dtype);
    run = run_program_step(in.backend, g, options);
  }
  return {std::move(b), std::move(pred), std::move(run)};
}

Command add_program_command(CLI::App& root) {
  auto flags = std::make_shared<ProgramFlags>();
  ProgramInput& input = flags->request.input;
  CLI::App* app = root.add_subcommand(
      "program",
      "a whole sharded program from a file: every tensor's sharding, each op's collectives forward and "
      "backward, memory and time; --run executes and verifies it");
  app->add_option("FILE", input.file, "the program (docs/programs.md), e.g. examples/programs/mlp.prog")->required();
  app->add_option("--mesh", input.mesh, "the device mesh, replacing the file's mesh line, e.g. --mesh X=4,Y=2");
  add_split_flag(*app, input.common.split);
  app->add_option("--dims", input.common.dims,
                  "letter sizes, each replacing the file's (the others stay), e.g. --dims B=4,T=16");
  app->add_option("--spec", input.pins,
                  "pin a tensor's sharding, replacing the file's pin (a repeat block's tensor: every copy); "
                  "repeatable, e.g. --spec w_in='w_in[D, F_X]'");
  app->add_flag("--train", input.train,
                "a training step: forward, backward and the update (the default when the "
                "program has a loss), e.g. --train");
  app->add_flag("--infer", input.infer, "an inference step: forward only, e.g. --infer");
  app->add_option("--optimizer", input.optimizer, "the update: sgd (default) or adam, e.g. --optimizer adam");
  add_rings_flag(*app, input.rings);
  app->add_flag("--run", input.run,
                "also execute the step on real ranks and verify it against the dense f64 step, "
                "e.g. --run");
  app->add_option("--backend", input.backend,
                  "where --run executes: threads (default) or mpi (under mpirun -n <devices>), e.g. --backend mpi")
      ->each([flags](const std::string&) { flags->backend_given = true; });
  app->add_option("--seed", flags->request.seed, "the seed of the inputs' and params' values (--run), e.g. --seed 7");
  app->add_option("--input", flags->request.inputs,
                  "a leaf's values from a .npy file (--run; float64/32, int64/32 or bool, C order, the leaf's shape), "
                  "repeatable, e.g. --input x=x.npy");
  app->add_option("--save", flags->save,
                  "write every computed tensor and every leaf's gradient (NAME.grad) as NAME.npy into this directory "
                  "(--run), e.g. --save out/");
  app->add_option("--trace", flags->trace,
                  "write device 0's step as a Chrome trace (Perfetto): the predicted timeline, or with --run the "
                  "measured one, e.g. --trace step.json");
  add_dtype_flag(*app, input.common.dtype, kProgramDTypeRule);
  add_hw_flag(*app, input.common.hw);
  add_json_flag(*app, input.common.json);
  app->footer(
      "A program is one op per line in the Scaling Book's notation: einsums (a @ b), elementwise ops with\n"
      "broadcasting by letter, reductions, softmax and norms over a letter, reshapes, repeat blocks and a loss.\n"
      "Each tensor's sharding is pinned (in the file or by --spec) or follows from its op; every reshard an op\n"
      "needs is listed under it with the reason. Exit status: 0 (verified, with --run), 2 bad input, 3 wrong\n"
      "result. Defaults: --dtype f64 with --run (else f32 on a calibrated profile, else bf16), --hw calibrated\n"
      "when 'shardmm calibrate' has written a profile, else h100.\n\n"
      "Examples:\n"
      "  shardmm program examples/programs/mlp.prog\n"
      "  shardmm program examples/programs/mlp.prog --mesh X=2 --dims B=2,T=4,D=8,F=16 --run\n"
      "  shardmm program examples/programs/gpt.prog --spec x='x[B, T, D]' --json\n"
      "  shardmm program examples/programs/tp_ffn.prog --run --input x=examples/programs/tp_ffn/x.npy\n"
      "      --input a=examples/programs/tp_ffn/a.npy --input b=examples/programs/tp_ffn/b.npy\n"
      "  mpirun -n 4 shardmm program examples/programs/gpt.prog --run --backend mpi\n\n" +
      std::string(kDocsHint) + " docs/programs.md (the language and this command).");
  return {app, [flags](std::ostream& out) {
            const ProgramFlags& f = *flags;
            const ProgramInput& in = f.request.input;
            if (f.save && !in.run) throw InputError("--save works with --run; add --run");
            if (f.save) {
              std::error_code ec;
              if (f.save->empty() ||
                  (std::filesystem::exists(*f.save, ec) && !std::filesystem::is_directory(*f.save, ec))) {
                throw InputError("--save '" + *f.save +
                                 "': not a directory; name one (it is created when missing), "
                                 "e.g. --save out/");
              }
            }
            if (f.backend_given && !in.run) {
              throw InputError("--backend " + in.backend +
                               " chooses where --run executes the step; add --run or drop --backend");
            }
            if (f.trace) check_writable_file(*f.trace, "--trace '" + *f.trace + "'");
            const ProgramReport report = evaluate_program(f.request);
            const nn::ProgramRun* r = report.run ? &*report.run : nullptr;
            if (r && process_rank(in.backend) != 0) return r->verification.verified ? 0 : 3;
            if (r && f.save) save_results(*f.save, *r);
            if (f.trace) write_chrome_trace_file(*f.trace, trace_events(report.bound.graph, report.prediction, r));
            if (in.common.json) {
              out << program_json(f.request, report).dump(2) << "\n";
            } else {
              print_program_report(out, f.request, report);
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
