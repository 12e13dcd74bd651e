// A plan's peak_bytes_per_device is what the executor holds (plan/memory.h): the figure the
// run's memory check charges against the limit, on either backend, and a bound on what every
// device's executor really allocates, reached by device 0 where no exchange is involved.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "random_cases.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/memory.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {
namespace {

using testing::Rng;
using testing::uniform;

PlanOptions options(DType dtype, bool reduction_workspace) {
  PlanOptions o;
  o.dtype = dtype;
  o.hw = builtin_profile("h100");
  o.reduction_workspace = reduction_workspace;
  return o;
}

bool has(const Plan& plan, OpKind op) {
  return std::any_of(plan.steps.begin(), plan.steps.end(), [&](const Step& s) { return s.op == op; });
}

// The memory check's charge for running `plan` on `backend`.
std::int64_t charged(const std::string& backend, const Mesh& mesh, const Plan& plan, const DimSizes& sizes, DType dtype,
                     const Contraction* c, const Spec* from) {
  RunRequest req;
  req.backend = backend;
  req.mesh = mesh;
  req.plan = plan;
  req.sizes = sizes;
  req.dtype = dtype;
  req.contraction = c;
  req.reshard_from = from;
  return memory_need(req).device_bytes;
}

// A random layout of `spec`'s dimensions over the mesh, for reshards.
Spec random_layout(Rng& rng, const Mesh& mesh, const Spec& spec, bool unreduced) {
  std::vector<std::string> dims;
  for (const DimSpec& d : spec.dims) dims.push_back(d.name);
  return testing::random_spec(rng, mesh, spec.tensor, dims, unreduced);
}

TEST(PeakTest, ThePlansPeakIsWhatTheRunIsChargedOnEitherBackend) {
  Rng rng(29007);
  std::map<OpKind, int> seen;
  std::int64_t with_workspace = 0;
  for (unsigned i = 0; i < testing::scaled_cases(150); ++i) {
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    const testing::RandomContraction r = testing::random_contraction(rng, mesh, 9);
    const Contraction& c = r.contraction;
    const DType dtype = uniform(rng, 0, 1) ? DType::f32 : DType::f64;
    for (const bool mpi : {false, true}) {
      const std::string backend = mpi ? "mpi" : "threads";
      const MatmulPlanning p = plan_matmul(mesh, c, r.sizes, options(dtype, mpi));
      for (const Plan& plan : p.candidates) {
        ASSERT_EQ(plan.peak_bytes_per_device, charged(backend, mesh, plan, r.sizes, dtype, &c, nullptr))
            << r.text << " on " << backend << ": " << plan.description;
        for (const Step& s : plan.steps) ++seen[s.op];
      }
      // A reshard of A to another layout.
      const Spec to = random_layout(rng, mesh, c.a, true);
      const Plan reshard = plan_reshard(mesh, c.a, to, global_shape(c.a, r.sizes), options(dtype, mpi));
      ASSERT_EQ(reshard.peak_bytes_per_device, charged(backend, mesh, reshard, r.sizes, dtype, nullptr, &c.a))
          << format_spec(c.a, mesh) << " -> " << format_spec(to, mesh) << " on " << backend;
      for (const Step& s : reshard.steps) ++seen[s.op];
      if (mpi) {
        const Plan on_threads = plan_reshard(mesh, c.a, to, global_shape(c.a, r.sizes), options(dtype, false));
        with_workspace += reshard.peak_bytes_per_device > on_threads.peak_bytes_per_device;
      }
    }
  }
  // The buffers beyond blocks and staging were all weighed: rings, exchanges, reductions.
  for (OpKind op : {OpKind::all_gather_einsum, OpKind::einsum_reduce_scatter, OpKind::exchange, OpKind::reduce_scatter,
                    OpKind::all_reduce, OpKind::all_to_all}) {
    EXPECT_GT(seen[op], 0) << to_string(op);
  }
  EXPECT_GT(with_workspace, 0) << "no reshard on mpi counted a reduction workspace";
}

// Every device's executor, built for real on the threads backend: its buffers and einsum
// workspaces (Executor::bytes_held) and the inputs, as allocated.
std::vector<std::int64_t> held_per_device(const Mesh& mesh, const Plan& plan, const DimSizes& sizes, DType dtype,
                                          const std::vector<Spec>& inputs) {
  std::vector<std::int64_t> held(static_cast<std::size_t>(mesh.device_count()), 0);
  run_backend("threads", mesh, [&](Communicator& comm) {
    std::int64_t bytes = 0;
    for (const Spec& input : inputs) {
      const DistTensor t(mesh, comm.rank(), input, global_shape(input, sizes), dtype);
      bytes += buffer_bytes(t.buffer().elements(), dtype);
    }
    const Executor exec(comm, plan, sizes, dtype);
    held[static_cast<std::size_t>(comm.rank())] = bytes + exec.bytes_held();
  });
  return held;
}

TEST(PeakTest, NoDeviceHoldsMoreThanThePeakAndDeviceZeroHoldsItWithoutAnExchange) {
  Rng rng(2907);
  int rings = 0, exchanges = 0, exact = 0;
  for (unsigned i = 0; i < testing::scaled_cases(80); ++i) {
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    const testing::RandomContraction r = testing::random_contraction(rng, mesh, 9);
    const DType dtype = uniform(rng, 0, 1) ? DType::f32 : DType::f64;
    const MatmulPlanning p = plan_matmul(mesh, r.contraction, r.sizes, options(dtype, false));
    // The cheapest, and the first ring and the first exchange among the candidates.
    std::vector<const Plan*> picked{&p.candidates.front()};
    const auto ring = [](const Plan& q) {
      return std::any_of(q.steps.begin(), q.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); });
    };
    const auto exchange = [](const Plan& q) { return has(q, OpKind::exchange); };
    for (const auto it : {std::find_if(p.candidates.begin(), p.candidates.end(), ring),
                          std::find_if(p.candidates.begin(), p.candidates.end(), exchange)}) {
      if (it != p.candidates.end()) picked.push_back(&*it);
    }
    for (const Plan* plan : picked) {
      const std::vector<std::int64_t> held =
          held_per_device(mesh, *plan, r.sizes, dtype, {r.contraction.a, r.contraction.b});
      for (std::size_t d = 0; d < held.size(); ++d) {
        EXPECT_LE(held[d], plan->peak_bytes_per_device) << r.text << ", device " << d << ": " << plan->description;
      }
      if (!exchange(*plan)) {
        EXPECT_EQ(held[0], plan->peak_bytes_per_device) << r.text << ": " << plan->description;
        ++exact;
      }
      exchanges += exchange(*plan);
      rings += ring(*plan);
    }
  }
  EXPECT_GT(rings, 0);
  EXPECT_GT(exchanges, 0);
  EXPECT_GT(exact, 0);
}

}  // namespace
}  // namespace shardmm
