// Random meshes with multi-character axis names, and every spec of a small mesh, for the
// core and plan tests (random specs and contractions: support/random_cases.h).
//
//   Rng rng(seed);
//   Mesh mesh = random_named_mesh(rng, 3, 4);           // 1..3 axes of size 1..4
//   for (const Spec& t : all_specs(mesh, {"I", "J"}, true)) ...
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "random_cases.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm::testing {

// 1..max_rank axes of size 1..max_size. Names are single letters, or (one mesh in three)
// multi-character names, some of them prefixes of others, so that printing must brace them.
inline Mesh random_named_mesh(Rng& rng, int max_rank, int max_size) {
  static const std::vector<std::string> letters{"X", "Y", "Z", "W"};
  static const std::vector<std::string> words{"dp", "tp", "a", "ab", "pp2", "b"};
  const auto rank = static_cast<std::size_t>(uniform(rng, 1, max_rank));
  std::vector<std::string> names = uniform(rng, 0, 2) == 0 ? words : letters;
  std::shuffle(names.begin(), names.end(), rng);
  std::vector<MeshAxis> axes;
  for (std::size_t i = 0; i < rank; ++i) axes.push_back({names[i], uniform(rng, 1, max_size)});
  return Mesh(std::move(axes));
}

// Every legal spec over `dims`: all assignments of each axis to a dimension, to the
// unreduced set (when allowed) or to nothing, and all orders within a dimension.
inline std::vector<Spec> all_specs(const Mesh& mesh, const std::vector<std::string>& dims, bool allow_unreduced) {
  const auto n_dims = static_cast<int>(dims.size());
  const int choices = n_dims + (allow_unreduced ? 2 : 1);  // each dim, unreduced, unused
  std::vector<Spec> out;
  std::vector<int> pick(static_cast<std::size_t>(mesh.rank()), 0);
  while (true) {
    Spec s;
    s.tensor = "T";
    for (const std::string& d : dims) s.dims.push_back({d, {}});
    for (int a = 0; a < mesh.rank(); ++a) {
      const int p = pick[static_cast<std::size_t>(a)];
      if (p < n_dims) s.dims[static_cast<std::size_t>(p)].axes.push_back(a);
      if (allow_unreduced && p == n_dims) s.unreduced.push_back(a);
    }
    std::vector<Spec> orders{s};
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      std::vector<Spec> next;
      for (const Spec& o : orders) {
        Spec p = o;
        do {
          next.push_back(p);
        } while (std::next_permutation(p.dims[d].axes.begin(), p.dims[d].axes.end()));
      }
      orders.swap(next);
    }
    out.insert(out.end(), orders.begin(), orders.end());
    std::size_t i = 0;
    while (i < pick.size() && ++pick[i] == choices) pick[i++] = 0;
    if (i == pick.size()) break;
  }
  return out;
}

}  // namespace shardmm::testing
