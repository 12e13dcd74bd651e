// Distributed tensors: a global shape, a spec, and this device's shard.
//
//   run_threads(mesh, [&](Communicator& comm) {
//     DistTensor a = DistTensor::filled(comm.mesh(), comm.rank(), spec, {8, 4}, DType::f32,
//                                       [](const Index& i, std::int64_t) { return i[0] - i[1]; });
//     a.local_shape();   // this device's block extents
//   });
//
// Only the device's own block is ever materialized. A spec with unreduced axes {U_G}
// holds partial sums: the logical tensor is the sum, over the members of G, of their
// blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

using Index = std::vector<std::int64_t>;
using Shape = std::vector<std::int64_t>;

// Raw storage for one dtype, 64-byte aligned, allocated once and reused. Allocation
// failure is an InputError naming the bytes asked for. Blocks of 64 KiB and more come from the
// runtime's caching pool (BufferPoolStats below): a freed one serves the next Buffer of its size,
// or one of at least half its size when none of that size is kept.
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::int64_t elements, DType dtype);
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <class T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data());
  }
  std::int64_t elements() const { return elements_; }
  DType dtype() const { return dtype_; }
  std::int64_t bytes() const;

 private:
  struct Free {
    std::size_t bytes;  // as allocated: the pool keeps blocks by size
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  std::int64_t elements_ = 0;
  DType dtype_ = DType::f32;
};

// The caching pool behind Buffers (and einsum workspaces), per process. It keeps freed blocks
// for the next Buffer they serve (their size, or up to twice the request) until the run ends:
// run_backend releases it. A block is made only when none kept serves, so the blocks of a size
// never outnumber the most of that size in use at once; a miss lets go of kept blocks beyond
// twice the peak of live bytes (src/runtime/buffer_pool.h).
struct BufferPoolStats {
  std::int64_t live_bytes = 0;    // in Buffers now, as they asked for
  std::int64_t spare_bytes = 0;   // in use beyond that: a Buffer given a kept block up to twice its size
  std::int64_t kept_bytes = 0;    // freed, kept for reuse
  std::int64_t peak_bytes = 0;    // the most live at once since the last release
  std::int64_t reused_bytes = 0;  // served from kept blocks since the last release (live bytes)
};
BufferPoolStats buffer_pool_stats();
// Frees every kept block and starts the peak (from what is live now) and reused_bytes again.
void release_buffer_pool();

class DistTensor {
 public:
  DistTensor() = default;
  // An uninitialized shard of `spec` for `device`.
  DistTensor(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype);

  // Each element of the block is value(global index, r), where r is the device's rank in
  // the group of unreduced axes (0 when there are none): the logical tensor is the sum of
  // value(i, r) over r.
  using Generator = std::function<double(const Index& global, std::int64_t unreduced_rank)>;
  static DistTensor filled(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype,
                           const Generator& value);

  // Scatter: this device's block of a dense row-major global array (`global` holds
  // prod(global_shape) elements of `dtype`). With unreduced axes the value goes to the
  // member at coordinate 0 of them and the others hold zeros, so the sum is the array.
  static DistTensor from_global(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype,
                                const void* global);

  const Spec& spec() const { return spec_; }
  const Shape& global_shape() const { return global_; }
  const std::vector<Range>& box() const { return box_; }  // this device's block
  const Shape& local_shape() const { return local_; }
  std::int64_t device() const { return device_; }
  DType dtype() const { return buffer_.dtype(); }
  std::int64_t elements() const { return buffer_.elements(); }
  Buffer& buffer() { return buffer_; }
  const Buffer& buffer() const { return buffer_; }
  void* data() { return buffer_.data(); }
  const void* data() const { return buffer_.data(); }

 private:
  Spec spec_;
  Shape global_;
  std::vector<Range> box_;
  Shape local_;
  std::int64_t device_ = 0;
  Buffer buffer_;
};

class Communicator;

// Replicas of a block that should be equal are not: a wrong result, not a failure to get one.
class ReplicasDisagree : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Gather: every rank sends its shard to device 0, which returns the logical global tensor
// (row-major, f64; unreduced axes summed in group-rank order, replicas checked to agree:
// ReplicasDisagree on device 0 when they do not); the other ranks return an empty vector.
// Call it on every rank (SPMD).
std::vector<double> gather_global(Communicator& comm, const DistTensor& shard);

// Assembles the logical global tensor of one rank's shards, for verification only:
// `shards` holds every device's shard (index = device id). Unreduced axes are summed in
// group-rank order. The result is row-major, in f64.
std::vector<double> assemble_global(const Mesh& mesh, const std::vector<const DistTensor*>& shards);

}  // namespace shardmm
