// Which of a planning's candidates a differential test runs. Without an output spec the
// planner offers every output layout (about 1,500 candidates a contraction on 4-8 devices,
// 16 times a given output's count); running them all made the random contraction tests 4-6x
// slower while every such layout is also drawn as a given output by other cases.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "shardmm/plan/planner.h"

namespace shardmm::testing {

// Every candidate when the output was given (`all`); else the chosen one (`chosen`, an index
// into `all`, -1 for none) and an even sample of the rest, `sample` in all.
inline std::vector<Plan> sampled_candidates(const std::vector<Plan>& all, bool output_given, int chosen,
                                            std::size_t sample = 24) {
  if (output_given || all.size() <= sample) return all;
  std::vector<Plan> picked;
  if (chosen >= 0) picked.push_back(all[static_cast<std::size_t>(chosen)]);
  const std::size_t stride = all.size() / (sample - 1);
  for (std::size_t at = 0; picked.size() < sample && at < all.size(); at += stride) picked.push_back(all[at]);
  return picked;
}

}  // namespace shardmm::testing
