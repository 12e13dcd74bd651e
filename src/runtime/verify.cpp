#include "shardmm/runtime/verify.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "shardmm/core/error.h"
#include "shardmm/runtime/kernels.h"

namespace shardmm {

namespace {

std::int64_t elements(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t e : s) n *= e;
  return n;
}

double round_to(DType dtype, double v) { return dtype == DType::f32 ? double(static_cast<float>(v)) : v; }

double eps(DType dtype) { return dtype == DType::f32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53); }

// Device 0's verdict, shared with every rank (a sum over the whole mesh of values that
// only device 0 fills in).
Verification share(Communicator& comm, Verification v) {
  double msg[5] = {0, 0, 0, 0, 0};
  if (comm.rank() == 0) {
    msg[0] = v.verified ? 1 : 0;
    msg[1] = v.max_abs_error;
    msg[2] = v.max_rel_error;
    msg[3] = v.tolerance;
    msg[4] = v.rel_tolerance;
  }
  comm.all_reduce(msg, 5, DType::f64, comm.mesh().all_axes());
  if (comm.rank() != 0) {
    v.verified = msg[0] == 1;
    v.max_abs_error = msg[1];
    v.max_rel_error = msg[2];
    v.tolerance = msg[3];
    v.rel_tolerance = msg[4];
    v.detail = "see device 0";
  }
  return v;
}

Verification compare(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                     double rel_slack) {
  Verification v;
  v.tolerance = tolerance;
  v.rel_tolerance = rel_slack;
  v.verified = got.size() == want.size();
  std::size_t worst = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double rel = err / std::max(std::fabs(want[i]), std::numeric_limits<double>::min());
    if (!(err <= tolerance + rel_slack * std::fabs(want[i]))) v.verified = false;  // NaN fails too
    if (!(err <= v.max_abs_error)) {
      v.max_abs_error = err;
      worst = i;
    }
    if (want[i] != 0) v.max_rel_error = std::max(v.max_rel_error, rel);
  }
  if (!got.empty()) {
    v.detail = "largest error at flat index " + std::to_string(worst) + ": got " + std::to_string(got[worst]) +
               ", expected " + std::to_string(want[worst]);
  }
  return v;
}

}  // namespace

DistTensor::Generator uniform_values(std::uint64_t seed) {
  return [seed](const Index& i, std::int64_t r) {
    std::uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(r) + 1) * 0xD6E8FEB86659FD93ull;
    for (std::int64_t x : i) {
      h ^= static_cast<std::uint64_t>(x) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
    }
    h *= 0x94D049BB133111EBull;
    h ^= h >> 32;
    return static_cast<double>(h >> 11) * std::ldexp(1.0, -52) - 1.0;  // [-1, 1)
  };
}

std::vector<double> dense_logical(const Mesh& mesh, const Spec& spec, const Shape& shape, DType dtype,
                                  const DistTensor::Generator& value) {
  const std::int64_t n = elements(shape);
  const std::int64_t parts = mesh.group_size(spec.unreduced);
  std::vector<double> out(static_cast<std::size_t>(n));
  Index idx(shape.size(), 0);
  for (std::int64_t pos = 0; pos < n; ++pos) {
    std::int64_t rest = pos;
    for (std::size_t d = shape.size(); d-- > 0;) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
    }
    double v = 0;
    for (std::int64_t r = 0; r < parts; ++r) v += round_to(dtype, value(idx, r));
    out[static_cast<std::size_t>(pos)] = v;
  }
  return out;
}

namespace {

// The largest sum of the magnitudes of an element's partial sums (its magnitude when it has
// none): the scale of the rounding in any sum the partials enter. (Rounding is symmetric in
// sign, so the magnitudes of the rounded values are themselves rounded values.)
double largest_partial_magnitude(const Mesh& mesh, const Spec& spec, const Shape& shape, DType dtype,
                                 const DistTensor::Generator& value) {
  const auto magnitude = [&](const Index& i, std::int64_t r) { return std::fabs(round_to(dtype, value(i, r))); };
  const std::vector<double> sums = dense_logical(mesh, spec, shape, dtype, magnitude);
  return sums.empty() ? 0.0 : *std::max_element(sums.begin(), sums.end());
}

}  // namespace

Verification verify_contraction(Communicator& comm, const Contraction& c, const DimSizes& sizes, DType dtype,
                                const DistTensor& result, const DistTensor::Generator& a_values,
                                const DistTensor::Generator& b_values) {
  const Mesh& mesh = comm.mesh();
  Verification v;
  std::vector<double> got;
  try {
    got = gather_global(comm, result);
  } catch (const ReplicasDisagree& e) {  // a wrong result; any other failure ends the run
    v.detail = e.what();
  }
  if (comm.rank() == 0 && v.detail.empty()) {
    const Shape a_shape = global_shape(c.a, sizes), b_shape = global_shape(c.b, sizes);
    const std::vector<double> a = dense_logical(mesh, c.a, a_shape, dtype, a_values);
    const std::vector<double> b = dense_logical(mesh, c.b, b_shape, dtype, b_values);
    EinsumLayout layout;
    std::map<std::string, std::int64_t> extents(sizes.begin(), sizes.end());
    for (const DimSpec& d : c.a.dims) layout.a.push_back(d.name);
    for (const DimSpec& d : c.b.dims) layout.b.push_back(d.name);
    layout.c = c.out_dims;
    std::int64_t c_elements = 1;
    for (const std::string& d : c.out_dims) c_elements *= sizes.at(d);
    std::vector<double> want(static_cast<std::size_t>(c_elements));
    LocalEinsum(layout, extents, DType::f64).run(a.data(), b.data(), want.data());
    std::int64_t terms = mesh.group_size(c.a.unreduced) * mesh.group_size(c.b.unreduced);
    for (const std::string& j : c.contracted()) terms *= sizes.at(j);
    // The rounding scales with what the ranks add up: an operand's partial sums, not their
    // total, which may nearly cancel.
    const double max_a = largest_partial_magnitude(mesh, c.a, a_shape, dtype, a_values);
    const double max_b = largest_partial_magnitude(mesh, c.b, b_shape, dtype, b_values);
    const double tolerance = 2.0 * static_cast<double>(terms) * eps(dtype) * max_a * max_b;
    v = compare(got, want, tolerance, eps(dtype));
  }
  return share(comm, v);
}

Verification verify_reshard(Communicator& comm, const Spec& from, const Shape& shape, DType dtype,
                            const DistTensor& result, const DistTensor::Generator& values) {
  Verification v;
  std::vector<double> got;
  try {
    got = gather_global(comm, result);
  } catch (const ReplicasDisagree& e) {  // a wrong result; any other failure ends the run
    v.detail = e.what();
  }
  if (comm.rank() == 0 && v.detail.empty()) {
    // Resolving unreduced axes sums `parts` partials (each below 1 in magnitude) in the
    // tensor's dtype: that sum may round, by at most parts^2 * eps. Moving data alone is exact.
    const double parts = static_cast<double>(comm.mesh().group_size(from.unreduced));
    const double tolerance = parts > 1 ? parts * parts * eps(dtype) : 0.0;
    v = compare(got, dense_logical(comm.mesh(), from, shape, dtype, values), tolerance, 0.0);
  }
  return share(comm, v);
}

}  // namespace shardmm
