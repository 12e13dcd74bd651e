// The threads backend against the closed-form results of collectives_testing.h, plus its
// failure behaviour: released ranks, mismatches, the watchdog, bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/collectives_testing.h"
#include "runtime/threads_backend.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/errors.h"

namespace shardmm {
namespace {

using testing::Size;

// A watchdog short enough that a broken rendezvous fails the test instead of hanging it,
// long enough for 8 ranks on a loaded 2-core machine. `shared_cores` unset: as the machine has.
void run(const Mesh& mesh, const std::function<void(Communicator&)>& body, double watchdog_s = 120,
         std::optional<bool> shared_cores = {}) {
  detail::ThreadsOptions options;
  options.watchdog = std::chrono::duration<double>(watchdog_s);
  options.shared_cores = shared_cores;
  detail::run_threads(mesh, body, options);
}

// The message of the exception `f` throws, which must be an E.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

// A one-shot signal between ranks of a test.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Runs `f`; if it throws, opens `gate` first (releasing the peer that waits on it), then
// rethrows, so that the error `f` raised is the one the run reports.
template <typename F>
void opening_if_it_throws(Gate& gate, F&& f) {
  try {
    f();
  } catch (...) {
    gate.open();
    throw;
  }
}

struct Topology {
  std::string mesh;
  AxisList axes;
  std::string name;
};

void PrintTo(const Topology& t, std::ostream* out) { *out << t.name; }

std::vector<Topology> topologies() {
  std::vector<Topology> out;
  for (int n = 1; n <= 8; ++n) {
    std::string name = "X", mesh = "X=";
    name += std::to_string(n);  // appended, not "X" + ...: GCC 12 warns falsely (-Wrestrict) on that
    mesh += std::to_string(n);
    out.push_back({mesh, {0}, name});
  }
  auto add = [&](const std::string& mesh, const std::string& prefix,
                 const std::vector<std::pair<AxisList, std::string>>& groups) {
    for (const auto& [axes, name] : groups) out.push_back({mesh, axes, prefix + "_over_" + name});
  };
  add("X=2,Y=2", "X2Y2", {{{0}, "X"}, {{1}, "Y"}, {{0, 1}, "XY"}, {{1, 0}, "YX"}, {{}, "none"}});
  add("X=2,Y=3", "X2Y3", {{{0}, "X"}, {{1}, "Y"}, {{0, 1}, "XY"}, {{1, 0}, "YX"}});
  add("X=2,Y=2,Z=2", "X2Y2Z2",
      {{{0}, "X"}, {{1}, "Y"}, {{2}, "Z"}, {{0, 2}, "XZ"}, {{2, 1, 0}, "ZYX"}, {{0, 1, 2}, "XYZ"}});
  return out;
}

// Whether the ranks share cores decides how members wait and whether they do each other's
// parts (only parts of at most 1 MiB); both ways run on every mesh, whatever the machine has,
// except for the large sizes, whose parts nobody takes: those run once, as the machine decides.
enum class Cores { own, shared, machine };

using Param = std::tuple<Topology, Size, DType, Cores>;

std::vector<Param> params() {
  std::vector<Param> out;
  for (const Topology& t : topologies()) {
    for (Size size : {Size::zero, Size::one, Size::small, Size::uneven, Size::large}) {
      for (DType dtype : {DType::f32, DType::f64}) {
        if (size == Size::large) {
          out.emplace_back(t, size, dtype, Cores::machine);
        } else {
          for (Cores cores : {Cores::own, Cores::shared}) out.emplace_back(t, size, dtype, cores);
        }
      }
    }
  }
  return out;
}

class Collectives : public ::testing::TestWithParam<Param> {};

TEST_P(Collectives, MatchClosedForm) {
  // Named, not bound: the lambda below captures them (clang 14 cannot capture a binding).
  const auto& topology = std::get<0>(GetParam());
  const auto size = std::get<1>(GetParam());
  const DType dtype = std::get<2>(GetParam());
  const auto cores = std::get<3>(GetParam());
  run(
      Mesh::parse(topology.mesh),
      [&](Communicator& comm) {
        if (dtype == DType::f32) {
          EXPECT_TRUE(testing::check_collectives<float>(comm, topology.axes, size));
        } else {
          EXPECT_TRUE(testing::check_collectives<double>(comm, topology.axes, size));
        }
      },
      120, cores == Cores::machine ? std::nullopt : std::optional<bool>(cores == Cores::shared));
}

INSTANTIATE_TEST_SUITE_P(Threads, Collectives, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Cores cores = std::get<3>(info.param);
                           return std::get<0>(info.param).name + "_" + testing::to_string(std::get<1>(info.param)) +
                                  "_" + to_string(std::get<2>(info.param)) +
                                  (cores == Cores::shared ? "_shared_cores"
                                   : cores == Cores::own  ? "_own_cores"
                                                          : "");
                         });

// The checks can only catch a wrong summation order if the data makes order matter.
TEST(CollectivesTesting, SpreadValuesMakeSummationOrderVisible) {
  for (int n : {3, 8}) {
    std::vector<std::int64_t> members;
    for (int m = 0; m < n; ++m) members.push_back(m);
    const std::vector<std::int64_t> reversed(members.rbegin(), members.rend());
    int f32_differs = 0, f64_differs = 0;
    for (std::int64_t k = 0; k < 1000; ++k) {
      f32_differs += testing::ordered_sum<float>(members, k) != testing::ordered_sum<float>(reversed, k);
      f64_differs += testing::ordered_sum<double>(members, k) != testing::ordered_sum<double>(reversed, k);
    }
    EXPECT_GT(f32_differs, 100) << n << " members";
    EXPECT_GT(f64_differs, 100) << n << " members";
  }
}

TEST(Threads, EachRankHasItsOwnIdAndThread) {
  const Mesh mesh = Mesh::parse("X=3,Y=2");
  std::mutex mutex;
  std::set<std::int64_t> ranks;
  std::set<std::thread::id> threads;
  run_threads(mesh, [&](Communicator& comm) {
    EXPECT_EQ(comm.mesh(), mesh);
    EXPECT_EQ(comm.backend(), "threads");
    std::lock_guard lock(mutex);
    ranks.insert(comm.rank());
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ranks, (std::set<std::int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(threads.size(), 6u);
}

// Successive collectives on overlapping groups, in an order that differs between groups'
// members only where the contract allows (the same sequence per group).
TEST(Threads, SuccessiveCollectivesOnOverlappingGroupsStayApart) {
  for (bool shared_cores : {false, true}) {
    SCOPED_TRACE(shared_cores ? "shared cores" : "own cores");
    run(
        Mesh::parse("X=2,Y=2,Z=2"),
        [](Communicator& comm) {
          for (int round = 0; round < 20; ++round) {
            EXPECT_TRUE(testing::check_all_reduce<float>(comm, {0}, 7));
            EXPECT_TRUE(testing::check_all_gather<double>(comm, {1, 2}, Size::uneven));
            EXPECT_TRUE(testing::check_reduce_scatter<float>(comm, {2, 0}, Size::uneven));
            EXPECT_TRUE(testing::check_all_to_all<double>(comm, {0, 1, 2}, Size::uneven));
            comm.barrier();
          }
        },
        120, shared_cores);
  }
}

// Row y=1 starts only after row y=0 has finished its collectives over X: if a group over X
// waited for the other row, row y=0 would never finish.
TEST(Threads, GroupsProceedIndependently) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  Gate row0_done;
  std::atomic<int> row0_left{2};
  run(
      mesh,
      [&](Communicator& comm) {
        if (mesh.coord(comm.rank(), 1) == 1) row0_done.wait();
        for (int i = 0; i < 10; ++i) EXPECT_TRUE(testing::check_all_reduce<double>(comm, {0}, 33));
        if (mesh.coord(comm.rank(), 1) == 0 && --row0_left == 0) row0_done.open();
      },
      20);
}

TEST(Threads, SendRecvRing) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    run_threads(Mesh::parse("X=" + std::to_string(n)), [n](Communicator& comm) {
      const std::int64_t right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
      std::vector<double> mine(100), got(100);
      for (int k = 0; k < 100; ++k) mine[k] = testing::tagged<double>(comm.rank(), k);
      comm.send(mine.data(), 800, right, 7);
      comm.recv(got.data(), 800, left, 7);
      for (int k = 0; k < 100; ++k) ASSERT_EQ(got[k], testing::tagged<double>(left, k)) << "element " << k;
    });
  }
}

TEST(Threads, MessagesAreMatchedByTagAndArriveInOrder) {
  run(Mesh::parse("X=2"), [](Communicator& comm) {
    if (comm.rank() == 0) {
      for (int i = 0; i < 3; ++i) comm.send(&i, sizeof i, 1, 1);
      const int other = 42;
      comm.send(&other, sizeof other, 1, 2);
      comm.send(nullptr, 0, 1, 3);
    } else {
      int value = -1;
      comm.recv(&value, sizeof value, 0, 2);  // tag 2 first, though it was sent last
      EXPECT_EQ(value, 42);
      comm.recv(nullptr, 0, 0, 3);
      for (int i = 0; i < 3; ++i) {
        comm.recv(&value, sizeof value, 0, 1);
        EXPECT_EQ(value, i);
      }
    }
  });
}

TEST(Threads, ARankThatThrowsReleasesTheOthersAndItsErrorIsRethrown) {
  // Rank 2 throws while the others wait for it in an all_reduce, a recv and a barrier.
  const std::string what = message_of<std::logic_error>([] {
    run(Mesh::parse("X=4"), [](Communicator& comm) {
      std::vector<float> data(4, 1.0f);
      switch (comm.rank()) {
        case 0:
          comm.all_reduce(data.data(), 4, DType::f32, {0});
          break;
        case 1:
          comm.recv(data.data(), 16, 3, 0);
          break;
        case 2:
          throw std::logic_error("boom on rank 2");
        case 3:
          comm.barrier();
          break;
      }
    });
  });
  EXPECT_EQ(what, "boom on rank 2");
}

TEST(Threads, AThrowAfterCollectivesIsRethrown) {
  EXPECT_EQ(message_of<InputError>([] {
              run(Mesh::parse("X=2,Y=2"), [](Communicator& comm) {
                EXPECT_TRUE(testing::check_all_reduce<float>(comm, {1}, 9));
                if (comm.rank() == 3) throw InputError("late failure");
                EXPECT_TRUE(testing::check_all_gather<float>(comm, {0}, Size::small));
                comm.barrier();
              });
            }),
            "late failure");
}

TEST(Threads, DifferentCollectivesAreAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                std::vector<float> a(4), b(8);
                if (comm.rank() == 0) {
                  comm.all_gather(a.data(), b.data(), {4, 4}, DType::f32, {0});
                } else {
                  comm.all_reduce(a.data(), 4, DType::f32, {0});
                }
              });
            }),
            "collective mismatch in group over X of device 0: rank 0 called all_gather(f32, counts [4, 4]), "
            "rank 1 called all_reduce(f32, 4 elements)");
}

TEST(Threads, SumAgainstMaxIsAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                std::vector<double> a(4);
                comm.all_reduce(a.data(), 4, DType::f64, {0}, comm.rank() == 1 ? ReduceOp::max : ReduceOp::sum);
              });
            }),
            "collective mismatch in group over X of device 0: rank 0 called all_reduce(f64, 4 elements), "
            "rank 1 called all_reduce(max, f64, 4 elements)");
}

TEST(Threads, MaxTakesTheLargestOfEachElementNaNIncluded) {
  run(Mesh::parse("X=3"), [](Communicator& comm) {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    // Per element: the members' values by group rank. The NaN wins wherever it is.
    const std::vector<std::vector<double>> by_rank = {
        {-1, 2, -inf, nan, 0}, {-3, 7, -inf, 1, -0.5}, {-2, 7, -inf, 2, nan}};
    std::vector<double> data = by_rank[static_cast<std::size_t>(comm.rank())];
    comm.all_reduce(data.data(), 5, DType::f64, {0}, ReduceOp::max);
    EXPECT_EQ(data[0], -1);
    EXPECT_EQ(data[1], 7);
    EXPECT_EQ(data[2], -inf);
    EXPECT_TRUE(std::isnan(data[3]));
    EXPECT_TRUE(std::isnan(data[4]));
  });
}

TEST(Threads, DisagreeingCountsOrDtypesAreAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=3"), [](Communicator& comm) {
                std::vector<double> data(8);
                comm.all_reduce(data.data(), comm.rank() == 2 ? 8 : 4, comm.rank() == 1 ? DType::f64 : DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 0: rank 0 called all_reduce(f32, 4 elements), "
            "rank 1 called all_reduce(f64, 4 elements), rank 2 called all_reduce(f32, 8 elements)");
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2,Y=2"), [](Communicator& comm) {
                std::vector<float> send(4), recv(3);
                const Counts counts = comm.rank() == 2 ? Counts{1, 3} : Counts{2, 2};
                comm.reduce_scatter(send.data(), recv.data(), counts, DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 0: rank 0 called reduce_scatter(f32, counts [2, 2]), "
            "rank 2 called reduce_scatter(f32, counts [1, 3])");
}

TEST(Threads, GroupAxisOrderMustAgree) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2,Y=2"), [](Communicator& comm) {
                float x = 1;
                comm.all_reduce(&x, 1, DType::f32, comm.rank() == 3 ? AxisList{1, 0} : AxisList{0, 1});
              });
            }),
            "collective mismatch in group over XY of device 0: rank 0 called all_reduce(f32, 1 element) over XY, "
            "rank 3 called all_reduce(f32, 1 element) over YX");
}

TEST(Threads, BarrierAgainstACollectiveIsAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                float x = 1;
                if (comm.rank() == 0) comm.barrier();
                else comm.all_reduce(&x, 1, DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 0: rank 0 called barrier(), "
            "rank 1 called all_reduce(f32, 1 element)");
}

TEST(Threads, AllToAllCountsMustPair) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=3"), [](Communicator& comm) {
                std::vector<float> send(9), recv(9);
                Counts send_counts{1, 1, 1}, recv_counts{1, 1, 1};
                if (comm.rank() == 2) recv_counts[1] = 2;  // rank 1 sends it only one
                comm.all_to_all(send.data(), send_counts, recv.data(), recv_counts, DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 0: in all_to_all(f32), rank 1 sends 1 element to "
            "rank 2, which expects 2 from it");
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=1"), [](Communicator& comm) {
                float x = 0;
                comm.all_to_all(&x, {1}, &x, {0}, DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 0: in all_to_all(f32), rank 0 sends 1 element to "
            "itself but expects 0");
}

TEST(Threads, ARankThatReturnsWithoutCallingIsAMismatch) {
  // One waiting rank, one missing rank: with more, which rank reports which returns first
  // depends on timing.
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2,Y=2"), [](Communicator& comm) {
                float x = 1;
                if (comm.rank() != 3) comm.all_reduce(&x, 1, DType::f32, {0});
              });
            }),
            "collective mismatch in group over X of device 1: rank 1 called all_reduce(f32, 1 element); "
            "rank 3 returned without calling it");
  const std::string what = message_of<CollectiveMismatch>([] {
    run(Mesh::parse("X=2"), [](Communicator& comm) {
      int x = 0;
      if (comm.rank() == 0) comm.recv(&x, sizeof x, 1, 5);
    });
  });
  EXPECT_EQ(what, "p2p mismatch: rank 0 called recv(4 bytes from rank 1, tag 5); rank 1 returned without sending it");
}

TEST(Threads, RecvOfTheWrongSizeIsAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                double x = 0;
                if (comm.rank() == 0) comm.send(&x, 4, 1, 0);
                else comm.recv(&x, 8, 0, 0);
              });
            }),
            "p2p mismatch: rank 1 called recv(8 bytes from rank 0, tag 0) but rank 0 sent 4 bytes");
}

// Ranks 1 and 2 stay away, blocked on a gate that only rank 0's timeout opens, so that
// rank 0's watchdog, not their return, ends its wait.
TEST(Threads, WatchdogNamesTheCollectiveAndTheMissingRanks) {
  Gate timed_out;
  EXPECT_EQ(message_of<CollectiveTimeout>([&] {
              run(
                  Mesh::parse("X=3"),
                  [&](Communicator& comm) {
                    if (comm.rank() != 0) return timed_out.wait();
                    float x = 1;
                    try {
                      comm.all_reduce(&x, 1, DType::f32, {0});
                    } catch (...) {
                      timed_out.open();
                      throw;
                    }
                  },
                  1);
            }),
            "collective timeout in group over X of device 0: rank 0 called all_reduce(f32, 1 element) and "
            "waited 1 s; ranks 1, 2 never arrived (watchdog 1 s; SHARDMM_WATCHDOG_S sets it)");
}

// recv, and the waits of irecv and isend.
TEST(Threads, WatchdogCoversPointToPoint) {
  const std::string hint = " (watchdog 0.5 s; SHARDMM_WATCHDOG_S sets it)";
  const std::pair<std::function<void(Communicator&, int&)>, std::string> calls[] = {
      {[](Communicator& c, int& x) { c.recv(&x, sizeof x, 1, 3); },
       "recv(4 bytes from rank 1, tag 3); nothing arrived"},
      {[](Communicator& c, int& x) { c.irecv(&x, sizeof x, 1, 3)->wait(); },
       "recv(4 bytes from rank 1, tag 3); nothing arrived"},
      {[](Communicator& c, int& x) { c.isend(&x, sizeof x, 1, 3)->wait(); },
       "isend(4 bytes to rank 1, tag 3); no receive was posted"},
  };
  for (const auto& named_call : calls) {
    const auto& call = named_call.first;  // named, not bound: the lambda captures it
    const auto& what = named_call.second;
    Gate timed_out;
    EXPECT_EQ(message_of<CollectiveTimeout>([&] {
                run(
                    Mesh::parse("X=2"),
                    [&](Communicator& comm) {
                      if (comm.rank() == 1) return timed_out.wait();
                      int x = 0;
                      try {
                        call(comm, x);
                      } catch (...) {
                        timed_out.open();
                        throw;
                      }
                    },
                    0.5);
              }),
              "p2p timeout: rank 0 waited 0.5 s in " + what + hint);
  }
}

TEST(Threads, WatchdogComesFromTheEnvironment) {
  ::setenv("SHARDMM_WATCHDOG_S", "2.5", 1);
  EXPECT_EQ(detail::threads_options_from_env().watchdog.count(), 2.5);
  for (const char* bad : {"soon", "0", "-1", "3s", ""}) {
    ::setenv("SHARDMM_WATCHDOG_S", bad, 1);
    EXPECT_EQ(message_of<InputError>([] { detail::threads_options_from_env(); }),
              std::string("SHARDMM_WATCHDOG_S='") + bad + "' is not a positive number of seconds");
  }
  ::unsetenv("SHARDMM_WATCHDOG_S");
  EXPECT_EQ(detail::threads_options_from_env().watchdog.count(), 300.0);
}

// Argument errors are InputErrors raised on the calling rank; the others are released.
TEST(Threads, BadArgumentsAreInputErrors) {
  auto on_rank_1 = [](std::function<void(Communicator&)> call) {
    return message_of<InputError>([&] {
      run(Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
        float x[8] = {};
        if (comm.rank() == 1) call(comm);
        else comm.all_reduce(x, 8, DType::f32, {0, 1});
      });
    });
  };
  float buf[16] = {};
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.all_reduce(buf, 4, DType::bf16, {0}); }),
            "the threads backend computes in f32 and f64; got bf16");
  EXPECT_EQ(on_rank_1([&](Communicator& c) {
              c.all_gather(buf, buf + 4, {4, 4}, DType::f16, {0});
            }),
            "the threads backend computes in f32 and f64; got f16");
  EXPECT_EQ(on_rank_1([&](Communicator& c) {
              c.all_gather(buf, buf + 4, {4, 4, 4}, DType::f32, {0});
            }),
            "all_gather in the group over X of device 1: got 3 counts for 2 members; pass one count per member");
  EXPECT_EQ(on_rank_1([&](Communicator& c) {
              c.reduce_scatter(buf, buf + 8, {2, -1}, DType::f32, {1});
            }),
            "reduce_scatter in the group over Y of device 0: count -1 for member 1; a count is a number of "
            "elements >= 0");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.all_reduce(buf, -3, DType::f64, {1}); }),
            "all_reduce of -3 elements; a count is a number of elements >= 0");
  EXPECT_EQ(on_rank_1([&](Communicator& c) {
              c.all_to_all(buf, {1, 1}, buf + 8, {1}, DType::f32, {1});
            }),
            "all_to_all (recv counts) in the group over Y of device 0: got 1 counts for 2 members; pass one count "
            "per member");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.all_reduce(buf, 1, DType::f32, {2}); }),
            "group axis 2 is not an axis of mesh X=2,Y=2; axes are numbered 0 to 1");
  EXPECT_EQ(on_rank_1([&](Communicator& c) {
              c.all_reduce(buf, 1, DType::f32, {1, 0, 1});
            }),
            "group YXY names axis Y twice; a group lists distinct mesh axes");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.send(buf, 4, 4, 0); }),
            "send to device 4: mesh X=2,Y=2 has devices 0 to 3");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.recv(buf, 4, -1, 0); }),
            "recv from device -1: mesh X=2,Y=2 has devices 0 to 3");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.send(buf, -4, 0, 0); }),
            "send to device 0 of -4 bytes; a message size is >= 0");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.isend(buf, 4, 4, 0); }),
            "isend to device 4: mesh X=2,Y=2 has devices 0 to 3");
  EXPECT_EQ(on_rank_1([&](Communicator& c) { c.irecv(buf, -4, 0, 0); }),
            "recv from device 0 of -4 bytes; a message size is >= 0");
}

// Nonblocking point-to-point (isend, irecv): the ring a collective matmul runs, mixed with
// the blocking calls, and what happens to requests that are dropped or never matched.
TEST(ThreadsNonblocking, RingMatchesAndMixesWithBlockingCalls) {
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    run(Mesh::parse("X=" + std::to_string(n)), [n](Communicator& comm) {
      const std::int64_t right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
      std::vector<double> mine(100), got(100), again(100);
      for (int k = 0; k < 100; ++k) mine[k] = testing::tagged<double>(comm.rank(), k);
      Request in = comm.irecv(got.data(), 800, left, 7);
      Request out = comm.isend(mine.data(), 800, right, 7);
      out->wait();
      in->wait();
      EXPECT_TRUE(in->test());
      // A blocking send meets an irecv, an isend a blocking recv.
      comm.send(mine.data(), 800, right, 8);
      Request back = comm.isend(mine.data(), 800, left, 9);
      Request late = comm.irecv(again.data(), 800, left, 8);
      std::vector<double> from_right(100);
      comm.recv(from_right.data(), 800, right, 9);
      late->wait();
      back->wait();
      for (int k = 0; k < 100; ++k) {
        ASSERT_EQ(got[k], testing::tagged<double>(left, k)) << "element " << k;
        ASSERT_EQ(again[k], testing::tagged<double>(left, k)) << "element " << k;
        ASSERT_EQ(from_right[k], testing::tagged<double>(right, k)) << "element " << k;
      }
    });
  }
}

TEST(ThreadsNonblocking, ZeroBytesManyInFlightAndWaitsInAnyOrder) {
  run(Mesh::parse("X=2"), [](Communicator& comm) {
    constexpr int count = 64;
    const std::int64_t peer = 1 - comm.rank();
    std::vector<std::vector<float>> out(count), in(count);
    std::vector<Request> requests;
    for (int i = 0; i < count; ++i) {
      // Message i: i floats under tag i % 3, so that each tag's messages must stay in order.
      out[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(i), static_cast<float>(comm.rank() * 1000 + i));
      in[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(i), -1.0f);
      requests.push_back(comm.isend(out[static_cast<std::size_t>(i)].data(), 4 * i, peer, i % 3));
      requests.push_back(comm.irecv(in[static_cast<std::size_t>(i)].data(), 4 * i, peer, i % 3));
    }
    for (auto r = requests.rbegin(); r != requests.rend(); ++r) (*r)->wait();  // the last posted first
    for (int i = 0; i < count; ++i) {
      for (float v : in[static_cast<std::size_t>(i)])
        ASSERT_EQ(v, static_cast<float>(peer * 1000 + i)) << "message " << i;
    }
  });
}

// The receiving rank's progress thread copies: rank 0's isend completes while rank 1 sits
// outside every communicator call, and rank 1 finds the data when it comes back. So the
// rings need no helper thread calling test() here (they have one on mpi).
TEST(ThreadsNonblocking, TransfersProceedWhileTheReceiverIsBusy) {
  Gate sent;
  run(Mesh::parse("X=2"), [&](Communicator& comm) {
    EXPECT_FALSE(comm.wants_progress_thread());
    std::vector<int> data(1000);
    if (comm.rank() == 0) {
      std::iota(data.begin(), data.end(), 5);
      comm.barrier();  // rank 1's irecv is posted
      comm.isend(data.data(), 4000, 1, 0)->wait();
      sent.open();
    } else {
      Request r = comm.irecv(data.data(), 4000, 0, 0);
      comm.barrier();
      sent.wait();  // "computing": no communicator call until the send has completed
      EXPECT_TRUE(r->test());
      r->wait();
      for (int k = 0; k < 1000; ++k) ASSERT_EQ(data[static_cast<std::size_t>(k)], k + 5);
    }
  });
}

// A request dropped before its peer posts is withdrawn: the peer's call meets the next one.
TEST(ThreadsNonblocking, DroppedRequestsAreWithdrawn) {
  run(Mesh::parse("X=2"), [](Communicator& comm) {
    int first = -1, second = -1;
    if (comm.rank() == 0) {
      { Request dropped = comm.irecv(&first, 4, 1, 1); }
      { Request dropped = comm.isend(&first, 4, 1, 2); }
      comm.barrier();
      comm.recv(&second, 4, 1, 1);
      EXPECT_EQ(first, -1) << "a withdrawn receive was written";
      EXPECT_EQ(second, 42);
      const int value = 7;
      comm.send(&value, 4, 1, 2);
    } else {
      comm.barrier();
      const int value = 42;
      comm.isend(&value, 4, 0, 1)->wait();
      comm.irecv(&second, 4, 0, 2)->wait();
      EXPECT_EQ(second, 7) << "the withdrawn send was received";
    }
  });
}

TEST(ThreadsNonblocking, APeerThatReturnsWithoutMatchingIsAMismatch) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                int x = 0;
                if (comm.rank() == 0) comm.irecv(&x, sizeof x, 1, 5)->wait();
              });
            }),
            "p2p mismatch: rank 0 called recv(4 bytes from rank 1, tag 5); rank 1 returned without sending it");
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                int x = 0;
                if (comm.rank() == 1) comm.isend(&x, sizeof x, 0, 6)->wait();
              });
            }),
            "p2p mismatch: rank 1 called isend(4 bytes to rank 0, tag 6); rank 0 returned without receiving it");
}

TEST(ThreadsNonblocking, SizesMustAgree) {
  EXPECT_EQ(message_of<CollectiveMismatch>([] {
              run(Mesh::parse("X=2"), [](Communicator& comm) {
                double x = 0;
                if (comm.rank() == 0) comm.send(&x, 4, 1, 0);
                else comm.irecv(&x, 8, 0, 0)->wait();
              });
            }),
            "p2p mismatch: rank 1 called recv(8 bytes from rank 0, tag 0) but rank 0 sent 4 bytes");
  // Only the sender waits: the receiver keeps its request until the sender has failed.
  Gate failed;
  EXPECT_EQ(message_of<CollectiveMismatch>([&] {
              run(Mesh::parse("X=2"), [&](Communicator& comm) {
                double x = 0;
                if (comm.rank() == 1) {
                  Request r = comm.irecv(&x, 8, 0, 0);
                  return failed.wait();
                }
                opening_if_it_throws(failed, [&] { comm.isend(&x, 4, 1, 0)->wait(); });
              });
            }),
            "p2p mismatch: rank 0 called isend(4 bytes to rank 1, tag 0) but rank 1 posted a receive of 8 bytes");
}

// irecv_lent: an isend's buffer is read in place, and the send completes only when the
// receiver drops its request; a blocking send is copied, as for irecv.
TEST(ThreadsNonblocking, ALentReceiveReadsTheSendersBufferUntilItIsDropped) {
  for (const bool receive_first : {true, false}) {
    SCOPED_TRACE(receive_first ? "receive posted first" : "send posted first");
    Gate posted, read, tested;
    std::atomic<bool> send_done_early{false};
    std::vector<double> mine(64);
    run(Mesh::parse("X=2"), [&](Communicator& comm) {
      if (comm.rank() == 0) {
        for (int k = 0; k < 64; ++k) mine[static_cast<std::size_t>(k)] = testing::tagged<double>(0, k);
        if (receive_first) posted.wait();
        Request out = comm.isend(mine.data(), 512, 1, 3);
        if (!receive_first) posted.open();
        read.wait();
        send_done_early = out->test();
        tested.open();
        out->wait();  // returns once rank 1 lets go
        comm.send(mine.data(), 512, 1, 4);
        return;
      }
      std::vector<double> own(64, -1.0);
      if (!receive_first) posted.wait();
      Request in = comm.irecv_lent(own.data(), 512, 0, 3);
      if (receive_first) posted.open();
      in->wait();
      EXPECT_TRUE(in->test());
      EXPECT_EQ(in->received(), static_cast<const void*>(mine.data())) << "not lent";
      EXPECT_EQ(own[0], -1.0) << "copied although lent";
      read.open();
      tested.wait();
      in.reset();
      Request copied = comm.irecv_lent(own.data(), 512, 0, 4);
      copied->wait();
      EXPECT_EQ(copied->received(), static_cast<const void*>(own.data()));
      for (int k = 0; k < 64; ++k) ASSERT_EQ(own[static_cast<std::size_t>(k)], testing::tagged<double>(0, k));
    });
    EXPECT_FALSE(send_done_early) << "the send completed while its buffer was lent";
  }
}

// A lent receive dropped unwaited, or of the wrong size, leaves nobody waiting forever.
TEST(ThreadsNonblocking, LentReceivesFailAndUnwindLikeOthers) {
  run(Mesh::parse("X=2"), [](Communicator& comm) {
    double x = 1;
    if (comm.rank() == 0) {
      comm.barrier();
      comm.isend(&x, 8, 1, 0)->wait();  // completes when rank 1 drops its request unwaited
    } else {
      Request r = comm.irecv_lent(&x, 8, 0, 0);
      comm.barrier();
      while (!r->test()) std::this_thread::yield();
    }
  });
  Gate failed;  // the sender waits for the receiver's error, so that it is the one reported
  EXPECT_EQ(message_of<CollectiveMismatch>([&] {
              run(Mesh::parse("X=2"), [&](Communicator& comm) {
                double x = 0;
                if (comm.rank() == 0) {
                  comm.barrier();
                  Request r = comm.isend(&x, 4, 1, 0);
                  return failed.wait();
                }
                Request r = comm.irecv_lent(&x, 8, 0, 0);
                comm.barrier();
                opening_if_it_throws(failed, [&] { r->wait(); });
              });
            }),
            "p2p mismatch: rank 1 called recv(8 bytes from rank 0, tag 0) but rank 0 sent 4 bytes");
}

// A rank that throws while its buffer is lent must wait for the reader to let go, and the
// reader may be waiting for a message it will never send: the thrower releases everyone at
// once (well inside the watchdog) and its own error is the one reported. If it catches the
// error and carries on, the run still fails: its peers were stopped.
TEST(ThreadsNonblocking, ARankUnwindingPastALentBufferReleasesItsPeers) {
  for (const bool caught : {false, true}) {
    SCOPED_TRACE(caught ? "caught" : "thrown");
    const auto start = std::chrono::steady_clock::now();
    Gate lent_out;
    const std::string message = message_of<std::runtime_error>([&] {
      run(
          Mesh::parse("X=2"),
          [&](Communicator& comm) {
            double x = 1, y = 0;
            if (comm.rank() == 1) {
              Request lent = comm.irecv_lent(&y, 8, 0, 0);
              lent->wait();
              lent_out.open();
              comm.recv(&y, 8, 0, 1);  // never sent: only rank 0's release ends this
              return;
            }
            try {
              Request out = comm.isend(&x, 8, 1, 0);
              lent_out.wait();
              throw std::runtime_error("rank 0 failed mid-ring");
            } catch (const std::runtime_error&) {
              if (!caught) throw;
            }
          },
          60);
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << "waited for the watchdog";
    EXPECT_EQ(message, caught ? "p2p mismatch: rank 0 dropped a send a peer was reading in place while an exception "
                                "unwound it, and caught the exception; its peers were stopped"
                              : "rank 0 failed mid-ring");
  }
}

TEST(Backends, ThreadsIsAlwaysThereAndRunsEveryDevice) {
  const std::vector<std::string> backends = available_backends();
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends[0], "threads");
  std::atomic<int> calls{0};
  run_backend("threads", Mesh::parse("X=2,Y=3"), [&](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "threads");
    EXPECT_TRUE(testing::check_all_reduce<double>(comm, {1}, 5));
    ++calls;
  });
  EXPECT_EQ(calls, 6);
}

TEST(Backends, UnknownBackendListsTheBuiltOnes) {
  std::string built = "threads";
  for (const std::string& b : available_backends()) {
    if (b != "threads") built += ", " + b;
  }
  EXPECT_EQ(message_of<InputError>([] { run_backend("nccl", Mesh::parse("X=2"), [](Communicator&) {}); }),
            "unknown backend 'nccl'; this build has: " + built);
}

// What callers adapt to is asked of the backend, by name before it runs or of its communicator.
TEST(Backends, CapabilitiesByNameAreTheCommunicators) {
  const BackendCapabilities threads = backend_capabilities("threads");
  EXPECT_TRUE(threads.ranks_in_one_process);
  EXPECT_FALSE(threads.reduces_into_workspace);
  run_backend("threads", Mesh::parse("X=2"), [&](Communicator& comm) { EXPECT_EQ(comm.capabilities(), threads); });
  EXPECT_EQ(message_of<InputError>([] { backend_capabilities("nccl"); }).rfind("unknown backend 'nccl'", 0), 0u);
}

}  // namespace
}  // namespace shardmm
