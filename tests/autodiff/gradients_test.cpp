// Every op's backward on random sharded programs (random meshes up to 8 devices, uneven
// and empty shards): gradients against central finite differences of an independent
// dense interpreter, against the same program on one device, and the symbolic tape's
// events and memory against the executed ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "autodiff_programs.h"
#include "autodiff_testing.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::check_symbolic;
using testing::execute;
using testing::Executed;
using testing::Kind;
using testing::Program;

bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * (1 + std::abs(b)); }

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
      // The ops over a letter (Instr::dim) counted where that letter is sharded.
      Tape symbolic(mesh, {DType::f64});
      const std::vector<Var> v = testing::replay(symbolic, p);
      for (const auto& in : p.ops) {
        if (in.kind < Kind::reduce_sum) continue;
        const Spec& s = v[static_cast<std::size_t>(in.args[0])].spec();
        if (!s.dims[static_cast<std::size_t>(s.find_dim(in.dim))].axes.empty()) ++sharded_letter[in.kind];
      }
    }
    SCOPED_TRACE("case " + std::to_string(c) + ": " + p.text);

    const Executed sharded = execute(p, mesh, false);
    const Executed single = execute(p, Mesh::parse("X=1"), true);
    const std::vector<std::vector<double>> fd = testing::finite_differences(p);
    const double dense = testing::dense_loss(p, testing::dense_leaves(p));
    EXPECT_TRUE(close(sharded.loss, dense, 1e-12)) << sharded.loss << " vs dense " << dense;
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      EXPECT_TRUE(sharded.grads_in_leaf_spec[l]) << "leaf " << l << " gradient not in the leaf's spec";
      ASSERT_EQ(sharded.grads[l].size(), fd[l].size());
      for (std::size_t i = 0; i < fd[l].size(); ++i) {
        EXPECT_TRUE(close(sharded.grads[l][i], fd[l][i], 1e-6))
            << "leaf " << l << " (" << format_spec(p.leaves[l].spec, mesh) << ") element " << i << ": "
            << sharded.grads[l][i] << " vs finite difference " << fd[l][i];
        EXPECT_TRUE(close(sharded.grads[l][i], single.grads[l][i], 1e-11))
            << "leaf " << l << " element " << i << ": " << sharded.grads[l][i] << " vs one device " << single.grads[l][i];
      }
    }

    check_symbolic(p, mesh, sharded);
  }
  for (int k = 0; k <= static_cast<int>(testing::kLastKind); ++k) {
    EXPECT_GE(seen[static_cast<Kind>(k)], 5) << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely generated";
  }
  for (int k = static_cast<int>(Kind::reduce_sum); k <= static_cast<int>(testing::kLastKind); ++k) {
    EXPECT_GE(sharded_letter[static_cast<Kind>(k)], 5)
        << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely over a sharded letter";
  }
}

}  // namespace
}  // namespace shardmm
