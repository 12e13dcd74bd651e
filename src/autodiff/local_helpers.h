// Helpers of the ops that compute on each rank's block (local_ops.cpp, reduction_ops.cpp;
// private to the autodiff layer).
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "autodiff/tape_impl.h"
#include "shardmm/core/error.h"

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

// A nonlinear op needs whole values: f(a + b) != f(a) + f(b).
inline void require_whole(const Mesh& mesh, const Spec& spec, const char* op) {
  if (!spec.unreduced.empty()) {
    throw InputError(std::string(op) + " of " + format_spec(spec, mesh) + ": the value is unreduced over " +
                     mesh.axis_names(spec.unreduced) + " (partial sums) and " + op +
                     " needs whole values; all_reduce or reduce_scatter it first");
  }
}

inline Tape& same_tape(Var a, Var b, const char* op) {
  if (&a.tape() != &b.tape()) throw InputError(std::string(op) + ": the operands belong to different tapes");
  return a.tape();
}

// The index of dimension `dim` in `spec`; InputError naming the op when it has none.
inline int dim_index(const Spec& spec, std::string_view dim, const Mesh& mesh, const char* op) {
  const int d = spec.find_dim(dim);
  if (d < 0) {
    throw InputError(std::string(op) + ": " + format_spec(spec, mesh) + " has no dimension '" + std::string(dim) + "'");
  }
  return d;
}

}  // namespace shardmm::autodiff
