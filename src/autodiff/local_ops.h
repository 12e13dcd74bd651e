// What the ops that compute on each rank's block share (local_ops.cpp, shape_ops.cpp,
// reduction_ops.cpp, sharded_ops.cpp):
// typed access to a value's shard, elementwise and letter-wise kernels, operand checks.
// Private to the autodiff layer.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "autodiff/tape_impl.h"

namespace shardmm::autodiff {

// Calls f with a null pointer of the tape's element type (f32 or f64).
template <class F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::f32) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<double*>(nullptr));
  }
}

template <class T>
const T* in(const Value& v) {
  return v.data->buffer().as<T>();
}

// kernel(a, b, out, n) over a's shard and a new one of `spec`, with T* pointers of the tape's
// element type (b's null where b is), on executed tapes; the layout only on symbolic ones.
template <class Kernel>
Value blockwise(Tape::Impl& t, Spec spec, const Shape& shape, const Value& a, const Value* b, Kernel kernel) {
  Value out{std::move(spec), nullptr};
  if (!a.data) return out;
  auto data = t.make_shard(out.spec, shape);
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    kernel(in<T>(a), b ? in<T>(*b) : static_cast<const T*>(nullptr), data->buffer().as<T>(), data->elements());
  });
  out.data = std::move(data);
  return out;
}

// out[i] = f(a[i], b[i]) in double (b null: f(a[i], 0)).
template <class F>
Value elementwise(Tape::Impl& t, Spec spec, const Shape& shape, const Value& a, const Value* b, F f) {
  return blockwise(t, std::move(spec), shape, a, b, [&f](const auto* x, const auto* z, auto* dst, std::int64_t n) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(f(x[i], z ? z[i] : T(0)));
  });
}

// One local op's work, forward or in its backward, recorded as OpKind::local events
// (docs/cost-model.md, "Local ops"): each pass the code makes over a block, reading it or
// writing it, adds the block's bytes (the largest block's: Tape::Impl::block_bytes); executed
// tapes time it. A collective inside the op (a norm's row statistics over a sharded letter)
// ends one event and starts the next, so that no event's span holds a collective. An op
// records one event at least, with 0 bytes where it moves none.
class LocalWork {
 public:
  LocalWork(Tape::Impl& t, std::string function, std::string tensor)
      : t_(t), function_(std::move(function)), tensor_(std::move(tensor)), start_(t.clock()) {}
  // `times` passes over a block of `spec`.
  LocalWork& pass(const Spec& spec, const Shape& shape, int times = 1);
  // Before a collective: the work so far as one event (none when it moved no bytes).
  void split();
  // After it: the next event's clock starts.
  void resume() { start_ = t_.clock(); }
  // The op's last event.
  void finish();

 private:
  Tape::Impl& t_;
  std::string function_, tensor_;
  double start_;
  std::int64_t bytes_ = 0;
  bool recorded_ = false;
};

// The spec's letters, in order.
inline std::vector<std::string> dim_names(const Spec& spec) {
  std::vector<std::string> out;
  for (const DimSpec& d : spec.dims) out.push_back(d.name);
  return out;
}

// A nonlinear op needs whole values: f(a + b) != f(a) + f(b). InputError otherwise.
void require_whole(const Mesh& mesh, const Spec& spec, const char* op);

// The operands' common tape; InputError when they belong to different tapes.
Tape& same_tape(Var a, Var b, const char* op);

// The index of dimension `dim` in `spec`; InputError naming the op when it has none.
int dim_index(const Spec& spec, std::string_view dim, const Mesh& mesh, const char* op);

// A copy of `v`'s shard under another spec of the same blocks, byte for byte (renamed,
// split or merged dimensions): a local step `function` on spec's tensor, the copy's bytes.
Value relabeled(Tape::Impl& t, const Value& v, Spec spec, const Shape& shape, std::string function);

// `v` (global shape `shape`) summed over the letters not in `letters` and permuted into
// their order, on each rank's block (shape_ops.cpp). The result keeps v's sharding of each
// kept letter and v's unreduced axes, and is unreduced over the axes that sharded a summed
// letter: each member of those holds a partial sum. `out_shape` receives its global shape.
Value sum_to_letters(Tape::Impl& t, const Value& v, const Shape& shape, const std::vector<std::string>& letters,
                     Shape* out_shape);

}  // namespace shardmm::autodiff
