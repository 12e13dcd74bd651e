// Determinism across backends (a 4-process job): random plans (determinism_cases.h) run
// 100 times on the mpi backend give, on every rank and in every repetition, the same bits
// as the threads backend computes for that device inside this process.
// SHARDMM_DETERMINISM_CASES=N draws N contractions and N reshards (default 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "determinism_cases.h"
#include "mpi/mpi_test.h"

namespace shardmm {
namespace {

constexpr int kRepetitions = 100;

Mesh four_device_mesh(testing::Rng& rng) {
  static const char* meshes[] = {"X=4", "X=2,Y=2", "X=1,Y=4", "X=2,Y=1,Z=2"};
  return Mesh::parse(meshes[testing::uniform(rng, 0, 3)]);
}

int case_count() {
  const char* env = std::getenv("SHARDMM_DETERMINISM_CASES");
  return env ? std::max(1, std::atoi(env)) : 3;
}

TEST(MpiDeterminismTest, RepetitionsGiveTheThreadsBackendsBits) {
  const auto cases = testing::random_plan_cases(case_count(), four_device_mesh);  // the same on every rank
  EXPECT_GT(
      std::count_if(cases.begin(), cases.end(), [](const testing::PlanCase& k) { return testing::reduces(k.plan); }),
      0);
  const auto me = static_cast<std::size_t>(world_rank);
  std::vector<std::vector<unsigned char>> threads;
  for (const auto& k : cases) threads.push_back(testing::run_plan_case("threads", k)[me]);
  int differing = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (testing::run_plan_case("mpi", cases[i])[me] != threads[i] && differing++ < 10) {
        ADD_FAILURE() << "repetition " << rep << ", rank " << world_rank << ": " << cases[i].name;
      }
    }
  }
  EXPECT_EQ(differing, 0);
}

}  // namespace
}  // namespace shardmm
