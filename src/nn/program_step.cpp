// A program recorded on the autodiff tape: each op's layout rule (nn/program.h), the
// reshards a rule or a pin inserts (with the reason, for the report), one step executed
// and verified or predicted.
#include <algorithm>
#include <cmath>

#include "shardmm/autodiff/causal_mask.h"
#include "shardmm/autodiff/reductions.h"
#include "shardmm/autodiff/shape_ops.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "nn/step_checks.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm::nn {

using autodiff::Var;
using program::Graph;
using program::GraphOp;
using program::OpKind;
using program::Role;

const char* to_string(Optimizer o) { return o == Optimizer::sgd ? "sgd" : "adam"; }

int update_blocks(Optimizer o) { return o == Optimizer::sgd ? 3 : 7; }

Optimizer parse_optimizer(std::string_view text) {
  if (text == "sgd") return Optimizer::sgd;
  if (text == "adam") return Optimizer::adam;
  throw InputError("unknown optimizer '" + std::string(text) + "' in " + field("optimizer") +
                   "; the optimizers are sgd and adam");
}

namespace {

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// x's layout with every letter sharded as `like` shards it where `like` has the letter, and
// no unreduced axes when `whole`; an axis that `like` gives a letter is taken off x's others.
Spec aligned_to(const Spec& x, const Spec& like, bool whole) {
  Spec out = x;
  for (DimSpec& d : out.dims) {
    const int j = like.find_dim(d.name);
    if (j >= 0) d.axes = like.dims[static_cast<std::size_t>(j)].axes;
  }
  for (std::size_t i = 0; i < out.dims.size(); ++i) {
    if (like.find_dim(out.dims[i].name) >= 0) continue;
    AxisList& axes = out.dims[i].axes;
    axes.erase(std::remove_if(axes.begin(), axes.end(), [&](int a) { return like.dim_of_axis(a) >= 0; }), axes.end());
  }
  if (whole) out.unreduced.clear();
  return out;
}

Spec whole(const Spec& x) {
  Spec out = x;
  out.unreduced.clear();
  return out;
}

Spec unsharded(const Spec& x, const std::vector<std::string>& letters) {
  Spec out = x;
  for (DimSpec& d : out.dims) {
    if (std::find(letters.begin(), letters.end(), d.name) != letters.end()) d.axes.clear();
  }
  return out;
}

// A route's dispatch on one rank: every group of `probs`' shard (its indices besides the
// tokens and the experts, which the shard holds whole) routed by moe_assign, a 1 at (token,
// expert, slot) for each kept choice in `out`, probs' letters then the capacity letter.
void route_shard(const DistTensor& probs, int tokens_dim, int experts_dim, int top, std::int64_t capacity,
                 DistTensor& out) {
  const Shape& local = probs.local_shape();
  const std::int64_t nt = local[static_cast<std::size_t>(tokens_dim)],
                     ne = local[static_cast<std::size_t>(experts_dim)];
  if (probs.elements() == 0) return;
  const std::int64_t groups = probs.elements() / (nt * ne);
  // By group: the local offset of each (token, expert) element, and its probability.
  std::vector<std::vector<std::int64_t>> offset(static_cast<std::size_t>(groups),
                                                std::vector<std::int64_t>(static_cast<std::size_t>(nt * ne)));
  std::vector<std::vector<double>> p(static_cast<std::size_t>(groups),
                                     std::vector<double>(static_cast<std::size_t>(nt * ne)));
  std::vector<std::int64_t> index(local.size(), 0);
  for (std::int64_t i = 0; i < probs.elements(); ++i) {
    std::int64_t group = 0;
    for (std::size_t d = 0; d < local.size(); ++d) {
      if (static_cast<int>(d) != tokens_dim && static_cast<int>(d) != experts_dim) group = group * local[d] + index[d];
    }
    const auto at = static_cast<std::size_t>(index[static_cast<std::size_t>(tokens_dim)] * ne +
                                             index[static_cast<std::size_t>(experts_dim)]);
    offset[static_cast<std::size_t>(group)][at] = i;
    p[static_cast<std::size_t>(group)][at] =
        probs.dtype() == DType::f32 ? probs.buffer().as<float>()[i] : probs.buffer().as<double>()[i];
    for (std::size_t d = local.size(); d-- > 0;) {
      if (++index[d] < local[d]) break;
      index[d] = 0;
    }
  }
  for (std::size_t group = 0; group < p.size(); ++group) {
    const auto choices = moe_assign(p[group], nt, ne, top, capacity);
    for (std::int64_t t = 0; t < nt; ++t) {
      for (const MoeChoice& c : choices[static_cast<std::size_t>(t)]) {
        if (!c.kept) continue;
        const std::int64_t o = offset[group][static_cast<std::size_t>(t * ne + c.expert)] * capacity + c.slot;
        if (out.dtype() == DType::f32) {
          out.buffer().as<float>()[o] = 1.0f;
        } else {
          out.buffer().as<double>()[o] = 1.0;
        }
      }
    }
  }
}

class Recorder {
 public:
  Recorder(autodiff::Tape& tape, const Graph& g, const ProgramOptions& options)
      : tape_(tape), g_(g), options_(options) {
    r_.values.resize(g.tensors.size());
    r_.specs.resize(g.tensors.size());
    r_.origin.resize(g.tensors.size());
    r_.notes.resize(g.ops.size());
  }

  ProgramRecord record() {
    for (int i : g_.leaves()) leaf(i);
    for (std::size_t k = 0; k < g_.ops.size(); ++k) {
      tape_.set_scope(static_cast<int>(k));
      op(static_cast<int>(k));
    }
    tape_.set_scope(-1);
    return std::move(r_);
  }

 private:
  const program::Tensor& tensor(int i) const { return g_.tensors[static_cast<std::size_t>(i)]; }
  const Mesh& mesh() const { return g_.mesh; }

  void leaf(int i) {
    const program::Tensor& t = tensor(i);
    Spec spec = t.pinned ? *t.pinned : program::replicated_spec(t);
    spec.tensor = t.name;
    // A leaf of a program is differentiable; solve's one-op graphs make a route's dispatch a leaf.
    r_.values[static_cast<std::size_t>(i)] = tape_.input(spec, t.shape, leaf_values(g_, i, options_), t.differentiable);
    r_.specs[static_cast<std::size_t>(i)] = spec;
    r_.origin[static_cast<std::size_t>(i)] =
        std::string(t.pinned ? "pinned" : "replicated (not pinned)") + (t.regathered ? ", regathered" : "");
  }

  // x resharded to `to`, noted with the reason, when it is not there already.
  Var moved(int op, Var x, const Spec& to, const std::string& why) {
    if (x.spec() == to) return x;
    Spec target = to;
    target.tensor = x.spec().tensor;
    r_.notes[static_cast<std::size_t>(op)].push_back(format_spec(x.spec(), mesh()) + " -> " +
                                                     format_spec(target, mesh()) + ": " + why);
    return autodiff::reshard(x, target);
  }

  Var whole_operand(int op, Var x, const std::string& function) {
    if (x.spec().unreduced.empty()) return x;
    return moved(op, x, whole(x.spec()), function + " needs whole values, not partial sums");
  }

  void op(int k) {
    const GraphOp& op = g_.ops[static_cast<std::size_t>(k)];
    const program::Tensor& out = tensor(op.result);
    std::vector<Var> in;
    for (int x : op.operands) in.push_back(r_.values[static_cast<std::size_t>(x)]);
    const std::string& f = op.op.function;
    Var y;
    std::string origin = "follows from its op";
    switch (op.op.kind) {
      case OpKind::einsum: {
        if (out.pinned) {
          Spec to = *out.pinned;
          to.tensor = out.name;
          y = autodiff::planned_einsum(in[0], in[1], to, keep(op.operands[0]), keep(op.operands[1]));
          tape_.set_name(y, out.name);
          r_.specs[static_cast<std::size_t>(op.result)] = to;
          r_.origin[static_cast<std::size_t>(op.result)] = "pinned";
          r_.values[static_cast<std::size_t>(op.result)] = y;
          return;
        }
        y = einsum(k, in[0], in[1], out, origin);
        break;
      }
      case OpKind::binary:
        y = binary(k, in[0], in[1], out.letters, f);
        break;
      case OpKind::unary: {
        const Var x = whole_operand(k, in[0], f);
        y = f == "relu"   ? autodiff::relu(x)
            : f == "gelu" ? autodiff::gelu(x)
            : f == "silu" ? autodiff::silu(x)
            : f == "tanh" ? autodiff::tanh(x)
                          : autodiff::exp(x);
        break;
      }
      case OpKind::scale:
        y = autodiff::scale(in[0], op.op.constant);
        break;
      case OpKind::reduce: {
        if (op.op.over.empty()) {
          y = f == "sum" ? autodiff::sum(in[0]) : autodiff::mean(in[0]);
        } else if (f == "max") {
          y = autodiff::reduce_max(whole_operand(k, in[0], f), op.op.over);
        } else {
          y = f == "sum" ? autodiff::reduce_sum(in[0], op.op.over) : autodiff::reduce_mean(in[0], op.op.over);
        }
        break;
      }
      case OpKind::normalize: {
        const Var x = whole_operand(k, in[0], f);
        y = f == "softmax"      ? autodiff::softmax(x, op.op.over)
            : f == "layer_norm" ? autodiff::layer_norm(x, op.op.over)
                                : autodiff::rms_norm(x, op.op.over);
        break;
      }
      case OpKind::causal_mask:
        y = autodiff::causal_mask(whole_operand(k, in[0], f), op.op.from[0], op.op.to[0]);
        break;
      case OpKind::transpose:
        y = autodiff::transpose(in[0], out.letters);
        break;
      case OpKind::rename:
        y = autodiff::rename(in[0], op.op.from[0], op.op.to[0]);
        break;
      case OpKind::route:
        y = route(k, in[0], out);
        break;
      case OpKind::split: {
        std::vector<std::pair<std::string, std::int64_t>> parts;
        for (const std::string& l : op.op.to) parts.emplace_back(l, g_.dims.at(l));
        Var x = in[0];
        if (!autodiff::can_split_locally(mesh(), x.spec(), x.shape(), op.op.from[0], parts)) {
          x = moved(k, x, unsharded(x.spec(), op.op.from),
                    "split needs '" + op.op.from[0] + "' whole or split along its first part's rows");
        }
        y = autodiff::split_dim(x, op.op.from[0], parts);
        break;
      }
      case OpKind::merge: {
        Var x = in[0];
        if (!autodiff::can_merge_locally(mesh(), x.spec(), x.shape(), op.op.from)) {
          x = moved(k, x, unsharded(x.spec(), op.op.from), "merge needs only its first letter sharded, by whole rows");
        }
        y = autodiff::merge_dims(x, op.op.from, op.op.to[0]);
        break;
      }
    }
    if (out.pinned) {
      Spec to = *out.pinned;
      y = moved(k, y, to, "pinned");
      origin = "pinned";
    }
    tape_.set_name(y, out.name);
    const Spec& spec = y.spec();
    r_.specs[static_cast<std::size_t>(op.result)] = spec;
    r_.origin[static_cast<std::size_t>(op.result)] = origin;
    r_.values[static_cast<std::size_t>(op.result)] = y;
  }

  // The local einsum where the operands' shardings allow it, else the planner's cheapest
  // layout (the Scaling Book's cases 2 and 4 need a collective first).
  Var einsum(int k, Var a, Var b, const program::Tensor& out, std::string& origin) {
    try {
      return autodiff::einsum(a, b, out.letters);
    } catch (const InputError& local) {
      Contraction c;
      c.a = a.spec();
      c.b = b.spec();
      c.out_tensor = out.name;
      c.out_dims = out.letters;
      DimSizes sizes;
      for (const std::string& l : c.all_dims()) sizes[l] = g_.dims.at(l);
      PlanOptions options;
      options.dtype = tape_.dtype();
      options.hw = options_.hw;
      const MatmulPlanning planning = plan_matmul(mesh(), c, sizes, options);
      if (planning.chosen < 0) throw;
      Spec to = planning.candidates[static_cast<std::size_t>(planning.chosen)].output;
      to.tensor = out.name;
      origin =
          "chosen by the matmul planner (the cheapest of " + std::to_string(planning.candidates.size()) + " plans)";
      r_.notes[static_cast<std::size_t>(k)].push_back("the operands' shardings cannot contract locally (" +
                                                      std::string(local.headline()) + "); planned to " +
                                                      format_spec(to, mesh()));
      const GraphOp& op = g_.ops[static_cast<std::size_t>(k)];
      return autodiff::planned_einsum(a, b, to, keep(op.operands[0]), keep(op.operands[1]));
    }
  }

  // A regathered param's all_gathers for an einsum drop their output after the forward pass.
  autodiff::Gathered keep(int tensor_index) const {
    return tensor(tensor_index).regathered ? autodiff::Gathered::regathered : autodiff::Gathered::kept;
  }

  // Routing compares a group's tokens for each expert's slots, so the tokens and the experts
  // are whole on each device; the other letters (the groups: sequences) keep their sharding.
  Var route(int k, Var probs, const program::Tensor& out) {
    const program::Op& o = g_.ops[static_cast<std::size_t>(k)].op;
    probs = whole_operand(k, probs, "route");
    probs = moved(k, probs, unsharded(probs.spec(), {o.over, o.from[0]}),
                  "route needs each group's tokens ('" + o.from[0] + "') and experts ('" + o.over + "') whole");
    Spec spec = probs.spec();
    spec.tensor = out.name;
    spec.dims.push_back({out.letters.back(), {}});
    const int tokens = probs.spec().find_dim(o.from[0]), experts = probs.spec().find_dim(o.over), top = o.top;
    const std::int64_t capacity = g_.dims.at(out.letters.back());
    return autodiff::data_from(
        probs, spec, out.shape,
        [=](const DistTensor& p, DistTensor& d) { route_shard(p, tokens, experts, top, capacity, d); }, "route");
  }

  // add, sub, mul with broadcasting: the operands agree letter by letter on the first
  // operand's sharding (the second's where only it has the letter).
  Var binary(int k, Var a, Var b, const std::vector<std::string>& letters, const std::string& f) {
    const bool keep_partial = f != "mul" && a.spec().unreduced == b.spec().unreduced;
    const std::string why = keep_partial ? ""
                            : f == "mul" ? "mul needs whole values"
                                         : f + " needs matching partial sums";
    a = moved(k, a, keep_partial ? a.spec() : whole(a.spec()), why);
    b = moved(k, b, aligned_to(b.spec(), a.spec(), !keep_partial),
              why.empty() ? f + " needs both operands' letters sharded alike" : why);
    return autodiff::binary(a, b,
                            f == "add"   ? autodiff::BinaryOp::add
                            : f == "sub" ? autodiff::BinaryOp::sub
                                         : autodiff::BinaryOp::mul,
                            letters);
  }

  autodiff::Tape& tape_;
  const Graph& g_;
  const ProgramOptions& options_;
  ProgramRecord r_;
};

// Device `device`'s memory: the leaves as the program stores them, and (training) what the
// tape holds for the backward pass, the gradients and the optimizer's state.
ProgramMemory memory_of(const autodiff::Tape& tape, const Graph& g, const ProgramRecord& r, const ProgramOptions& o,
                        std::int64_t device) {
  ProgramMemory out;
  for (int i : g.leaves()) {
    const auto u = static_cast<std::size_t>(i);
    const std::int64_t bytes = local_elements(g.mesh, r.specs[u], g.tensors[u].shape, device) * dtype_bytes(o.dtype);
    (g.tensors[u].role == Role::param ? out.params : out.inputs) += bytes;
  }
  const bool train = o.train && g.loss >= 0;
  if (train) {
    const autodiff::TapeMemory m = tape.memory();
    out.gradients = m.gradients;
    out.activations = m.activations;
    if (o.optimizer == Optimizer::adam) out.optimizer_state = 2 * out.params;
  }
  const auto point = [&](autodiff::Phase phase, int op, std::string tensor) {
    ProgramMemoryPoint p;
    p.phase = phase;
    p.op = op;
    p.tensor = std::move(tensor);
    p.params = out.params;
    p.inputs = out.inputs;
    p.optimizer_state = out.optimizer_state;
    return p;
  };
  for (const autodiff::MemoryPoint& m : tape.memory_timeline()) {
    ProgramMemoryPoint p = point(m.phase, m.scope, m.tensor);
    p.gradients = m.gradients;
    p.activations = m.activations;
    p.transient = m.transient;
    out.timeline.push_back(std::move(p));
  }
  if (train) {
    ProgramMemoryPoint p = point(autodiff::Phase::update, -1, "");
    p.gradients = out.gradients;
    out.timeline.push_back(std::move(p));
  }
  for (std::size_t i = 0; i < out.timeline.size(); ++i) {
    if (out.timeline[i].total() > out.timeline[out.peak_point].total()) out.peak_point = i;
  }
  return out;
}

}  // namespace

autodiff::TapeOptions tape_options(const ProgramOptions& options, autodiff::PlanCache* plans) {
  autodiff::TapeOptions t{options.dtype, options.hw, 0, plans};
  t.rings = options.rings;
  return t;
}

DistTensor::Generator leaf_values(const Graph& g, int tensor, const ProgramOptions& options) {
  const program::Tensor& t = g.tensors[static_cast<std::size_t>(tensor)];
  if (auto given = options.inputs.find(t.name); given != options.inputs.end()) {
    // Row-major strides of the global array; each element is its own value whatever the shard.
    const DenseTensor* values = &given->second;
    return [values](const Index& i, std::int64_t) {
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < i.size(); ++d) offset = offset * values->shape[d] + i[d];
      return values->values[static_cast<std::size_t>(offset)];
    };
  }
  const DistTensor::Generator uniform = uniform_values(options.seed * 0x100000001B3ull ^ name_hash(t.name));
  if (t.role != Role::param || t.shape.empty() || t.shape[0] == 0) return uniform;
  const double s = 1.0 / std::sqrt(static_cast<double>(t.shape[0]));
  return [uniform, s](const Index& i, std::int64_t r) { return s * uniform(i, r); };
}

void check_program_inputs(const Graph& g, const std::map<std::string, DenseTensor>& inputs) {
  for (const auto& [name, values] : inputs) {
    const int i = g.find(name);
    if (i < 0 || g.tensors[static_cast<std::size_t>(i)].role == Role::computed) {
      throw InputError(field("input") + " " + name + ": the program has no input or param '" + name + "'" +
                       (i >= 0 ? " (it is computed)" : ""));
    }
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(i)];
    if (values.shape != t.shape) {
      std::string want, got;
      for (std::int64_t n : t.shape) want += (want.empty() ? "" : ", ") + std::to_string(n);
      for (std::int64_t n : values.shape) got += (got.empty() ? "" : ", ") + std::to_string(n);
      throw InputError(field("input") + " " + name + ": an array of shape (" + got + ") for " +
                       format_spec(program::replicated_spec(t), g.mesh) + ", whose shape is (" + want + ")");
    }
  }
}

ProgramRecord record_program(autodiff::Tape& tape, const Graph& g, const ProgramOptions& options) {
  if (!(tape.mesh() == g.mesh)) throw InputError("record_program: the tape's mesh is not the program's");
  check_program_inputs(g, options.inputs);
  return Recorder(tape, g, options).record();
}

ProgramPrediction predict_program(const Graph& g, const ProgramOptions& options) {
  autodiff::Tape tape(g.mesh, tape_options(options));
  ProgramPrediction p;
  p.record = record_program(tape, g, options);
  if (options.train && g.loss >= 0) {
    tape.backward(p.record.values[static_cast<std::size_t>(g.loss)]);
    for (int t : g.leaves()) {
      if (g.tensors[static_cast<std::size_t>(t)].role != Role::param) continue;
      tape.update(p.record.values[static_cast<std::size_t>(t)], to_string(options.optimizer),
                  update_blocks(options.optimizer), {});
    }
  }
  p.events = tape.events();
  p.memory = memory_of(tape, g, p.record, options, 0);
  return p;
}

ExecutedStep execute_program_step(autodiff::Tape& tape, const Graph& g, const ProgramOptions& options) {
  if (options.dtype != DType::f32 && options.dtype != DType::f64) {
    throw InputError(std::string("a program runs in f32 or f64; got ") + to_string(options.dtype) + " in " +
                     field("dtype"));
  }
  const bool train = options.train && g.loss >= 0;
  ExecutedStep step;
  step.record = record_program(tape, g, options);
  const std::vector<Var>& v = step.record.values;
  if (!train) return step;
  tape.backward(v[static_cast<std::size_t>(g.loss)]);
  step.updated.resize(g.tensors.size());
  for (int t : g.leaves()) {
    if (g.tensors[static_cast<std::size_t>(t)].role != Role::param) continue;
    const Var leaf = v[static_cast<std::size_t>(t)];
    const DistTensor& grad = tape.grad(leaf);
    const DistTensor& w = leaf.value();
    DistTensor& updated = step.updated[static_cast<std::size_t>(t)] =
        DistTensor(g.mesh, w.device(), w.spec(), w.global_shape(), options.dtype);
    tape.update(leaf, to_string(options.optimizer), update_blocks(options.optimizer), [&] {
      for (std::int64_t i = 0; i < updated.elements(); ++i) {
        if (options.dtype == DType::f32) {
          updated.buffer().as<float>()[i] = static_cast<float>(
              updated_value(options.optimizer, w.buffer().as<float>()[i], grad.buffer().as<float>()[i], options.lr));
        } else {
          updated.buffer().as<double>()[i] =
              updated_value(options.optimizer, w.buffer().as<double>()[i], grad.buffer().as<double>()[i], options.lr);
        }
      }
    });
  }
  return step;
}

ProgramRun run_program(Communicator& comm, const Graph& g, const ProgramOptions& options) {
  if (!(comm.mesh() == g.mesh)) throw InputError("run_program: the communicator's mesh is not the program's");
  const bool train = options.train && g.loss >= 0;
  autodiff::Tape tape(comm, tape_options(options));
  ExecutedStep step = execute_program_step(tape, g, options);
  ProgramRun run;
  run.record = std::move(step.record);
  const std::vector<Var>& v = run.record.values;

  // Everything to device 0 first (every rank takes part), then compared there.
  std::vector<std::pair<std::string, std::vector<double>>> got;
  std::vector<std::pair<int, int>> what;  // (tensor, 0 value | 1 gradient | 2 updated)
  auto take = [&](int t, int kind, const DistTensor& shard) {
    const std::string& name = g.tensors[static_cast<std::size_t>(t)].name;
    got.emplace_back(kind == 0 ? name : (kind == 1 ? "gradient of " : "updated ") + name, gather_global(comm, shard));
    what.emplace_back(t, kind);
  };
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].role == Role::computed && !g.tensors[t].temporary) take(static_cast<int>(t), 0, v[t].value());
  }
  if (train) {
    for (int t : g.leaves()) {
      take(t, 1, tape.grad(v[static_cast<std::size_t>(t)]));
      if (g.tensors[static_cast<std::size_t>(t)].role == Role::param)
        take(t, 2, step.updated[static_cast<std::size_t>(t)]);
    }
  }

  run.events = tape.events();
  run.max_bytes_sent = detail::max_bytes_sent(comm, run.events);
  run.memory = memory_of(tape, g, run.record, options, comm.rank());
  Verification& verdict = run.verification;
  verdict.verified = true;
  if (comm.rank() == 0) {
    ProgramOptions dense_options = options;
    dense_options.train = train;
    const DenseProgramStep want = dense_program_step(g, dense_options);
    const double rel = options.dtype == DType::f64 ? 1e-9 : 1e-3;
    for (std::size_t k = 0; k < got.size(); ++k) {
      const auto [t, kind] = what[k];
      const auto u = static_cast<std::size_t>(t);
      if (kind == 2) {
        // The update of the gradient the step computed (got[k - 1], just checked against the
        // dense one): Adam's first step, lr g / (|g| + eps), turns a gradient that is zero but
        // for rounding into a step of up to lr either way, which the dense update of the dense
        // gradient need not match.
        const std::vector<double>& grad = got[k - 1].second;
        std::vector<double> expected(grad.size());
        for (std::size_t i = 0; i < grad.size(); ++i)
          expected[i] = updated_value(options.optimizer, want.values[u].values[i], grad[i], options.lr);
        detail::compare(verdict, got[k].first, got[k].second, expected, rel);
        continue;
      }
      const DenseTensor& expected = kind == 0 ? want.values[u] : want.grads[u];
      detail::compare(verdict, got[k].first, got[k].second, expected.values, rel);
      run.results.emplace_back(g.tensors[u].name + (kind == 1 ? ".grad" : ""),
                               DenseTensor{g.tensors[u].shape, got[k].second});
    }
  }
  detail::share_verdict(comm, verdict);
  for (Var& x : run.record.values) x = Var();
  return run;
}

}  // namespace shardmm::nn
