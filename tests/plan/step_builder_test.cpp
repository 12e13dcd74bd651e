// One step built and costed through the public step builder is the step the planners build
// and cost (the autodiff tape relies on it).
#include "shardmm/plan/step_builder.h"

#include <gtest/gtest.h>

#include "shardmm/core/contraction.h"

namespace shardmm {
namespace {

PlanOptions f32_v5e() { return PlanOptions{DType::f32, builtin_profile("tpu-v5e"), std::nullopt}; }

void expect_same_cost(const Step& built, const Step& planned, const Mesh& mesh) {
  EXPECT_EQ(built.op, planned.op);
  EXPECT_EQ(format_spec(built.to, mesh), format_spec(planned.to, mesh));
  EXPECT_EQ(built.bytes_sent, planned.bytes_sent);
  EXPECT_EQ(built.bytes_received, planned.bytes_received);
  EXPECT_DOUBLE_EQ(built.flops, planned.flops);
  EXPECT_DOUBLE_EQ(built.time_s, planned.time_s);
}

TEST(StepBuilder, AllGatherCostsAsPlanReshardCostsIt) {
  const Mesh mesh = Mesh::parse("X=4,Y=2");
  const Spec from = parse_spec("A[I_X, J_Y]", mesh);
  const std::vector<std::int64_t> shape{8192, 4100};
  const Plan plan = plan_reshard(mesh, from, parse_spec("A[I, J_Y]", mesh), shape, f32_v5e());
  ASSERT_EQ(plan.steps.size(), 1u);
  Step built = make_step(OpKind::all_gather, from, {0}, 0);
  cost_step(built, mesh, shape, f32_v5e());
  EXPECT_GT(built.time_s, 0);
  expect_same_cost(built, plan.steps[0], mesh);
}

TEST(StepBuilder, EinsumCostsAsPlanMatmulCostsIt) {
  const Mesh mesh = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I_X, J] @ B[J, K] -> C[I_X, K]", mesh);
  const DimSizes sizes = parse_dims("I=8192,J=4096,K=1000");
  const MatmulPlanning m = plan_matmul(mesh, c, sizes, f32_v5e());
  const Plan& chosen = m.candidates.at(static_cast<std::size_t>(m.chosen));
  ASSERT_EQ(chosen.steps.size(), 1u);
  Step built = make_step(OpKind::einsum, c.a, {});
  built.from_b = c.b;
  built.to = chosen.steps[0].to;
  cost_einsum(built, mesh, global_shape(built.from, sizes), global_shape(built.from_b, sizes),
              global_shape(built.to, sizes), f32_v5e());
  EXPECT_GT(built.flops, 0);
  expect_same_cost(built, chosen.steps[0], mesh);
}

}  // namespace
}  // namespace shardmm
