// The dynamic program on problems shaped like a program's: each variable's factor names it and
// a few earlier ones (the previous op's, a residual's far back), so the factor graph is a DAG
// with cycles, and each factor allows a few of the tuples its domains span. Its optimum is
// exhaustive search's, equally fast ties go to the least memory, and its bound counts the
// tuples it joins, not the dense product of their domains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "random_cases.h"
#include "shardmm/solve/choices.h"

namespace shardmm::solve {
namespace {

using testing::uniform;

// Variables 0..n-1 in topological order; variable v's factor names it and 1-5 earlier ones,
// mostly the nearest (a chain), sometimes one far back (a residual). A planted assignment,
// when there is one, is allowed by every factor, so most problems have an optimum.
ChoiceProblem random_sparse_problem(testing::Rng& rng) {
  ChoiceProblem p;
  const int n = uniform(rng, 2, 16);
  for (int v = 0; v < n; ++v) p.domain.push_back(uniform(rng, 1, 10));
  const bool planted = uniform(rng, 0, 9) > 0;
  Assignment plant;
  for (int d : p.domain) plant.push_back(uniform(rng, 0, d - 1));
  const auto add_factor = [&](std::vector<int> vars) {
    Factor f;
    f.vars = std::move(vars);
    std::int64_t dense = 1;
    for (int v : f.vars) dense *= p.domain[static_cast<std::size_t>(v)];
    const int listed = uniform(rng, 1, static_cast<int>(std::min<std::int64_t>(dense, 60)));
    std::vector<std::vector<int>> tuples;
    if (planted) {
      std::vector<int> t;
      for (int v : f.vars) t.push_back(plant[static_cast<std::size_t>(v)]);
      tuples.push_back(t);
    }
    while (static_cast<int>(tuples.size()) < listed) {
      std::vector<int> t;
      for (int v : f.vars) t.push_back(uniform(rng, 0, p.domain[static_cast<std::size_t>(v)] - 1));
      if (std::find(tuples.begin(), tuples.end(), t) == tuples.end()) tuples.push_back(t);
    }
    for (std::vector<int>& t : tuples) {
      // Times on a coarse grid, so that different assignments often tie and memory decides.
      f.entries.push_back({std::move(t), uniform(rng, 0, 20) * 1e-5, uniform(rng, 0, 1000), {}, {}});
    }
    p.factors.push_back(std::move(f));
  };
  for (int v = 0; v < n; ++v) {
    if (uniform(rng, 0, 3) == 0) add_factor({v});
    if (v == 0) continue;
    std::vector<int> vars = {v};
    const int arity = std::min(v + 1, uniform(rng, 2, 6));
    while (static_cast<int>(vars.size()) < arity) {
      const int back = uniform(rng, 0, 3) > 0 ? uniform(rng, 1, std::min(v, 3)) : uniform(rng, 1, v);
      if (std::find(vars.begin(), vars.end(), v - back) == vars.end()) vars.push_back(v - back);
    }
    std::shuffle(vars.begin(), vars.end(), rng);
    add_factor(vars);
  }
  return p;
}

TEST(Elimination, AgreesWithExhaustiveSearchOnSparseDagProblems) {
  testing::Rng rng(20261205);
  const int trials = static_cast<int>(testing::scaled_cases(600));
  int optimal = 0, infeasible = 0, tied = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const ChoiceProblem p = random_sparse_problem(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const SolveOutcome truth = solve_exhaustive(p, {});
    const std::optional<SolveOutcome> dp = solve_elimination(p);
    ASSERT_TRUE(dp.has_value());
    ASSERT_EQ(dp->status, truth.status);
    EXPECT_EQ(dp->method, "dynamic programming");
    if (truth.status != SolveStatus::optimal) {
      ++infeasible;
      EXPECT_TRUE(dp->best.empty());
      continue;
    }
    ++optimal;
    ASSERT_EQ(dp->best.size(), p.domain.size());
    const Evaluation e = evaluate(p, dp->best);
    ASSERT_TRUE(e.allowed);
    EXPECT_EQ(e.time, dp->value.time);
    EXPECT_EQ(e.memory, dp->value.memory);
    EXPECT_NEAR(dp->value.time, truth.value.time, 1e-12 * truth.value.time);
    EXPECT_EQ(dp->lower_bound, dp->value.time);
    // Nothing as fast holds less memory: with less, the best is slower.
    SolveLimits less;
    less.memory_limit = dp->value.memory - 1;
    const SolveOutcome leaner = solve_exhaustive(p, less);
    if (leaner.status == SolveStatus::optimal) {
      EXPECT_GT(leaner.value.time, dp->value.time * (1 + 1e-12));
      tied += truth.value.memory > dp->value.memory ? 1 : 0;
    }
  }
  std::printf("%d sparse problems: %d optimal (%d where exhaustive search's first optimum held more memory), %d "
              "infeasible\n",
              trials, optimal, tied, infeasible);
  EXPECT_GE(optimal, trials * 3 / 4);
  EXPECT_GE(infeasible, 1);
  EXPECT_GE(tied, 1);
}

// A chain of 6-variable factors, each allowing 10 of its 10^6 tuples (the shifts of one
// pattern): the dense product is a million, the tables the join meets hold ten tuples.
TEST(Elimination, BoundsTheTuplesItJoinsNotTheDenseProduct) {
  ChoiceProblem p;
  const int n = 20, arity = 6, d = 10;
  p.domain.assign(n, d);
  for (int first = 0; first + arity <= n; ++first) {
    Factor f;
    for (int i = 0; i < arity; ++i) f.vars.push_back(first + i);
    for (int shift = 0; shift < d; ++shift) {
      std::vector<int> t;
      for (int i = 0; i < arity; ++i) t.push_back((shift + first + i) % d);
      f.entries.push_back({t, 1e-3 * ((shift * 7 + first) % d), 0, {}, {}});
    }
    p.factors.push_back(std::move(f));
  }
  const std::optional<SolveOutcome> dp = solve_elimination(p, 100);
  ASSERT_TRUE(dp.has_value());
  ASSERT_EQ(dp->status, SolveStatus::optimal);
  // Only the shifts of the pattern are allowed: the best is the one whose factors cost least.
  double best = -1;
  for (int shift = 0; shift < d; ++shift) {
    Assignment a;
    for (int v = 0; v < n; ++v) a.push_back((shift + v) % d);
    const Evaluation e = evaluate(p, a);
    ASSERT_TRUE(e.allowed);
    if (best < 0 || e.time < best) best = e.time;
  }
  EXPECT_NEAR(dp->value.time, best, 1e-12 * best);
  // A bound below the tuples one elimination joins (ten) gives up.
  EXPECT_FALSE(solve_elimination(p, 5).has_value());
}

// Tables whose values are not independent: x's two tables each put half their rows on x = 0,
// so the join on x is 25 times what the tables' sizes predict (10,099 tuples, 396 estimated).
// Eliminating a and b first through their other tables (c's, d's) joins at most 1,000. Under a
// bound of 5,000 the misjudged join is cut off and the other order taken; the optimum is
// exhaustive search's.
TEST(Elimination, ATableLargerThanEstimatedIsCutOffAndAnotherOrderTaken) {
  enum { x, a, b, c, d };
  ChoiceProblem p;
  p.domain = {100, 100, 100, 10, 10};
  const auto cost = [](int i, int j) { return 1e-6 * ((i * 31 + j * 17) % 23); };
  for (int other : {a, b}) {
    Factor skewed;  // over (x, other): x = 0 with every value, each other x with value 0
    skewed.vars = {x, other};
    for (int v = 0; v < 100; ++v) skewed.entries.push_back({{0, v}, cost(0, v + other), 0, {}, {}});
    for (int v = 1; v < 100; ++v) skewed.entries.push_back({{v, 0}, cost(v, other), 0, {}, {}});
    p.factors.push_back(std::move(skewed));
  }
  for (auto [other, small] : {std::pair{a, c}, std::pair{b, d}}) {
    Factor dense;  // over (other, small): every pair
    dense.vars = {other, small};
    for (int i = 0; i < 100; ++i) {
      for (int j = 0; j < 10; ++j) dense.entries.push_back({{i, j}, cost(i + small, j), 0, {}, {}});
    }
    p.factors.push_back(std::move(dense));
  }
  const std::optional<SolveOutcome> dp = solve_elimination(p, 5000);
  ASSERT_TRUE(dp.has_value());
  ASSERT_EQ(dp->status, SolveStatus::optimal);
  ASSERT_TRUE(evaluate(p, dp->best).allowed);
  // Exhaustive search of the 10^8 assignments, by the problem's structure: for each x, the
  // best a (with its best c) and the best b (with its best d).
  const auto at = [&](const Factor& f, int i, int j) {
    for (const FactorEntry& e : f.entries) {
      if (e.values[0] == i && e.values[1] == j) return e.time;
    }
    return -1.0;  // not allowed
  };
  double truth = -1;
  for (int vx = 0; vx < 100; ++vx) {
    double total = 0;
    for (int side : {0, 1}) {
      double least = -1;
      for (int v = 0; v < 100; ++v) {
        const double skewed = at(p.factors[static_cast<std::size_t>(side)], vx, v);
        if (skewed < 0) continue;
        for (int w = 0; w < 10; ++w) {
          const double sum = skewed + at(p.factors[static_cast<std::size_t>(2 + side)], v, w);
          if (least < 0 || sum < least) least = sum;
        }
      }
      total += least;
    }
    if (truth < 0 || total < truth) truth = total;
  }
  EXPECT_NEAR(dp->value.time, truth, 1e-12);
  // Every order joins more than 100 tuples somewhere: a bound of 100 gives up.
  EXPECT_FALSE(solve_elimination(p, 100).has_value());
}

}  // namespace
}  // namespace shardmm::solve
