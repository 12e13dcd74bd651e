// A PlannerMemo shared by many plan_matmul calls changes no answer: every candidate, its steps
// and figures, and the choice, as a call without one gives them.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "plan_text.h"
#include "shardmm/core/error.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

using testing::everything;

// A[I, J] @ B[J, K] in every spec each operand may take on X=2,Y=2 (each axis sharding one
// letter, in either order, or neither), and the result free or pinned to a few layouts:
// one memo plans them all, in two sizes of I (the memo's figures must not mix them up).
TEST(PlannerMemo, SharedByManyContractionsChangesNoPlan) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const std::vector<std::string> a_specs{"A[I, J]",     "A[I_X, J]",  "A[I_Y, J]",  "A[I, J_X]", "A[I, J_Y]",
                                         "A[I_X, J_Y]", "A[I_Y, J_X]", "A[I_XY, J]", "A[I_YX, J]", "A[I, J_XY]"};
  const std::vector<std::string> b_specs{"B[J, K]",    "B[J_X, K]",   "B[J_Y, K]",   "B[J, K_X]",
                                         "B[J, K_YX]", "B[J_X, K_Y]", "B[J_XY, K]"};
  const std::vector<std::string> outputs{"", " -> C[I, K]", " -> C[I_X, K_Y]", " -> C[I, K]{U_X}", " -> C[I_Y, K]{U_X}"};
  PlanOptions options{DType::bf16, builtin_profile("h100"), std::nullopt};
  PlannerMemo memo;
  int compared = 0;
  for (const char* sizes : {"I=64,J=32,K=48", "I=40,J=32,K=48"}) {
    const DimSizes dims = parse_dims(sizes);
    for (const std::string& a : a_specs) {
      for (const std::string& b : b_specs) {
        for (const std::string& out : outputs) {
          const std::string text = a + " @ " + b + (out.empty() ? " -> C[I, K]" : out);
          Contraction c = parse_contraction(text, mesh);
          if (out.empty()) c.out.reset();
          std::string fresh, remembered;
          try {
            fresh = everything(plan_matmul(mesh, c, dims, options), mesh);
          } catch (const InputError& e) {
            fresh = std::string("InputError: ") + e.what();
          }
          try {
            remembered = everything(plan_matmul(mesh, c, dims, options, &memo), mesh);
          } catch (const InputError& e) {
            remembered = std::string("InputError: ") + e.what();
          }
          ASSERT_EQ(remembered, fresh) << text << " (" << sizes << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 10 * 7 * 5);
}

TEST(PlannerMemo, RefusesAnotherMeshOrDtype) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
  const DimSizes dims = parse_dims("I=8,J=8,K=8");
  PlannerMemo memo;
  plan_matmul(mesh, c, dims, {DType::bf16, builtin_profile("h100"), std::nullopt}, &memo);
  EXPECT_THROW(plan_matmul(mesh, c, dims, {DType::f32, builtin_profile("h100"), std::nullopt}, &memo),
               std::logic_error);
  const Mesh other = Mesh::parse("X=4,Y=2");
  EXPECT_THROW(plan_matmul(other, parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", other), dims,
                           {DType::bf16, builtin_profile("h100"), std::nullopt}, &memo),
               std::logic_error);
}

}  // namespace
}  // namespace shardmm
