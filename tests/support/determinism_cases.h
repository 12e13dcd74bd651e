// Random plans for the determinism tests (runtime/determinism_test.cpp on threads,
// mpi/mpi_determinism_test.cpp on mpi): sharded contractions with every candidate plan,
// and reshards from unreduced sources, run on inputs from uniform_values, whose values
// have full mantissas, so that a summation order that changed would change the bits.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "random_cases.h"
#include "sampled_candidates.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::testing {

// One plan with the specs it starts from (a reshard has no second operand).
struct PlanCase {
  std::string name;  // seed, mesh and specs: enough to reproduce it
  Mesh mesh;
  Plan plan;
  DimSizes sizes;
  DType dtype = DType::f32;
  Spec a, b;
  bool matmul = true;
};

inline PlanOptions determinism_options(DType dtype) {
  PlanOptions o;
  o.dtype = dtype;
  o.hw = builtin_profile("h100");
  return o;
}

// `count` random contractions (dimensions up to 9, so up to 81 contracted terms), each
// with every candidate plan (a sample without an output spec: sampled_candidates.h), and
// `count` random reshards of 2-D tensors up to 40 x 40 with unreduced sources, which
// reduce across ranks; meshes from `mesh_of`. f32 and f64 alternate.
inline std::vector<PlanCase> random_plan_cases(int count, const std::function<Mesh(Rng&)>& mesh_of) {
  std::vector<PlanCase> cases;
  for (int i = 0; i < count; ++i) {
    const std::uint64_t seed = 4200 + static_cast<std::uint64_t>(i);
    Rng rng(seed);
    const Mesh mesh = mesh_of(rng);
    const auto rc = random_contraction(rng, mesh, 9);
    const DType dtype = i % 2 ? DType::f64 : DType::f32;
    const MatmulPlanning planning = plan_matmul(mesh, rc.contraction, rc.sizes, determinism_options(dtype));
    for (const Plan& plan : sampled_candidates(planning.candidates, rc.contraction.out.has_value(), planning.chosen)) {
      cases.push_back({"seed " + std::to_string(seed) + " mesh " + mesh.to_string() + ": " + rc.text + " [" +
                           plan.description + "]",
                       mesh, plan, rc.sizes, dtype, rc.contraction.a, rc.contraction.b, true});
    }
  }
  for (int i = 0; i < count; ++i) {
    const std::uint64_t seed = 5200 + static_cast<std::uint64_t>(i);
    Rng rng(seed);
    const Mesh mesh = mesh_of(rng);
    const Spec from = random_spec(rng, mesh, "T", {"I", "J"}, true);
    const Spec to = random_spec(rng, mesh, "T", {"I", "J"}, false);
    const DimSizes sizes = {{"I", uniform(rng, 1, 40)}, {"J", uniform(rng, 1, 40)}};
    const DType dtype = i % 2 ? DType::f64 : DType::f32;
    const Plan plan = plan_reshard(mesh, from, to, global_shape(from, sizes), determinism_options(dtype));
    cases.push_back({"seed " + std::to_string(seed) + " mesh " + mesh.to_string() + ": " + format_spec(from, mesh) +
                         " -> " + format_spec(to, mesh) + " [" + plan.description + "]",
                     mesh, plan, sizes, dtype, from, Spec{}, false});
  }
  return cases;
}

inline bool reduces(const Plan& plan) {
  for (const Step& s : plan.steps) {
    if (s.op == OpKind::reduce_scatter || s.op == OpKind::all_reduce) return true;
  }
  return false;
}

// Each device's result bytes, by device id; on mpi only this process's device is filled.
// The executor runs twice: the second run reuses its buffers and must not see the
// first's leftovers.
using DeviceBytes = std::vector<std::vector<unsigned char>>;

inline DeviceBytes run_plan_case(std::string_view backend, const PlanCase& k) {
  DeviceBytes out(static_cast<std::size_t>(k.mesh.device_count()));
  run_backend(backend, k.mesh, [&](Communicator& comm) {
    const std::int64_t me = comm.rank();
    const DistTensor a = DistTensor::filled(k.mesh, me, k.a, global_shape(k.a, k.sizes), k.dtype, uniform_values(11));
    DistTensor b;
    if (k.matmul) b = DistTensor::filled(k.mesh, me, k.b, global_shape(k.b, k.sizes), k.dtype, uniform_values(12));
    Executor exec(comm, k.plan, k.sizes, k.dtype);
    exec.run(a, k.matmul ? &b : nullptr);
    const DistTensor& r = exec.run(a, k.matmul ? &b : nullptr);
    const auto* bytes = static_cast<const unsigned char*>(r.data());
    out[static_cast<std::size_t>(me)].assign(bytes, bytes + r.buffer().bytes());
  });
  return out;
}

}  // namespace shardmm::testing
