// A C++ engine using shardmm as a library: plan a sharded matmul, run it on in-process
// ranks, and check the answer. Build: part of the project (target example_sharded_matmul).
//
//   build/examples/example_sharded_matmul
#include <iostream>

#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

int main() {
  using namespace shardmm;
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  // Megatron's row-parallel layer: the contracting dimension F is split, so each device
  // computes a partial sum; asking for Z sharded over X and Y makes it a reduce_scatter.
  const Contraction c = parse_contraction("Y[B, F_XY] @ W[F_XY, D] -> Z[B_XY, D]", mesh);
  const DimSizes sizes = parse_dims("B=64,F=256,D=96");
  PlanOptions options;
  options.dtype = DType::f32;
  options.hw = builtin_profile("h100");
  const MatmulPlanning planning = plan_matmul(mesh, c, sizes, options);
  const Plan& plan = planning.candidates.at(static_cast<std::size_t>(planning.chosen));
  std::cout << "plan: " << plan.description << "\n";

  bool verified = false;
  run_threads(mesh, [&](Communicator& comm) {
    // Each rank builds only its own shards.
    DistTensor y = DistTensor::filled(mesh, comm.rank(), c.a, global_shape(c.a, sizes), DType::f32, uniform_values(1));
    DistTensor w = DistTensor::filled(mesh, comm.rank(), c.b, global_shape(c.b, sizes), DType::f32, uniform_values(2));
    Executor exec(comm, plan, sizes, DType::f32);
    const DistTensor& z = exec.run(y, &w);
    const Verification v = verify_contraction(comm, c, sizes, DType::f32, z, uniform_values(1), uniform_values(2));
    if (comm.rank() == 0) {
      std::cout << "device 0 holds Z rows [" << z.box()[0].offset << ", " << z.box()[0].end() << ") of "
                << sizes.at("B") << "; " << (v.verified ? "verified" : "WRONG") << " (max abs error " << v.max_abs_error
                << ")\n";
      verified = v.verified;
    }
  });
  return verified ? 0 : 1;
}
