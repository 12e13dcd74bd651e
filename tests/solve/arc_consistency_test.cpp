// ArcConsistency (src/solve/arc_consistency.h) on random problems against a direct oracle:
// sweep every factor and union, each by brute force, until nothing drops. The worklist must
// reach the same fixpoint however the factors come (all at once, or a few at a time with a
// settle between, as a build adds them), and never drop a value some assignment the factors
// and unions allow takes (checked by enumerating every assignment).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "random_cases.h"
#include "solve/arc_consistency.h"

namespace shardmm::solve {
namespace {

struct Problem {
  std::vector<int> domain;
  std::vector<Factor> factors;
  std::vector<std::vector<int>> unions;    // the union's variable, then its parts' (mask variables)
  std::vector<std::vector<char>> allowed;  // by variable: what restrict() is given (empty: nothing)
};

// Up to 6 variables: a few with arbitrary domains, the others masks of 2 or 3 bits; up to 5
// factors of random tuples; up to 2 unions over mask variables; some variables restricted.
Problem random_problem(std::mt19937& rng) {
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  const int masks = 1 << pick(2, 3);
  const int plain = pick(1, 3), mask_vars = pick(2, 4);
  for (int v = 0; v < plain; ++v) p.domain.push_back(pick(1, 4));
  for (int v = 0; v < mask_vars; ++v) p.domain.push_back(masks);
  const int n = static_cast<int>(p.domain.size());
  for (int f = pick(1, 5); f > 0; --f) {
    Factor factor;
    std::vector<int> vars(static_cast<std::size_t>(n));
    for (int v = 0; v < n; ++v) vars[static_cast<std::size_t>(v)] = v;
    std::shuffle(vars.begin(), vars.end(), rng);
    factor.vars.assign(vars.begin(), vars.begin() + pick(1, std::min(3, n)));
    for (int e = pick(0, 12); e > 0; --e) {
      FactorEntry entry;
      for (int v : factor.vars) entry.values.push_back(pick(0, p.domain[static_cast<std::size_t>(v)] - 1));
      factor.entries.push_back(entry);
    }
    p.factors.push_back(factor);
  }
  for (int u = pick(0, 2); u > 0 && mask_vars >= 2; --u) {
    std::vector<int> vars;
    for (int v = plain; v < n; ++v) vars.push_back(v);
    std::shuffle(vars.begin(), vars.end(), rng);
    vars.resize(static_cast<std::size_t>(pick(2, mask_vars)));
    p.unions.push_back(vars);
  }
  p.allowed.resize(static_cast<std::size_t>(n));
  for (int v = 0; v < n; ++v) {
    if (pick(0, 3) != 0) continue;
    for (int x = 0; x < p.domain[static_cast<std::size_t>(v)]; ++x)
      p.allowed[static_cast<std::size_t>(v)].push_back(pick(0, 3) != 0);
  }
  return p;
}

// The fixpoint by the definition: sweep everything until nothing drops.
std::vector<std::vector<char>> oracle(const Problem& p) {
  std::vector<std::vector<char>> live;
  for (std::size_t v = 0; v < p.domain.size(); ++v) {
    live.emplace_back(static_cast<std::size_t>(p.domain[v]), 1);
    if (!p.allowed[v].empty()) live[v] = p.allowed[v];
  }
  const auto is_live = [&](int v, int x) {
    return live[static_cast<std::size_t>(v)][static_cast<std::size_t>(x)] != 0;
  };
  for (bool dropped = true; dropped;) {
    dropped = false;
    const auto keep = [&](int v, const std::vector<char>& supported) {
      for (std::size_t x = 0; x < supported.size(); ++x) {
        if (live[static_cast<std::size_t>(v)][x] && !supported[x]) {
          live[static_cast<std::size_t>(v)][x] = 0;
          dropped = true;
        }
      }
    };
    for (const Factor& f : p.factors) {
      std::vector<std::vector<char>> supported;
      for (int v : f.vars) supported.emplace_back(static_cast<std::size_t>(p.domain[static_cast<std::size_t>(v)]), 0);
      for (const FactorEntry& e : f.entries) {
        bool all = true;
        for (std::size_t i = 0; i < f.vars.size(); ++i) all = all && is_live(f.vars[i], e.values[i]);
        for (std::size_t i = 0; all && i < f.vars.size(); ++i) supported[i][static_cast<std::size_t>(e.values[i])] = 1;
      }
      for (std::size_t i = 0; i < f.vars.size(); ++i) keep(f.vars[i], supported[i]);
    }
    // A union: every tuple of the parts' live masks whose or is a live mask of the union
    // supports each of them and that mask.
    for (const std::vector<int>& u : p.unions) {
      const int masks = p.domain[static_cast<std::size_t>(u[0])];
      std::vector<std::vector<char>> supported(u.size(), std::vector<char>(static_cast<std::size_t>(masks), 0));
      std::vector<int> tuple(u.size() - 1, 0);
      for (bool more = true; more;) {
        bool all = true;
        int whole = 0;
        for (std::size_t i = 0; i < tuple.size(); ++i) {
          all = all && is_live(u[i + 1], tuple[i]);
          whole |= tuple[i];
        }
        if (all && is_live(u[0], whole)) {
          supported[0][static_cast<std::size_t>(whole)] = 1;
          for (std::size_t i = 0; i < tuple.size(); ++i) supported[i + 1][static_cast<std::size_t>(tuple[i])] = 1;
        }
        std::size_t i = 0;
        while (i < tuple.size() && ++tuple[i] == masks) tuple[i++] = 0;
        more = i < tuple.size();
      }
      for (std::size_t i = 0; i < u.size(); ++i) keep(u[i], supported[i]);
    }
  }
  return live;
}

// Every value some full assignment takes, where the assignment has an entry in every factor,
// meets every union and takes only allowed values.
std::vector<std::vector<char>> used_by_solutions(const Problem& p) {
  std::vector<std::vector<char>> used;
  for (int d : p.domain) used.emplace_back(static_cast<std::size_t>(d), 0);
  std::vector<int> a(p.domain.size(), 0);
  for (bool more = true; more;) {
    bool ok = true;
    for (std::size_t v = 0; ok && v < a.size(); ++v)
      ok = p.allowed[v].empty() || p.allowed[v][static_cast<std::size_t>(a[v])] != 0;
    for (std::size_t f = 0; ok && f < p.factors.size(); ++f) {
      const Factor& factor = p.factors[f];
      ok = std::any_of(factor.entries.begin(), factor.entries.end(), [&](const FactorEntry& e) {
        for (std::size_t i = 0; i < factor.vars.size(); ++i) {
          if (a[static_cast<std::size_t>(factor.vars[i])] != e.values[i]) return false;
        }
        return true;
      });
    }
    for (std::size_t u = 0; ok && u < p.unions.size(); ++u) {
      int whole = 0;
      for (std::size_t i = 1; i < p.unions[u].size(); ++i) whole |= a[static_cast<std::size_t>(p.unions[u][i])];
      ok = a[static_cast<std::size_t>(p.unions[u][0])] == whole;
    }
    for (std::size_t v = 0; ok && v < a.size(); ++v) used[v][static_cast<std::size_t>(a[v])] = 1;
    std::size_t v = 0;
    while (v < a.size() && ++a[v] == p.domain[v]) a[v++] = 0;
    more = v < a.size();
  }
  return used;
}

TEST(ArcConsistency, ReachesTheFixpointOfSweepingEverythingAndKeepsEverySolutionsValues) {
  std::mt19937 rng(20261208);
  const int cases = static_cast<int>(testing::scaled_cases(2000));
  int dropped_some = 0, emptied = 0;
  for (int c = 0; c < cases; ++c) {
    const Problem p = random_problem(rng);
    const std::vector<std::vector<char>> expected = oracle(p);
    const auto run = [&](bool all_at_once) {
      ArcConsistency ac(p.domain);
      for (std::size_t v = 0; v < p.allowed.size(); ++v) {
        if (!p.allowed[v].empty()) ac.restrict(static_cast<int>(v), p.allowed[v]);
      }
      for (const std::vector<int>& u : p.unions) ac.add_union(u);
      for (std::size_t f = 0; f < p.factors.size(); ++f) {
        ac.add(p.factors[f]);
        if (!all_at_once) ac.settle();
      }
      ac.settle();
      return ac.values();
    };
    ASSERT_EQ(run(true), expected) << "case " << c;
    ASSERT_EQ(run(false), expected) << "case " << c;
    const std::vector<std::vector<char>> used = used_by_solutions(p);
    for (std::size_t v = 0; v < used.size(); ++v) {
      for (std::size_t x = 0; x < used[v].size(); ++x) {
        if (used[v][x]) {
          ASSERT_TRUE(expected[v][x]) << "case " << c << ": variable " << v << " value " << x;
        }
      }
    }
    bool some = false, empty = false;
    for (std::size_t v = 0; v < expected.size(); ++v) {
      some = some || std::count(expected[v].begin(), expected[v].end(), 0) >
                         std::count(p.allowed[v].begin(), p.allowed[v].end(), 0);
      empty = empty || std::none_of(expected[v].begin(), expected[v].end(), [](char l) { return l != 0; });
    }
    dropped_some += some;
    emptied += empty;
  }
  // The cases are not all trivial: many drop values, some leave a variable nothing.
  EXPECT_GT(dropped_some, cases / 4);
  EXPECT_GT(emptied, cases / 20);
}

}  // namespace
}  // namespace shardmm::solve
