// The planners: reshards and sharded contractions, costed on a hardware profile.
//
//   Mesh mesh = Mesh::parse("X=4");
//   PlanOptions opt{DType::bf16, builtin_profile("tpu-v5e")};
//   Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
//   MatmulPlanning p = plan_matmul(mesh, c, parse_dims("I=8192,J=4096,K=16384"), opt);
//   p.cases[0].case_number;          // 3: both inputs shard the contracting dimension J over X
//   p.candidates[p.chosen].steps;    // einsum, then all_reduce over X
//
// Planning is pure computation over specs and shapes: it never touches a communicator,
// so a plan for 8192 devices is computed on a laptop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/step.h"

namespace shardmm {

struct PlanOptions {
  DType dtype = DType::bf16;
  HardwareProfile hw;
  std::optional<std::int64_t> mem_limit_bytes;  // per device, against Plan::peak_bytes_per_device
  // The backend that will run the plan reduces through a workspace (the mpi backend:
  // BackendCapabilities::reduces_into_workspace), which the peak then counts (plan/memory.h).
  // false: the threads backend, which reduces in place.
  bool reduction_workspace = false;
  // Candidates predicted within this fraction of the cheapest one's time are a near tie, which
  // goes to the one with the fewest synchronizations (plan/step.h). 0: the cheapest, always.
  double tie_margin = 0;
};

// Plans `from` -> `to` for one tensor of global `shape` (the two specs name the same
// dimensions in the same order). Always correct; for the common cases the cheapest
// known plan: reduce_scatter before gathers, all_to_all to move an axis between
// dimensions, slices (free) before gathers so that less data moves.
Plan plan_reshard(const Mesh& mesh, const Spec& from, const Spec& to, const std::vector<std::int64_t>& shape,
                  const PlanOptions& options);

// The Scaling Book's four cases, per mesh axis, judged from the input shardings.
struct AxisCase {
  int axis = 0;
  int case_number = 1;  // 1..4
  std::string reason;
};

struct MatmulPlanning {
  std::vector<AxisCase> cases;   // Candidates::all only
  std::vector<Plan> candidates;  // distinct strategies, cheapest first (ties broken by description)
  // Index into candidates; -1 when none fits the memory limit. Among those that fit, the one
  // with the fewest synchronizations within PlanOptions::tie_margin of the cheapest's time
  // (then the cheaper, then the earlier).
  int chosen = -1;
  // Without an output spec the candidates cover every output layout, unless that would be
  // more combinations of the mesh axes' roles than the planner weighs: then (false) only the
  // output layouts the inputs' sharded axes give.
  bool every_output_layout = true;
};

// What plan_matmul works out while it weighs a contraction's candidates (each step's cost and
// memory, each operand's reshards), kept for later calls: a caller that plans thousands of
// contractions of the same tensors (solve records each op in every combination of its specs)
// then costs each reshard and step once. A memo serves one mesh, dtype and hardware profile
// (plan_matmul checks the mesh and the dtype); one thread at a time.
class PlannerMemo {
 public:
  PlannerMemo();
  ~PlannerMemo();
  PlannerMemo(const PlannerMemo&) = delete;
  PlannerMemo& operator=(const PlannerMemo&) = delete;
  // Drops what it keeps of contractions (their layouts and reshards, which name the tensors)
  // and keeps the steps' costs, which name none and serve other tensors' contractions on the
  // mesh: for a caller done with some tensors (solve, after each op), most of the memory.
  void forget_contractions();
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Which candidates plan_matmul weighs and builds in full (steps, specs, description).
enum class Candidates {
  all,     // every one, each built: the `plan` command lists them; near_tie and find_candidate
           // look among them
  serial,  // those without a collective matmul step, what a tape that runs no ring asks for
           // (solve records each op in every combination of its specs): the chosen one among
           // them alone is built, no `cases` (their reasons are texts, a tenth of the work of
           // planning a contraction the memo knows). The same choice as among all's ringless
           // candidates, in two thirds of the time on planner_bench's 8,192-device sweep.
};

// `memo`, when given, remembers across calls; the answer is the same without it.
MatmulPlanning plan_matmul(const Mesh& mesh, const Contraction& contraction, const DimSizes& sizes,
                           const PlanOptions& options, PlannerMemo* memo = nullptr,
                           Candidates built = Candidates::all);

// The plan's steps' uncertainties summed (Step::confidence): how far its predicted time may be
// off where the model knows its figures are weak.
double uncertainty_s(const Plan& plan);

// The chosen plan and the other candidate that fits memory predicted nearest to it, where the
// two are closer than their uncertainties together: the model cannot rank them, whatever
// tie_margin picked (docs/cost-model.md, "Confidence").
struct NearTie {
  int candidate = -1;        // index into candidates
  double difference_s = 0;   // |its predicted time - the chosen one's|
  double uncertainty_s = 0;  // uncertainty_s of both
};
std::optional<NearTie> near_tie(const MatmulPlanning& planning);

// The cheapest candidate whose steps are exactly `ops`, in order, and where `bidirectional`
// is given, whose first step goes that many ways round; nullptr when the planner offered none.
// For measuring one strategy against another (calibrate's ring probes, the benchmarks).
const Plan* find_candidate(const MatmulPlanning& planning, const std::vector<OpKind>& ops,
                           std::optional<bool> bidirectional = std::nullopt);

// Validates that `from` and `to` describe the same tensor (same dimension names in the
// same order); throws InputError naming the difference.
void check_same_tensor(const Spec& from, const Spec& to, const Mesh& mesh);

}  // namespace shardmm
