// rename, scale and causal_mask (layer_ops.h): local ops whose backwards are linear in the
// output gradient, so a gradient arrives and leaves in whatever layout it has.
#include "shardmm/autodiff/layer_ops.h"

#include <cstring>
#include <limits>

#include "autodiff/tape_impl.h"
#include "shardmm/core/error.h"

namespace shardmm::autodiff {
namespace {

// `spec` with dimension `from` called `to`.
Spec renamed(Spec spec, std::string_view from, std::string_view to) {
  for (DimSpec& d : spec.dims) {
    if (d.name == from) d.name = std::string(to);
  }
  return spec;
}

// A copy of v's shard under another spec of the same block (the shard records its spec).
Value relabel(const Tape::Impl& t, const Value& v, Spec spec, const Shape& shape) {
  Value out{std::move(spec), nullptr};
  if (v.data) {
    auto data = t.make_shard(out.spec, shape);
    std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
    out.data = std::move(data);
  }
  return out;
}

// Calls body(T*) with the tape's element type, f32 or f64.
template <class F>
void typed(DType dtype, std::shared_ptr<DistTensor>& shard, F&& body) {
  if (dtype == DType::f32) {
    body(shard->buffer().as<float>());
  } else {
    body(shard->buffer().as<double>());
  }
}

// Sets the elements of `shard` whose global `col` index exceeds their `row` index.
void fill_above_diagonal(std::shared_ptr<DistTensor>& shard, DType dtype, int row, int col, double value) {
  const Shape& local = shard->local_shape();
  const std::vector<Range>& box = shard->box();
  std::vector<std::int64_t> index(local.size(), 0);
  typed(dtype, shard, [&](auto* data) {
    for (std::int64_t i = 0; i < shard->elements(); ++i) {
      if (box[static_cast<std::size_t>(col)].offset + index[static_cast<std::size_t>(col)] >
          box[static_cast<std::size_t>(row)].offset + index[static_cast<std::size_t>(row)]) {
        data[i] = static_cast<std::remove_pointer_t<decltype(data)>>(value);
      }
      for (std::size_t d = local.size(); d-- > 0;) {
        if (++index[d] < local[d]) break;
        index[d] = 0;
      }
    }
  });
}

}  // namespace

Var rename(Var x, std::string_view from, std::string_view to) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  if (x.spec().find_dim(from) < 0) {
    throw InputError("rename: " + format_spec(x.spec(), t.mesh) + " has no dimension '" + std::string(from) + "'");
  }
  if (x.spec().find_dim(to) >= 0) {
    throw InputError("rename: " + format_spec(x.spec(), t.mesh) + " already has a dimension '" + std::string(to) + "'");
  }
  const Node& nx = t.node(x);
  const Shape shape = nx.shape;
  Value y = relabel(t, nx.value, renamed(nx.value.spec, from, to), shape);
  return t.add_node(tape, std::move(y), shape, {x.id()},
                    [from = std::string(from), to = std::string(to)](Tape::Impl& impl, const Node& self,
                                                                     const Value& grad) {
                      impl.accumulate(self.inputs[0], relabel(impl, grad, renamed(grad.spec, to, from), self.shape));
                    });
}

Var scale(Var x, double factor) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& nx = t.node(x);
  const Shape shape = nx.shape;
  auto scaled = [](const Tape::Impl& impl, const Value& v, const Shape& shape, double f) {
    Value out{v.spec, nullptr};
    if (v.data) {
      auto data = impl.make_shard(v.spec, shape);
      std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
      typed(impl.options.dtype, data, [&](auto* p) {
        for (std::int64_t i = 0; i < data->elements(); ++i) p[i] *= static_cast<std::remove_pointer_t<decltype(p)>>(f);
      });
      out.data = std::move(data);
    }
    return out;
  };
  Value y = scaled(t, nx.value, shape, factor);
  return t.add_node(tape, std::move(y), shape, {x.id()},
                    [factor, scaled](Tape::Impl& impl, const Node& self, const Value& grad) {
                      impl.accumulate(self.inputs[0], scaled(impl, grad, self.shape, factor));
                    });
}

Var causal_mask(Var x, std::string_view row, std::string_view col) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Spec& spec = x.spec();
  const int r = spec.find_dim(row), c = spec.find_dim(col);
  if (r < 0 || c < 0) {
    throw InputError("causal_mask: " + format_spec(spec, t.mesh) + " lacks dimension '" +
                     std::string(r < 0 ? row : col) + "'");
  }
  if (!spec.unreduced.empty()) {
    throw InputError("causal_mask of " + format_spec(spec, t.mesh) +
                     ": masking a partial sum would mask each part; reduce it first");
  }
  const Node& nx = t.node(x);
  const Shape shape = nx.shape;
  Value y = relabel(t, nx.value, nx.value.spec, shape);
  if (y.data) {
    auto data = std::const_pointer_cast<DistTensor>(y.data);
    fill_above_diagonal(data, t.options.dtype, r, c, -std::numeric_limits<double>::infinity());
  }
  // The masked entries are constants: their gradient is zero.
  return t.add_node(tape, std::move(y), shape, {x.id()}, [r, c](Tape::Impl& impl, const Node& self, const Value& grad) {
    Value g = impl.align(grad, self.value.spec, self.shape);
    Value dx = relabel(impl, g, g.spec, self.shape);
    if (dx.data) {
      auto data = std::const_pointer_cast<DistTensor>(dx.data);
      fill_above_diagonal(data, impl.options.dtype, r, c, 0.0);
    }
    impl.accumulate(self.inputs[0], std::move(dx));
  });
}

}  // namespace shardmm::autodiff
