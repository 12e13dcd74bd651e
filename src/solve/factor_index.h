// A factor's entries by tuple, for O(1) lookup of an assignment's entry (the exhaustive
// solver and evaluate() look up every factor for every assignment they try).
#pragma once

#include <cstdint>
#include <vector>

#include "shardmm/solve/choices.h"

namespace shardmm::solve {

struct FactorIndex {
  FactorIndex(const ChoiceProblem& p, const Factor& f);
  int entry(const Assignment& a) const;  // -1: the factor does not allow a's tuple

  std::vector<int> vars;
  std::vector<std::int64_t> strides;
  std::vector<int> entry_of;  // by the tuple's mixed-radix position
};

std::vector<FactorIndex> index_factors(const ChoiceProblem& p);

}  // namespace shardmm::solve
