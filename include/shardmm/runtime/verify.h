// Verification against a dense single-device reference, on any backend.
//
//   run_backend("threads", mesh, [&](Communicator& comm) {
//     ... const DistTensor& c = exec.run(a, &b);
//     Verification v = verify_contraction(comm, contraction, sizes, dtype, c, a_values, b_values);
//     v.verified;   // the same verdict on every rank
//   });
//
// Every rank sends its shard to device 0, which assembles the logical result (summing
// unreduced axes, checking that replicas agree bit for bit), computes the reference in
// f64 from the same input values, and shares the verdict with all ranks.
//
// Tolerance: recursive summation of n terms errs by at most about n * eps * sum|a*b|, so
// a result element passes when |got - want| <= 2 * n * eps(dtype) * max|A| * max|B|
// (+ eps * |want|: Verification's rel_tolerance), with n the number of terms summed into it (the contracted length
// times the inputs' partial-sum counts) and eps 2^-24 for f32, 2^-53 for f64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm {

struct Verification {
  bool verified = false;
  double max_abs_error = 0;
  double max_rel_error = 0;
  double tolerance = 0;      // an element passes when |got - want| <= tolerance
  double rel_tolerance = 0;  //   + rel_tolerance * |want| (0: the tolerance alone)
  std::string detail;        // where the largest error is, or why it failed
};

// Deterministic input values: uniform in [-1, 1), a function of the global index, the
// unreduced member and `seed` only, so the same logical tensor results on any mesh.
DistTensor::Generator uniform_values(std::uint64_t seed);

// The logical (summed over unreduced members) dense tensor that `value` defines for
// `spec`, row-major, each member's value first rounded to `dtype`.
std::vector<double> dense_logical(const Mesh& mesh, const Spec& spec, const Shape& shape, DType dtype,
                                  const DistTensor::Generator& value);

Verification verify_contraction(Communicator& comm, const Contraction& c, const DimSizes& sizes, DType dtype,
                                const DistTensor& result, const DistTensor::Generator& a_values,
                                const DistTensor::Generator& b_values);

// A reshard must reproduce its input exactly: tolerance 0.
Verification verify_reshard(Communicator& comm, const Spec& from, const Shape& shape, DType dtype,
                            const DistTensor& result, const DistTensor::Generator& values);

}  // namespace shardmm
