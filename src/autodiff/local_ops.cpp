// Ops computed on each rank's block alone: activations, SwiGLU, mul, add, scale, rename, sum
// and mean (softmax and the norms, which may need their rows' statistics from other ranks, are
// in reduction_ops.cpp; broadcasting and the letter permutations in shape_ops.cpp). Their
// backwards are linear in the output gradient, so a gradient unreduced over an axis the value
// does not use stays unreduced (tape.h).
#include "autodiff/local_ops.h"

#include <cmath>
#include <cstring>

#include "autodiff/activation_kernels.h"
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

int dim_index(const Spec& spec, std::string_view dim, const Mesh& mesh, const char* op) {
  const int d = spec.find_dim(dim);
  if (d < 0) {
    throw InputError(std::string(op) + ": " + format_spec(spec, mesh) + " has no dimension '" + std::string(dim) + "'");
  }
  return d;
}

LocalWork& LocalWork::pass(const Spec& spec, const Shape& shape, int times) {
  bytes_ =
      checked_add(bytes_, checked_mul(times, t_.block_bytes(spec, shape), "a local op's bytes"), "a local op's bytes");
  return *this;
}

void LocalWork::split() {
  if (bytes_ == 0) return;
  t_.record_local(function_, tensor_, bytes_, start_);
  recorded_ = true;
  bytes_ = 0;
}

void LocalWork::finish() {
  if (bytes_ > 0 || !recorded_) t_.record_local(function_, tensor_, bytes_, start_);
  recorded_ = true;
  bytes_ = 0;
}

Value relabeled(Tape::Impl& t, const Value& v, Spec spec, const Shape& shape, std::string function) {
  LocalWork work(t, std::move(function), spec.tensor);
  Value out{std::move(spec), nullptr};
  if (v.data) {
    auto data = t.make_shard(out.spec, shape);
    std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
    out.data = std::move(data);
  }
  work.pass(out.spec, shape, 2).finish();  // a copy: read and written
  return out;
}

namespace {

void require_same_spec(const Mesh& mesh, Var a, Var b, const char* op) {
  if (!(a.spec() == b.spec()) || a.shape() != b.shape()) {
    throw InputError(std::string(op) + " needs both operands in one layout and shape; got " +
                     format_spec(a.spec(), mesh) + " and " + format_spec(b.spec(), mesh) + " (reshard one)");
  }
}

// The activation F (activation_kernels.h) forward, and its slope backward.
template <class F>
Var unary(Var x) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, x.spec(), F::name);
  const Node& nx = t.node(x);
  Spec spec = nx.value.spec;
  spec.tensor = std::string(F::name) + "(" + nx.value.spec.tensor + ")";
  LocalWork work(t, F::name, spec.tensor);
  Value y = blockwise(t, std::move(spec), nx.shape, nx.value, nullptr,
                      [](const auto* x, const auto*, auto* y, std::int64_t n) { kernels::forward<F>(x, y, n); });
  work.pass(nx.value.spec, nx.shape).pass(y.spec, nx.shape).finish();  // x read, y written
  t.node(x).saved = t.node(x).saved || t.node(x).requires_grad;        // another reader may keep it already
  const Shape shape = nx.shape;
  return t.add_node(tape, std::move(y), shape, {x.id()}, [](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ix = self.inputs[0];
    const Value g = impl.align(grad, self.value.spec, self.shape);
    const Value& xv = impl.saved_value(ix);
    LocalWork work(impl, F::name, "d" + self.value.spec.tensor);
    const Value dx =
        blockwise(impl, g.spec, self.shape, g, &xv,
                  [](const auto* g, const auto* x, auto* dx, std::int64_t n) { kernels::backward<F>(g, x, dx, n); });
    work.pass(g.spec, self.shape, 3).finish();  // g and x read, dx written
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
  LocalWork work(t, op, y.spec.tensor);
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
  work.pass(nx.value.spec, nx.shape).pass(y.spec, {}).finish();
  return t.add_node(tape, std::move(y), {}, {x.id()},
                    [scale, op](Tape::Impl& impl, const Node& self, const Value& grad) {
                      const int ix = self.inputs[0];
                      const Node& nx = impl.node(ix);
                      const Value g = impl.align(grad, self.value.spec, self.shape);
                      LocalWork work(impl, op, "d" + self.value.spec.tensor);
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
                      work.pass(g.spec, {}).pass(dx.spec, nx.shape).finish();
                      impl.accumulate(ix, std::move(dx));
                    });
}

}  // namespace

Var relu(Var x) { return unary<kernels::Relu>(x); }
Var gelu(Var x) { return unary<kernels::Gelu>(x); }
Var silu(Var x) { return unary<kernels::Silu>(x); }
Var tanh(Var x) { return unary<kernels::Tanh>(x); }
Var exp(Var x) { return unary<kernels::Exp>(x); }

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
  LocalWork work(t, "swiglu", spec.tensor);
  Value y = blockwise(
      t, std::move(spec), na.shape, na.value, &nb.value,
      [](const auto* x, const auto* z, auto* y, std::int64_t n) { kernels::gated<kernels::Silu>(x, z, y, n); });
  work.pass(y.spec, na.shape, 3).finish();  // gate and up read, y written
  // dup = g silu(gate) reads gate; dgate = g up silu'(gate) reads both.
  const bool a_grad = na.requires_grad, b_grad = nb.requires_grad;
  t.node(gate).saved = t.node(gate).saved || a_grad || b_grad;
  t.node(up).saved = t.node(up).saved || a_grad;
  const Shape shape = na.shape;
  return t.add_node(tape, std::move(y), shape, {gate.id(), up.id()},
                    [](Tape::Impl& impl, const Node& self, const Value& grad) {
                      const int ia = self.inputs[0], ib = self.inputs[1];
                      const Value g = impl.align(grad, self.value.spec, self.shape);
                      const Value& av = impl.saved_value(ia);
                      const Value& bv = impl.saved_value(ib);
                      LocalWork work(impl, "swiglu", "d" + self.value.spec.tensor);
                      // slope = up silu'(gate): the backward kernel with up as its gradient.
                      const Value slope = blockwise(impl, g.spec, self.shape, bv, &av,
                                                    [](const auto* z, const auto* x, auto* y, std::int64_t n) {
                                                      kernels::backward<kernels::Silu>(z, x, y, n);
                                                    });
                      const Value gated = blockwise(impl, g.spec, self.shape, av, nullptr,
                                                    [](const auto* x, const auto*, auto* y, std::int64_t n) {
                                                      kernels::forward<kernels::Silu>(x, y, n);
                                                    });
                      const auto times = [](double x, double z) { return x * z; };
                      Value da = elementwise(impl, g.spec, self.shape, g, &slope, times);
                      Value db = elementwise(impl, g.spec, self.shape, g, &gated, times);
                      // slope: gate, up read, written; gated: gate read, written; da and db:
                      // g and one of them read, written.
                      work.pass(g.spec, self.shape, 3 + 2 + 3 + 3).finish();
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
  LocalWork work(t, "scale", spec.tensor);
  Value y = elementwise(t, std::move(spec), nx.shape, nx.value, nullptr, times);
  work.pass(y.spec, nx.shape, 2).finish();  // x read, y written
  const Shape shape = nx.shape;
  // Linear and elementwise: the gradient scales in whatever layout it came, partial sums too.
  return t.add_node(tape, std::move(y), shape, {x.id()},
                    [times](Tape::Impl& impl, const Node& self, const Value& grad) {
                      LocalWork work(impl, "scale", "d" + self.value.spec.tensor);
                      Value dx = elementwise(impl, grad.spec, self.shape, grad, nullptr, times);
                      work.pass(grad.spec, self.shape, 2).finish();
                      impl.accumulate(self.inputs[0], std::move(dx));
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
  Value y = relabeled(t, nx.value, std::move(out), shape, "rename");
  return t.add_node(
      tape, std::move(y), shape, {x.id()},
      [from = std::string(from), to = std::string(to)](Tape::Impl& impl, const Node& self, const Value& grad) {
        Spec spec = renamed(grad.spec, to, from);
        spec.tensor = "d" + self.value.spec.tensor;
        impl.accumulate(self.inputs[0], relabeled(impl, grad, std::move(spec), self.shape, "rename"));
      });
}

Var data_from(Var x, const Spec& spec, Shape shape, const LocalData& fill, std::string function) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  validate_spec(spec, t.mesh);
  require_whole(t.mesh, spec, "data_from");
  Value y{spec, nullptr};
  const Node& nx = t.node(x);
  LocalWork work(t, std::move(function), spec.tensor);
  if (nx.value.data) {
    auto data = t.make_shard(spec, shape);
    std::memset(data->data(), 0, static_cast<std::size_t>(data->buffer().bytes()));
    fill(*nx.value.data, *data);
    y.data = std::move(data);
  }
  work.pass(nx.value.spec, nx.shape).pass(spec, shape).finish();  // x read, the result written (zeroed)
  // No inputs: backward never reaches x through this value. A backward that does nothing
  // still makes the value an op's, which the memory timeline counts within its op.
  return t.add_node(tape, std::move(y), std::move(shape), {}, [](Tape::Impl&, const Node&, const Value&) {});
}

Var add(Var a, Var b) {
  require_same_spec(same_tape(a, b, "add").mesh(), a, b, "add");
  return binary(a, b, BinaryOp::add, dim_names(a.spec()));
}

Var sum(Var x) { return scaled_sum(x, 1.0, "sum"); }

Var mean(Var x) {
  std::int64_t count = 1;
  for (std::int64_t e : x.shape()) count *= e;
  if (count == 0) throw InputError("mean of " + format_spec(x.spec(), x.tape().mesh()) + ": it has no elements");
  return scaled_sum(x, 1.0 / static_cast<double>(count), "mean");
}

}  // namespace shardmm::autodiff
