// shardmm model LAYER --strategy S --mesh M [--split array|chunk] --dims ... [--train|--infer] [--run] [--backend]
//                     [--causal] [--activation] [--capacity-factor] [--dtype] [--hw] [--json] [--print-program]
// One training (or inference) step of a parallel layer: the layer's program with every
// tensor pinned by the strategy (nn::model_program), its collectives, bytes, memory and time
// predicted by the symbolic autodiff tape, and with --run the same program executed,
// measured and verified against its dense f64 step, as `shardmm program` does.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/program_common.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/nn/model.h"
#include "shardmm/nn/program.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {
namespace {

struct ModelFlags {
  std::string layer, strategy, dims;
  PlanningFlags common;
  bool infer = false, train = false, run = false, causal = false, print_program = false;
  std::optional<std::string> activation;
  std::optional<double> capacity_factor;
  std::string backend = "threads";
  bool backend_given = false;
};

// The flags that only some layers take, checked against the layer.
void check_layer_flags(const ModelFlags& f, nn::LayerKind layer) {
  const bool attends = layer == nn::LayerKind::attention || layer == nn::LayerKind::block;
  if (f.causal && !attends) {
    throw InputError("--causal applies to the attention and block layers; layer " + f.layer + " has no attention");
  }
  if (f.activation && layer == nn::LayerKind::attention) {
    throw InputError("--activation " + *f.activation + ": layer attention has no MLP to apply it to");
  }
  if (f.capacity_factor) {
    if (layer != nn::LayerKind::moe) {
      throw InputError("--capacity-factor applies to the moe layer; layer " + f.layer + " routes no tokens");
    }
    if (!(*f.capacity_factor > 0) || !std::isfinite(*f.capacity_factor)) {
      throw InputError("--capacity-factor " + format_sig3(*f.capacity_factor) +
                       ": must be a positive number (1.0 gives each expert its even share of a sequence's tokens)");
    }
  }
  if (f.train && f.infer)
    throw InputError("--train and --infer exclude each other; give one (training is the default)");
  if (f.backend_given && !f.run) {
    throw InputError("--backend " + f.backend + " chooses where --run executes the step; add --run or drop --backend");
  }
}

struct Row {
  autodiff::Phase phase;
  OpKind op;
  AxisList axes;
  nn::CollectiveTally predicted;
  std::optional<nn::CollectiveTally> measured;
  double measured_time_s = 0;  // device 0's time inside these collectives
};

std::vector<Row> rows_of(const nn::ProgramPrediction& p, const nn::ProgramRun* s) {
  std::vector<Row> rows;
  for (const nn::CollectiveTally& t : nn::tally_collectives(p.events))
    rows.push_back({t.phase, t.op, t.axes, t, {}, 0});
  if (!s) return rows;
  const auto row_of = [&rows](autodiff::Phase phase, OpKind op, const AxisList& axes) {
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const Row& r) { return r.phase == phase && r.op == op && r.axes == axes; });
    if (it == rows.end()) it = rows.insert(rows.end(), Row{phase, op, axes, {phase, op, axes}, {}, 0});
    return it;
  };
  for (const nn::CollectiveTally& t : nn::tally_collectives(s->events, &s->max_bytes_sent)) {
    row_of(t.phase, t.op, t.axes)->measured = t;
  }
  for (const autodiff::TapeEvent& e : s->events) {
    if (is_collective(e.step.op)) {
      row_of(e.phase, e.step.op, e.step.axes)->measured_time_s += e.measured.end_s - e.measured.start_s;
    }
  }
  return rows;
}

std::string strategy_line(const nn::ModelConfig& m) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < m.strategies.size(); ++i) {
    const MeshAxis& a = m.mesh.axis(m.axes[i]);
    parts.push_back(std::string(nn::to_string(m.strategies[i])) + " on axis " + a.name + " (" + std::to_string(a.size) +
                    ")");
  }
  return join(parts, ", ");
}

// The layer's input, its params and its output, as the program holds them between steps.
std::vector<int> stored_tensors(const program::Graph& g) {
  std::vector<int> out = {g.find("X")};
  for (int i : g.leaves()) {
    if (g.tensors[static_cast<std::size_t>(i)].role == program::Role::param) out.push_back(i);
  }
  out.push_back(g.find("Y"));
  return out;
}

std::string shape_text(const Shape& s) {
  std::vector<std::string> parts;
  for (std::int64_t x : s) parts.push_back(std::to_string(x));
  return "[" + join(parts, ", ") + "]";
}

void print_text(std::ostream& out, const ModelFlags& f, const Planning& p, const nn::ModelConfig& m,
                const program::Graph& g, const nn::ProgramPrediction& pred, const nn::ProgramRun* step) {
  out << "shardmm model " << f.layer << " --strategy " << f.strategy << " --mesh " << m.mesh.to_string()
      << (m.mesh.split_rule() == SplitRule::array ? "" : " --split " + std::string(to_string(m.mesh.split_rule())))
      << " --dims " << f.dims << ": one "
      << (m.train ? "training step (forward, backward, SGD)" : "inference step (forward)") << "\n\n";
  out << "  strategy  " << strategy_line(m) << "\n";
  out << "  dtype     " << to_string(p.options.dtype) << "\n";
  print_hardware(out, p);

  out << "\nTensors, as stored between steps (device 0's shard):\n";
  Table tensors({"tensor", "sharding", "global", "device 0"});
  for (int i : stored_tensors(g)) {
    Spec spec = pred.record.specs[static_cast<std::size_t>(i)];
    spec.tensor = g.tensors[static_cast<std::size_t>(i)].name;
    const Shape& shape = g.tensors[static_cast<std::size_t>(i)].shape;
    tensors.add(
        {spec.tensor, format_spec(spec, m.mesh), shape_text(shape), shape_text(local_shape(m.mesh, spec, shape, 0))});
  }
  tensors.print(out);

  const std::vector<Row> rows = rows_of(pred, step);
  out << "\nCollectives per step (bytes: the most any device sends)" << (step ? ", predicted | measured" : "") << ":\n";
  std::vector<std::string> header = {"phase", "collective", "count", "bytes", "time"};
  if (step) header.insert(header.end(), {"| count", "bytes", "device 0 time (with waits)"});
  Table table(header);
  int count = 0;
  std::int64_t bytes = 0;
  for (const Row& r : rows) {
    std::vector<std::string> cells = {
        autodiff::to_string(r.phase), std::string(to_string(r.op)) + " over " + m.mesh.axis_names(r.axes),
        std::to_string(r.predicted.count), format_bytes(static_cast<double>(r.predicted.bytes)),
        format_time(r.predicted.time_s)};
    if (step) {
      const nn::CollectiveTally got = r.measured.value_or(nn::CollectiveTally{r.phase, r.op, r.axes});
      cells.insert(cells.end(), {"| " + std::to_string(got.count), format_bytes(static_cast<double>(got.bytes)),
                                 format_time(r.measured_time_s)});
    }
    table.add(cells);
    count += r.predicted.count;
    bytes += r.predicted.bytes;
  }
  if (rows.empty()) {
    out << "  none: every device computes its part alone\n";
  } else {
    table.add({"total", "", std::to_string(count), format_bytes(static_cast<double>(bytes)), ""});
    for (std::size_t c : {2u, 3u, 4u}) table.right_align(c);
    table.print(out);
  }

  out << "\nMemory per device (device 0, the largest shards):\n";
  out << "  parameters   " << format_bytes(static_cast<double>(pred.memory.params))
      << (m.train ? " (and as much again for their gradients)" : "") << "\n";
  out << "  activations  " << format_bytes(static_cast<double>(pred.memory.activations))
      << (m.train ? " kept for the backward pass" : " (none kept: no backward pass)") << "\n";
  out << "  inputs       " << format_bytes(static_cast<double>(pred.memory.inputs)) << " (X and the loss's G)\n";

  const EventTimes t = event_times(pred.events);
  out << "\nPredicted time on " << p.options.hw.name << ": " << event_times_text(t) << " = "
      << format_time(t.comm + t.compute()) << " (serialized, no overlap)\n";
  if (step) {
    const Verification& v = step->verification;
    out << "\nRun (" << f.backend << ", " << m.mesh.device_count()
        << (m.mesh.device_count() == 1 ? " rank): " : " ranks): ") << (v.verified ? "verified" : "WRONG")
        << " against the dense f64 step of the layer's program (every computed tensor"
        << (m.train ? ", the input's and every weight's gradient, every weight's update" : "") << "; max abs error "
        << format_error(v.max_abs_error) << ", tolerance " << format_error(v.tolerance) << ")\n";
  }
}

Json tally_json(const nn::CollectiveTally& t) {
  Json j = Json::object();
  j["count"] = t.count;
  j["bytes"] = t.bytes;
  return j;
}

Json model_json(const ModelFlags& f, const Planning& p, const nn::ModelConfig& m, const program::Graph& g,
                const nn::ProgramPrediction& pred, const nn::ProgramRun* step) {
  Json doc = Json::object();
  doc["command"] = "model";
  doc["layer"] = f.layer;
  doc["strategy"] = f.strategy;
  add_mesh_json(doc, m.mesh);
  doc["dims"] = dims_json(m.dims);
  doc["train"] = m.train;
  doc["dtype"] = to_string(p.options.dtype);
  doc["hardware"] = p.options.hw.name;
  Json axes = Json::object();
  for (std::size_t i = 0; i < m.strategies.size(); ++i)
    axes[nn::to_string(m.strategies[i])] = m.mesh.axis(m.axes[i]).name;
  doc["strategy_axes"] = axes;
  Json tensors = Json::array();
  for (int i : stored_tensors(g)) {
    Spec spec = pred.record.specs[static_cast<std::size_t>(i)];
    spec.tensor = g.tensors[static_cast<std::size_t>(i)].name;
    const Shape& shape = g.tensors[static_cast<std::size_t>(i)].shape;
    tensors.push_back({{"name", spec.tensor},
                       {"spec", format_spec(spec, m.mesh)},
                       {"shape", shape},
                       {"device0_shape", local_shape(m.mesh, spec, shape, 0)}});
  }
  doc["tensors"] = tensors;
  Json collectives = Json::array();
  for (const Row& r : rows_of(pred, step)) {
    Json row = {{"phase", autodiff::to_string(r.phase)}, {"op", to_string(r.op)}, {"axes", Json::array()}};
    for (int a : r.axes) row["axes"].push_back(m.mesh.axis(a).name);
    row["predicted"] = tally_json(r.predicted);
    row["predicted"]["time_s"] = r.predicted.time_s;
    row["measured"] = nullptr;
    if (step) {
      row["measured"] = tally_json(r.measured.value_or(nn::CollectiveTally{r.phase, r.op, r.axes}));
      row["measured"]["device0_time_s"] = r.measured_time_s;
    }
    collectives.push_back(row);
  }
  doc["collectives"] = collectives;
  doc["memory"] = {{"parameter_bytes", pred.memory.params}, {"activation_bytes", pred.memory.activations}};
  const EventTimes t = event_times(pred.events);
  doc["predicted_time_s"] = {{"communication", t.comm},
                             {"compute", t.compute()},
                             {"einsum", t.einsum},
                             {"local", t.local},
                             {"total", t.comm + t.compute()}};
  doc["run"] = nullptr;
  if (step) {
    const Verification& v = step->verification;
    doc["run"] = {{"backend", f.backend},
                  {"verified", v.verified},
                  {"max_abs_error", v.max_abs_error},
                  {"tolerance", v.tolerance},
                  {"detail", v.detail}};
  }
  return doc;
}

}  // namespace

Command add_model_command(CLI::App& root) {
  auto flags = std::make_shared<ModelFlags>();
  // A run computes in f32 or f64; predictions need a profile with those peaks.
  flags->common.dtype = "f32";
  flags->common.fallback_hw = "h100";
  CLI::App* app = root.add_subcommand(
      "model",
      "one training step of a parallel layer: predicted collectives, bytes, memory and time; --run executes "
      "and verifies it");
  app->add_option("LAYER", flags->layer, "mlp, attention, block (attention + MLP with layer norms) or moe")->required();
  app->add_option("--strategy", flags->strategy, "tp, sp, dp, fsdp, ep, or two joined by '+', e.g. --strategy dp+tp")
      ->required();
  add_mesh_flag(*app, flags->common.mesh);
  add_split_flag(*app, flags->common.split);
  app->add_option("--dims", flags->dims,
                  "the layer's sizes: B batch, T sequence, D model width, F MLP width, H heads, E experts, K experts "
                  "per token, e.g. --dims B=8,T=1024,D=4096,F=16384,H=32")
      ->required();
  app->add_flag("--train", flags->train, "a training step: forward, backward and SGD (the default), e.g. --train");
  app->add_flag("--infer", flags->infer, "an inference step: forward only, e.g. --infer");
  app->add_flag("--causal", flags->causal, "attention sees only earlier positions (attention, block), e.g. --causal");
  app->add_option("--activation", flags->activation,
                  "the MLP's activation: relu, gelu (default) or silu, e.g. --activation relu");
  app->add_option("--capacity-factor", flags->capacity_factor,
                  "moe: tokens an expert takes per sequence, as a multiple of its even share T*K/E (default 1.25; "
                  "at most T, as no expert sees a token twice), e.g. --capacity-factor 2");
  app->add_flag("--run", flags->run,
                "also execute the step on real ranks, measure it and verify it against the "
                "dense single-device step, e.g. --run");
  app->add_option("--backend", flags->backend,
                  "where --run executes: threads (default) or mpi (under mpirun -n <devices>), e.g. --backend mpi")
      ->each([flags](const std::string&) { flags->backend_given = true; });
  add_dtype_flag(*app, flags->common.dtype);
  add_hw_flag(*app, flags->common.hw);
  add_json_flag(*app, flags->common.json);
  app->add_flag("--print-program", flags->print_program,
                "print the layer's program, every tensor pinned by the strategy, and stop: 'shardmm program' and "
                "'shardmm solve' take the text, e.g. --print-program > mlp_tp.prog");
  app->footer(
      "Strategies (each takes one mesh axis: the one named after it, else the axes in order):\n"
      "  tp    Megatron tensor parallel: W_in and Wq/Wk/Wv split by columns (F, heads), W_out and Wo by rows;\n"
      "        one all_reduce after each, and its dual in backward.\n"
      "  sp    tp plus sequence parallel: T split outside the tensor-parallel region; each all_reduce becomes a\n"
      "        reduce_scatter + all_gather of the same bytes, and layer norms keep 1/N of their activations.\n"
      "  dp    data parallel: B split, weights replicated, weight gradients all-reduced (2V per layer).\n"
      "  fsdp  fully sharded data parallel: B split, weights stored split and all-gathered for forward and again\n"
      "        for backward, gradients reduce-scattered (3V per layer: 1.5x dp).\n"
      "  ep    expert parallel (moe): B and the experts split; tokens go to their experts and back by all_to_all.\n"
      "Layers take: mlp B,T,D,F; attention B,T,D,H (H divides D); block B,T,D,F,H; moe B,T,D,F,E[,K].\n"
      "Combinations: dp+tp, dp+sp (mlp, attention, block). Uneven shards are legal.\n"
      "Each layer is a program (docs/programs.md) with every tensor pinned by the strategy (--print-program shows\n"
      "it); without --run every figure comes from the symbolic autodiff tape of the same program the run executes.\n"
      "Exit status: 0 (verified, with --run), 2 bad input, 3 wrong result. Defaults: --dtype f32, --hw calibrated when "
      "'shardmm calibrate' has written a profile, else h100.\n\n"
      "Examples:\n"
      "  shardmm model mlp --strategy tp --mesh X=8 --dims B=8,T=2048,D=4096,F=16384\n"
      "  shardmm model block --strategy sp --mesh X=4 --dims B=8,T=1024,D=4096,F=16384,H=32 --causal\n"
      "  shardmm model block --strategy dp+tp --mesh dp=2,tp=2 --dims B=4,T=16,D=32,F=64,H=4 --run\n"
      "  shardmm model moe --strategy ep --mesh X=4 --dims B=8,T=64,D=32,F=64,E=8,K=2 --run --dtype f64\n"
      "  mpirun -n 4 shardmm model mlp --strategy fsdp --mesh X=4 --dims B=8,T=4,D=16,F=32 --run --backend mpi\n\n" +
      std::string(kDocsHint) + " docs/model.md (this command).");
  return {app, [flags](std::ostream& out) {
            ModelFlags& f = *flags;
            f.common.dims = f.dims;
            const Planning p = make_planning(f.common);
            nn::ModelConfig m = nn::make_model_config(f.layer, f.strategy, p.mesh, p.sizes);
            check_layer_flags(f, m.layer);
            m.train = !f.infer;
            m.causal = f.causal;
            if (f.activation) m.activation = nn::parse_activation(*f.activation);
            if (f.capacity_factor) m.capacity_factor = *f.capacity_factor;
            if (f.print_program) {
              if (f.run || f.common.json) {
                throw InputError(std::string("--print-program prints the layer's program and nothing else; drop ") +
                                 (f.run ? "--run" : "--json") + " (run the printed text with 'shardmm program FILE')");
              }
              out << nn::model_program_text(m);
              return 0;
            }
            const program::Graph g = nn::model_program(m);
            nn::ProgramOptions options;
            options.dtype = p.options.dtype;
            options.hw = p.options.hw;
            options.train = m.train;
            const nn::ProgramPrediction pred = nn::predict_program(g, options);
            std::optional<nn::ProgramRun> step;
            if (f.run) {
              check_backend(f.backend, m.mesh);
              check_run_size(g, pred, p.options.dtype);
              if (p.options.dtype != DType::f32 && p.options.dtype != DType::f64) {
                throw InputError(std::string("--run computes in f32 or f64, not ") + to_string(p.options.dtype) +
                                 "; pass --dtype f32 or --dtype f64");
              }
              step = run_program_step(f.backend, g, options);
              if (process_rank(f.backend) != 0) return step->verification.verified ? 0 : 3;
            }
            const nn::ProgramRun* s = step ? &*step : nullptr;
            if (f.common.json) {
              out << model_json(f, p, m, g, pred, s).dump(2) << "\n";
            } else {
              print_text(out, f, p, m, g, pred, s);
            }
            if (s && !s->verification.verified) {
              std::cerr << "shardmm: error: the step does not match the dense reference: " + s->verification.detail +
                               "\n";
              return 3;
            }
            return 0;
          }};
}

}  // namespace shardmm::cli
