#include "cli/program_common.h"

#include "cli/common.h"
#include "shardmm/core/error.h"
#include "shardmm/core/files.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {

namespace {
// A program is text a person writes; anything larger is a mistake (a binary, a log).
inline constexpr std::size_t kMaxProgramBytes = 4 << 20;
// --run's dense f64 reference runs plain loops on one core.
inline constexpr double kMaxReferenceFlops = 5e9;
}  // namespace

program::Program read_program(const std::string& file) {
  const std::string text =
      read_small_file(file, kMaxProgramBytes, "program " + file, "is larger than a program can be (4 MiB)");
  return program::parse_program(text, file);
}

program::BindOptions program_bind_options(const std::optional<std::string>& mesh, const std::string& split,
                                          const std::optional<std::string>& dims, const std::vector<std::string>& pins,
                                          const std::string& pins_field) {
  program::BindOptions o;
  o.specs_field = pins_field;
  o.split = parse_split_rule(split);
  if (mesh) o.mesh = parse_mesh(*mesh, o.split);
  if (dims) o.dims = parse_dims(*dims);
  for (const std::string& s : pins) {
    const std::size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
      throw InputError(field(pins_field) + " '" + s + "': expected NAME=SPEC, e.g. " + field(pins_field) +
                       " w_in='w_in[D, F_X]'");
    }
    const std::string name = s.substr(0, eq);
    if (!o.specs.emplace(name, s.substr(eq + 1)).second) {
      throw InputError(field(pins_field) + " " + name + " is given twice; give each tensor one spec");
    }
  }
  return o;
}

BoundProgram bind_program(const ProgramInput& in, const std::string& pins_field) {
  if (in.train && in.infer) throw InputError("--train and --infer exclude each other; give one");
  const nn::Optimizer optimizer = nn::parse_optimizer(in.optimizer);
  program::Program parsed = in.text ? program::parse_program(*in.text, in.file) : read_program(in.file);
  program::Graph g =
      program::bind(parsed, program_bind_options(in.mesh, in.common.split, in.common.dims, in.pins, pins_field));
  PlanningFlags planning = in.common;
  planning.mesh = g.mesh.to_string();
  planning.dims.reset();
  // Steps are predicted for a GPU unless this machine is calibrated; --run computes in f64.
  planning.fallback_hw = "h100";
  if (!planning.dtype && in.run) planning.dtype = "f64";
  Planning p = make_planning(planning);
  if (in.train && g.loss < 0)
    throw InputError(field("train") + ": the program has no loss line; add one (loss sum(...))");
  const bool train = !in.infer && g.loss >= 0;
  if (in.run) {
    check_backend(in.backend, g.mesh);
    if (p.options.dtype != DType::f32 && p.options.dtype != DType::f64) {
      throw InputError(field("run") + " computes in f32 or f64, not " + to_string(p.options.dtype) + "; pass " +
                       field("dtype") + " f32 or " + field("dtype") + " f64");
    }
  }
  return {std::move(parsed), std::move(g), std::move(p), train, optimizer};
}

void EventTimes::add(const Step& step) {
  (is_collective(step.op) ? comm : multiplies(step.op) ? einsum : local) += step.time_s;
}

EventTimes event_times(const std::vector<autodiff::TapeEvent>& events) {
  EventTimes t;
  for (const autodiff::TapeEvent& e : events) t.add(e.step);
  return t;
}

std::string prediction_profile_note(const Planning& p) {
  if (p.hw_source != "built-in") return "";
  return "  (predicted on the built-in " + p.options.hw.name +
         " profile, not this machine: `shardmm calibrate` measures this one, which then becomes the default)\n";
}

std::string event_times_text(const EventTimes& t) {
  return "communication " + format_time(t.comm) + " + einsum " + format_time(t.einsum) + " + local " +
         format_time(t.local);
}

void print_collectives(std::ostream& out, const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events) {
  const std::vector<nn::CollectiveTally> tallies = nn::tally_collectives(events);
  out << "\nCollectives per step:\n";
  if (tallies.empty()) {
    out << "  none: every device computes its part alone\n";
    return;
  }
  Table table({"phase", "collective", "count", "bytes", "time"});
  for (const nn::CollectiveTally& t : tallies) {
    const std::string reduce = t.reduce == ReduceOp::max ? "(max)" : "";
    table.add({autodiff::to_string(t.phase), std::string(to_string(t.op)) + reduce + " over " + mesh.axis_names(t.axes),
               std::to_string(t.count), format_bytes(static_cast<double>(t.bytes)), format_time(t.time_s)});
  }
  for (std::size_t c : {2u, 3u, 4u}) table.right_align(c);
  table.print(out);
}

Json collectives_json(const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events) {
  Json collectives = Json::array();
  for (const nn::CollectiveTally& t : nn::tally_collectives(events)) {
    Json row = {{"phase", autodiff::to_string(t.phase)},
                {"op", to_string(t.op)},
                {"axes", Json::array()},
                {"count", t.count},
                {"bytes", t.bytes},
                {"time_s", t.time_s}};
    for (int a : t.axes) row["axes"].push_back(mesh.axis(a).name);
    if (t.op == OpKind::all_reduce) row["reduce"] = to_string(t.reduce);
    collectives.push_back(row);
  }
  return collectives;
}

std::string memory_point_text(const program::Graph& g, const nn::ProgramMemoryPoint& m) {
  if (m.phase == autodiff::Phase::update) return "the update";
  if (m.op < 0) return "reducing d" + m.tensor + " into " + m.tensor + "'s spec (backward)";
  const program::GraphOp& op = g.ops[static_cast<std::size_t>(m.op)];
  return "line " + std::to_string(op.where.line) + " (" + g.tensors[static_cast<std::size_t>(op.result)].name + " = " +
         op.expression + "), " + autodiff::to_string(m.phase);
}

Json memory_json(const program::Graph& g, const nn::ProgramMemory& m) {
  Json timeline = Json::array();
  for (const nn::ProgramMemoryPoint& p : m.timeline) {
    const program::GraphOp* op = p.op >= 0 ? &g.ops[static_cast<std::size_t>(p.op)] : nullptr;
    timeline.push_back({{"phase", autodiff::to_string(p.phase)},
                        {"line", op ? Json(op->where.line) : Json(nullptr)},
                        {"op", op ? Json(op->expression) : Json(nullptr)},
                        {"tensor", op ? g.tensors[static_cast<std::size_t>(op->result)].name : p.tensor},
                        {"param_bytes", p.params},
                        {"input_bytes", p.inputs},
                        {"gradient_bytes", p.gradients},
                        {"optimizer_state_bytes", p.optimizer_state},
                        {"activation_bytes", p.activations},
                        {"transient_bytes", p.transient},
                        {"total_bytes", p.total()}});
  }
  return {{"param_bytes", m.params},
          {"input_bytes", m.inputs},
          {"gradient_bytes", m.gradients},
          {"optimizer_state_bytes", m.optimizer_state},
          {"activation_bytes", m.activations},
          {"total_bytes", m.total()},
          {"peak_bytes", m.peak()},
          {"peak_point", m.timeline.empty() ? Json(nullptr) : Json(m.peak_point)},
          {"timeline", timeline}};
}

void check_run_size(const program::Graph& g, const nn::ProgramPrediction& pred, DType dtype) {
  double flops = 0;
  for (const autodiff::TapeEvent& e : pred.events) flops += e.step.flops;
  flops *= static_cast<double>(g.mesh.device_count());
  if (flops > kMaxReferenceFlops) {
    throw InputError(field("run") + " verifies the step against a dense single-device reference of about " +
                     format_flops(flops) + ", more than " + field("run") + " computes (" +
                     format_flops(kMaxReferenceFlops) + "); give smaller " + field("dims") + " with " + field("run") +
                     " (the prediction alone has no size limit)");
  }
  const double need = 2.0 * static_cast<double>(pred.memory.total()) * static_cast<double>(g.mesh.device_count()) * 8 /
                      dtype_bytes(dtype);
  if (need > static_cast<double>(available_memory())) {
    throw InputError(field("run") + " needs about " + format_bytes(need) +
                     " here (every device's shards and the dense f64 " + "reference) but " +
                     format_bytes(static_cast<double>(available_memory())) + " is available; give smaller " +
                     field("dims") + " with " + field("run"));
  }
}

nn::ProgramRun run_program_step(const std::string& backend, const program::Graph& g,
                                const nn::ProgramOptions& options) {
  nn::ProgramRun mine;
  run_backend(backend, g.mesh, [&](Communicator& comm) {
    nn::ProgramRun r = nn::run_program(comm, g, options);
    if (comm.rank() == 0 || !comm.capabilities().ranks_in_one_process) mine = std::move(r);
  });
  return mine;
}

}  // namespace shardmm::cli
