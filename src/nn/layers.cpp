#include "shardmm/nn/layers.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "nn/step_checks.h"
#include "shardmm/autodiff/causal_mask.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"

namespace shardmm::nn {
namespace {

using autodiff::Gathered;
using autodiff::Var;

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// The fan-in of a weight: the product of the dimensions its einsum contracts.
std::int64_t fan_in(const ModelConfig& m, const std::string& tensor) {
  const auto& d = m.dims;
  if (tensor == "W_out") return d.at("F");
  if (tensor == "Wo") return d.at("H") * d.at("A");
  return d.at("D");  // Wq, Wk, Wv, W_in, W_router
}

// Records a layer's pieces on one tape; `f` is the tensor-parallel axis (tp or sp).
class Recorder {
 public:
  Recorder(autodiff::Tape& tape, const ModelConfig& m, std::uint64_t seed) : tape_(tape), m_(m), seed_(seed) {
    for (Strategy s : {Strategy::tp, Strategy::sp}) {
      if (m.has(s)) tensor_axes_ = {m.axis_of(s)};
    }
    sequence_parallel_ = m.has(Strategy::sp);
    if (m.has(Strategy::fsdp)) fsdp_axes_ = {m.axis_of(Strategy::fsdp)};
  }

  LayerProgram record() {
    LayerProgram p;
    const TensorLayout in = input_layout(m_);
    p.input = tape_.input(in.spec, in.shape, step_values(m_, "X", seed_), m_.train);
    for (const TensorLayout& t : parameter_layouts(m_)) {
      p.parameters.emplace_back(t, tape_.input(t.spec, t.shape, step_values(m_, t.name, seed_), m_.train));
      params_.emplace(t.name, p.parameters.back().second);
    }
    switch (m_.layer) {
      case LayerKind::mlp: p.output = reduced(mlp(gathered(p.input))); break;
      case LayerKind::attention: p.output = reduced(attention(gathered(p.input))); break;
      case LayerKind::block: p.output = block(p.input); break;
      case LayerKind::moe: p.output = moe(p.input); break;
    }
    if (m_.train) {
      const TensorLayout out = output_layout(m_);
      const Var g = tape_.input(out.spec, out.shape, step_values(m_, "G", seed_), false);
      p.loss = autodiff::einsum(p.output, g, {});
    }
    return p;
  }

 private:
  // A weight as its einsum uses it: FSDP gathers the stored split (again in backward).
  Var weight(const std::string& name) {
    const Var w = params_.at(name);
    if (fsdp_axes_.empty()) return w;
    const Spec& spec = w.spec();
    for (const DimSpec& d : spec.dims) {
      if (!d.axes.empty()) return autodiff::all_gather(w, d.name, fsdp_axes_, Gathered::regathered);
    }
    return w;
  }

  // Sequence parallel: the T-split input made whole for the tensor-parallel region.
  Var gathered(Var x) { return sequence_parallel_ ? autodiff::all_gather(x, "T", tensor_axes_) : x; }
  // The row-parallel partial sums finished: reduce_scatter over T (sp) or all_reduce (tp).
  Var reduced(Var z) {
    if (tensor_axes_.empty()) return z;
    return sequence_parallel_ ? autodiff::reduce_scatter(z, "T", tensor_axes_) : autodiff::all_reduce(z, tensor_axes_);
  }

  Var activation(Var h) const {
    switch (m_.mlp.activation) {
      case Activation::relu: return autodiff::relu(h);
      case Activation::gelu: return autodiff::gelu(h);
      case Activation::silu: return autodiff::silu(h);
    }
    return h;
  }

  Var mlp(Var x) {
    const Var h = autodiff::einsum(x, weight("W_in"), {"B", "T", "F"});
    return autodiff::einsum(activation(h), weight("W_out"), {"B", "T", "D"});
  }

  Var attention(Var x) {
    const Var q = autodiff::einsum(x, weight("Wq"), {"B", "T", "H", "A"});
    const Var k = autodiff::rename(autodiff::einsum(x, weight("Wk"), {"B", "T", "H", "A"}), "T", "S");
    const Var v = autodiff::rename(autodiff::einsum(x, weight("Wv"), {"B", "T", "H", "A"}), "T", "S");
    Var scores = autodiff::scale(autodiff::einsum(q, k, {"B", "H", "T", "S"}),
                                 1.0 / std::sqrt(static_cast<double>(m_.dims.at("A"))));
    if (m_.attention.causal) scores = autodiff::causal_mask(scores, "T", "S");
    const Var heads = autodiff::einsum(autodiff::softmax(scores), v, {"B", "T", "H", "A"});
    return autodiff::einsum(heads, weight("Wo"), {"B", "T", "D"});
  }

  Var layer_norm(Var x) {
    const std::int64_t d = m_.dims.at("D");
    if (!norm_scale_.valid()) {
      norm_scale_ = tape_.input(tape_.spec("gamma[D]"), {d}, [](const Index&, std::int64_t) { return 1.0; });
      norm_bias_ = tape_.input(tape_.spec("beta[D]"), {d}, [](const Index&, std::int64_t) { return 0.0; });
    }
    return autodiff::layer_norm(x, norm_scale_, norm_bias_, kLayerNormEps);
  }

  Var block(Var x) {
    const Var a = autodiff::add(x, reduced(attention(gathered(layer_norm(x)))));
    return autodiff::add(a, reduced(mlp(gathered(layer_norm(a)))));
  }

  Var moe(Var x) {
    const MoeConfig cfg = m_.moe();
    const std::int64_t e = m_.dims.at("E"), t = m_.dims.at("T");
    DimSizes sizes = m_.dims;
    sizes["C"] = moe_capacity(cfg, t, e);
    const Var probs = autodiff::softmax(autodiff::einsum(x, weight("W_router"), {"B", "T", "E"}));
    // Routing is data: each rank routes its own sequences from its probabilities.
    std::map<std::vector<std::int64_t>, double> slots;  // (b, t, e, c) -> 1
    if (!tape_.symbolic()) {
      const DistTensor& p = probs.value();
      const std::int64_t b0 = p.box()[0].offset, local_b = p.local_shape()[0];
      for (std::int64_t b = 0; b < local_b; ++b) {
        std::vector<double> mine(static_cast<std::size_t>(t * e));
        for (std::size_t i = 0; i < mine.size(); ++i) {
          mine[i] = p.dtype() == DType::f32 ? p.buffer().as<float>()[b * t * e + static_cast<std::int64_t>(i)]
                                            : p.buffer().as<double>()[b * t * e + static_cast<std::int64_t>(i)];
        }
        const auto route = moe_assign(cfg, mine, t, e);
        for (std::int64_t pos = 0; pos < t; ++pos) {
          for (const MoeChoice& c : route[static_cast<std::size_t>(pos)]) {
            if (c.kept) slots[{b0 + b, pos, c.expert, c.slot}] = 1.0;
          }
        }
      }
    }
    const std::string b = x.spec().dims[0].axes.empty() ? "B" : "B_{" + m_.mesh.axis(x.spec().dims[0].axes[0]).name + "}";
    const Var dispatch = tape_.input(tape_.spec("dispatch[" + b + ", T, E, C]"),
                                     {m_.dims.at("B"), t, e, sizes.at("C")},
                                     [slots](const Index& i, std::int64_t) {
                                       const auto it = slots.find(i);
                                       return it == slots.end() ? 0.0 : it->second;
                                     });
    Var buffers = autodiff::einsum(x, dispatch, {"B", "E", "C", "D"});
    const bool expert_parallel = m_.has(Strategy::ep);
    const AxisList ep = expert_parallel ? AxisList{m_.axis_of(Strategy::ep)} : AxisList{};
    if (expert_parallel) buffers = autodiff::all_to_all(buffers, "B", "E", ep);
    const Var h = autodiff::einsum(buffers, weight("W_in"), {"B", "E", "C", "F"});
    Var out = autodiff::einsum(activation(h), weight("W_out"), {"B", "E", "C", "D"});
    if (expert_parallel) out = autodiff::all_to_all(out, "E", "B", ep);
    const Var gates = autodiff::einsum(probs, dispatch, {"B", "T", "E", "C"});
    return autodiff::einsum(gates, out, {"B", "T", "D"});
  }

  autodiff::Tape& tape_;
  const ModelConfig& m_;
  std::uint64_t seed_;
  AxisList tensor_axes_, fsdp_axes_;
  bool sequence_parallel_ = false;
  std::map<std::string, Var> params_;
  Var norm_scale_, norm_bias_;
};

// A dense tensor from the step's generator.
DenseTensor dense_of(const ModelConfig& m, const std::string& name, const Shape& shape, std::uint64_t seed) {
  const DistTensor::Generator gen = step_values(m, name, seed);
  return dense(shape, [&](const std::vector<std::int64_t>& i) { return gen(i, 0); });
}

// The layer's input is the previous layer's output: where a backward reads it (tp's
// replicated X, like sp's gathered copy of its shard) it is an activation kept for the
// backward pass, counted as one rather than as a leaf, so strategies compare like with like.
autodiff::TapeMemory layer_memory(const autodiff::Tape& tape, const LayerProgram& p) {
  autodiff::TapeMemory m = tape.memory();
  const std::int64_t input = tape.bytes_saved_for_backward(p.input);
  m.leaves -= input;
  m.activations += input;
  return m;
}

}  // namespace

DistTensor::Generator step_values(const ModelConfig& m, const std::string& tensor, std::uint64_t seed) {
  const DistTensor::Generator uniform = uniform_values(seed * 0x100000001B3ull ^ name_hash(tensor));
  if (tensor == "X" || tensor == "G") return uniform;
  const double s = 1.0 / std::sqrt(static_cast<double>(fan_in(m, tensor)));
  return [uniform, s](const Index& i, std::int64_t r) { return s * uniform(i, r); };
}

LayerProgram record_layer(autodiff::Tape& tape, const ModelConfig& m, std::uint64_t seed) {
  return Recorder(tape, m, seed).record();
}

DenseStep dense_layer_step(const ModelConfig& m, double lr, std::uint64_t seed) {
  Params params;
  for (const TensorLayout& t : parameter_layouts(m)) params[t.name] = dense_of(m, t.name, t.shape, seed);
  const TensorLayout in = input_layout(m);
  const DenseTensor x = dense_of(m, "X", in.shape, seed);
  // Inference compares the output only; its G is never used, so any seed of dY does.
  const DenseTensor dy = dense_of(m, "G", in.shape, seed);
  switch (m.layer) {
    case LayerKind::mlp: return mlp_step(m.mlp, params, x, dy, lr);
    case LayerKind::attention: return attention_step(m.attention, params, x, dy, lr);
    case LayerKind::block: return block_step({m.attention, m.mlp}, params, x, dy, lr);
    case LayerKind::moe: return moe_step(m.moe(), params, x, dy, lr);
  }
  throw std::logic_error("unknown layer");
}

LayerStep run_layer_step(Communicator& comm, const ModelConfig& m, const StepOptions& options) {
  if (options.dtype != DType::f32 && options.dtype != DType::f64) {
    throw InputError(std::string("a layer step computes in f32 or f64; got ") + to_string(options.dtype));
  }
  autodiff::Tape tape(comm, {options.dtype, options.hw, 0});
  const LayerProgram p = record_layer(tape, m, options.seed);
  if (m.train) tape.backward(p.loss);

  // Gather everything to device 0 first (every rank takes part), then compare there.
  std::vector<std::pair<std::string, std::vector<double>>> got;
  got.emplace_back("output", gather_global(comm, p.output.value()));
  if (m.train) {
    got.emplace_back("input gradient", gather_global(comm, tape.grad(p.input)));
    for (const auto& [layout, var] : p.parameters) {
      const DistTensor& g = tape.grad(var);
      DistTensor updated(m.mesh, comm.rank(), layout.spec, layout.shape, options.dtype);
      for (std::int64_t i = 0; i < updated.elements(); ++i) {
        if (options.dtype == DType::f32) {
          updated.buffer().as<float>()[i] = var.value().buffer().as<float>()[i] -
                                            static_cast<float>(options.lr) * g.buffer().as<float>()[i];
        } else {
          updated.buffer().as<double>()[i] =
              var.value().buffer().as<double>()[i] - options.lr * g.buffer().as<double>()[i];
        }
      }
      got.emplace_back("gradient of " + layout.name, gather_global(comm, g));
      got.emplace_back("updated " + layout.name, gather_global(comm, updated));
    }
  }

  LayerStep step;
  step.events = tape.events();
  step.memory = layer_memory(tape, p);
  step.max_bytes_sent = detail::max_bytes_sent(comm, step.events);

  Verification& v = step.verification;
  v.verified = true;
  if (comm.rank() == 0) {
    const DenseStep want = dense_layer_step(m, options.lr, options.seed);
    const double rel = options.dtype == DType::f64 ? 1e-9 : 1e-3;
    detail::compare(v, "output", got[0].second, want.output.values, rel);
    if (m.train) {
      detail::compare(v, "input gradient", got[1].second, want.input_grad.values, rel);
      std::size_t k = 2;
      for (const auto& [layout, var] : p.parameters) {
        detail::compare(v, got[k].first, got[k].second, want.grads.at(layout.name).values, rel);
        detail::compare(v, got[k + 1].first, got[k + 1].second, want.updated.at(layout.name).values, rel);
        k += 2;
      }
    }
  }
  detail::share_verdict(comm, v);
  return step;
}

LayerPrediction predict_layer(const ModelConfig& m, DType dtype, const HardwareProfile& hw) {
  autodiff::Tape tape(m.mesh, {dtype, hw, 0});
  const LayerProgram p = record_layer(tape, m, 1);
  if (m.train) tape.backward(p.loss);
  return {tape.events(), layer_memory(tape, p)};
}

std::vector<CollectiveTally> tally_collectives(const std::vector<autodiff::TapeEvent>& events,
                                               const std::vector<std::int64_t>* bytes) {
  std::vector<CollectiveTally> out;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const autodiff::TapeEvent& e = events[i];
    if (!is_collective(e.step.op)) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const CollectiveTally& t) {
                             return t.phase == e.phase && t.op == e.step.op && t.axes == e.step.axes &&
                                    t.reduce == e.step.reduce;
                           });
    if (it == out.end()) it = out.insert(out.end(), CollectiveTally{e.phase, e.step.op, e.step.axes, 0, 0, 0, e.step.reduce});
    ++it->count;
    it->bytes += bytes ? (*bytes)[i] : e.step.bytes_sent;
    it->time_s += e.step.time_s;
  }
  return out;
}

}  // namespace shardmm::nn
