// Plans executed on the mpi backend (a 4-process job): random contractions, every
// candidate plan, verified against the dense reference on device 0 and compared bit for
// bit with the same plan run on the threads backend inside this process.
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dense_reference.h"
#include "mpi/mpi_test.h"
#include "runtime/mpi/mpi_backend.h"
#include "random_cases.h"
#include "sampled_candidates.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {
namespace {

PlanOptions options(DType dtype) {
  PlanOptions o;
  o.dtype = dtype;
  o.hw = builtin_profile("h100");
  return o;
}

std::vector<unsigned char> bytes_of(const DistTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + t.buffer().bytes()};
}

// This device's result bytes when `plan` runs on `backend`, and the verdict.
struct Outcome {
  std::vector<unsigned char> bytes;
  bool verified = false;
};

Outcome run_on(const std::string& backend, const Mesh& mesh, const Plan& plan, const Contraction& c,
               const DimSizes& sizes, DType dtype, std::int64_t device) {
  Outcome out;
  run_backend(backend, mesh, [&](Communicator& comm) {
    DistTensor a = DistTensor::filled(mesh, comm.rank(), c.a, global_shape(c.a, sizes), dtype, uniform_values(1));
    DistTensor b = DistTensor::filled(mesh, comm.rank(), c.b, global_shape(c.b, sizes), dtype, uniform_values(2));
    Executor exec(comm, plan, sizes, dtype);
    const DistTensor& r = exec.run(a, &b);
    const Verification v = verify_contraction(comm, c, sizes, dtype, r, uniform_values(1), uniform_values(2));
    if (comm.rank() == device) {
      out.bytes = bytes_of(r);
      out.verified = v.verified;
    }
  });
  return out;
}

Mesh four_device_mesh(testing::Rng& rng) {
  static const char* meshes[] = {"X=4", "X=2,Y=2", "X=1,Y=4", "X=2,Y=1,Z=2"};
  return Mesh::parse(meshes[testing::uniform(rng, 0, 3)]);
}

TEST(MpiExecutorTest, RandomContractionsMatchThreadsBitForBit) {
  int plans = 0;
  const int cases = static_cast<int>(testing::scaled_cases(120));
  for (int i = 0; i < cases; ++i) {
    const std::uint64_t seed = 7000 + static_cast<std::uint64_t>(i);
    testing::Rng rng(seed);  // every rank draws the same cases
    const Mesh mesh = four_device_mesh(rng);
    const auto rc = testing::random_contraction(rng, mesh, 9);
    const DType dtype = i % 2 ? DType::f32 : DType::f64;
    const MatmulPlanning p = plan_matmul(mesh, rc.contraction, rc.sizes, options(dtype));
    for (const Plan& plan : testing::sampled_candidates(p.candidates, rc.contraction.out.has_value(), p.chosen)) {
      const Outcome mpi = run_on("mpi", mesh, plan, rc.contraction, rc.sizes, dtype, world_rank);
      const Outcome threads = run_on("threads", mesh, plan, rc.contraction, rc.sizes, dtype, world_rank);
      EXPECT_TRUE(mpi.verified) << "seed " << seed << " " << rc.text << " [" << plan.description << "]";
      EXPECT_EQ(mpi.bytes, threads.bytes)
          << "seed " << seed << " rank " << world_rank << " " << rc.text << " [" << plan.description << "]";
      ++plans;
    }
  }
  EXPECT_GT(plans, cases);
}

// The collective matmul rings (isend/irecv between chunk GEMMs) on the mpi backend: every
// fused candidate, on a torus profile so that groups of 4 also go both ways round (gathering
// and scattering).
TEST(MpiExecutorTest, CollectiveMatmulsMatchThreadsBitForBit) {
  PlanOptions torus = options(DType::f32);
  torus.hw = builtin_profile("tpu-v5e");
  std::map<std::string, int> rings;  // by kind, one way or both ways round
  for (int i = 0; i < 80; ++i) {
    const std::uint64_t seed = 7500 + static_cast<std::uint64_t>(i);
    testing::Rng rng(seed);
    const Mesh mesh = four_device_mesh(rng);
    const auto rc = testing::random_contraction(rng, mesh, 9);
    // Every other case with the helper thread that tests the transfers during the GEMMs.
    const ScopedEnv helper("SHARDMM_PROGRESS_THREAD", i % 2 == 1 ? "1" : "0");
    // The rings among the candidates (a sample of them without an output spec).
    std::vector<Plan> fused;
    for (const Plan& plan : plan_matmul(mesh, rc.contraction, rc.sizes, torus).candidates) {
      if (std::any_of(plan.steps.begin(), plan.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); })) {
        fused.push_back(plan);
      }
    }
    for (const Plan& plan : testing::sampled_candidates(fused, rc.contraction.out.has_value(), -1)) {
      const auto ring =
          std::find_if(plan.steps.begin(), plan.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); });
      ++rings[std::string(to_string(ring->op)) + (gathers_contracted(*ring) ? " contracted" : "") +
              (ring->bidirectional ? " both ways" : "")];
      const Outcome mpi = run_on("mpi", mesh, plan, rc.contraction, rc.sizes, DType::f32, world_rank);
      const Outcome threads = run_on("threads", mesh, plan, rc.contraction, rc.sizes, DType::f32, world_rank);
      EXPECT_TRUE(mpi.verified) << "seed " << seed << " " << rc.text << " [" << plan.description << "]";
      EXPECT_EQ(mpi.bytes, threads.bytes)
          << "seed " << seed << " rank " << world_rank << " " << rc.text << " [" << plan.description << "]";
    }
  }
  EXPECT_GE(rings["all_gather_einsum"], 10);
  EXPECT_GE(rings["all_gather_einsum both ways"], 3);
  EXPECT_GE(rings["all_gather_einsum contracted"], 3);
  EXPECT_GE(rings["einsum_reduce_scatter"], 5);
  EXPECT_GE(rings["einsum_reduce_scatter both ways"], 3);
}

// The rings with shards and running sums of 64 KiB and more (the random cases above are too
// small for that): on one machine they go through shared memory, lent where they lie, each
// gather-ring shard forwarded from member to member and let go in the order the ring
// protocol sets. Every ring candidate, one way and both ways round, bit for bit with threads.
TEST(MpiExecutorTest, RingsOfLentShardsMatchThreadsBitForBit) {
  PlanOptions torus = options(DType::f32);
  torus.hw = builtin_profile("tpu-v5e");
  const std::int64_t lent_before = detail::mpi_shared_sends(true);
  int rings = 0;
  for (const auto& [mesh_text, expression] : std::vector<std::pair<const char*, const char*>>{
           {"X=4", "A[I_X, J] @ B[J, K_X] -> C[I_X, K]"},
           {"X=4", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]"},
           {"X=4", "A[I_X, J] @ B[J_X, K] -> C[I_X, K]"},  // B's contracted J round the ring
           {"X=2,Y=2", "A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_X, K_Y]"}}) {
    const Mesh mesh = Mesh::parse(mesh_text);
    const Contraction c = parse_contraction(expression, mesh);
    const DimSizes sizes = {{"I", 512}, {"J", 384}, {"K", 512}};
    for (const Plan& plan : plan_matmul(mesh, c, sizes, torus).candidates) {
      if (std::none_of(plan.steps.begin(), plan.steps.end(),
                       [](const Step& s) { return is_collective_matmul(s.op); })) {
        continue;
      }
      ++rings;
      const Outcome mpi = run_on("mpi", mesh, plan, c, sizes, DType::f32, world_rank);
      const Outcome threads = run_on("threads", mesh, plan, c, sizes, DType::f32, world_rank);
      EXPECT_TRUE(mpi.verified) << expression << " [" << plan.description << "]";
      EXPECT_EQ(mpi.bytes, threads.bytes)
          << "rank " << world_rank << " " << expression << " [" << plan.description << "]";
    }
  }
  EXPECT_GE(rings, 8);
  if (shared_memory_on()) {
    EXPECT_GT(detail::mpi_shared_sends(true), lent_before);
  }
}

TEST(MpiExecutorTest, ReshardsOnTwoByTwo) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const DimSizes sizes = parse_dims("I=5,J=3");
  const char* specs[] = {"T[I, J]",        "T[I_X, J_Y]",    "T[I_XY, J]",    "T[I_YX, J]",
                         "T[I, J_X]{U_Y}", "T[I_Y, J]{U_X}", "T[I, J]{U_XY}", "T[I_X, J]"};
  for (const char* from_text : specs) {
    for (const char* to_text : specs) {
      const Spec from = parse_spec(from_text, mesh), to = parse_spec(to_text, mesh);
      const Shape shape = global_shape(from, sizes);
      const Plan plan = plan_reshard(mesh, from, to, shape, options(DType::f64));
      bool verified = false;
      run_backend("mpi", mesh, [&](Communicator& comm) {
        DistTensor t = DistTensor::filled(mesh, comm.rank(), from, shape, DType::f64, uniform_values(3));
        Executor exec(comm, plan, sizes, DType::f64);
        verified = verify_reshard(comm, from, shape, DType::f64, exec.run(t), uniform_values(3)).verified;
      });
      EXPECT_TRUE(verified) << from_text << " -> " << to_text << " [" << plan.description << "]";
    }
  }
}

}  // namespace
}  // namespace shardmm
