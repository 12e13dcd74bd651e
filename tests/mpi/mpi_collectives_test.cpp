// The mpi backend, run as a 4-process job (tests/mpi/CMakeLists.txt starts it under mpirun).
// Every process runs the same tests in the same order; each test's body runs on this
// process's rank. Only rank 0 prints gtest's report, the others print their failures, and
// the exit status is non-zero when any rank failed.
//
// Checks inside a body use EXPECT, never ASSERT: a rank that left a body early would leave
// its peers waiting in the next collective.
#include <gtest/gtest.h>

// The C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mpi/mpi_test.h"
#include "runtime/collectives_testing.h"
#include "runtime/mpi/mpi_backend.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/errors.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm {
namespace {

using testing::Size;

struct Group {
  const char* mesh;
  AxisList axes;
  const char* name;
};

// X=4 over X, every group of X=2,Y=2 (both orders of the two-axis group), and the empty
// group (each rank alone).
const Group kGroups[] = {
    {"X=4", {0}, "X4_X"},           {"X=2,Y=2", {0}, "X2Y2_X"},     {"X=2,Y=2", {1}, "X2Y2_Y"},
    {"X=2,Y=2", {0, 1}, "X2Y2_XY"}, {"X=2,Y=2", {1, 0}, "X2Y2_YX"}, {"X=4", {}, "X4_none"},
};

const Size kSizes[] = {Size::zero, Size::one, Size::small, Size::uneven, Size::large};

// Calls `check` with a value of the dtype's element type (float or double).
template <class F>
void with_dtype(DType dtype, F&& check) {
  if (dtype == DType::f32) {
    check(float{});
  } else {
    check(double{});
  }
}

// Restores the count limit when a test that lowered it ends.
class CountLimit {
 public:
  explicit CountLimit(std::int64_t limit) : previous_(detail::set_mpi_count_limit(limit)) {}
  ~CountLimit() { detail::set_mpi_count_limit(previous_); }
  CountLimit(const CountLimit&) = delete;
  CountLimit& operator=(const CountLimit&) = delete;

 private:
  std::int64_t previous_;
};

// ---- the four collectives against closed-form values ----

using CollectivesParam = std::tuple<Group, DType, Size>;

class Collectives : public ::testing::TestWithParam<CollectivesParam> {};

TEST_P(Collectives, MatchClosedForm) {
  // Named, not bound: the lambdas below capture them (clang 14 cannot capture a binding).
  const Group& group = std::get<0>(GetParam());
  const DType dtype = std::get<1>(GetParam());
  const auto size = std::get<2>(GetParam());
  int ran = 0;
  run_backend("mpi", Mesh::parse(group.mesh), [&](Communicator& comm) {
    ++ran;
    EXPECT_EQ(comm.backend(), "mpi");
    EXPECT_EQ(comm.rank(), world_rank);
    with_dtype(dtype, [&](auto t) {
      using T = decltype(t);
      EXPECT_TRUE(testing::check_collectives<T>(comm, group.axes, size));
    });
  });
  EXPECT_EQ(ran, 1);
}

std::string collectives_name(const ::testing::TestParamInfo<CollectivesParam>& info) {
  const auto& [group, dtype, size] = info.param;
  return std::string(group.name) + "_" + to_string(dtype) + "_" + testing::to_string(size);
}

INSTANTIATE_TEST_SUITE_P(Mpi, Collectives,
                         ::testing::Combine(::testing::ValuesIn(kGroups), ::testing::Values(DType::f32, DType::f64),
                                            ::testing::ValuesIn(kSizes)),
                         collectives_name);

// Counts and offsets beyond the limit go out as point-to-point pieces (the path for counts
// past INT_MAX); a limit of 3 elements splits every chunk of the small and uneven sizes.
TEST(MpiPieces, CollectivesMatchClosedFormWhenSplit) {
  const CountLimit limit(3);
  for (const Group& group : kGroups) {
    run_backend("mpi", Mesh::parse(group.mesh), [&](Communicator& comm) {
      for (Size size : {Size::one, Size::small, Size::uneven}) {
        EXPECT_TRUE(testing::check_collectives<float>(comm, group.axes, size)) << group.name;
        EXPECT_TRUE(testing::check_collectives<double>(comm, group.axes, size)) << group.name;
      }
    });
  }
}

TEST(MpiPieces, LargeCollectivesMatchClosedFormWhenSplit) {
  const CountLimit limit(100000);
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    EXPECT_TRUE(testing::check_collectives<double>(comm, {1, 0}, Size::large));
  });
}

// Groups on one node exchange through a shared window in rounds of at most a partition per
// peer (shared_exchange.h); a 64-byte partition makes every size but one element take several,
// and the window's two banks each be written again many times in one collective. (Not the
// large size: thousands of rounds of ranks time-sliced on two cores took 9 s.)
TEST(MpiShared, CollectivesMatchClosedFormInManySmallRounds) {
  const std::int64_t previous = detail::set_mpi_shared_part(64);
  const std::int64_t before = detail::mpi_shared_exchanges();
  for (const Group& group : kGroups) {
    run_backend("mpi", Mesh::parse(group.mesh), [&](Communicator& comm) {
      for (Size size : {Size::zero, Size::one, Size::small, Size::uneven}) {
        EXPECT_TRUE(testing::check_collectives<float>(comm, group.axes, size)) << group.name;
        EXPECT_TRUE(testing::check_collectives<double>(comm, group.axes, size)) << group.name;
      }
    });
  }
  detail::set_mpi_shared_part(previous);
  // Every group of more than one rank is on this node; SHARDMM_MPI_SHARED_MEMORY=0 (the
  // point-to-point run of this program) keeps all of them off the windows.
  if (!shared_memory_on()) {
    EXPECT_EQ(detail::mpi_shared_exchanges(), before);
  } else {
    EXPECT_GT(detail::mpi_shared_exchanges(), before + 100);
  }
}

// Each rank sizes its partition from its own core's L2, and cores of one node may differ: the
// group takes the least, so ranks that would each pick another size still share one layout.
TEST(MpiShared, RanksThatWouldPickDifferentPartitionsAgreeOnOne) {
  const std::int64_t previous = detail::set_mpi_shared_part(64 * (world_rank + 1));
  for (const Group& group : kGroups) {
    run_backend("mpi", Mesh::parse(group.mesh), [&](Communicator& comm) {
      for (Size size : {Size::one, Size::small, Size::uneven}) {
        EXPECT_TRUE(testing::check_collectives<float>(comm, group.axes, size)) << group.name;
      }
    });
  }
  detail::set_mpi_shared_part(previous);
}

// On one node a collective's large pieces that lie in Buffers are lent: the shared window
// carries only their sizes, and each receiver reads (or, in a reduce_scatter, sums) them where
// their senders keep them. The large size sends every piece that way; the mixed counts send
// one member's pieces lent, the others' through the window, and one member's nothing.
TEST(MpiShared, CollectivesReadLargePiecesOfBuffersInPlace) {
  using testing::BufferAllocator;
  const ScopedEnv lend("SHARDMM_MPI_LEND", "1");
  const std::int64_t before = detail::mpi_lent_pieces();
  for (const Group& group : kGroups) {
    run_backend("mpi", Mesh::parse(group.mesh), [&](Communicator& comm) {
      EXPECT_TRUE((testing::check_collectives<float, BufferAllocator<float>>(comm, group.axes, Size::large)))
          << group.name;
      EXPECT_TRUE((testing::check_collectives<double, BufferAllocator<double>>(comm, group.axes, Size::large)))
          << group.name;
      if (comm.mesh().group_size(group.axes) == 4) {
        const Counts mixed = {0, 300000, 7, 9000};
        for (bool in_place : {false, true}) {
          EXPECT_TRUE((testing::check_all_gather<float, BufferAllocator<float>>(comm, group.axes, mixed, in_place)))
              << group.name;
        }
        EXPECT_TRUE((testing::check_reduce_scatter<double, BufferAllocator<double>>(comm, group.axes, mixed)))
            << group.name;
      }
    });
  }
  if (shared_memory_on()) {
    EXPECT_GT(detail::mpi_lent_pieces(), before);
  } else {
    EXPECT_EQ(detail::mpi_lent_pieces(), before);
  }
}

// All gathers of 4 x 512 KiB of Buffers: `calls` of them on X=4, each rank's piece different
// in each call and checked where it lands. Returns the pieces this rank read where they were lent.
std::int64_t gathers_of_buffers(int calls) {
  const std::int64_t before = detail::mpi_lent_pieces();
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    constexpr std::int64_t kPiece = 128 << 10;  // f32 elements
    const Counts counts(4, kPiece);
    Buffer mine(kPiece, DType::f32), all(4 * kPiece, DType::f32);
    for (int c = 0; c < calls; ++c) {
      const auto value = [&](std::int64_t rank, std::int64_t i) {
        return static_cast<float>(c * 1000 + rank * 100 + i % 97);
      };
      for (std::int64_t i = 0; i < kPiece; ++i) mine.as<float>()[i] = value(comm.rank(), i);
      comm.all_gather(mine.data(), all.data(), counts, DType::f32, {0});
      std::int64_t wrong = 0;
      for (std::int64_t r = 0; r < 4; ++r) {
        for (std::int64_t i = 0; i < kPiece; ++i) wrong += all.as<float>()[r * kPiece + i] != value(r, i);
      }
      EXPECT_EQ(wrong, 0) << "call " << c << ", rank " << comm.rank();
    }
  });
  return detail::mpi_lent_pieces() - before;
}

// SHARDMM_MPI_LEND=0: nothing is lent, everything goes through the window.
TEST(MpiShared, LendingSwitchedOffSendsThroughTheWindow) {
  const ScopedEnv lend("SHARDMM_MPI_LEND", "0");
  EXPECT_EQ(gathers_of_buffers(4), 0);
}

// Unset, each exchange learns whether lending makes its calls follow each other sooner
// (lend_choice.h); its first calls try both, two calls each in turn, lending first, each rank
// for itself: of the first eight gathers four are lent, three pieces to each rank in each.
TEST(MpiShared, LendingIsLearnedTryingBothFirst) {
  const ScopedEnv lend("SHARDMM_MPI_LEND", nullptr);
  EXPECT_EQ(gathers_of_buffers(8), shared_memory_on() ? 12 : 0);
}

// On one node a send from a Buffer is lent in place. The ring below forwards each rank's shard
// n-1 hops, as the all_gather_einsum ring does (each member forwarding what it was lent), and
// lets go nearest the end first: every member reads every shard where its owner wrote it, and
// nothing is copied. A send from other memory (a vector) is copied once, into a bounce block.
std::vector<char> message(std::int64_t from, std::int64_t bytes, int tag);  // below, with the point-to-point tests

TEST(MpiShared, RingsLendBuffersInPlace) {
  const std::int64_t lent_before = detail::mpi_shared_sends(true);
  const std::int64_t copied_before = detail::mpi_shared_sends(false);
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    const std::int64_t n = 4, me = comm.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    constexpr std::int64_t kElements = 1 << 16;  // 256 KiB: shareable
    constexpr std::int64_t kBytes = kElements * 4;
    Buffer mine(kElements, DType::f32);
    for (std::int64_t i = 0; i < kElements; ++i) mine.as<float>()[i] = static_cast<float>(me * kElements + i);
    // Where each hop's copy would land, apart: a copy is forwarded while the next one arrives.
    std::vector<std::vector<float>> landing(n, std::vector<float>(kElements, -1.0f));
    const void* at = mine.data();
    std::vector<Request> received, forwarded;  // forwarded[k]: what arrived at hop k (0: mine)
    for (std::int64_t hop = 1; hop < n; ++hop) {
      std::vector<float>& land = landing[static_cast<std::size_t>(hop)];
      Request r = comm.irecv_lent(land.data(), kBytes, prev, 7);
      forwarded.push_back(comm.isend(at, kBytes, next, 7));
      r->wait();
      at = r->received();
      const std::int64_t owner = (me - hop + n) % n;
      const float* got = static_cast<const float*>(at);
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < kElements; ++i) wrong += got[i] != static_cast<float>(owner * kElements + i);
      EXPECT_EQ(wrong, 0) << "rank " << me << ", hop " << hop;
      EXPECT_EQ(at == land.data(), !shared_memory_on()) << "rank " << me << ", hop " << hop;
      received.push_back(std::move(r));
    }
    for (std::int64_t hop = n - 1; hop >= 1; --hop) {
      if (hop < n - 1) forwarded[static_cast<std::size_t>(hop)]->wait();
      received[static_cast<std::size_t>(hop - 1)].reset();
    }
    forwarded[0]->wait();
    const std::vector<char> out = message(me, 100, 3);
    std::vector<char> in(100);
    comm.send(out.data(), 100, next, 8);
    comm.recv(in.data(), 100, prev, 8);
    EXPECT_EQ(in, message(prev, 100, 3));
  });
  if (shared_memory_on()) {
    EXPECT_EQ(detail::mpi_shared_sends(true) - lent_before, 3);
    EXPECT_EQ(detail::mpi_shared_sends(false) - copied_before, 1);
  } else {
    EXPECT_EQ(detail::mpi_shared_sends(true), lent_before);
    EXPECT_EQ(detail::mpi_shared_sends(false), copied_before);
  }
}

// A blocking send is complete once copied, but a rank whose run ends before the receiver has
// read the copy must keep it until then: rank 0 returns at once, rank 1 receives later.
// Unchecked: a checked run's end already waits for every rank to return.
TEST(MpiShared, ACopiedSendOutlivesItsSendersRun) {
  BackendOptions unchecked;
  unchecked.check = false;
  run_backend(
      "mpi", Mesh::parse("X=4"),
      [&](Communicator& comm) {
        if (comm.rank() == 0) comm.send(message(0, 1000, 5).data(), 1000, 1, 5);
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          std::vector<char> in(1000);
          comm.recv(in.data(), 1000, 0, 5);
          EXPECT_EQ(in, message(0, 1000, 5));
        }
      },
      unchecked);
}

// The input error a run gives with `value` in the switch `name`.
std::string switch_error(const char* name, const char* value) {
  const ScopedEnv set(name, value);
  try {
    run_backend("mpi", Mesh::parse("X=4"), [](Communicator&) {});
  } catch (const InputError& e) {
    return e.what();
  }
  return "no InputError";
}

// Anything but 0 or 1 in a shared-memory switch is an input error.
TEST(MpiShared, TheSwitchesTakeZeroOrOne) {
  EXPECT_EQ(switch_error("SHARDMM_MPI_SHARED_MEMORY", "yes"),
            "SHARDMM_MPI_SHARED_MEMORY='yes': it is 1 (ranks on one node exchange through shared memory), 0 (MPI "
            "messages only) or unset (1)");
  EXPECT_EQ(switch_error("SHARDMM_MPI_LEND", "always"),
            "SHARDMM_MPI_LEND='always': it is 1 (a collective's large pieces in Buffers are lent to their receivers), "
            "0 (all go through the shared window) or unset (whichever has made the exchange's calls follow each "
            "other sooner)");
}

// ---- bitwise agreement with the threads backend ----

enum class Op { all_gather, reduce_scatter, all_reduce, all_to_all };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_gather:
      return "all_gather";
    case Op::reduce_scatter:
      return "reduce_scatter";
    case Op::all_reduce:
      return "all_reduce";
    case Op::all_to_all:
      return "all_to_all";
  }
  return "?";
}

template <class T>
std::vector<T> spread_data(std::int64_t device, std::int64_t count) {
  std::vector<T> v(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) v[static_cast<std::size_t>(k)] = testing::spread<T>(device, k);
  return v;
}

std::int64_t total(const Counts& counts) {
  std::int64_t sum = 0;
  for (std::int64_t c : counts) sum += c;
  return sum;
}

// Runs `op` on spread() inputs and returns this rank's output bytes.
template <class T>
std::vector<char> run_op(Communicator& comm, Op op, const AxisList& axes, Size size) {
  const std::int64_t n = comm.mesh().group_size(axes);
  const std::int64_t me = comm.mesh().group_rank(comm.rank(), axes);
  const DType dtype = testing::dtype_of<T>();
  std::vector<T> out;
  switch (op) {
    case Op::all_gather: {
      const Counts counts = testing::member_counts(size, n);
      const std::vector<T> send = spread_data<T>(comm.rank(), counts[static_cast<std::size_t>(me)]);
      out.resize(static_cast<std::size_t>(total(counts)));
      comm.all_gather(send.data(), out.data(), counts, dtype, axes);
      break;
    }
    case Op::reduce_scatter: {
      const Counts counts = testing::member_counts(size, n);
      const std::vector<T> send = spread_data<T>(comm.rank(), total(counts));
      out.resize(static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]));
      comm.reduce_scatter(send.data(), out.data(), counts, dtype, axes);
      break;
    }
    case Op::all_reduce:
      out = spread_data<T>(comm.rank(), testing::total_count(size, n));
      comm.all_reduce(out.data(), static_cast<std::int64_t>(out.size()), dtype, axes);
      break;
    case Op::all_to_all: {
      Counts send_counts, recv_counts;
      for (std::int64_t m = 0; m < n; ++m) {
        send_counts.push_back(testing::pair_count(size, n, me, m));
        recv_counts.push_back(testing::pair_count(size, n, m, me));
      }
      const std::vector<T> send = spread_data<T>(comm.rank(), total(send_counts));
      out.resize(static_cast<std::size_t>(total(recv_counts)));
      comm.all_to_all(send.data(), send_counts, out.data(), recv_counts, dtype, axes);
      break;
    }
  }
  std::vector<char> bytes(out.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), out.data(), bytes.size());
  return bytes;
}

::testing::AssertionResult same_bytes(const std::vector<char>& mpi, const std::vector<char>& threads) {
  if (mpi.size() != threads.size()) {
    return ::testing::AssertionFailure() << "mpi gave " << mpi.size() << " bytes, threads " << threads.size();
  }
  for (std::size_t i = 0; i < mpi.size(); ++i) {
    if (mpi[i] != threads[i]) return ::testing::AssertionFailure() << "first differing byte at " << i;
  }
  return ::testing::AssertionSuccess();
}

using BitwiseParam = std::tuple<Group, Op, DType>;

class MatchesThreads : public ::testing::TestWithParam<BitwiseParam> {};

// Every rank also runs the whole mesh on the threads backend, in-process, and compares its
// own device's output byte for byte: the contract fixes the reduction order, and spread()
// makes sums depend on it (tests/runtime/collectives_test.cpp checks that).
TEST_P(MatchesThreads, Bitwise) {
  // Named, not bound: the lambdas below capture them (clang 14 cannot capture a binding).
  const Group& group = std::get<0>(GetParam());
  const auto op = std::get<1>(GetParam());
  const DType dtype = std::get<2>(GetParam());
  const Mesh mesh = Mesh::parse(group.mesh);
  for (Size size : {Size::uneven, Size::large}) {
    std::vector<char> mpi;
    std::vector<std::vector<char>> threads(static_cast<std::size_t>(mesh.device_count()));
    with_dtype(dtype, [&](auto t) {
      using T = decltype(t);
      run_backend("mpi", mesh, [&](Communicator& comm) { mpi = run_op<T>(comm, op, group.axes, size); });
      run_threads(mesh, [&](Communicator& comm) {
        threads[static_cast<std::size_t>(comm.rank())] = run_op<T>(comm, op, group.axes, size);
      });
    });
    EXPECT_TRUE(same_bytes(mpi, threads[static_cast<std::size_t>(world_rank)]))
        << "rank " << world_rank << ", size " << testing::to_string(size);
  }
}

std::string bitwise_name(const ::testing::TestParamInfo<BitwiseParam>& info) {
  const auto& [group, op, dtype] = info.param;
  return std::string(group.name) + "_" + op_name(op) + "_" + to_string(dtype);
}

INSTANTIATE_TEST_SUITE_P(Mpi, MatchesThreads,
                         ::testing::Combine(::testing::ValuesIn(kGroups),
                                            ::testing::Values(Op::all_gather, Op::reduce_scatter, Op::all_reduce,
                                                              Op::all_to_all),
                                            ::testing::Values(DType::f32, DType::f64)),
                         bitwise_name);

// Only the row y = 0 of X=2,Y=2 reduces over X; the other row never calls it. The group's
// communicator involves its members only, so nobody waits for the other row.
TEST(MpiGroups, CollectiveOnPartOfTheMesh) {
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    if (comm.mesh().coord(comm.rank(), 1) == 0) {
      EXPECT_TRUE(testing::check_all_reduce<double>(comm, {0}, Size::uneven));
    }
    EXPECT_TRUE(testing::check_all_gather<float>(comm, {0, 1}, Size::small));
  });
}

// ---- point-to-point ----

std::vector<char> message(std::int64_t from, std::int64_t bytes, int tag) {
  std::vector<char> m(static_cast<std::size_t>(bytes));
  for (std::int64_t i = 0; i < bytes; ++i) m[static_cast<std::size_t>(i)] = static_cast<char>(from * 31 + tag * 7 + i);
  return m;
}

// Each rank sends to its successor before receiving from its predecessor: with sends
// that waited for their receiver this would deadlock at sizes past MPI's eager limit.
void ring(Communicator& comm, std::int64_t bytes) {
  const std::int64_t n = comm.mesh().device_count();
  const std::int64_t next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
  std::vector<char> out = message(comm.rank(), bytes, 1);
  comm.send(out.data(), bytes, next, 1);
  std::fill(out.begin(), out.end(), char(0));  // the send kept its own copy
  std::vector<char> in(static_cast<std::size_t>(bytes), char(-1));
  comm.recv(in.data(), bytes, prev, 1);
  EXPECT_EQ(in, message(prev, bytes, 1)) << "rank " << comm.rank() << ", " << bytes << " bytes";
}

// The same with isend/irecv, as the collective matmul rings use them: both directions in
// flight at once, the waits in another order than the posts.
void nonblocking_ring(Communicator& comm, std::int64_t bytes) {
  const std::int64_t n = comm.mesh().device_count();
  const std::int64_t next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
  const std::vector<char> right = message(comm.rank(), bytes, 1), left = message(comm.rank(), bytes, 2);
  std::vector<char> from_prev(static_cast<std::size_t>(bytes), char(-1)), from_next(from_prev);
  Request r1 = comm.irecv(from_prev.data(), bytes, prev, 1);
  Request r2 = comm.irecv(from_next.data(), bytes, next, 2);
  Request s1 = comm.isend(right.data(), bytes, next, 1);
  Request s2 = comm.isend(left.data(), bytes, prev, 2);
  while (!r2->test()) {
  }
  r2->wait();
  s2->wait();
  r1->wait();
  s1->wait();
  EXPECT_EQ(from_prev, message(prev, bytes, 1)) << "rank " << comm.rank() << ", " << bytes << " bytes";
  EXPECT_EQ(from_next, message(next, bytes, 2)) << "rank " << comm.rank() << ", " << bytes << " bytes";
}

TEST(MpiPointToPoint, Ring) {
  for (const char* mesh : {"X=4", "X=2,Y=2"}) {
    run_backend("mpi", Mesh::parse(mesh), [&](Communicator& comm) {
      for (std::int64_t bytes : {0, 1, 13, 4 << 20}) {
        ring(comm, bytes);
        nonblocking_ring(comm, bytes);
      }
      comm.barrier();
    });
  }
}

TEST(MpiPointToPoint, RingInPieces) {
  const CountLimit limit(3);
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    for (std::int64_t bytes : {0, 3, 10}) {
      ring(comm, bytes);
      nonblocking_ring(comm, bytes);
    }
  });
}

// Messages are matched by tag, whatever the order of the sends; messages with the same
// tag arrive in the order sent; a rank may send to itself.
TEST(MpiPointToPoint, TagsOrderAndSelf) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    const std::int64_t peer = (comm.rank() + 2) % 4;
    // (tag, sequence number); the payload depends on both.
    const std::pair<int, int> sent[] = {{5, 0}, {6, 0}, {5, 1}}, received[] = {{6, 0}, {5, 0}, {5, 1}};
    for (const auto& [tag, seq] : sent) {
      const std::vector<char> m = message(comm.rank(), 64, tag * 10 + seq);
      comm.send(m.data(), 64, peer, tag);
    }
    const std::vector<char> self = message(comm.rank(), 9, 0);
    comm.send(self.data(), 9, comm.rank(), 0);
    for (const auto& [tag, seq] : received) {
      std::vector<char> in(64);
      comm.recv(in.data(), 64, peer, tag);
      EXPECT_EQ(in, message(peer, 64, tag * 10 + seq)) << "rank " << comm.rank() << ", tag " << tag << " #" << seq;
    }
    std::vector<char> in(9);
    comm.recv(in.data(), 9, comm.rank(), 0);
    EXPECT_EQ(in, self);
  });
}

// Shorter and longer than the recv (or the irecv's wait) expects; either way the message is
// consumed.
TEST(MpiPointToPoint, SizeMismatchIsReported) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    const std::int64_t partner = comm.rank() ^ 1;
    const std::vector<char> m(16, 'x');
    for (int round = 0; round < 2; ++round) {
      comm.send(m.data(), 8, partner, 3);
      comm.send(m.data(), 16, partner, 3);
    }
    std::vector<char> in(16);
    EXPECT_THROW(comm.recv(in.data(), 16, partner, 3), CollectiveMismatch);
    EXPECT_THROW(comm.recv(in.data(), 8, partner, 3), CollectiveMismatch);
    for (std::int64_t bytes : {16, 8}) {
      std::string what = "(no CollectiveMismatch)";
      try {
        comm.irecv(in.data(), bytes, partner, 3)->wait();
      } catch (const CollectiveMismatch& e) {
        what = e.what();
      }
      EXPECT_EQ(what, "p2p mismatch: rank " + std::to_string(comm.rank()) + " called recv(" + std::to_string(bytes) +
                          " bytes from rank " + std::to_string(partner) + ", tag 3) but rank " +
                          std::to_string(partner) + " sent a message of another size");
    }
    ring(comm, 5);
    nonblocking_ring(comm, 5);
  });
}

// Many messages in flight between partners, several per tag (matched in order), waited
// for in reverse; nonblocking and blocking calls meet.
TEST(MpiNonblocking, ManyInFlightWaitedInAnyOrder) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    const std::int64_t partner = comm.rank() ^ 1;
    constexpr int count = 48;
    std::vector<std::vector<char>> out, in;
    std::vector<Request> requests;
    for (int i = 0; i < count; ++i) {
      const std::int64_t bytes = i % 4 == 0 ? 0 : 100 * i;
      out.push_back(message(comm.rank(), bytes, i));
      in.emplace_back(static_cast<std::size_t>(bytes), char(-1));
    }
    for (int i = 0; i < count; ++i) {
      requests.push_back(comm.irecv(in[static_cast<std::size_t>(i)].data(),
                                    static_cast<std::int64_t>(in[static_cast<std::size_t>(i)].size()), partner, i % 3));
      requests.push_back(comm.isend(out[static_cast<std::size_t>(i)].data(),
                                    static_cast<std::int64_t>(out[static_cast<std::size_t>(i)].size()), partner,
                                    i % 3));
    }
    for (auto r = requests.rbegin(); r != requests.rend(); ++r) (*r)->wait();
    for (int i = 0; i < count; ++i) {
      EXPECT_EQ(in[static_cast<std::size_t>(i)],
                message(partner, static_cast<std::int64_t>(in[static_cast<std::size_t>(i)].size()), i))
          << "rank " << comm.rank() << ", message " << i;
    }
    // A blocking send meets an irecv, an isend a blocking recv.
    const std::vector<char> m = message(comm.rank(), 77, 9);
    std::vector<char> got(77);
    Request r = comm.irecv(got.data(), 77, partner, 9);
    comm.send(m.data(), 77, partner, 9);
    r->wait();
    EXPECT_EQ(got, message(partner, 77, 9));
    Request s = comm.isend(m.data(), 77, partner, 10);
    comm.recv(got.data(), 77, partner, 10);
    s->wait();
    EXPECT_EQ(got, message(partner, 77, 9));
    // A lent receive is read where received() says: on one node the sender's bounce block (its
    // vector is not shareable memory, so the send copied it once), else its own buffer.
    std::fill(got.begin(), got.end(), char(-1));
    Request lent = comm.irecv_lent(got.data(), 77, partner, 11);
    comm.isend(m.data(), 77, partner, 11)->wait();
    lent->wait();
    const char* at = static_cast<const char*>(lent->received());
    EXPECT_EQ(std::vector<char>(at, at + 77), message(partner, 77, 9));
    EXPECT_EQ(at == got.data(), !shared_memory_on());
  });
}

// The collective matmul rings call test() from a helper thread while the rank's own thread
// computes (Executor: wants_progress_thread()): a 4 MiB message, far past the eager limit,
// completes from test() calls on another thread alone while both ranks' threads sleep.
TEST(MpiNonblocking, TestFromAHelperThreadMovesALargeMessage) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    const std::int64_t partner = comm.rank() ^ 1, bytes = 4 << 20;
    const std::vector<char> out = message(comm.rank(), bytes, 5);
    std::vector<char> in(static_cast<std::size_t>(bytes), char(-1));
    Request r = comm.irecv(in.data(), bytes, partner, 5);
    Request s = comm.isend(out.data(), bytes, partner, 5);
    bool completed = false;
    std::thread helper([&] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!completed && std::chrono::steady_clock::now() < give_up) {
        completed = r->test() & s->test();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
    helper.join();
    EXPECT_TRUE(completed) << "rank " << comm.rank();
    r->wait();
    s->wait();
    EXPECT_EQ(in, message(partner, bytes, 5)) << "rank " << comm.rank();
  });
}

// The rings get a helper thread only where it has a core of its own: 4 ranks of one BLAS
// thread each on this node leave none unless it has more than 4 cores.
// SHARDMM_PROGRESS_THREAD decides instead; anything but 0 or 1 is an input error.
TEST(MpiNonblocking, AHelperThreadOnlyWhereACoreIsFree) {
  const auto wanted = [] {
    bool wants = false;
    run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) { wants = comm.wants_progress_thread(); });
    return wants;
  };
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks_here = local ? std::atoi(local) : 4;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Messages through shared memory (all ranks on this node) move without MPI: never a helper.
  const bool messages = !shared_memory_on();
  EXPECT_EQ(wanted(), messages && ranks_here * blas::threads() < cores);
  setenv("SHARDMM_PROGRESS_THREAD", "1", 1);
  EXPECT_EQ(wanted(), messages);
  setenv("SHARDMM_PROGRESS_THREAD", "0", 1);
  EXPECT_FALSE(wanted());
  setenv("SHARDMM_PROGRESS_THREAD", "yes", 1);
  try {
    wanted();
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "SHARDMM_PROGRESS_THREAD='yes': it is 1 (a helper thread moves the rings' messages), 0 "
                 "(none) or unset (one where a core is free for it)");
  }
  unsetenv("SHARDMM_PROGRESS_THREAD");
}

// ---- errors ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// What callers adapt to is asked of the backend, by name before it runs or of its communicator.
TEST(MpiBackend, CapabilitiesByNameAreTheCommunicators) {
  const BackendCapabilities named = backend_capabilities("mpi");
  EXPECT_FALSE(named.ranks_in_one_process);
  EXPECT_TRUE(named.reduces_into_workspace);
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) { EXPECT_EQ(comm.capabilities(), named); });
}

TEST(MpiErrors, WorldSizeMustMatchTheMesh) {
  bool ran = false;
  auto run = [&](const char* mesh) {
    return error_of([&] { run_backend("mpi", Mesh::parse(mesh), [&](Communicator&) { ran = true; }); });
  };
  EXPECT_EQ(run("X=2"), "the mesh X=2 has 2 devices but mpirun started 4 processes; run with mpirun -n 2");
  EXPECT_EQ(run("X=2,Y=4"), "the mesh X=2,Y=4 has 8 devices but mpirun started 4 processes; run with mpirun -n 8");
  EXPECT_EQ(run("X=1"), "the mesh X=1 has 1 device but mpirun started 4 processes; run with mpirun -n 1");
  EXPECT_FALSE(ran);
}

// Raised before any communication, so a body can catch them and carry on.
TEST(MpiErrors, MisuseIsAnInputError) {
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    std::vector<float> data(8);
    EXPECT_EQ(error_of([&] { comm.all_reduce(data.data(), 8, DType::bf16, {0}); }),
              "the mpi backend computes in f32 and f64; got bf16");
    EXPECT_EQ(error_of([&] {
                comm.all_gather(data.data(), data.data(), {1, 1}, DType::f16, {0});
              }),
              "the mpi backend computes in f32 and f64; got f16");
    EXPECT_EQ(error_of([&] {
                comm.all_gather(data.data(), data.data() + 4, {1, 1, 1}, DType::f32, {0});
              }),
              "all_gather: got 3 counts for 2 members; pass one count per member");
    EXPECT_EQ(error_of([&] {
                comm.reduce_scatter(data.data(), data.data() + 4, {1, -1}, DType::f32, {1});
              }),
              "reduce_scatter: count -1; a count is a number of elements >= 0");
    EXPECT_EQ(error_of([&] { comm.all_reduce(data.data(), 8, DType::f32, {2}); }),
              "group axis 2 is out of range or repeated for mesh X=2,Y=2; a group lists distinct axes "
              "numbered 0 to 1");
    EXPECT_EQ(error_of([&] {
                comm.all_reduce(data.data(), 8, DType::f32, {1, 1});
              }),
              "group axis 1 is out of range or repeated for mesh X=2,Y=2; a group lists distinct axes "
              "numbered 0 to 1");
    EXPECT_EQ(error_of([&] { comm.send(data.data(), 4, 4, 0); }), "send to device 4: mesh X=2,Y=2 has devices 0 to 3");
    const std::string bad_tag = error_of([&] { comm.recv(data.data(), 4, 0, -1); });
    EXPECT_EQ(bad_tag.rfind("recv from device 0 with tag -1; the mpi backend takes tags 0 to ", 0), 0u) << bad_tag;
    // The communicator still works after the errors.
    EXPECT_TRUE(testing::check_all_reduce<float>(comm, {0, 1}, Size::small));
  });
}

TEST(MpiLaunch, RankAndLaunchAreKnown) {
  EXPECT_TRUE(detail::mpi_launched());
  EXPECT_EQ(detail::mpi_world_rank(), world_rank);
  const std::vector<std::string> backends = available_backends();
  EXPECT_NE(std::find(backends.begin(), backends.end(), "mpi"), backends.end());
}

}  // namespace
}  // namespace shardmm
