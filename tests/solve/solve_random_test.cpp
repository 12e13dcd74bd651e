// The solver on random programs (every op kind, pins, uneven and empty shards, both split
// rules, with and without collective matmul rings) on random meshes of up to two axes: its optimum is exhaustive search's, with and
// without a binding memory limit; `shardmm program` costs the answer as the solver did; and
// the answer, executed on threads, matches the dense f64 step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "random_cases.h"
#include "random_programs.h"
#include "same_choices.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/solve/solve.h"
#include "test_paths.h"

namespace shardmm::solve {
namespace {

double predicted_time(const nn::ProgramPrediction& p) {
  double s = 0;
  for (const autodiff::TapeEvent& e : p.events) s += e.step.time_s;
  return s;
}

// Case c of a random suite: a program of 2 to `max_ops` ops on a random mesh (up to `max_axes`
// axes and `max_devices` devices), bound with one split rule or the other, and options to cost
// it with (train or not, sgd or adam, rings or not).
struct RandomCase {
  std::string text;     // for the failures' trace
  std::string program;  // the program file
  SplitRule split = SplitRule::array;
  program::Graph graph;
  nn::ProgramOptions options;
};
RandomCase random_case(std::uint64_t seed, int c, int max_axes, std::int64_t max_devices, int max_ops) {
  testing::Rng rng(seed);
  const Mesh mesh = testing::random_mesh(rng, max_axes, max_devices);
  testing::ProgramWriter writer(rng, mesh);
  const testing::RandomProgram p = writer.write(testing::uniform(rng, 2, max_ops));
  program::BindOptions bind;
  bind.split = c % 2 ? SplitRule::chunk : SplitRule::array;
  RandomCase out;
  out.program = p.text;
  out.split = bind.split;
  out.text = "case " + std::to_string(c) + " (seed " + std::to_string(seed) + "), split " +
             std::string(to_string(bind.split)) + ":\n" + p.text;
  try {
    out.graph = program::bind(program::parse_program(p.text, "random.prog"), bind);
  } catch (const InputError& e) {
    throw std::runtime_error("the writer wrote a program that does not bind: " + std::string(e.what()) + "\n" +
                             out.text);
  }
  out.options.train = c % 4 != 3;
  out.options.optimizer = c % 3 == 0 ? nn::Optimizer::adam : nn::Optimizer::sgd;
  out.options.seed = static_cast<std::uint64_t>(c);
  out.options.rings = c % 5 == 2;  // the einsums' rings, and the scattered results they offer
  return out;
}

TEST(SolveRandom, OptimumIsExhaustiveSearchsAndRunsVerified) {
  const int cases = static_cast<int>(testing::scaled_cases(150));
  int compared = 0, limited = 0, executed = 0, rebatched = 0;
  for (int c = 0; c < cases; ++c) {
    const RandomCase rc = random_case(20261205 + static_cast<std::uint64_t>(c), c, 2, 4, 5);
    SCOPED_TRACE(rc.text);
    const program::Graph& g = rc.graph;
    const nn::ProgramOptions& options = rc.options;
    ProgramChoices choices;
    try {
      choices = build_choices(g, options);
    } catch (const InputError& e) {
      FAIL() << "no sharding found: " << e.what();  // the pins a writer draws always run as written
    }
    const std::optional<SolveOutcome> dp = solve_elimination(choices.problem);
    ASSERT_TRUE(dp.has_value());
    ASSERT_EQ(dp->status, SolveStatus::optimal);

    // Built in small batches (most of them entered beside the next one's recording), the
    // problem is the same.
    if (c % 4 == 1) {
      BuildLimits small;
      small.batch = 8 + static_cast<std::size_t>(c % 25);
      testing::expect_same_choices(choices, build_choices(g, options, small));
      ++rebatched;
    }

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
  std::printf(
      "%d random programs: %d compared with exhaustive search, %d with a binding limit, %d executed, %d rebuilt in "
      "small batches\n",
      cases, compared, limited, executed, rebatched);
  EXPECT_GE(compared, cases * 2 / 3);
  EXPECT_GE(limited, cases / 10);
  EXPECT_GE(executed, cases / 4);
  EXPECT_GE(rebatched, cases / 5);
}

// The search by neighbourhoods (what meshes past two axes get) on random programs on random
// meshes of up to three axes: never below the exact optimum where the whole space can be built
// (it searches a part of it), often equal to it; its answer costs under `shardmm program` what
// it says; no named strategy beats it; and executed, it matches the dense step.
// No sharding beats the compute bound (the bound a neighbourhood search reports): below the
// exact optimum (pins or not: it holds for every sharding) on each profile, the calibrated one's
// measured GEMM and local rates included; and it is tight somewhere (where the optimum computes
// alone and evenly), so a bound that were too high would show.
TEST(SolveRandom, NoShardingBeatsTheComputeBound) {
  const std::pair<std::string, DType> profiles[] = {
      {"h100", DType::bf16},
      {"tpu-v5e", DType::bf16},
      {shardmm::testing::tests_dir() + "/solve/profiles/calibrated-cpu.json", DType::f32}};
  const int cases = static_cast<int>(testing::scaled_cases(150));
  double tightest = 0;
  for (int c = 0; c < cases; ++c) {
    RandomCase rc = random_case(20261206 + static_cast<std::uint64_t>(c), c, 2, 4, 5);
    SCOPED_TRACE(rc.text);
    const auto& [profile, dtype] = profiles[c % 3];
    SCOPED_TRACE(profile);
    rc.options.hw = load_profile(profile);
    rc.options.dtype = dtype;
    const std::optional<SolveOutcome> dp = solve_elimination(build_choices(rc.graph, rc.options).problem);
    ASSERT_TRUE(dp.has_value());
    const double bound = compute_bound(rc.graph, rc.options);
    EXPECT_GT(bound, 0);
    EXPECT_LE(bound, dp->value.time * (1 + 1e-12));
    tightest = std::max(tightest, bound / dp->value.time);
  }
  EXPECT_GT(tightest, 0.99);
}

// A size-1 axis splits nothing: the search leaves it unused (placed_axes) and finds the
// optimum it finds on the mesh without the axis, wherever the axis stands.
TEST(SolveRandom, ASizeOneAxisChangesNoOptimum) {
  const int cases = static_cast<int>(testing::scaled_cases(60));
  for (int c = 0; c < cases; ++c) {
    const RandomCase rc = random_case(20261207 + static_cast<std::uint64_t>(c), c, 2, 4, 4);
    SCOPED_TRACE(rc.text);
    std::vector<MeshAxis> axes = rc.graph.mesh.axes();
    testing::Rng rng(static_cast<std::uint64_t>(c));
    axes.insert(axes.begin() + testing::uniform(rng, 0, static_cast<int>(axes.size())), MeshAxis{"U", 1});
    const Mesh with_unit(axes);
    SCOPED_TRACE("with the mesh " + with_unit.to_string());
    std::string text = rc.program;
    const std::size_t line = text.find("mesh ");
    ASSERT_NE(line, std::string::npos);
    text.replace(line, text.find('\n', line) - line, "mesh " + with_unit.to_string());
    program::BindOptions bind;
    bind.split = rc.split;
    const program::Graph g = program::bind(program::parse_program(text, "random.prog"), bind);
    const std::optional<SolveOutcome> without = solve_elimination(build_choices(rc.graph, rc.options).problem);
    const ProgramChoices choices = build_choices(g, rc.options);
    const std::optional<SolveOutcome> with = solve_elimination(choices.problem);
    ASSERT_TRUE(without.has_value());
    ASSERT_TRUE(with.has_value());
    ASSERT_EQ(with->status, SolveStatus::optimal);
    // (The dynamic program is blind to memory: of equally fast shardings it may take another.)
    EXPECT_NEAR(with->value.time, without->value.time, 1e-12 * without->value.time);
    const int unit = 1 << static_cast<int>(std::find(axes.begin(), axes.end(), MeshAxis{"U", 1}) - axes.begin());
    // (A mesh of one device keeps its axes: placed_axes.)
    if (rc.graph.mesh.device_count() > 1) {
      EXPECT_EQ(placed_axes(g.mesh) & unit, 0);
    }
  }
}

TEST(SolveRandom, NeighbourhoodSearchCostsWhatItSaysAndRunsVerified) {
  const int cases = static_cast<int>(testing::scaled_cases(60));
  int compared = 0, equal = 0, executed = 0;
  for (int c = 0; c < cases; ++c) {
    const RandomCase rc = random_case(20261206 + static_cast<std::uint64_t>(c), c, 3, 8, 4);
    SCOPED_TRACE(rc.text);
    const program::Graph& g = rc.graph;
    SolveOptions o;
    o.program = rc.options;
    o.search = SolveOptions::Search::neighbourhoods;
    o.seconds = 600;
    const SolveResult r = solve_program(g, o);
    ASSERT_TRUE(r.search.has_value());
    EXPECT_EQ(r.search->converged_axes, 2);
    const nn::ProgramPrediction pred = nn::predict_program(pinned_graph(g, r.specs, r.regathered), o.program);
    EXPECT_NEAR(r.outcome.value.time, predicted_time(pred), 1e-9 * predicted_time(pred) + 1e-15);
    EXPECT_EQ(r.outcome.value.memory, pred.memory.peak());
    for (const NamedStrategy& s : r.named) {
      if (!s.outcome.best.empty()) {
        EXPECT_GE(s.outcome.value.time, r.outcome.value.time * (1 - 1e-12)) << s.name;
      }
    }
    try {
      BuildLimits limits;
      limits.seconds = 5;
      const ProgramChoices whole = build_choices(g, o.program, limits);
      const std::optional<SolveOutcome> optimum = solve_elimination(whole.problem);
      ASSERT_TRUE(optimum.has_value());
      ++compared;
      EXPECT_GE(r.outcome.value.time, optimum->value.time * (1 - 1e-12));
      equal += r.outcome.value.time <= optimum->value.time * (1 + 1e-12) ? 1 : 0;
    } catch (const SearchTooLarge&) {
      // the whole space takes too long to build: the checks above still ran
    }
    if (c % 3 == 0) {
      ++executed;
      const program::Graph answer = pinned_graph(g, r.specs, r.regathered);
      nn::ProgramRun run;
      run_backend("threads", answer.mesh, [&](Communicator& comm) {
        nn::ProgramRun x = nn::run_program(comm, answer, o.program);
        if (comm.rank() == 0) run = std::move(x);
      });
      EXPECT_TRUE(run.verification.verified) << run.verification.detail;
    }
  }
  std::printf(
      "%d random programs searched by neighbourhoods: %d compared with the exact optimum, %d equal to it, "
      "%d executed\n",
      cases, compared, equal, executed);
  EXPECT_GE(compared, cases / 2);
  EXPECT_GE(executed, cases / 4);
}

}  // namespace
}  // namespace shardmm::solve
