// plan_matmul asked for serial plans only (Candidates::serial, what a tape that runs no ring
// asks for) weighs no collective matmul and builds only its choice: that must be the plan the
// call that builds them all would choose among its ringless candidates, to the last bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "plan_text.h"
#include "random_cases.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

using testing::everything;
using testing::Rng;
using testing::uniform;

bool ringless(const Plan& p) {
  return std::none_of(p.steps.begin(), p.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); });
}

// What the call that builds them all says the serial call must give: its ringless candidates'
// choice by the rule of MatmulPlanning::chosen (the first that fits; within the tie margin of
// its time, the first with the fewest synchronizations), alone.
MatmulPlanning expected_serial(const MatmulPlanning& all, double tie_margin) {
  MatmulPlanning out;
  out.every_output_layout = all.every_output_layout;
  const Plan* best = nullptr;
  double tied = 0;
  for (const Plan& p : all.candidates) {
    if (!p.fits_memory || !ringless(p)) continue;
    if (!best) {
      best = &p;
      tied = p.total_time_s * (1 + tie_margin);
    } else if (p.total_time_s <= tied && synchronizations(p) < synchronizations(*best)) {
      best = &p;
    }
  }
  if (best) {
    out.chosen = 0;
    out.candidates.push_back(*best);
  }
  return out;
}

// Random contractions (uneven and empty shards, pending sums, free and pinned outputs) on
// meshes of up to 3 axes, each planned on a random profile (rings both ways on a torus), with a
// random memory limit (some candidates over it, sometimes all) and tie margin.
TEST(PlannerCandidates, SerialChoosesAsAllAmongItsRinglessCandidates) {
  const std::vector<std::string> profiles = builtin_profile_names();
  int compared = 0, rings_chosen = 0, none_fits = 0;
  const int cases = static_cast<int>(testing::scaled_cases(400));
  for (unsigned seed = 1; seed <= static_cast<unsigned>(cases); ++seed) {
    Rng rng(seed);
    const Mesh mesh = testing::random_mesh(rng, 3, 64);
    // Small sizes for uneven and empty shards, large ones for compute that a ring can hide.
    const testing::RandomContraction rc = testing::random_contraction(rng, mesh, uniform(rng, 0, 1) ? 9 : 4096);
    PlanOptions options;
    options.hw = builtin_profile(profiles[static_cast<std::size_t>(uniform(rng, 0, std::ssize(profiles) - 1))]);
    options.dtype = uniform(rng, 0, 1) ? DType::bf16 : DType::f32;
    options.tie_margin = uniform(rng, 0, 3) * 0.02;
    options.reduction_workspace = uniform(rng, 0, 1) == 1;
    SCOPED_TRACE("seed " + std::to_string(seed) + ": mesh " + mesh.to_string() + ", " + rc.text + " on " +
                 options.hw.name);
    MatmulPlanning all;
    try {
      all = plan_matmul(mesh, rc.contraction, rc.sizes, options);
    } catch (const InputError&) {
      EXPECT_THROW(plan_matmul(mesh, rc.contraction, rc.sizes, options, nullptr, Candidates::serial), InputError);
      continue;
    }
    // A limit between the smallest and the largest peak, or under all of them.
    std::int64_t least = all.candidates.front().peak_bytes_per_device, most = least;
    for (const Plan& p : all.candidates) {
      least = std::min(least, p.peak_bytes_per_device);
      most = std::max(most, p.peak_bytes_per_device);
    }
    const int limit = uniform(rng, 0, 3);
    if (limit > 0) {
      options.mem_limit_bytes = limit == 1 ? least - 1 : least + (most - least) / limit;
      all = plan_matmul(mesh, rc.contraction, rc.sizes, options);
    }
    const MatmulPlanning serial = plan_matmul(mesh, rc.contraction, rc.sizes, options, nullptr, Candidates::serial);
    ASSERT_EQ(everything(serial, mesh), everything(expected_serial(all, options.tie_margin), mesh));
    EXPECT_TRUE(serial.cases.empty());  // a tape does not read them
    ASSERT_EQ(all.cases.size(), static_cast<std::size_t>(mesh.rank()));
    ++compared;
    none_fits += serial.chosen < 0;
    rings_chosen += all.chosen >= 0 && !ringless(all.candidates[static_cast<std::size_t>(all.chosen)]);
  }
  // The sample held the cases that matter: rings chosen where all are weighed (the serial
  // choice then another plan), and limits no serial plan fits. In proportion to the cases drawn
  // (the sanitizers' scaled runs draw a fifth of them).
  EXPECT_GT(compared, cases * 3 / 4);
  EXPECT_GT(rings_chosen, cases / 100);
  EXPECT_GT(none_fits, cases / 100);
}

}  // namespace
}  // namespace shardmm
