// Random meshes, specs and contractions for differential and property tests. Every
// generator takes the caller's engine, so a failure reproduces from its seed.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm::testing {

using Rng = std::mt19937_64;

inline int uniform(Rng& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// A random test's case count `n` times SHARDMM_PROPERTY_SCALE, when set (0.2 in the sanitizer
// builds, which run 3-15x slower: scripts/test-sanitizers.sh); at least 1.
inline unsigned scaled_cases(unsigned n) {
  const char* scale = std::getenv("SHARDMM_PROPERTY_SCALE");
  const double factor = scale ? std::atof(scale) : 1.0;
  return factor > 0 ? std::max(1u, static_cast<unsigned>(n * factor)) : n;
}

// 1 to `max_axes` axes named X, Y, Z, W with sizes 1..4 and at most `max_devices` devices.
inline Mesh random_mesh(Rng& rng, int max_axes = 3, std::int64_t max_devices = 8) {
  static const char* names[] = {"X", "Y", "Z", "W"};
  std::vector<MeshAxis> axes;
  std::int64_t devices = 1;
  const int n = uniform(rng, 1, max_axes);
  for (int i = 0; i < n; ++i) {
    const std::int64_t room = max_devices / devices;
    if (room < 1) break;
    const std::int64_t size = uniform(rng, 1, static_cast<int>(std::min<std::int64_t>(4, room)));
    axes.push_back({names[i], size});
    devices *= size;
  }
  return Mesh(axes);
}

// A legal spec over `dims`: each mesh axis shards a random dimension (in random order),
// is unreduced (when `allow_unreduced`), or is unused.
inline Spec random_spec(Rng& rng, const Mesh& mesh, const std::string& tensor, const std::vector<std::string>& dims,
                        bool allow_unreduced) {
  Spec s;
  s.tensor = tensor;
  for (const std::string& d : dims) s.dims.push_back({d, {}});
  std::vector<int> order(static_cast<std::size_t>(mesh.rank()));
  for (int i = 0; i < mesh.rank(); ++i) order[static_cast<std::size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const int n = static_cast<int>(dims.size());
  for (int a : order) {
    // A dimension (sharded 2 times in 3), else unreduced 1 time in 3 if allowed, else unused.
    const int choice = uniform(rng, 0, allow_unreduced ? n + 1 : n);
    if (choice < n) {
      if (uniform(rng, 0, 2) > 0) s.dims[static_cast<std::size_t>(choice)].axes.push_back(a);
    } else if (allow_unreduced && uniform(rng, 0, 2) == 0) {
      s.unreduced.push_back(a);
    }
  }
  std::sort(s.unreduced.begin(), s.unreduced.end());
  return s;
}

struct RandomContraction {
  Contraction contraction;
  DimSizes sizes;
  std::string text;  // canonical, parseable
};

// Batch, contracted and free letters in random orders, sizes 1..max_size (so shards are
// often uneven or empty), random input specs (possibly unreduced) and, half the time, a
// random requested output spec.
inline RandomContraction random_contraction(Rng& rng, const Mesh& mesh, int max_size = 7) {
  std::vector<std::string> letters = {"I", "J", "K", "L", "M", "N", "P", "Q"};
  std::shuffle(letters.begin(), letters.end(), rng);
  std::size_t next = 0;
  const auto take = [&](int n) {
    std::vector<std::string> out(letters.begin() + static_cast<std::ptrdiff_t>(next),
                                 letters.begin() + static_cast<std::ptrdiff_t>(next) + n);
    next += static_cast<std::size_t>(n);
    return out;
  };
  const auto batch = take(uniform(rng, 0, 1));
  const auto contracted = take(uniform(rng, 0, 2));
  // The output needs a dimension (a spec can't be empty), so batch or free_a has one.
  const auto free_a = take(uniform(rng, batch.empty() ? 1 : 0, 2));
  const auto free_b = take(uniform(rng, batch.empty() && contracted.empty() ? 1 : 0, 2));
  const auto join = [&](std::initializer_list<const std::vector<std::string>*> parts) {
    std::vector<std::string> out;
    for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    std::shuffle(out.begin(), out.end(), rng);
    return out;
  };
  const auto a_dims = join({&batch, &contracted, &free_a});
  const auto b_dims = join({&batch, &contracted, &free_b});
  const auto c_dims = join({&batch, &free_a, &free_b});
  RandomContraction r;
  for (const auto& l : a_dims) r.sizes[l] = uniform(rng, 1, max_size);
  for (const auto& l : b_dims) r.sizes[l] = uniform(rng, 1, max_size);
  const Spec a = random_spec(rng, mesh, "A", a_dims, true);
  const Spec b = random_spec(rng, mesh, "B", b_dims, true);
  r.text = format_spec(a, mesh) + " @ " + format_spec(b, mesh);
  // Without an output spec the output's order is implied; batch letters need one to exist.
  if (!batch.empty() || uniform(rng, 0, 1) == 0) {
    r.text += " -> " + format_spec(random_spec(rng, mesh, "C", c_dims, true), mesh);
  }
  r.contraction = parse_contraction(r.text, mesh);
  return r;
}

}  // namespace shardmm::testing
