// The dense single-device reference for differential tests: logical tensors built from
// the same generator the distributed tensors use, and a naive einsum in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardmm/core/geometry.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm::testing {

// Small multiples of 1/8: products and sums of a few thousand of them are exact in f32
// and f64, so a correct sharded result equals the reference bit for bit.
inline double test_value(std::uint64_t tensor_seed, const Index& i, std::int64_t r) {
  std::uint64_t h = tensor_seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(r) * 0xBF58476D1CE4E5B9ull;
  for (std::int64_t x : i) {
    h ^= static_cast<std::uint64_t>(x) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0x94D049BB133111EBull;
  }
  h ^= h >> 31;
  return static_cast<double>(static_cast<std::int64_t>(h % 33) - 16) / 8.0;
}

inline DistTensor::Generator generator(std::uint64_t tensor_seed) {
  return [tensor_seed](const Index& i, std::int64_t r) { return test_value(tensor_seed, i, r); };
}

// C[c] = sum over the other letters of A[a] * B[b]; every letter's size in `sizes`.
inline std::vector<double> dense_einsum(const std::vector<std::string>& a_dims, const std::vector<double>& a,
                                        const std::vector<std::string>& b_dims, const std::vector<double>& b,
                                        const std::vector<std::string>& c_dims, const DimSizes& sizes) {
  std::vector<std::string> letters = c_dims;
  for (const auto* dims : {&a_dims, &b_dims}) {
    for (const std::string& l : *dims) {
      if (std::find(letters.begin(), letters.end(), l) == letters.end()) letters.push_back(l);
    }
  }
  std::map<std::string, std::int64_t> value;
  const auto offset = [&](const std::vector<std::string>& dims) {
    std::int64_t at = 0;
    for (const std::string& l : dims) at = at * sizes.at(l) + value[l];
    return at;
  };
  std::int64_t c_n = 1;
  for (const std::string& l : c_dims) c_n *= sizes.at(l);
  std::vector<double> c(static_cast<std::size_t>(c_n), 0.0);
  std::int64_t total = 1;
  for (const std::string& l : letters) total *= sizes.at(l);
  for (std::int64_t pos = 0; pos < total; ++pos) {
    std::int64_t rest = pos;
    for (std::size_t i = letters.size(); i-- > 0;) {
      value[letters[i]] = rest % sizes.at(letters[i]);
      rest /= sizes.at(letters[i]);
    }
    c[static_cast<std::size_t>(offset(c_dims))] +=
        a[static_cast<std::size_t>(offset(a_dims))] * b[static_cast<std::size_t>(offset(b_dims))];
  }
  return c;
}

inline std::vector<std::string> dim_names(const Spec& s) {
  std::vector<std::string> out;
  for (const DimSpec& d : s.dims) out.push_back(d.name);
  return out;
}

}  // namespace shardmm::testing
