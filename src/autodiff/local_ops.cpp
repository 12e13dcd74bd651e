// Ops computed on each rank's block alone: activations, SwiGLU, mul, add, scale, rename,
// softmax, layer norm, sum and mean. Their backwards are linear in the output gradient, so a
// gradient unreduced over an axis the value does not use stays unreduced (tape.h).
#include "autodiff/local_ops.h"

#include <cmath>
#include <cstring>

#include "shardmm/autodiff/shape_ops.h"
#include "shardmm/core/error.h"

namespace shardmm::autodiff {

void require_whole(const Mesh& mesh, const Spec& spec, const char* op) {
  if (!spec.unreduced.empty()) {
    throw InputError(std::string(op) + " of " + format_spec(spec, mesh) + ": the value is unreduced over " +
                     mesh.axis_names(spec.unreduced) + " (partial sums) and " + op +
                     " needs whole values; all_reduce or reduce_scatter it first");
  }
}

Tape& same_tape(Var a, Var b, const char* op) {
  if (&a.tape() != &b.tape()) throw InputError(std::string(op) + ": the operands belong to different tapes");
  return a.tape();
}

Value relabeled(Tape::Impl& t, const Value& v, Spec spec, const Shape& shape) {
  Value out{std::move(spec), nullptr};
  if (v.data) {
    auto data = t.make_shard(out.spec, shape);
    std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
    out.data = std::move(data);
  }
  return out;
}

namespace {

enum class Activation { relu, gelu, silu, tanh, exp };

const char* name(Activation f) {
  switch (f) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::silu: return "silu";
    case Activation::tanh: return "tanh";
    case Activation::exp: return "exp";
  }
  return "?";
}

constexpr double kGeluC = 0.044715;
const double kSqrt2OverPi = std::sqrt(2.0 / std::acos(-1.0));

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double apply(Activation f, double x) {
  switch (f) {
    case Activation::relu: return x > 0 ? x : 0.0;
    case Activation::gelu: return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x)));
    case Activation::silu: return x * sigmoid(x);
    case Activation::tanh: return std::tanh(x);
    case Activation::exp: return std::exp(x);
  }
  return 0;
}

double derivative(Activation f, double x) {
  switch (f) {
    case Activation::relu: return x > 0 ? 1.0 : 0.0;
    case Activation::gelu: {
      const double t = std::tanh(kSqrt2OverPi * (x + kGeluC * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * x * x);
    }
    case Activation::silu: {
      const double s = sigmoid(x);
      return s * (1.0 + x * (1.0 - s));
    }
    case Activation::tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case Activation::exp: return std::exp(x);
  }
  return 0;
}

// Softmax and layer norm need each row (the last dimension) whole on one device.
void require_whole_rows(const Mesh& mesh, const Spec& spec, const char* op) {
  require_whole(mesh, spec, op);
  if (spec.dims.empty()) throw InputError(std::string(op) + " needs a dimension to normalize over; got a rank-0 value");
  if (!spec.dims.back().axes.empty()) {
    throw InputError(std::string(op) + " of " + format_spec(spec, mesh) + ": its last dimension '" + spec.dims.back().name +
                     "' is sharded; " + op + " works on whole rows, so gather it (or shard another dimension)");
  }
}

void require_same_spec(const Mesh& mesh, Var a, Var b, const char* op) {
  if (!(a.spec() == b.spec()) || a.shape() != b.shape()) {
    throw InputError(std::string(op) + " needs both operands in one layout and shape; got " + format_spec(a.spec(), mesh) +
                     " and " + format_spec(b.spec(), mesh) + " (reshard one)");
  }
}

std::int64_t last_extent(const Value& v) { return v.data->local_shape().empty() ? 1 : v.data->local_shape().back(); }

Var unary(Var x, Activation f) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, x.spec(), name(f));
  const Node& nx = t.node(x);
  Spec spec = nx.value.spec;
  spec.tensor = std::string(name(f)) + "(" + nx.value.spec.tensor + ")";
  Value y = elementwise(t, std::move(spec), nx.shape, nx.value, nullptr, [f](double v, double) { return apply(f, v); });
  t.node(x).saved = t.node(x).requires_grad;
  const Shape shape = nx.shape;
  return t.add_node(tape, std::move(y), shape, {x.id()}, [f](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ix = self.inputs[0];
    const Value g = impl.align(grad, self.value.spec, self.shape);
    const Value dx = elementwise(impl, g.spec, self.shape, g, &impl.saved_value(ix),
                                 [f](double gr, double v) { return gr * derivative(f, v); });
    impl.accumulate(ix, std::move(dx));
  });
}

// sum(x) * scale: the loss ops.
Var scaled_sum(Var x, double scale, const char* op) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& nx = t.node(x);
  Value y;
  y.spec.tensor = std::string(op) + "(" + nx.value.spec.tensor + ")";
  // Each rank sums its own block: partial over every axis that splits x, and over x's own partial sums.
  y.spec.unreduced = sharding_axes(nx.value.spec);
  y.spec.unreduced.insert(y.spec.unreduced.end(), nx.value.spec.unreduced.begin(), nx.value.spec.unreduced.end());
  std::sort(y.spec.unreduced.begin(), y.spec.unreduced.end());
  if (nx.value.data) {
    auto out = t.make_shard(y.spec, {});
    with_type(t.options.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T* src = in<T>(nx.value);
      double total = 0;
      for (std::int64_t i = 0; i < nx.value.data->elements(); ++i) total += src[i];
      out->buffer().as<T>()[0] = static_cast<T>(total * scale);
    });
    y.data = std::move(out);
  }
  return t.add_node(tape, std::move(y), {}, {x.id()}, [scale](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ix = self.inputs[0];
    const Node& nx = impl.node(ix);
    const Value g = impl.align(grad, self.value.spec, self.shape);
    Value dx{nx.value.spec, nullptr};
    dx.spec.unreduced = g.spec.unreduced;
    if (g.data) {
      auto out = impl.make_shard(dx.spec, nx.shape);
      with_type(impl.options.dtype, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        const T v = static_cast<T>(in<T>(g)[0] * scale);
        T* dst = out->buffer().as<T>();
        for (std::int64_t i = 0; i < out->elements(); ++i) dst[i] = v;
      });
      dx.data = std::move(out);
    }
    impl.accumulate(ix, std::move(dx));
  });
}

}  // namespace

Var relu(Var x) { return unary(x, Activation::relu); }
Var gelu(Var x) { return unary(x, Activation::gelu); }
Var silu(Var x) { return unary(x, Activation::silu); }
Var tanh(Var x) { return unary(x, Activation::tanh); }
Var exp(Var x) { return unary(x, Activation::exp); }

namespace {

Spec renamed(Spec spec, std::string_view from, std::string_view to) {
  spec.dims[static_cast<std::size_t>(spec.find_dim(from))].name = std::string(to);
  return spec;
}

}  // namespace

Var swiglu(Var gate, Var up) {
  Tape& tape = same_tape(gate, up, "swiglu");
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, gate.spec(), "swiglu");
  require_same_spec(t.mesh, gate, up, "swiglu");
  const Node& na = t.node(gate);
  const Node& nb = t.node(up);
  Spec spec = na.value.spec;
  spec.tensor = "swiglu(" + na.value.spec.tensor + "," + nb.value.spec.tensor + ")";
  const auto silu_of = [](double x) { return apply(Activation::silu, x); };
  Value y = elementwise(t, std::move(spec), na.shape, na.value, &nb.value,
                        [silu_of](double x, double z) { return silu_of(x) * z; });
  // dup = g silu(gate) reads gate; dgate = g up silu'(gate) reads both.
  const bool a_grad = na.requires_grad, b_grad = nb.requires_grad;
  t.node(gate).saved = t.node(gate).saved || a_grad || b_grad;
  t.node(up).saved = t.node(up).saved || a_grad;
  const Shape shape = na.shape;
  return t.add_node(tape, std::move(y), shape, {gate.id(), up.id()},
                    [silu_of](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ia = self.inputs[0], ib = self.inputs[1];
    const Value g = impl.align(grad, self.value.spec, self.shape);
    const Value& av = impl.saved_value(ia);
    const Value& bv = impl.saved_value(ib);
    const Value slope = elementwise(impl, g.spec, self.shape, av, &bv,
                                    [](double x, double z) { return z * derivative(Activation::silu, x); });
    const Value gated =
        elementwise(impl, g.spec, self.shape, av, nullptr, [silu_of](double x, double) { return silu_of(x); });
    const auto times = [](double x, double z) { return x * z; };
    Value da = elementwise(impl, g.spec, self.shape, g, &slope, times);
    Value db = elementwise(impl, g.spec, self.shape, g, &gated, times);
    impl.accumulate(ia, std::move(da));
    impl.accumulate(ib, std::move(db));
  });
}

// mul and add keep their same-spec contract; binary does the work.
Var mul(Var a, Var b) {
  require_same_spec(same_tape(a, b, "mul").mesh(), a, b, "mul");
  return binary(a, b, BinaryOp::mul, dim_names(a.spec()));
}

Var scale(Var x, double factor) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& nx = t.node(x);
  Spec spec = nx.value.spec;
  spec.tensor = "scale(" + nx.value.spec.tensor + ")";
  const auto times = [factor](double v, double) { return v * factor; };
  Value y = elementwise(t, std::move(spec), nx.shape, nx.value, nullptr, times);
  const Shape shape = nx.shape;
  // Linear and elementwise: the gradient scales in whatever layout it came, partial sums too.
  return t.add_node(tape, std::move(y), shape, {x.id()}, [times](Tape::Impl& impl, const Node& self, const Value& grad) {
    impl.accumulate(self.inputs[0], elementwise(impl, grad.spec, self.shape, grad, nullptr, times));
  });
}

Var rename(Var x, std::string_view from, std::string_view to) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Spec& s = x.spec();
  if (s.find_dim(from) < 0) {
    throw InputError("rename: " + format_spec(s, t.mesh) + " has no dimension '" + std::string(from) + "'");
  }
  if (from != to && s.find_dim(to) >= 0) {
    throw InputError("rename: " + format_spec(s, t.mesh) + " already has a dimension '" + std::string(to) + "'");
  }
  Spec out = renamed(s, from, to);
  validate_spec(out, t.mesh);  // the new name must be a dimension name
  const Node& nx = t.node(x);
  const Shape shape = nx.shape;
  Value y = relabeled(t, nx.value, std::move(out), shape);
  return t.add_node(tape, std::move(y), shape, {x.id()},
                    [from = std::string(from), to = std::string(to)](Tape::Impl& impl, const Node& self,
                                                                    const Value& grad) {
    impl.accumulate(self.inputs[0], relabeled(impl, grad, renamed(grad.spec, to, from), self.shape));
  });
}

Var add(Var a, Var b) {
  require_same_spec(same_tape(a, b, "add").mesh(), a, b, "add");
  return binary(a, b, BinaryOp::add, dim_names(a.spec()));
}

Var softmax(Var x) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole_rows(t.mesh, x.spec(), "softmax");
  const Node& nx = t.node(x);
  Value y{nx.value.spec, nullptr};
  y.spec.tensor = "softmax(" + nx.value.spec.tensor + ")";
  if (nx.value.data) {
    auto out = t.make_shard(y.spec, nx.shape);
    const std::int64_t n = last_extent(nx.value);
    const std::int64_t rows = n == 0 ? 0 : out->elements() / n;
    with_type(t.options.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* src = in<T>(nx.value) + r * n;
        T* dst = out->buffer().as<T>() + r * n;
        double peak = src[0];
        for (std::int64_t i = 1; i < n; ++i) peak = std::max<double>(peak, src[i]);
        double total = 0;
        for (std::int64_t i = 0; i < n; ++i) total += std::exp(src[i] - peak);
        for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(std::exp(src[i] - peak) / total);
      }
    });
    y.data = std::move(out);
  }
  const Shape shape = nx.shape;
  const bool needs = nx.requires_grad;
  Var out = t.add_node(tape, std::move(y), shape, {x.id()}, [](Tape::Impl& impl, const Node& self, const Value& grad) {
    // dx = y * (g - sum_row(g * y)), from the saved output.
    const Value g = impl.align(grad, self.value.spec, self.shape);
    Value dx{g.spec, nullptr};
    if (g.data) {
      auto d = impl.make_shard(g.spec, self.shape);
      const std::int64_t n = last_extent(g);
      const std::int64_t rows = n == 0 ? 0 : d->elements() / n;
      with_type(impl.options.dtype, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        for (std::int64_t r = 0; r < rows; ++r) {
          const T* y = in<T>(self.value) + r * n;
          const T* gr = in<T>(g) + r * n;
          T* dst = d->buffer().as<T>() + r * n;
          double dot = 0;
          for (std::int64_t i = 0; i < n; ++i) dot += static_cast<double>(gr[i]) * y[i];
          for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(y[i] * (gr[i] - dot));
        }
      });
      dx.data = std::move(d);
    }
    impl.accumulate(self.inputs[0], std::move(dx));
  });
  t.node(out).saved = needs;
  return out;
}

Var layer_norm(Var x, Var scale, Var bias, double eps) {
  Tape& tape = same_tape(x, scale, "layer_norm");
  same_tape(x, bias, "layer_norm");
  Tape::Impl& t = tape.impl();
  require_whole_rows(t.mesh, x.spec(), "layer_norm");
  const DimSpec& last = x.spec().dims.back();
  for (Var p : {scale, bias}) {
    const Spec& s = p.spec();
    if (s.dims.size() != 1 || s.dims[0].name != last.name || !s.dims[0].axes.empty() || !s.unreduced.empty() ||
        p.shape()[0] != x.shape().back()) {
      throw InputError("layer_norm of " + format_spec(x.spec(), t.mesh) + ": scale and bias must be [" + last.name +
                       "] replicated, of size " + std::to_string(x.shape().back()) + "; got " + format_spec(s, t.mesh));
    }
  }
  if (!(eps > 0)) throw InputError("layer_norm: eps must be positive; got " + std::to_string(eps));
  const Node& nx = t.node(x);
  Value y{nx.value.spec, nullptr};
  y.spec.tensor = "layer_norm(" + nx.value.spec.tensor + ")";
  const Shape local = local_shape(t.mesh, nx.value.spec, nx.shape, t.device());
  const std::int64_t n = local.back();
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < local.size(); ++i) rows *= local[i];
  // Per row: mean and 1/sqrt(var + eps), kept for the backward pass.
  auto stats = std::make_shared<std::vector<double>>();
  if (nx.value.data) {
    auto out = t.make_shard(y.spec, nx.shape);
    stats->resize(static_cast<std::size_t>(2 * rows));
    with_type(t.options.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const T* gamma = in<T>(t.node(scale).value);
      const T* beta = in<T>(t.node(bias).value);
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* src = in<T>(nx.value) + r * n;
        T* dst = out->buffer().as<T>() + r * n;
        double mu = 0, var = 0;
        for (std::int64_t i = 0; i < n; ++i) mu += src[i];
        mu /= static_cast<double>(n);
        for (std::int64_t i = 0; i < n; ++i) var += (src[i] - mu) * (src[i] - mu);
        var /= static_cast<double>(n);
        const double rstd = 1.0 / std::sqrt(var + eps);
        (*stats)[static_cast<std::size_t>(2 * r)] = mu;
        (*stats)[static_cast<std::size_t>(2 * r + 1)] = rstd;
        for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>((src[i] - mu) * rstd * gamma[i] + beta[i]);
      }
    });
    y.data = std::move(out);
  }
  const bool needs = nx.requires_grad || t.node(scale).requires_grad;
  t.node(x).saved = t.node(x).saved || needs;
  t.node(scale).saved = t.node(scale).saved || nx.requires_grad;
  const Shape shape = nx.shape;
  Var out = t.add_node(tape, std::move(y), shape, {x.id(), scale.id(), bias.id()},
                       [stats, rows, n](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ix = self.inputs[0], is = self.inputs[1], ib = self.inputs[2];
    const Value g = impl.align(grad, self.value.spec, self.shape);
    // The parameters' gradients sum over this rank's rows: partial over every axis that
    // splits the rows, and over the gradient's own partial sums.
    Value dparam{impl.node(is).value.spec, nullptr};
    dparam.spec.unreduced = sharding_axes(self.value.spec);
    dparam.spec.unreduced.insert(dparam.spec.unreduced.end(), g.spec.unreduced.begin(), g.spec.unreduced.end());
    std::sort(dparam.spec.unreduced.begin(), dparam.spec.unreduced.end());
    Value dx{g.spec, nullptr}, dscale = dparam, dbias = dparam;
    if (g.data) {
      const Value& xv = impl.saved_value(ix);
      const Value& sv = impl.saved_value(is);
      const Shape& pshape = impl.node(is).shape;
      auto px = impl.make_shard(g.spec, self.shape);
      auto ps = impl.make_shard(dparam.spec, pshape);
      auto pb = impl.make_shard(dparam.spec, pshape);
      with_type(impl.options.dtype, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        const T* gamma = in<T>(sv);
        std::vector<double> ds(static_cast<std::size_t>(n), 0.0), db(static_cast<std::size_t>(n), 0.0);
        for (std::int64_t r = 0; r < rows; ++r) {
          const T* xr = in<T>(xv) + r * n;
          const T* gr = in<T>(g) + r * n;
          T* dst = px->buffer().as<T>() + r * n;
          const double mu = (*stats)[static_cast<std::size_t>(2 * r)];
          const double rstd = (*stats)[static_cast<std::size_t>(2 * r + 1)];
          double mean_gy = 0, mean_gy_xhat = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const double xhat = (xr[i] - mu) * rstd;
            const double gy = static_cast<double>(gr[i]) * gamma[i];
            mean_gy += gy;
            mean_gy_xhat += gy * xhat;
            ds[static_cast<std::size_t>(i)] += static_cast<double>(gr[i]) * xhat;
            db[static_cast<std::size_t>(i)] += gr[i];
          }
          mean_gy /= static_cast<double>(n);
          mean_gy_xhat /= static_cast<double>(n);
          for (std::int64_t i = 0; i < n; ++i) {
            const double xhat = (xr[i] - mu) * rstd;
            dst[i] = static_cast<T>(rstd * (static_cast<double>(gr[i]) * gamma[i] - mean_gy - xhat * mean_gy_xhat));
          }
        }
        for (std::int64_t i = 0; i < n; ++i) {
          ps->buffer().as<T>()[i] = static_cast<T>(ds[static_cast<std::size_t>(i)]);
          pb->buffer().as<T>()[i] = static_cast<T>(db[static_cast<std::size_t>(i)]);
        }
      });
      dx.data = std::move(px);
      dscale.data = std::move(ps);
      dbias.data = std::move(pb);
    }
    impl.accumulate(ix, std::move(dx));
    impl.accumulate(is, std::move(dscale));
    impl.accumulate(ib, std::move(dbias));
  });
  t.node(out).extra_saved_bytes = needs ? 2 * rows * dtype_bytes(t.options.dtype) : 0;
  return out;
}

Var sum(Var x) { return scaled_sum(x, 1.0, "sum"); }

Var mean(Var x) {
  std::int64_t count = 1;
  for (std::int64_t e : x.shape()) count *= e;
  if (count == 0) throw InputError("mean of " + format_spec(x.spec(), x.tape().mesh()) + ": it has no elements");
  return scaled_sum(x, 1.0 / static_cast<double>(count), "mean");
}

}  // namespace shardmm::autodiff
