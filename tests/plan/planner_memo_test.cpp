// A PlannerMemo shared by many plan_matmul calls changes no answer: every candidate, its steps
// and figures, and the choice, as a call without one gives them.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "plan_text.h"
#include "shardmm/core/error.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

using testing::everything;

// Plans each contraction of `texts` (its output spec dropped where it ends in " (free)": the
// output's letters stay) in each of `sizes`, with and without one memo shared by them all,
// and expects the same answers. The memo forgets its contractions after every `forget_every`
// of them (0: never). Returns how many it compared.
int expect_memo_changes_no_plan(const Mesh& mesh, const std::vector<std::string>& texts,
                                const std::vector<std::string>& sizes, int forget_every = 0) {
  const PlanOptions options{DType::bf16, builtin_profile("h100"), std::nullopt};
  PlannerMemo memo;
  int compared = 0;
  for (const std::string& size : sizes) {
    const DimSizes dims = parse_dims(size);
    for (const std::string& text : texts) {
      const bool free = text.ends_with(" (free)");
      Contraction c = parse_contraction(free ? text.substr(0, text.size() - 7) : text, mesh);
      if (free) c.out.reset();
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
      EXPECT_EQ(remembered, fresh) << text << " (" << size << ")";
      if (remembered != fresh) return compared;
      ++compared;
      if (forget_every > 0 && compared % forget_every == 0) memo.forget_contractions();
    }
  }
  return compared;
}

// A[I, J] @ B[J, K] in every spec each operand may take on X=2,Y=2 (each axis sharding one
// letter, in either order, or neither), and the result free or pinned to a few layouts.
std::vector<std::string> contractions_on_a_2x2_mesh() {
  const std::vector<std::string> a_specs{"A[I, J]",     "A[I_X, J]",  "A[I_Y, J]",  "A[I, J_X]", "A[I, J_Y]",
                                         "A[I_X, J_Y]", "A[I_Y, J_X]", "A[I_XY, J]", "A[I_YX, J]", "A[I, J_XY]"};
  const std::vector<std::string> b_specs{"B[J, K]",    "B[J_X, K]",   "B[J_Y, K]",   "B[J, K_X]",
                                         "B[J, K_YX]", "B[J_X, K_Y]", "B[J_XY, K]"};
  const std::vector<std::string> outputs{" -> C[I, K] (free)", " -> C[I, K]", " -> C[I_X, K_Y]", " -> C[I, K]{U_X}",
                                         " -> C[I_Y, K]{U_X}"};
  std::vector<std::string> texts;
  for (const std::string& a : a_specs) {
    for (const std::string& b : b_specs) {
      for (const std::string& out : outputs) texts.push_back(a + " @ " + b + out);
    }
  }
  return texts;
}

// One memo plans them all, in two sizes of I (the memo's figures must not mix them up).
TEST(PlannerMemo, SharedByManyContractionsChangesNoPlan) {
  EXPECT_EQ(expect_memo_changes_no_plan(Mesh::parse("X=2,Y=2"), contractions_on_a_2x2_mesh(),
                                        {"I=64,J=32,K=48", "I=40,J=32,K=48"}),
            2 * 10 * 7 * 5);
}

// The memo forgetting its contractions now and then (as solve's recorder makes it after each
// op), keeping the steps' costs: the next contractions plan as they would with a fresh one.
TEST(PlannerMemo, ForgettingItsContractionsChangesNoPlan) {
  EXPECT_EQ(expect_memo_changes_no_plan(Mesh::parse("X=2,Y=2"), contractions_on_a_2x2_mesh(),
                                        {"I=64,J=32,K=48", "I=40,J=32,K=48"}, 37),
            2 * 10 * 7 * 5);
}

// The same tensors in contractions where their letters play other roles (batch, free,
// contracted): a reshard the memo keeps for one serves the others, and must be planned
// the same for all (the planner once added the splits of a gather over several axes only
// where the letter's role let a ring fuse it, and a shared memo then gave a later contraction
// the earlier one's ways).
TEST(PlannerMemo, SharedAcrossTheLettersRolesChangesNoPlan) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  // B and the result: A's I and J batch; I batch and J contracted; I free and J contracted;
  // I contracted and J free. The result unsharded, or its first letter over X then Y.
  const std::vector<std::pair<std::string, std::vector<std::string>>> others{{"B[I, J]", {"C[I, J]", "C[I_XY, J]"}},
                                                                             {"B[J, I]", {"C[I]", "C[I_XY]"}},
                                                                             {"B[J, K]", {"C[I, K]", "C[I_XY, K]"}},
                                                                             {"B[I, K]", {"C[J, K]", "C[J_XY, K]"}}};
  std::vector<std::string> texts;
  for (const auto& [b, outputs] : others) {
    for (const char* a : {"A[I_XY, J]", "A[I, J_YX]", "A[I_X, J_Y]", "A[I, J]{U_XY}"}) {
      const std::string text = std::string(a) + " @ " + b;
      texts.push_back(text + " -> " + outputs[0] + " (free)");
      for (const std::string& out : outputs) texts.push_back(text + " -> " + out);
    }
  }
  EXPECT_EQ(expect_memo_changes_no_plan(mesh, texts, {"I=12,J=20,K=8"}), 4 * 4 * 3);
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
