#include "shardmm/runtime/tensor.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "shardmm/core/error.h"
#include "shardmm/plan/memory.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/kernels.h"
#include "buffer_pool.h"
#if SHARDMM_HAVE_MPI
#include "runtime/mpi/shareable_memory.h"
#endif

namespace shardmm {

// Where the mpi backend runs all ranks on one machine, Buffers are made shareable so that its
// messages can lend them to a peer in place (runtime/mpi/shareable_memory.h).
void Buffer::Free::operator()(void* p) const {
#if SHARDMM_HAVE_MPI
  if (detail::free_shareable(p)) return;
#endif
  detail::pool_free(p, bytes);
}

Buffer::Buffer(std::int64_t elements, DType dtype) : elements_(elements), dtype_(dtype) {
  const std::int64_t bytes = checked_mul(elements, dtype_bytes(dtype), "a buffer's size");
  // Never zero-sized, so that data() is a valid pointer even for an empty shard.
  const std::int64_t rounded = buffer_bytes(elements, dtype);
  data_.get_deleter().bytes = static_cast<std::size_t>(rounded);
#if SHARDMM_HAVE_MPI
  if (detail::buffers_shareable() && static_cast<std::size_t>(rounded) >= detail::kShareableMinBytes) {
    data_.reset(detail::allocate_shareable(static_cast<std::size_t>(rounded)));
  }
#endif
  if (!data_) data_.reset(detail::pool_allocate(static_cast<std::size_t>(rounded)));
  if (!data_) {
    throw InputError("cannot allocate " + std::to_string(bytes) +
                     " bytes for one buffer on this device: not that much memory is free; ask for smaller sizes (" +
                     field("dims") + ", " + field("sizes") + ") or more devices");
  }
}

std::int64_t Buffer::bytes() const { return elements_ * dtype_bytes(dtype_); }

DistTensor::DistTensor(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype)
    : spec_(std::move(spec)), global_(std::move(global_shape)), device_(device) {
  box_ = shard_box(mesh, spec_, global_, device);
  std::int64_t n = 1;
  for (const Range& r : box_) {
    local_.push_back(r.extent);
    n *= r.extent;
  }
  buffer_ = Buffer(n, dtype);
}

namespace {

// Calls f(global index, linear local position) for every element of the box, in
// row-major order.
template <class F>
void for_each_in_box(const std::vector<Range>& box, F&& f) {
  const std::size_t rank = box.size();
  for (const Range& r : box) {
    if (r.extent == 0) return;
  }
  Index idx(rank);
  for (std::size_t d = 0; d < rank; ++d) idx[d] = box[d].offset;
  for (std::int64_t pos = 0;; ++pos) {
    f(idx, pos);
    std::size_t d = rank;
    while (d > 0) {
      --d;
      if (++idx[d] < box[d].end()) break;
      idx[d] = box[d].offset;
      if (d == 0) return;
    }
    if (rank == 0) return;
  }
}

}  // namespace

DistTensor DistTensor::filled(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype,
                              const Generator& value) {
  DistTensor t(mesh, device, std::move(spec), std::move(global_shape), dtype);
  const std::int64_t r = mesh.group_rank(device, t.spec_.unreduced);
  if (dtype == DType::f32) {
    float* p = t.buffer_.as<float>();
    for_each_in_box(t.box_, [&](const Index& i, std::int64_t pos) { p[pos] = static_cast<float>(value(i, r)); });
  } else if (dtype == DType::f64) {
    double* p = t.buffer_.as<double>();
    for_each_in_box(t.box_, [&](const Index& i, std::int64_t pos) { p[pos] = value(i, r); });
  } else {
    throw InputError(std::string("tensors hold f32 or f64 data; got ") + to_string(dtype));
  }
  return t;
}

DistTensor DistTensor::from_global(const Mesh& mesh, std::int64_t device, Spec spec, Shape global_shape, DType dtype,
                                   const void* global) {
  DistTensor t(mesh, device, std::move(spec), std::move(global_shape), dtype);
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw InputError(std::string("tensors hold f32 or f64 data; got ") + to_string(dtype));
  }
  if (mesh.group_rank(device, t.spec_.unreduced) != 0) {
    std::memset(t.data(), 0, static_cast<std::size_t>(t.buffer_.bytes()));
    return t;
  }
  Shape offset;
  for (const Range& r : t.box_) offset.push_back(r.offset);
  if (dtype == DType::f32) {
    copy_box(static_cast<const float*>(global), t.global_, offset, t.buffer_.as<float>(), t.local_,
             Shape(t.local_.size(), 0), t.local_);
  } else {
    copy_box(static_cast<const double*>(global), t.global_, offset, t.buffer_.as<double>(), t.local_,
             Shape(t.local_.size(), 0), t.local_);
  }
  return t;
}

std::vector<double> gather_global(Communicator& comm, const DistTensor& shard) {
  constexpr int kGatherTag = 0x5e7f;
  const Mesh& mesh = comm.mesh();
  if (comm.rank() != 0) {
    comm.send(shard.data(), shard.buffer().bytes(), 0, kGatherTag);
    return {};
  }
  std::vector<DistTensor> shards;
  std::vector<const DistTensor*> ptrs;
  for (std::int64_t dev = 0; dev < mesh.device_count(); ++dev) {
    DistTensor t(mesh, dev, shard.spec(), shard.global_shape(), shard.dtype());
    if (dev == 0) {
      std::memcpy(t.data(), shard.data(), static_cast<std::size_t>(shard.buffer().bytes()));
    } else {
      comm.recv(t.data(), t.buffer().bytes(), dev, kGatherTag);
    }
    shards.push_back(std::move(t));
  }
  for (const DistTensor& t : shards) ptrs.push_back(&t);
  return assemble_global(mesh, ptrs);
}

std::vector<double> assemble_global(const Mesh& mesh, const std::vector<const DistTensor*>& shards) {
  const DistTensor& first = *shards.at(0);
  const Spec& spec = first.spec();
  const Shape& shape = first.global_shape();
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  std::vector<double> global(static_cast<std::size_t>(n), 0.0);
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  // Replicated axes: one replica (coordinate 0) supplies the value; the others must agree.
  AxisList replicated;
  for (int a = 0; a < mesh.rank(); ++a) {
    if (!spec.uses(a)) replicated.push_back(a);
  }
  const auto value = [](const DistTensor& t, std::int64_t pos) {
    return t.dtype() == DType::f32 ? double(t.buffer().as<float>()[pos]) : t.buffer().as<double>()[pos];
  };
  for (std::int64_t dev = 0; dev < mesh.device_count(); ++dev) {
    const DistTensor& t = *shards.at(static_cast<std::size_t>(dev));
    if (mesh.group_rank(dev, replicated) != 0) {
      // Compare with the replica at coordinate 0 of the replicated axes.
      std::int64_t twin = dev;
      for (int a : replicated) twin -= mesh.coord(dev, a) * mesh.stride(a);
      const DistTensor& ref = *shards.at(static_cast<std::size_t>(twin));
      if (std::memcmp(t.data(), ref.data(), static_cast<std::size_t>(t.buffer().bytes())) != 0) {
        throw ReplicasDisagree("replicas disagree: device " + std::to_string(dev) + " and device " +
                               std::to_string(twin) + " should hold the same block of " + spec.tensor);
      }
      continue;
    }
    for_each_in_box(t.box(), [&](const Index& i, std::int64_t pos) {
      std::int64_t at = 0;
      for (std::size_t d = 0; d < i.size(); ++d) at += i[d] * strides[d];
      global[static_cast<std::size_t>(at)] += value(t, pos);
    });
  }
  return global;
}

}  // namespace shardmm
