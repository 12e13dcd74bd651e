// causal_mask (causal_mask.h): a local op; its backward zeroes the masked entries' gradient.
#include "shardmm/autodiff/causal_mask.h"

#include <cstring>
#include <limits>

#include "autodiff/local_ops.h"
#include "shardmm/core/error.h"

namespace shardmm::autodiff {
namespace {

// A copy of v (shards are never modified once made: tape_impl.h).
Value copy_of(const Tape::Impl& t, const Value& v, const Shape& shape) {
  Value out{v.spec, nullptr};
  if (v.data) {
    auto data = t.make_shard(out.spec, shape);
    std::memcpy(data->data(), v.data->data(), static_cast<std::size_t>(v.data->buffer().bytes()));
    out.data = std::move(data);
  }
  return out;
}

// Sets the elements of `shard` whose global `col` index exceeds their `row` index.
void fill_above_diagonal(std::shared_ptr<DistTensor>& shard, DType dtype, int row, int col, double value) {
  const Shape& local = shard->local_shape();
  const std::vector<Range>& box = shard->box();
  std::vector<std::int64_t> index(local.size(), 0);
  const auto fill = [&](auto* data) {
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
  };
  if (dtype == DType::f32) {
    fill(shard->buffer().as<float>());
  } else {
    fill(shard->buffer().as<double>());
  }
}

}  // namespace

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
  // Passes: the copy (x read, y written), then the mask written over y.
  LocalWork work(t, "causal_mask", nx.value.spec.tensor);
  Value y = copy_of(t, nx.value, shape);
  if (y.data) {
    auto data = std::const_pointer_cast<DistTensor>(y.data);
    fill_above_diagonal(data, t.options.dtype, r, c, -std::numeric_limits<double>::infinity());
  }
  work.pass(y.spec, shape, 3).finish();
  // The masked entries are constants: their gradient is zero.
  return t.add_node(tape, std::move(y), shape, {x.id()}, [r, c](Tape::Impl& impl, const Node& self, const Value& grad) {
    Value g = impl.align(grad, self.value.spec, self.shape);
    LocalWork work(impl, "causal_mask", "d" + self.value.spec.tensor);
    Value dx = copy_of(impl, g, self.shape);
    if (dx.data) {
      auto data = std::const_pointer_cast<DistTensor>(dx.data);
      fill_above_diagonal(data, impl.options.dtype, r, c, 0.0);
    }
    work.pass(g.spec, self.shape, 3).finish();
    impl.accumulate(self.inputs[0], std::move(dx));
  });
}

}  // namespace shardmm::autodiff
