// The verifier must accept a correct sharded result and reject a wrong one, on every rank.
#include <gtest/gtest.h>

#include <atomic>

#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {
namespace {

struct Outcome {
  std::atomic<int> verified{0}, rejected{0};
  double max_abs = 0, tolerance = 0;
};

// Runs the chosen plan and verifies; `corrupt` alters device 1's result first.
void run_and_verify(const std::string& expr, const std::string& mesh_text, const std::string& dims, DType dtype,
                    bool corrupt, Outcome& outcome) {
  const Mesh mesh = Mesh::parse(mesh_text);
  const Contraction c = parse_contraction(expr, mesh);
  const DimSizes sizes = parse_dims(dims);
  PlanOptions opt;
  opt.dtype = dtype;
  opt.hw = builtin_profile("h100");
  const MatmulPlanning p = plan_matmul(mesh, c, sizes, opt);
  const Plan& plan = p.candidates.at(static_cast<std::size_t>(p.chosen));
  run_threads(mesh, [&](Communicator& comm) {
    DistTensor a = DistTensor::filled(mesh, comm.rank(), c.a, global_shape(c.a, sizes), dtype, uniform_values(1));
    DistTensor b = DistTensor::filled(mesh, comm.rank(), c.b, global_shape(c.b, sizes), dtype, uniform_values(2));
    Executor exec(comm, plan, sizes, dtype);
    const DistTensor& result = exec.run(a, &b);
    if (corrupt && comm.rank() == 1 && result.elements() > 0) {
      DistTensor& writable = const_cast<DistTensor&>(result);
      if (dtype == DType::f32) {
        writable.buffer().as<float>()[0] += 0.5f;
      } else {
        writable.buffer().as<double>()[0] += 0.5;
      }
    }
    const Verification v = verify_contraction(comm, c, sizes, dtype, result, uniform_values(1), uniform_values(2));
    (v.verified ? outcome.verified : outcome.rejected)++;
    if (comm.rank() == 0) {
      outcome.max_abs = v.max_abs_error;
      outcome.tolerance = v.tolerance;
    }
  });
}

TEST(VerifyTest, AcceptsCorrectResultsOnEveryRank) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Outcome o;
    run_and_verify("A[I, J_X] @ B[J_X, K] -> C[I_X, K]", "X=4", "I=9,J=301,K=7", dtype, false, o);
    EXPECT_EQ(o.verified, 4);
    EXPECT_EQ(o.rejected, 0);
    EXPECT_GT(o.tolerance, 0);
    EXPECT_LE(o.max_abs, o.tolerance);
  }
}

// An operand of partial sums that nearly cancel: its total is tiny, the partials are not, and
// the rounding of their sum scales with the partials. (X=4, I=2: the tolerance taken from the
// totals was 1.6e-17 in f64 against a correct result's 2.4e-17 error.)
TEST(VerifyTest, ToleranceScalesWithThePartialSumsNotTheirTotal) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const char* sizes : {"I=2,J=1,K=1", "I=8,J=1,K=1"}) {
      Outcome o;
      run_and_verify("A[I, J] @ B[J, K]{U_X} -> C[I_X, K]", "X=4", sizes, dtype, false, o);
      EXPECT_EQ(o.verified, 4) << sizes << " " << to_string(dtype);
      EXPECT_LE(o.max_abs, o.tolerance);
    }
  }
}

TEST(VerifyTest, RejectsACorruptedShardOnEveryRank) {
  Outcome o;
  run_and_verify("A[I_X, J] @ B[J, K_Y] -> C[I_X, K_Y]", "X=2,Y=2", "I=6,J=5,K=4", DType::f64, true, o);
  EXPECT_EQ(o.verified, 0);
  EXPECT_EQ(o.rejected, 4);
  EXPECT_NEAR(o.max_abs, 0.5, 1e-12);
}

TEST(VerifyTest, RejectsReplicasThatDisagree) {
  // C is replicated over Y: corrupting device 1 (y=1) leaves device 0's copy intact, so
  // only the replica check can notice.
  Outcome o;
  run_and_verify("A[I_X, J] @ B[J, K] -> C[I_X, K]", "X=2,Y=2", "I=6,J=5,K=4", DType::f32, true, o);
  EXPECT_EQ(o.verified, 0);
  EXPECT_EQ(o.rejected, 4);
}

}  // namespace
}  // namespace shardmm
