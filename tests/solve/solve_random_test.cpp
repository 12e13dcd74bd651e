// The solver on random programs (every op kind, pins, uneven and empty shards, both split
// rules, with and without collective matmul rings) on random meshes of up to two axes: its optimum is exhaustive search's, with and
// without a binding memory limit; `shardmm program` costs the answer as the solver did; and
// the answer, executed on threads, matches the dense f64 step.
#include <gtest/gtest.h>

#include <cstdio>

#include "random_cases.h"
#include "random_programs.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/solve/solve.h"

namespace shardmm::solve {
namespace {

double predicted_time(const nn::ProgramPrediction& p) {
  double s = 0;
  for (const autodiff::TapeEvent& e : p.events) s += e.step.time_s;
  return s;
}

TEST(SolveRandom, OptimumIsExhaustiveSearchsAndRunsVerified) {
  const int cases = static_cast<int>(testing::scaled_cases(150));
  int compared = 0, limited = 0, executed = 0;
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = 20261205 + static_cast<std::uint64_t>(c);
    testing::Rng rng(seed);
    const Mesh mesh = testing::random_mesh(rng, 2, 4);
    testing::ProgramWriter writer(rng, mesh);
    const testing::RandomProgram p = writer.write(testing::uniform(rng, 2, 5));
    program::BindOptions bind;
    bind.split = c % 2 ? SplitRule::chunk : SplitRule::array;
    SCOPED_TRACE("case " + std::to_string(c) + " (seed " + std::to_string(seed) + "), split " +
                 std::string(to_string(bind.split)) + ":\n" + p.text);
    program::Graph g;
    ASSERT_NO_THROW(g = program::bind(program::parse_program(p.text, "random.prog"), bind))
        << "the writer wrote a program that does not bind";
    nn::ProgramOptions options;
    options.train = c % 4 != 3;
    options.optimizer = c % 3 == 0 ? nn::Optimizer::adam : nn::Optimizer::sgd;
    options.seed = static_cast<std::uint64_t>(c);
    options.rings = c % 5 == 2;  // the einsums' rings, and the scattered results they offer
    ProgramChoices choices;
    try {
      choices = build_choices(g, options);
    } catch (const InputError& e) {
      FAIL() << "no sharding found: " << e.what();  // the pins a writer draws always run as written
    }
    const std::optional<SolveOutcome> dp = solve_elimination(choices.problem);
    ASSERT_TRUE(dp.has_value());
    ASSERT_EQ(dp->status, SolveStatus::optimal);

    // The answer costs, under `shardmm program`, exactly what the solver says.
    const program::Graph answer = pinned_graph(g, specs_of(choices, dp->best), regathered_of(choices, dp->best));
    const nn::ProgramPrediction pred = nn::predict_program(answer, options);
    EXPECT_NEAR(dp->value.time, predicted_time(pred), 1e-9 * predicted_time(pred) + 1e-15);
    EXPECT_EQ(dp->value.memory, pred.memory.peak());

    SolveOutcome truth;
    try {
      truth = solve_exhaustive(choices.problem, {}, 200'000);
    } catch (const InputError&) {
      continue;  // too many assignments to enumerate: the checks above still ran
    }
    ++compared;
    EXPECT_NEAR(dp->value.time, truth.value.time, 1e-15);
    SolveLimits tight;
    tight.memory_limit = truth.value.memory - 1;
    const SolveOutcome t = solve_exhaustive(choices.problem, tight, 200'000);
    const SolveOutcome m = solve_mip(choices.problem, tight);
    ASSERT_EQ(m.status, t.status);
    if (t.status == SolveStatus::optimal) {
      ++limited;
      EXPECT_NEAR(m.value.time, t.value.time, 1e-15);
      EXPECT_LE(m.value.memory, *tight.memory_limit);
    }

    if (c % 3 == 0) {
      ++executed;
      nn::ProgramRun run;
      run_backend("threads", answer.mesh, [&](Communicator& comm) {
        nn::ProgramRun r = nn::run_program(comm, answer, options);
        if (comm.rank() == 0) run = std::move(r);
      });
      EXPECT_TRUE(run.verification.verified) << run.verification.detail;
    }
  }
  std::printf("%d random programs: %d compared with exhaustive search, %d with a binding limit, %d executed\n", cases,
              compared, limited, executed);
  EXPECT_GE(compared, cases * 2 / 3);
  EXPECT_GE(limited, cases / 10);
  EXPECT_GE(executed, cases / 4);
}

}  // namespace
}  // namespace shardmm::solve
