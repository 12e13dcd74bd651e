// Two choice problems built from one program (solve::build_choices) compared entry by entry:
// how the build goes (its batches, its threads) must not change what it builds.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "shardmm/solve/solve.h"

namespace shardmm::testing {

// The factors' entries compared (a failed comparison is reported where it happens).
inline std::size_t expect_same_choices(const solve::ProgramChoices& a, const solve::ProgramChoices& b) {
  EXPECT_EQ(a.evaluations, b.evaluations);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.problem.domain, b.problem.domain);
  EXPECT_EQ(a.problem.value_bytes, b.problem.value_bytes);
  std::size_t entries = 0;
  EXPECT_EQ(a.problem.factors.size(), b.problem.factors.size());
  if (a.problem.factors.size() != b.problem.factors.size()) return entries;
  for (std::size_t f = 0; f < a.problem.factors.size(); ++f) {
    const solve::Factor &x = a.problem.factors[f], &y = b.problem.factors[f];
    EXPECT_EQ(x.vars, y.vars);
    EXPECT_EQ(x.entries.size(), y.entries.size()) << "factor " << f;
    if (x.entries.size() != y.entries.size()) return entries;
    for (std::size_t e = 0; e < x.entries.size(); ++e, ++entries) {
      EXPECT_EQ(x.entries[e].values, y.entries[e].values);
      EXPECT_EQ(x.entries[e].time, y.entries[e].time);
      EXPECT_EQ(x.entries[e].memory, y.entries[e].memory);
      EXPECT_EQ(x.entries[e].shared, y.entries[e].shared);
      EXPECT_EQ(x.entries[e].figures, y.entries[e].figures);
    }
  }
  EXPECT_EQ(a.problem.points.size(), b.problem.points.size());
  if (a.problem.points.size() != b.problem.points.size()) return entries;
  for (std::size_t p = 0; p < a.problem.points.size(); ++p) {
    EXPECT_EQ(a.problem.points[p].terms.size(), b.problem.points[p].terms.size());
    if (a.problem.points[p].terms.size() != b.problem.points[p].terms.size()) return entries;
    for (std::size_t t = 0; t < a.problem.points[p].terms.size(); ++t) {
      const solve::PointTerm &x = a.problem.points[p].terms[t], &y = b.problem.points[p].terms[t];
      EXPECT_TRUE(x.kind == y.kind && x.index == y.index && x.figure == y.figure && x.count == y.count);
    }
  }
  return entries;
}

}  // namespace shardmm::testing
