// Every op's backward on random sharded programs (random meshes up to 8 devices, uneven
// and empty shards): gradients against central finite differences of an independent
// dense interpreter, against the same program on one device, and the symbolic tape's
// events and memory against the executed ones.
#include <gtest/gtest.h>

#include <map>

#include "autodiff_programs.h"
#include "autodiff_testing.h"

namespace shardmm {
namespace {

using testing::Kind;
using testing::Program;

TEST(Gradients, RandomCompositionsMatchFiniteDifferencesAndOneDevice) {
  testing::Rng rng(20261129);
  std::map<Kind, int> seen;
  const int cases = 400;
  for (int c = 0; c < cases; ++c) {
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    testing::ProgramGenerator gen(rng);
    const Program p = gen.generate(mesh, testing::uniform(rng, 3, 7));
    for (const auto& in : p.ops) ++seen[in.kind];
    SCOPED_TRACE("case " + std::to_string(c) + ": " + p.text);

    testing::check_program(p);
  }
  for (int k = 0; k <= static_cast<int>(Kind::mean); ++k) {
    EXPECT_GE(seen[static_cast<Kind>(k)], 5) << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely generated";
  }
}

}  // namespace
}  // namespace shardmm
