// The mpi backend's check mode, in a 4-process job: ranks that call different collectives,
// over different axes or with disagreeing counts all get a CollectiveMismatch that names the
// collective and the ranks, instead of a hang or wrong bytes. Each body catches the error
// and returns, which is what lets the job go on to the next test (under `shardmm run` the
// error ends the job instead; tests/mpi/run_fault.cmake covers that and the watchdog).
//
// Every expected message is deterministic: where a rank could see its peers in more than one
// state, the test arranges that only one is possible when it decides.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "mpi/mpi_test.h"
#include "runtime/collectives_testing.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/errors.h"

namespace shardmm {
namespace {

using testing::Size;

// What `call` throws as a CollectiveMismatch on this rank, or a note saying it did not.
std::string mismatch_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const CollectiveMismatch& e) {
    return e.what();
  }
  return "(no CollectiveMismatch)";
}

TEST(MpiCheck, DifferentCollectivesAreAMismatchOnEveryRank) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    std::vector<float> a(4), b(4);
    EXPECT_EQ(mismatch_of([&] {
                if (comm.rank() == 3) {
                  comm.all_reduce(a.data(), 4, DType::f32, {0});
                } else {
                  comm.all_gather(a.data(), b.data(), {1, 1, 1, 1}, DType::f32, {0});
                }
              }),
              "collective mismatch in group over X of device 0: rank 0 called all_gather(f32, counts [1, 1, 1, 1]), "
              "rank 3 called all_reduce(f32, 4 elements)")
        << "rank " << comm.rank();
  });
}

TEST(MpiCheck, DisagreeingCountsOrDtypesAreAMismatch) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    std::vector<double> data(8);
    EXPECT_EQ(mismatch_of([&] {
                comm.all_reduce(data.data(), comm.rank() == 2 ? 8 : 4, comm.rank() == 1 ? DType::f64 : DType::f32, {0});
              }),
              "collective mismatch in group over X of device 0: rank 0 called all_reduce(f32, 4 elements), "
              "rank 1 called all_reduce(f64, 4 elements), rank 2 called all_reduce(f32, 8 elements)")
        << "rank " << comm.rank();
  });
  // Over X of X=2,Y=2 the groups are {0, 2} and {1, 3}: only the first disagrees, and the
  // second completes with the right sums.
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    if (comm.rank() % 2 == 1) {
      EXPECT_TRUE(testing::check_reduce_scatter<float>(comm, {0}, Counts{2, 2})) << "rank " << comm.rank();
      return;
    }
    std::vector<float> send(4), recv(3);
    const Counts counts = comm.rank() == 2 ? Counts{1, 3} : Counts{2, 2};
    EXPECT_EQ(mismatch_of([&] { comm.reduce_scatter(send.data(), recv.data(), counts, DType::f32, {0}); }),
              "collective mismatch in group over X of device 0: rank 0 called reduce_scatter(f32, counts [2, 2]), "
              "rank 2 called reduce_scatter(f32, counts [1, 3])")
        << "rank " << comm.rank();
  });
}

TEST(MpiCheck, GroupAxisOrderMustAgree) {
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    float x = 1;
    EXPECT_EQ(mismatch_of([&] {
                comm.all_reduce(&x, 1, DType::f32, comm.rank() == 3 ? AxisList{1, 0} : AxisList{0, 1});
              }),
              "collective mismatch in group over XY of device 0: rank 0 called all_reduce(f32, 1 element) over XY, "
              "rank 3 called all_reduce(f32, 1 element) over YX")
        << "rank " << comm.rank();
  });
}

// Rank 3 calls over X (its group {1, 3}) while the others call over XY. Rank 3 and rank 1
// each find the other calling over another group that includes them, a certain deadlock;
// ranks 0 and 2 wait for rank 3, which returns after its error without calling over XY.
TEST(MpiCheck, DifferentAxesAreAMismatch) {
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    float x = 1;
    const std::string what = mismatch_of([&] {
      comm.all_reduce(&x, 1, DType::f32, comm.rank() == 3 ? AxisList{0} : AxisList{0, 1});
    });
    switch (comm.rank()) {
      case 3:
        EXPECT_EQ(what,
                  "collective mismatch in group over X of device 1: rank 3 called all_reduce(f32, 1 element) "
                  "over X; rank 1 called all_reduce(f32, 1 element) over XY");
        break;
      case 1:
        EXPECT_EQ(what,
                  "collective mismatch in group over XY of device 0: rank 1 called all_reduce(f32, 1 element) "
                  "over XY; rank 3 called all_reduce(f32, 1 element) over X");
        break;
      default:
        EXPECT_EQ(what, "collective mismatch in group over XY of device 0: rank " + std::to_string(comm.rank()) +
                            " called all_reduce(f32, 1 element); rank 3 returned without calling it")
            << "rank " << comm.rank();
    }
  });
}

TEST(MpiCheck, ARankThatReturnsWithoutCallingIsAMismatch) {
  run_backend("mpi", Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    if (comm.rank() == 3) return;
    float x = 1;
    const std::string what = mismatch_of([&] { comm.all_reduce(&x, 1, DType::f32, {0}); });
    if (comm.rank() == 1) {
      EXPECT_EQ(what,
                "collective mismatch in group over X of device 1: rank 1 called all_reduce(f32, 1 element); "
                "rank 3 returned without calling it");
    } else {
      EXPECT_EQ(what, "(no CollectiveMismatch)") << "rank " << comm.rank();  // group {0, 2} agrees
      EXPECT_EQ(x, 2.0f);
    }
  });
}

TEST(MpiCheck, BarrierAgainstACollectiveIsAMismatch) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    float x = 1;
    EXPECT_EQ(mismatch_of([&] {
                if (comm.rank() == 0) comm.barrier();
                else comm.all_reduce(&x, 1, DType::f32, {0});
              }),
              "collective mismatch in group over X of device 0: rank 0 called barrier(), rank 1 called "
              "all_reduce(f32, 1 element), rank 2 called all_reduce(f32, 1 element), rank 3 called "
              "all_reduce(f32, 1 element)")
        << "rank " << comm.rank();
  });
}

TEST(MpiCheck, AllToAllCountsMustPair) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    std::vector<float> send(8), recv(8);
    Counts send_counts{1, 1, 1, 1}, recv_counts{1, 1, 1, 1};
    if (comm.rank() == 2) recv_counts[1] = 2;  // rank 1 sends it only one
    EXPECT_EQ(
        mismatch_of([&] { comm.all_to_all(send.data(), send_counts, recv.data(), recv_counts, DType::f32, {0}); }),
        "collective mismatch in group over X of device 0: in all_to_all(f32), rank 1 sends 1 element to "
        "rank 2, which expects 2 from it")
        << "rank " << comm.rank();
  });
}

// A mismatch the members all saw leaves nothing in flight: the same communicator goes on.
TEST(MpiCheck, TheGroupCarriesOnAfterAnAgreedMismatch) {
  run_backend("mpi", Mesh::parse("X=4"), [&](Communicator& comm) {
    float x = 1;
    EXPECT_NE(mismatch_of([&] { comm.all_reduce(&x, comm.rank() == 0 ? 2 : 1, DType::f32, {0}); }),
              "(no CollectiveMismatch)");
    EXPECT_TRUE(testing::check_collectives<float>(comm, {0}, Size::uneven)) << "rank " << comm.rank();
  });
}

// Check mode off moves the same bytes, without the exchange.
TEST(MpiCheck, CollectivesAreRightWithTheCheckOff) {
  BackendOptions options;
  options.check = false;
  run_backend(
      "mpi", Mesh::parse("X=2,Y=2"),
      [&](Communicator& comm) {
        for (const AxisList& axes : {AxisList{0}, AxisList{1, 0}}) {
          EXPECT_TRUE(testing::check_collectives<double>(comm, axes, Size::uneven)) << "rank " << comm.rank();
        }
        comm.barrier();
      },
      options);
}

TEST(MpiCheck, AWatchdogMustBePositive) {
  BackendOptions options;
  options.watchdog_s = -1;
  bool ran = false;
  try {
    run_backend(
        "mpi", Mesh::parse("X=4"), [&](Communicator&) { ran = true; }, options);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "a watchdog of -1 s; a watchdog is a positive number of seconds, or 0 for "
                 "SHARDMM_WATCHDOG_S or 300 s");
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace shardmm
