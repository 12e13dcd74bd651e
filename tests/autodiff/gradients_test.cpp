// Every op's backward on random sharded programs (random meshes up to 8 devices, uneven
// and empty shards): gradients against central finite differences of an independent
// dense interpreter, against the same program on one device, and the symbolic tape's
// events and memory against the executed ones.
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <map>

#include "autodiff_programs.h"
#include "autodiff_testing.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::Kind;
using testing::Program;

TEST(Gradients, RandomCompositionsMatchFiniteDifferencesAndOneDevice) {
  testing::Rng rng(20261129);
  std::map<Kind, int> seen, sharded_letter;
  const int cases = 400;
  for (int c = 0; c < cases; ++c) {
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    testing::ProgramGenerator gen(rng);
    const Program p = gen.generate(mesh, testing::uniform(rng, 3, 7));
    for (const auto& in : p.ops) ++seen[in.kind];
    {
      // The ops over a letter (Instr::dim, reduce_sum to rms_norm_over) counted where that letter is sharded.
      Tape symbolic(mesh, {DType::f64});
      const std::vector<Var> v = testing::replay(symbolic, p);
      for (const auto& in : p.ops) {
        if (in.kind < Kind::reduce_sum || in.kind > Kind::rms_norm_over) continue;
        const Spec& s = v[static_cast<std::size_t>(in.args[0])].spec();
        if (!s.dims[static_cast<std::size_t>(s.find_dim(in.dim))].axes.empty()) ++sharded_letter[in.kind];
      }
    }
    SCOPED_TRACE("case " + std::to_string(c) + ": " + p.text);

    testing::check_program(p);
  }
  std::pair<int, Kind> fewest{INT_MAX, Kind::sum}, fewest_sharded{INT_MAX, Kind::sum};  // (count, kind)
  for (int k = 0; k <= static_cast<int>(testing::kLastKind); ++k) {
    EXPECT_GE(seen[static_cast<Kind>(k)], 5)
        << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely generated";
    fewest = std::min(fewest, {seen[static_cast<Kind>(k)], static_cast<Kind>(k)});
  }
  for (int k = static_cast<int>(Kind::reduce_sum); k <= static_cast<int>(Kind::rms_norm_over); ++k) {
    EXPECT_GE(sharded_letter[static_cast<Kind>(k)], 5)
        << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely over a sharded letter";
    fewest_sharded = std::min(fewest_sharded, {sharded_letter[static_cast<Kind>(k)], static_cast<Kind>(k)});
  }
  std::printf("%d programs: the rarest op %s generated %d times, %s over a sharded letter %d times (the fewest)\n",
              cases, testing::kind_name(fewest.second), fewest.first, testing::kind_name(fewest_sharded.second),
              fewest_sharded.first);
}

}  // namespace
}  // namespace shardmm
