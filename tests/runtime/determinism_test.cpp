// Determinism on the threads backend: the same inputs and plan give bitwise-identical
// outputs run after run. 100 repetitions of random sharded contractions and reshards
// (uneven and empty shards, unreduced inputs, every candidate plan; determinism_cases.h),
// each repetition on fresh rank threads with a fresh executor, so that thread scheduling
// differs every time. mpi/mpi_determinism_test.cpp holds the mpi backend to these bits.
// SHARDMM_DETERMINISM_CASES=N draws N contractions and N reshards (default 12).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "determinism_cases.h"

namespace shardmm {
namespace {

using testing::DeviceBytes;
using testing::PlanCase;

constexpr int kRepetitions = 100;

int case_count() {
  const char* env = std::getenv("SHARDMM_DETERMINISM_CASES");
  return env ? std::max(1, std::atoi(env)) : 12;
}

TEST(DeterminismTest, RandomCasesGiveTheSameBitsInEveryRepetition) {
  const std::vector<PlanCase> cases =
      testing::random_plan_cases(case_count(), [](testing::Rng& rng) { return testing::random_mesh(rng, 3, 8); });
  const auto reducing =
      std::count_if(cases.begin(), cases.end(), [](const PlanCase& k) { return testing::reduces(k.plan); });
  // Reductions are where a changing order would show; the sample must have plenty.
  ASSERT_GE(reducing, static_cast<std::ptrdiff_t>(cases.size() / 4)) << "of " << cases.size() << " cases";

  std::vector<DeviceBytes> first;
  for (const PlanCase& k : cases) first.push_back(testing::run_plan_case("threads", k));
  int differing = 0;
  for (int rep = 1; rep < kRepetitions; ++rep) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const DeviceBytes now = testing::run_plan_case("threads", cases[i]);
      for (std::size_t d = 0; d < now.size(); ++d) {
        if (now[d] != first[i][d] && differing++ < 10) {
          ADD_FAILURE() << "repetition " << rep << ", device " << d << ": " << cases[i].name;
        }
      }
    }
  }
  EXPECT_EQ(differing, 0);
  RecordProperty("cases", static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace shardmm
