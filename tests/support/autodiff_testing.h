// Helpers for the autodiff tests: run a tape on every rank, collect shards, assemble them.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm::testing {

// Values from a dense row-major array: the generator of a leaf whose logical value is known.
inline DistTensor::Generator from_dense(std::vector<double> values, Shape shape) {
  return [values = std::move(values), shape = std::move(shape)](const Index& i, std::int64_t) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) at = at * shape[d] + i[d];
    return values[static_cast<std::size_t>(at)];
  };
}

inline DistTensor copy_of(const Mesh& mesh, const DistTensor& t) {
  DistTensor c(mesh, t.device(), t.spec(), t.global_shape(), t.dtype());
  std::memcpy(c.data(), t.data(), static_cast<std::size_t>(t.buffer().bytes()));
  return c;
}

// Named tensors of every rank, by device; assembled into logical dense tensors.
class Collected {
 public:
  explicit Collected(const Mesh& mesh) : mesh_(mesh) {}

  void put(const std::string& name, const DistTensor& shard) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& v = shards_[name];
    v.resize(static_cast<std::size_t>(mesh_.device_count()));
    v[static_cast<std::size_t>(shard.device())] = copy_of(mesh_, shard);
  }
  std::vector<double> global(const std::string& name) const {
    std::vector<const DistTensor*> ptrs;
    for (const DistTensor& t : shards_.at(name)) ptrs.push_back(&t);
    return assemble_global(mesh_, ptrs);
  }
  // This device's raw bytes (bitwise comparisons across backends).
  std::vector<unsigned char> bytes(const std::string& name, std::int64_t device) const {
    const DistTensor& t = shards_.at(name)[static_cast<std::size_t>(device)];
    const auto* p = static_cast<const unsigned char*>(t.data());
    return {p, p + t.buffer().bytes()};
  }
  bool has(const std::string& name) const { return shards_.count(name) > 0; }

 private:
  Mesh mesh_;
  std::mutex mutex_;
  std::map<std::string, std::vector<DistTensor>> shards_;
};

}  // namespace shardmm::testing
