// Ops computed on each rank's block alone: activations, SwiGLU, add, scale, rename, sum and
// mean (softmax and the norms, which may need their rows' statistics from other ranks, are in
// reduction_ops.cpp). Their backwards are linear in the output gradient, so a gradient unreduced
// over an axis the value does not use stays unreduced (tape.h).
#include <cmath>
#include <cstring>

#include "autodiff/local_helpers.h"
#include "autodiff/tape_impl.h"
#include "shardmm/core/error.h"

namespace shardmm::autodiff {

namespace {

enum class Activation { relu, gelu, silu };

const char* name(Activation f) {
  switch (f) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::silu: return "silu";
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
  }
  return 0;
}

// out[i] = f(a[i], b[i]) in double (b null: f(a[i], 0)), on executed tapes; the layout only
// on symbolic ones.
template <class F>
Value elementwise(Tape::Impl& t, Spec spec, const Shape& shape, const Value& a, const Value* b, F f) {
  Value out{std::move(spec), nullptr};
  if (!a.data) return out;
  auto data = t.make_shard(out.spec, shape);
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* x = in<T>(a);
    const T* z = b ? in<T>(*b) : nullptr;
    T* dst = data->buffer().as<T>();
    for (std::int64_t i = 0; i < data->elements(); ++i) dst[i] = static_cast<T>(f(x[i], z ? z[i] : T(0)));
  });
  out.data = std::move(data);
  return out;
}

void require_same_spec(const Mesh& mesh, Var a, Var b, const char* op) {
  if (!(a.spec() == b.spec()) || a.shape() != b.shape()) {
    throw InputError(std::string(op) + " needs both operands in one layout and shape; got " + format_spec(a.spec(), mesh) +
                     " and " + format_spec(b.spec(), mesh) + " (reshard one)");
  }
}

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

namespace {

// f(a) * b with f = silu (SwiGLU's gate) or the identity (mul): same spec, whole values.
Var gated_product(Var a, Var b, bool swish, const char* op) {
  Tape& tape = same_tape(a, b, op);
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, a.spec(), op);
  require_same_spec(t.mesh, a, b, op);
  const auto f = [swish](double x) { return swish ? apply(Activation::silu, x) : x; };
  const auto df = [swish](double x) { return swish ? derivative(Activation::silu, x) : 1.0; };
  const Node& na = t.node(a);
  const Node& nb = t.node(b);
  Spec spec = na.value.spec;
  spec.tensor = std::string(op) + "(" + na.value.spec.tensor + "," + nb.value.spec.tensor + ")";
  Value y = elementwise(t, std::move(spec), na.shape, na.value, &nb.value, [f](double x, double z) { return f(x) * z; });
  // db = g f(a) reads a; da = g b f'(a) reads b, and a when f is not the identity.
  const bool a_grad = na.requires_grad, b_grad = nb.requires_grad;
  t.node(a).saved = t.node(a).saved || b_grad || (swish && a_grad);
  t.node(b).saved = t.node(b).saved || a_grad;
  const Shape shape = na.shape;
  return t.add_node(tape, std::move(y), shape, {a.id(), b.id()},
                    [f, df](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ia = self.inputs[0], ib = self.inputs[1];
    const Value g = impl.align(grad, self.value.spec, self.shape);
    const Value& av = impl.saved_value(ia);
    const Value& bv = impl.saved_value(ib);
    // da = g b f'(a): b's role is played by the product b f'(a), a's by f(a).
    const Value slope = elementwise(impl, g.spec, self.shape, av, &bv, [df](double x, double z) { return z * df(x); });
    const Value gate = elementwise(impl, g.spec, self.shape, av, nullptr, [f](double x, double) { return f(x); });
    const auto times = [](double x, double z) { return x * z; };
    Value da = elementwise(impl, g.spec, self.shape, g, &slope, times);
    Value db = elementwise(impl, g.spec, self.shape, g, &gate, times);
    impl.accumulate(ia, std::move(da));
    impl.accumulate(ib, std::move(db));
  });
}

// A copy of `v`'s shard under another spec of the same blocks (renamed dimensions).
Value relabeled(Tape::Impl& t, const Value& v, Spec spec, const Shape& shape) {
  Value out{std::move(spec), nullptr};
  if (v.data) {
    auto data = t.make_shard(out.spec, shape);
    std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
    out.data = std::move(data);
  }
  return out;
}

Spec renamed(Spec spec, std::string_view from, std::string_view to) {
  spec.dims[static_cast<std::size_t>(spec.find_dim(from))].name = std::string(to);
  return spec;
}

}  // namespace

Var swiglu(Var gate, Var up) { return gated_product(gate, up, true, "swiglu"); }
Var mul(Var a, Var b) { return gated_product(a, b, false, "mul"); }

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
  Tape& tape = same_tape(a, b, "add");
  Tape::Impl& t = tape.impl();
  require_same_spec(t.mesh, a, b, "add");
  const Node& na = t.node(a);
  const Node& nb = t.node(b);
  Spec spec = na.value.spec;
  spec.tensor = na.value.spec.tensor + "+" + nb.value.spec.tensor;
  Value y = elementwise(t, std::move(spec), na.shape, na.value, &nb.value, [](double x, double z) { return x + z; });
  const Shape shape = na.shape;
  // The sum's gradient is each operand's, in whatever layout it came.
  return t.add_node(tape, std::move(y), shape, {a.id(), b.id()}, [](Tape::Impl& impl, const Node& self, const Value& grad) {
    impl.accumulate(self.inputs[0], grad);
    impl.accumulate(self.inputs[1], grad);
  });
}

Var sum(Var x) { return scaled_sum(x, 1.0, "sum"); }

Var mean(Var x) {
  std::int64_t count = 1;
  for (std::int64_t e : x.shape()) count *= e;
  if (count == 0) throw InputError("mean of " + format_spec(x.spec(), x.tape().mesh()) + ": it has no elements");
  return scaled_sum(x, 1.0 / static_cast<double>(count), "mean");
}

}  // namespace shardmm::autodiff
