// The benchmarks' span (runtime/bench_timing.h): from the first rank's start to the last
// rank's finish, also where ranks share a core and start at different moments.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <mutex>
#include <vector>

#include "runtime/bench_timing.h"
#include "shardmm/core/mesh.h"

namespace shardmm {
namespace {

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Busy until this thread has had `seconds` of CPU time.
void burn_cpu(double seconds) {
  const double until = thread_cpu_s() + seconds;
  volatile double x = 1;
  while (thread_cpu_s() < until) x = x * 1.0000001 + 1e-9;
}

// Confines the calling thread, and the threads it starts, to one CPU for its lifetime.
class OneCpu {
 public:
  OneCpu() {
    EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_), 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &saved_)) {
        CPU_SET(c, &one);
        break;
      }
    }
    EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  }
  ~OneCpu() { pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_); }
  OneCpu(const OneCpu&) = delete;
  OneCpu& operator=(const OneCpu&) = delete;

 private:
  cpu_set_t saved_{};
};

TEST(GroupSpan, CoversEveryRanksWorkWhenTheyShareOneCore) {
  // Three ranks on one CPU, each with 3 ms of work: they cannot all be done sooner than 9 ms
  // after the first starts. A rank's own span can be 3 ms (the others ran first) or 6 ms;
  // the group's is at least 9 on every trial.
  constexpr int kRanks = 3, kTrials = 7;
  constexpr double kWork = 0.003;
  std::mutex lock;
  std::vector<std::vector<double>> spans(kRanks);
  {
    const OneCpu pinned;
    run_threads(Mesh::parse("X=3"), [&](Communicator& comm) {
      ASSERT_TRUE(comm.clock_is_shared());
      std::vector<double> mine;
      for (int t = 0; t < kTrials; ++t) mine.push_back(detail::group_span_s(comm, [] { burn_cpu(kWork); }));
      std::lock_guard hold(lock);
      spans[static_cast<std::size_t>(comm.rank())] = mine;
    });
  }
  for (int t = 0; t < kTrials; ++t) {
    EXPECT_GE(spans[0][t], kRanks * kWork) << "trial " << t;
    for (int r = 1; r < kRanks; ++r) EXPECT_EQ(spans[r][t], spans[0][t]) << "rank " << r << ", trial " << t;
  }
}

TEST(GroupSpan, LastsUntilTheSlowestRankFinishes) {
  std::mutex lock;
  std::vector<double> spans;
  run_threads(Mesh::parse("X=2,Y=2"), [&](Communicator& comm) {
    const double span = detail::group_span_s(comm, [&] {
      if (comm.rank() == 3) burn_cpu(0.02);
    });
    std::lock_guard hold(lock);
    spans.push_back(span);
  });
  ASSERT_EQ(spans.size(), 4u);
  for (double s : spans) EXPECT_GE(s, 0.02);
}

}  // namespace
}  // namespace shardmm
