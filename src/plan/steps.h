// Building and costing plan steps (private to the plan layer; plan/step_builder.h is the
// public door to one step).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/memory.h"
#include "shardmm/plan/planner.h"
#include "shardmm/plan/step.h"
#include "shardmm/plan/step_builder.h"

namespace shardmm::detail {

// A memo key of numbers (layouts, names and sizes as numbers: formatting and hashing specs'
// text took a quarter of a matmul planner's time).
struct NumbersHash {
  std::size_t operator()(const std::vector<std::int64_t>& key) const {
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the numbers
    for (std::int64_t n : key) h = (h ^ static_cast<std::uint64_t>(n)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
  }
};

// How many leading axes two axis lists share.
std::size_t common_prefix(const AxisList& a, const AxisList& b);
// The exchange from `from` to `to` (plan/step.h), which must have the same pending sums.
Step make_exchange(const Spec& from, const Spec& to);

// An exchange's traffic in elements, each the most any device has: what it sends (its
// staging for the sends), receives (for the receives), and copies (packs, unpacks, and keeps
// from block to block).
struct ExchangeTraffic {
  std::int64_t sent = 0, received = 0, copied = 0;
};

// A device's figures in some dimensions of an exchange: the elements its block shares with
// the group's blocks under the other layout (sent), the group's with its own block under the
// other layout (received), and its own two blocks with each other (kept).
struct ExchangeFactors {
  std::int64_t sends = 1, receives = 1, kept = 1;
  auto operator<=>(const ExchangeFactors&) const = default;
  // Checked (InputError on overflow), inline: walks multiply factors for each of 8,192 devices.
  void times(const ExchangeFactors& o) {
    std::int64_t s = 0, r = 0;
    if (__builtin_mul_overflow(sends, o.sends, &s) || __builtin_mul_overflow(receives, o.receives, &r)) overflow(o);
    sends = s;
    receives = r;
    kept *= o.kept;  // a sub-box of the device's block: fits
  }
  [[noreturn]] void overflow(const ExchangeFactors& o) const;
};
// One dimension's factors by the device's coordinates on the axes that split it under either
// layout (`axes`, the first the most significant digit of a key): an index into its few
// distinct factors, kept small so that a table of 8,192 keys stays in cache.
struct ExchangeDimFactors {
  AxisList axes;
  std::vector<std::uint32_t> which;  // by key: 1 + the index into `distinct`; 0 until worked out
  std::vector<ExchangeFactors> distinct;
  bool complete = false;  // every key worked out: `distinct` holds each factor some key has
  // f's index into `distinct`, added there if new: a scan while they are few (most dimensions
  // have one to four), `index` beyond.
  std::uint32_t number(const ExchangeFactors& f);

 private:
  std::map<ExchangeFactors, std::uint32_t> index;  // distinct's, once they are many
};
// A dimension's factors depend on its extent, its axes under both layouts and which of those
// the exchange's group holds: a planner's exchanges share most of them. By those, as numbers.
using ExchangeDimMemo = std::unordered_map<std::vector<std::int64_t>, ExchangeDimFactors, NumbersHash>;

// The traffic, its dimensions' factors remembered in `memo` when given (one mesh's).
ExchangeTraffic exchange_traffic(const Mesh& mesh, const Step& step, const std::vector<std::int64_t>& shape,
                                 ExchangeDimMemo* memo = nullptr);

// plan/memory.h's step_memory, given an exchange's traffic where it is known already, and
// with the einsums' workspaces remembered in `workspaces` where given.
StepMemory step_memory(const Mesh& mesh, const Step& step, const DimSizes& sizes, DType dtype,
                       const ExchangeTraffic* traffic, EinsumWorkspaces* workspaces);

// Fills bytes, FLOPs and predicted times of steps, remembering results: candidate plans
// share most of their steps.
class StepCoster {
  struct Cost {
    std::int64_t sent, received;
    double flops, time;
    Bound bound;
    StepMemory memory;
    Confidence confidence;
  };

 public:
  // What it remembers, by everything a step's figures depend on but the mesh, the dtype and
  // the hardware profile: a PlannerMemo's outlives the coster.
  struct Memo {
    std::unordered_map<std::string, Cost> costs;
    std::unordered_map<std::string, StepMemory> multiplying;
    EinsumWorkspaces workspaces;
    ExchangeDimMemo exchange_dims;
  };
  // `shared` (kept alive by the caller) instead of a memo of its own, when given.
  StepCoster(const Mesh& mesh, const PlanOptions& options, Memo* shared = nullptr)
      : mesh_(mesh), options_(options), memo_(shared ? shared : &own_) {}
  StepCoster(const StepCoster&) = delete;
  StepCoster& operator=(const StepCoster&) = delete;

  // Returns the step's memory (plan/memory.h) in the options' dtype.
  StepMemory cost(Step& step, const std::vector<std::int64_t>& shape);
  // `sizes` gives each letter's global size; or the operands' and the result's global shapes
  // (a symbolic tape costs every einsum it records: no map of sizes to build and search).
  void cost_einsum(Step& step, const DimSizes& sizes);
  void cost_einsum(Step& step, const std::vector<std::int64_t>& a_shape, const std::vector<std::int64_t>& b_shape,
                   const std::vector<std::int64_t>& c_shape);
  // The memory of a multiplying step (einsum or collective matmul), remembered.
  StepMemory memory(const Step& step, const DimSizes& sizes);

  // Largest per-device bytes of `spec` over `shape`.
  std::int64_t max_bytes(const Spec& spec, const std::vector<std::int64_t>& shape) const;

  // The smaller of an einsum's GEMM extents M and N on device 0 (einsum_time's rows), with
  // `chunk_letter` cut to `share` of its extent for one chunk of a ring.
  std::int64_t gemm_rows(const Step& einsum, const DimSizes& sizes, const std::string& chunk_letter = {},
                         double share = 1) const;
  std::int64_t gemm_rows(const Step& einsum, const std::vector<std::int64_t>& a_shape,
                         const std::vector<std::int64_t>& b_shape, const std::string& chunk_letter = {},
                         double share = 1) const;
  const Mesh& mesh() const { return mesh_; }
  const PlanOptions& options() const { return options_; }

 private:
  Cost cost_exchange(const Step& step, const ExchangeTraffic& traffic) const;
  const Mesh& mesh_;
  const PlanOptions& options_;
  Memo own_;
  Memo* memo_;
};

// The collective matmul that fuses `gather` (a costed all_gather of the einsum's operand
// `operand`, 0 or 1) into `einsum` (costed), as plan/step.h describes all_gather_einsum.
// `sizes` gives each letter's global size.
Step fuse_all_gather_einsum(const Step& gather, const Step& einsum, int operand, bool bidirectional,
                            const DimSizes& sizes, const StepCoster& coster);
// The collective matmul that fuses `einsum` (costed) into the costed reduce_scatter of its
// result that follows it; the partial sums travel one way round the ring or both.
Step fuse_einsum_reduce_scatter(const Step& einsum, const Step& scatter, bool bidirectional, const DimSizes& sizes,
                                const StepCoster& coster);

// Totals of a plan's steps (times, and `fits_memory` against the options' limit; the
// peak_bytes_per_device is set by the caller, from its steps' memory).
void total_up(Plan& plan, const PlanOptions& options);

// total_up's times, a step at a time (in the plan's order: the sums round alike): for a
// planner that weighs a plan it has not built.
class PlanTimes {
 public:
  void add(const Step& step);
  double comm_s() const { return comm_; }
  double compute_s() const { return compute_; }
  double total_s() const { return overlaps_ ? steps_ : comm_ + compute_; }

 private:
  double comm_ = 0, compute_ = 0, steps_ = 0;
  bool overlaps_ = false;
};

// One way to reshard a tensor: its steps, costed for the tensor's shape, and their memory.
struct CostedSteps {
  std::vector<Step> steps;
  std::vector<StepMemory> memory;
};

}  // namespace shardmm::detail

namespace shardmm::detail {

// The steps (not yet costed) of a reshard from `from` to `to`; see plan_reshard.
std::vector<Step> reshard_steps(const Mesh& mesh, const Spec& from, const Spec& to);

// plan_reshard on `coster`'s mesh, costing through `coster` (a planner that plans many
// reshards shares its memo); `options` sets the memory limit the plan is judged by.
Plan plan_reshard(StepCoster& coster, const Spec& from, const Spec& to, const std::vector<std::int64_t>& shape,
                  const PlanOptions& options);

// One reshard's ways (CostedSteps), and each way's steps' layouts as numbers, numbered
// (PlannerMemo::Impl::signatures): its part of a matmul candidate's signature, which tells
// candidates with the same steps apart.
struct ReshardWays {
  std::vector<CostedSteps> ways;
  std::vector<int> signatures;
};

// A step built and costed, and its memory.
struct CostedStep {
  Step step;
  StepMemory memory;
};

// A matmul's local einsum in one layout, costed, and the collective matmuls that fuse it with a
// step of one of its reshards: by that reshard's way, the part it reshards (A 0, B 1, the
// result 2) and whether the ring goes both ways round.
struct CostedEinsum {
  CostedStep einsum;
  std::map<std::tuple<const CostedSteps*, int, bool>, CostedStep> fused;
};

// A matmul's layout (each mesh axis's role, each letter's axes) for its operands' specs, as
// the planner builds it: the local einsum (the memo's einsum_steps entry; costed once a
// candidate takes it), A's and B's reshards into it, the result's layout as numbers, and
// without an output spec the layouts the result may be reduced to (worked out once a call asks).
struct MatmulLayout {
  const Step* einsum = nullptr;
  CostedEinsum* costed = nullptr;
  const ReshardWays* a_ways = nullptr;
  const ReshardWays* b_ways = nullptr;
  int c_layout = -1;  // the result's layout as numbers, numbered (PlannerMemo::Impl::signatures)
  std::vector<Spec> free_targets;
};

}  // namespace shardmm::detail

namespace shardmm {

struct PlannerMemo::Impl {
  // What the memo's figures are for, set by its first use: the mesh, and the dtype, the
  // hardware profile's name and whether reductions take a workspace (what reshards weigh).
  std::optional<Mesh> mesh;
  std::string costs;
  detail::StepCoster::Memo steps;
  // Letters and tensor names numbered, for the keys below (the same numbers in every call).
  std::map<std::string, int, std::less<>> ids;
  // A matmul planner's reshard options (its reshard_options) by the two specs as numbers,
  // names included (the steps carry them), and the shape. Its entries stay where they are.
  std::unordered_map<std::vector<std::int64_t>, detail::ReshardWays, detail::NumbersHash> reshards;
  // A matmul planner's local einsums by their names, the three layouts and the letters' sizes.
  std::unordered_map<std::vector<std::int64_t>, detail::CostedEinsum, detail::NumbersHash> einsums;
  // The layouts' local einsums before costing, by the same keys: tens of thousands of layouts
  // (the operands' specs times the axes' roles) share a few thousand.
  std::unordered_map<std::vector<std::int64_t>, Step, detail::NumbersHash> einsum_steps;
  // A pinned result's reshard options (entries of `reshards`) by the numbers of the local
  // einsum's result layout and of the pin (with the result's name and shape): one key of two
  // numbers where the layouts of thousands of calls share a few hundred.
  std::unordered_map<std::uint64_t, const detail::ReshardWays*> result_ways;
  // A matmul planner's layouts by the number of the contraction (the operands' names and
  // specs, the result's name and letters, the letters' sizes), the axes' roles and the letters'
  // axes.
  std::unordered_map<std::vector<std::int64_t>, detail::MatmulLayout, detail::NumbersHash> layouts;
  // The reshard ways' signatures and the layouts' results as numbers, each numbered once: a
  // candidate's signature is then four numbers (a planner weighs hundreds of thousands).
  std::unordered_map<std::vector<std::int64_t>, int, detail::NumbersHash> signatures;
};

}  // namespace shardmm
