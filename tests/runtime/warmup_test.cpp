// run_plan's warm-up: exactly `warmup` untimed runs, or, with warmup_min_s, more until that
// much time has passed, every rank making the same runs (they agree after each one; a rank
// that stopped early would leave the others waiting in a collective).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {
namespace {

using ::testing::HasSubstr;

// A small all_gather on 4 ranks: microseconds a run, so a timed warm-up needs many.
struct SmallReshard {
  Mesh mesh = Mesh::parse("X=4");
  Spec from = parse_spec("T[I_X, J]", mesh);
  RunRequest req;
  SmallReshard() {
    PlanOptions o;
    o.dtype = DType::f32;
    o.hw = builtin_profile("h100");
    req.mesh = mesh;
    req.sizes = parse_dims("I=9,J=16");
    req.dtype = DType::f32;
    req.plan = plan_reshard(mesh, from, parse_spec("T[I, J]", mesh), global_shape(from, req.sizes), o);
    req.reshard_from = &from;
    req.repeat = 1;
    req.verify = false;
  }
};

TEST(Warmup, WithoutATimeExactlyTheCount) {
  for (int warmup : {0, 1, 3}) {
    SmallReshard r;
    r.req.warmup = warmup;
    EXPECT_EQ(run_plan(r.req).warmup_runs, warmup);
  }
}

TEST(Warmup, RunsOnUntilTheTimeHasPassed) {
  SmallReshard r;
  r.req.warmup = 1;
  r.req.warmup_min_s = 0.05;
  const auto start = std::chrono::steady_clock::now();
  const RunReport report = run_plan(r.req);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.05);
  EXPECT_GT(report.warmup_runs, 1);
  // The count starts from --warmup even with no time to fill.
  r.req.warmup = 0;
  EXPECT_GE(run_plan(r.req).warmup_runs, 1);
}

TEST(Warmup, ATimeOutsideZeroToAMinuteIsAnInputError) {
  for (double bad : {-1.0, 61.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    SmallReshard r;
    r.req.warmup_min_s = bad;
    try {
      run_plan(r.req);
      ADD_FAILURE() << "warmup_min_s " << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("warmup_time ")) << bad;
      EXPECT_THAT(e.what(), HasSubstr("must be 0 to 60 seconds")) << bad;
    }
  }
}

}  // namespace
}  // namespace shardmm
