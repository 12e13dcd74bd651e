// Closed-form checks of the collectives, for the tests of every backend. Each check runs
// one collective on `comm` with rank-unique inputs and compares the result with the value
// computed here from the inputs' formula, in the order the contract fixes.
//
//   run_threads(Mesh::parse("X=2,Y=2"), [](Communicator& comm) {
//     EXPECT_TRUE(testing::check_all_gather<float>(comm, {0}, testing::Size::uneven));
//     EXPECT_TRUE(testing::check_collectives<double>(comm, {1, 0}, testing::Size::large));
//   });
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm::testing {

template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  return std::is_same_v<T, float> ? DType::f32 : DType::f64;
}

// Element k of device d's data for copies: d + 16 k' + 0.5 with k' = k mod 2^18, exact
// in f32 (below 2^23, one fractional bit) and unique per (device, k') for 16 devices, so
// a wrong value says where it came from: device = value mod 16 - 0.5.
template <typename T>
T tagged(std::int64_t device, std::int64_t k) {
  return static_cast<T>(static_cast<double>(device) + 16.0 * static_cast<double>(k % 262144) + 0.5);
}

// Element k of device d's data for sums: a hash of (d, k) made into a sign, a mantissa of
// digits-4 bits and an exponent spanning digits+8 binades, so that sums of three or more
// round differently in different orders (checked by a test), in f32 and in f64.
template <typename T>
T spread(std::int64_t device, std::int64_t k) {
  constexpr int digits = std::numeric_limits<T>::digits;
  std::uint64_t h = static_cast<std::uint64_t>(device) * 0x9E3779B97F4A7C15ull ^
                    static_cast<std::uint64_t>(k) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  // Built from its bits: std::ldexp would make the large checks several times slower.
  const std::uint64_t mantissa = (h & ((1ull << (digits - 4)) - 1)) << (52 - (digits - 4));
  const std::uint64_t exponent = 1023 + ((h >> 50) & 0x1fff) % (digits + 8) - (digits + 8) / 2;
  return static_cast<T>(std::bit_cast<double>((h >> 63) << 63 | exponent << 52 | mantissa));
}

// ((x[0] + x[1]) + x[2]) + ... in T: the contract's order, members by group rank (or, for
// ReduceOp::max, the largest x).
template <typename T>
T ordered_sum(const std::vector<std::int64_t>& members, std::int64_t k, ReduceOp op = ReduceOp::sum) {
  T sum = spread<T>(members[0], k);
  for (std::size_t m = 1; m < members.size(); ++m) {
    sum = op == ReduceOp::sum ? sum + spread<T>(members[m], k) : std::max(sum, spread<T>(members[m], k));
  }
  return sum;
}

enum class Size { zero, one, small, uneven, large };

inline const char* to_string(Size s) {
  switch (s) {
    case Size::zero:
      return "zero";
    case Size::one:
      return "one";
    case Size::small:
      return "small";
    case Size::uneven:
      return "uneven";
    case Size::large:
      return "large";
  }
  return "?";
}

// Part k of `total` split `parts` ways, the first total % parts one larger.
inline std::int64_t split(std::int64_t total, std::int64_t parts, std::int64_t k) {
  return total / parts + (k < total % parts ? 1 : 0);
}

constexpr std::int64_t large_elements = (1 << 20) + 3;

// Elements member m of n contributes to an all_gather (or gets from a reduce_scatter).
inline std::int64_t member_count(Size s, std::int64_t n, std::int64_t m) {
  switch (s) {
    case Size::zero:
      return 0;
    case Size::one:
      return 1;
    case Size::small:
      return 5;
    case Size::uneven:
      return (3 * m + 1) % 4;  // 1, 0, 3, 2, ...: some members send nothing
    case Size::large:
      return split(large_elements, n, m);
  }
  return 0;
}

inline Counts member_counts(Size s, std::int64_t n) {
  Counts c;
  for (std::int64_t m = 0; m < n; ++m) c.push_back(member_count(s, n, m));
  return c;
}

// Elements in an all_reduce.
inline std::int64_t total_count(Size s, std::int64_t n) {
  switch (s) {
    case Size::zero:
      return 0;
    case Size::one:
      return 1;
    case Size::small:
      return 5;
    case Size::uneven:
      return 2 * n + 1;  // one more than a multiple of the group size
    case Size::large:
      return large_elements;
  }
  return 0;
}

// Elements member `from` sends to member `to` of n in an all_to_all.
inline std::int64_t pair_count(Size s, std::int64_t n, std::int64_t from, std::int64_t to) {
  switch (s) {
    case Size::zero:
      return 0;
    case Size::one:
      return 1;
    case Size::small:
      return 5;
    case Size::uneven:
      return (from + 2 * to) % 4;
    case Size::large:
      return split(large_elements, n * n, from * n + to);
  }
  return 0;
}

namespace detail {

inline Counts prefix(const Counts& counts) {
  Counts out{0};
  for (std::int64_t c : counts) out.push_back(out.back() + c);
  return out;
}

// The first position where `got` differs from `expected` (bitwise), described.
template <typename T, class GotAlloc, class ExpectedAlloc>
::testing::AssertionResult compare(const Communicator& comm, const char* what, const std::vector<T, GotAlloc>& got,
                                   const std::vector<T, ExpectedAlloc>& expected) {
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure() << "rank " << comm.rank() << " " << what << ": size " << got.size()
                                         << ", expected " << expected.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "rank " << comm.rank() << " " << what << "[" << i
                                           << "] = " << std::setprecision(17) << got[i] << ", expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace detail

// Arrays in shardmm::Buffers, the memory the executor keeps tensors in (on one machine the mpi
// backend lends large Buffers to a peer in place instead of copying them): the checks' Alloc.
template <typename T>
struct BufferAllocator {
  using value_type = T;
  BufferAllocator() = default;
  template <typename U>
  BufferAllocator(const BufferAllocator<U>&) {}
  T* allocate(std::size_t n) {
    Buffer b(static_cast<std::int64_t>(n), dtype_of<T>());
    T* p = b.as<T>();
    const std::lock_guard lock(mutex());
    buffers().emplace(p, std::move(b));
    return p;
  }
  void deallocate(T* p, std::size_t) {
    const std::lock_guard lock(mutex());
    buffers().erase(p);
  }
  template <typename U>
  bool operator==(const BufferAllocator<U>&) const {
    return true;
  }

 private:
  // Ranks may be threads of one process: shared, behind a lock.
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<const void*, Buffer>& buffers() {
    static std::map<const void*, Buffer> b;
    return b;
  }
};

// all_gather of counts[m] tagged elements per member; in place (send inside recv at this
// rank's offset) when `in_place`.
template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_all_gather(Communicator& comm, const AxisList& axes, const Counts& counts,
                                            bool in_place = false) {
  using Array = std::vector<T, Alloc>;
  const Mesh& mesh = comm.mesh();
  const std::vector<std::int64_t> members = mesh.group_members(comm.rank(), axes);
  const auto me = static_cast<std::size_t>(mesh.group_rank(comm.rank(), axes));
  const Counts off = detail::prefix(counts);
  Array send(static_cast<std::size_t>(counts[me]));
  for (std::int64_t k = 0; k < counts[me]; ++k) send[static_cast<std::size_t>(k)] = tagged<T>(comm.rank(), k);
  std::vector<T> expected(static_cast<std::size_t>(off.back()));
  for (std::size_t m = 0; m < members.size(); ++m) {
    for (std::int64_t k = 0; k < counts[m]; ++k)
      expected[static_cast<std::size_t>(off[m] + k)] = tagged<T>(members[m], k);
  }
  Array recv(expected.size(), T(-1));
  const T* src = send.data();
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin() + off[me]);
    src = recv.data() + off[me];
  }
  const Array sent = send;
  comm.all_gather(src, recv.data(), counts, dtype_of<T>(), axes);
  if (auto r = detail::compare(comm, "all_gather recv", recv, expected); !r) return r;
  return detail::compare(comm, "all_gather send (must be unchanged)", send, sent);
}

template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_all_gather(Communicator& comm, const AxisList& axes, Size size,
                                            bool in_place = false) {
  return check_all_gather<T, Alloc>(comm, axes, member_counts(size, comm.mesh().group_size(axes)), in_place);
}

// reduce_scatter of a send buffer whose element k is spread(rank, k).
template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_reduce_scatter(Communicator& comm, const AxisList& axes, const Counts& counts) {
  using Array = std::vector<T, Alloc>;
  const Mesh& mesh = comm.mesh();
  const std::vector<std::int64_t> members = mesh.group_members(comm.rank(), axes);
  const auto me = static_cast<std::size_t>(mesh.group_rank(comm.rank(), axes));
  const Counts off = detail::prefix(counts);
  Array send(static_cast<std::size_t>(off.back()));
  for (std::size_t k = 0; k < send.size(); ++k) send[k] = spread<T>(comm.rank(), static_cast<std::int64_t>(k));
  std::vector<T> expected(static_cast<std::size_t>(counts[me]));
  for (std::size_t i = 0; i < expected.size(); ++i)
    expected[i] = ordered_sum<T>(members, off[me] + static_cast<std::int64_t>(i));
  Array recv(expected.size(), T(-1));
  const Array sent = send;
  comm.reduce_scatter(send.data(), recv.data(), counts, dtype_of<T>(), axes);
  if (auto r = detail::compare(comm, "reduce_scatter recv", recv, expected); !r) return r;
  return detail::compare(comm, "reduce_scatter send (must be unchanged)", send, sent);
}

template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_reduce_scatter(Communicator& comm, const AxisList& axes, Size size) {
  return check_reduce_scatter<T, Alloc>(comm, axes, member_counts(size, comm.mesh().group_size(axes)));
}

template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_all_reduce(Communicator& comm, const AxisList& axes, std::int64_t count,
                                            ReduceOp op = ReduceOp::sum) {
  const std::vector<std::int64_t> members = comm.mesh().group_members(comm.rank(), axes);
  std::vector<T, Alloc> data(static_cast<std::size_t>(count));
  std::vector<T> expected(data.size());
  for (std::size_t k = 0; k < data.size(); ++k) {
    data[k] = spread<T>(comm.rank(), static_cast<std::int64_t>(k));
    expected[k] = ordered_sum<T>(members, static_cast<std::int64_t>(k), op);
  }
  comm.all_reduce(data.data(), count, dtype_of<T>(), axes, op);
  return detail::compare(comm, (std::string("all_reduce(") + to_string(op) + ") data").c_str(), data, expected);
}

template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_all_reduce(Communicator& comm, const AxisList& axes, Size size,
                                            ReduceOp op = ReduceOp::sum) {
  return check_all_reduce<T, Alloc>(comm, axes, total_count(size, comm.mesh().group_size(axes)), op);
}

// all_to_all where member `from` sends pair_count(size, n, from, to) tagged elements to
// member `to`: element k of a sender's whole send buffer is tagged(sender, k).
template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_all_to_all(Communicator& comm, const AxisList& axes, Size size) {
  using Array = std::vector<T, Alloc>;
  const Mesh& mesh = comm.mesh();
  const std::vector<std::int64_t> members = mesh.group_members(comm.rank(), axes);
  const auto n = static_cast<std::int64_t>(members.size());
  const std::int64_t me = mesh.group_rank(comm.rank(), axes);
  Counts send_counts, recv_counts;
  for (std::int64_t m = 0; m < n; ++m) {
    send_counts.push_back(pair_count(size, n, me, m));
    recv_counts.push_back(pair_count(size, n, m, me));
  }
  const Counts send_off = detail::prefix(send_counts), recv_off = detail::prefix(recv_counts);
  Array send(static_cast<std::size_t>(send_off.back()));
  for (std::size_t k = 0; k < send.size(); ++k) send[k] = tagged<T>(comm.rank(), static_cast<std::int64_t>(k));
  std::vector<T> expected(static_cast<std::size_t>(recv_off.back()));
  for (std::int64_t m = 0; m < n; ++m) {
    std::int64_t at = 0;  // where member m's chunk for me starts in its send buffer
    for (std::int64_t t = 0; t < me; ++t) at += pair_count(size, n, m, t);
    for (std::int64_t i = 0; i < recv_counts[static_cast<std::size_t>(m)]; ++i) {
      expected[static_cast<std::size_t>(recv_off[static_cast<std::size_t>(m)] + i)] =
          tagged<T>(members[static_cast<std::size_t>(m)], at + i);
    }
  }
  Array recv(expected.size(), T(-1));
  const Array sent = send;
  comm.all_to_all(send.data(), send_counts, recv.data(), recv_counts, dtype_of<T>(), axes);
  if (auto r = detail::compare(comm, "all_to_all recv", recv, expected); !r) return r;
  return detail::compare(comm, "all_to_all send (must be unchanged)", send, sent);
}

// All four collectives, one after another on the same group (all_gather both out of
// place and in place, all_reduce summing and taking the maximum). Runs every one even after
// a failure, so that the ranks stay in step.
template <typename T, class Alloc = std::allocator<T>>
::testing::AssertionResult check_collectives(Communicator& comm, const AxisList& axes, Size size) {
  const ::testing::AssertionResult results[] = {check_all_gather<T, Alloc>(comm, axes, size),
                                                check_all_gather<T, Alloc>(comm, axes, size, true),
                                                check_reduce_scatter<T, Alloc>(comm, axes, size),
                                                check_all_reduce<T, Alloc>(comm, axes, size),
                                                check_all_reduce<T, Alloc>(comm, axes, size, ReduceOp::max),
                                                check_all_to_all<T, Alloc>(comm, axes, size)};
  for (const auto& r : results) {
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace shardmm::testing
