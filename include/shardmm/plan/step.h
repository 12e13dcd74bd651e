// Plans: printable lists of steps that turn sharded inputs into a sharded output.
//
//   Plan p = plan_reshard(mesh, from, to, shape, PlanOptions{DType::f32, profile});  // planner.h
//   for (const Step& s : p.steps) std::cout << to_string(s.op) << "\n";
//
// Each collective's layout transition (group G = `axes`, major to minor):
//   all_gather(G, dim d)      [.., D_{P G}, ..]  -> [.., D_P, ..]     G a suffix of d's axes
//   slice(G, dim d)           [.., D_P, ..]      -> [.., D_{P G}, ..] local, no communication
//   all_to_all(G, d -> e)     [D_{P G}, E_Q]     -> [D_P, E_{Q G}]    G a suffix of d's axes
//   reduce_scatter(G, dim d)  [.., D_P, ..]{U_G} -> [.., D_{P G}, ..]
//   all_reduce(G)             [..]{U_G}          -> [..]
//   all_reduce(max)(G)        [..]{U_G}          -> [..]              U_G here: each member holds a
//                                                                      partial maximum (autodiff's
//                                                                      row statistics), not a sum
//   to_partial(G)             [..]               -> [..]{U_G}         local: coordinate 0 of G
//                                                                      keeps the value, others 0
//   to_partial(G, dim d)      [.., D_{P G}, ..]  -> [.., D_P, ..]{U_G} local: each device pads its
//                                                                      block with zeros (G a suffix
//                                                                      of d's axes; no gather)
//   exchange(G)               [any layout]{U_S}  -> [any layout]{U_S} G: the axes sharding `from`
//                             beyond the prefix each dimension keeps. Every device sends each
//                             member of its group the part of its block that the member's new
//                             block covers (MPI_Alltoallv; XLA's collective-permute when each
//                             block has one destination), so it receives its new block less
//                             what it already held, in one collective. The reshard planner
//                             offers it beside its chain of the moves above, for layouts
//                             that chain serves poorly: A[I_XY] -> A[I_YX] (a permutation,
//                             where the chain gathers the whole of I), A[I_X] -> A[I_Y].
//   einsum                    local contraction of the two operands' shards
//   local                     work on each device's own blocks that neither moves data between
//                             devices nor multiplies (an activation, a norm's passes, a transpose,
//                             the optimizer's update): `function` names it, `memory_bytes` is
//                             what it reads plus writes, and it is costed by its traffic or, where
//                             the profile measured the function's per-element rate and that is
//                             slower, by its arithmetic (cost.h: local_op_cost). Recorded by the
//                             autodiff tape, never planned.
// Collective matmuls (the Scaling Book's "collective matmul"; XLA's windowed einsum): a collective
// and the einsum fused into a ring, so that while one chunk is multiplied the next is in
// flight. `from` @ `from_b` -> `to` as for einsum; G = `axes` is flattened into one ring.
//   all_gather_einsum(G, dim d of operand o)
//                             A @ B -> C where operand o (`ring_operand`: 0 A, 1 B) is held as
//                             [.., D_{P G}, ..] and the einsum needs [.., D_P, ..]: each ring
//                             step multiplies one member's shard while the next one moves.
//                             D free (in o and C, not in the other operand): each chunk
//                             fills its own rows of C. D contracted (in both operands, the
//                             other holding D_P, not in C; gathers_contracted): each chunk
//                             times the other operand's rows of D adds into all of C, the own
//                             chunk first, then in ring order (SUMMA's panel loop).
//   einsum_reduce_scatter(G, dim d of C)
//                             A @ B -> C[.., D_{P G}, ..] where the einsum alone gives
//                             C[.., D_P, ..]{U_G}: each ring step computes the partial block
//                             bound for one member, adds the running sum that arrived from
//                             the previous member and passes it on (both ways round: one block
//                             bound each way, the sums converging on their owner from both
//                             sides). D is free in one input.
// Planning never touches a communicator.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {

enum class OpKind {
  all_gather,
  reduce_scatter,
  all_reduce,
  all_to_all,
  slice,
  to_partial,
  einsum,
  all_gather_einsum,
  einsum_reduce_scatter,
  exchange,
  local,
};
const char* to_string(OpKind op);
// The collectives alone: the four and exchange (not the collective matmuls, which also compute).
bool is_collective(OpKind op);
// einsum and the collective matmuls: steps that multiply A and B into C.
bool multiplies(OpKind op);
// The collective matmuls.
bool is_collective_matmul(OpKind op);

// Which term of the cost model sets a step's predicted time (docs/cost-model.md, "What bounds
// a step"): a collective is latency-bound when its fixed per-hop costs (a calibrated fit's
// alpha) outweigh the time its bytes take on the links, bandwidth-bound otherwise; a local
// einsum is compute- or memory-bound by the roofline, and a slice or to_partial is a local
// copy (memory); a collective matmul is compute-bound when its GEMMs outlast its transfers,
// otherwise bound as one of its hops is. none: the step costs nothing (a group of one device).
enum class Bound { none, latency, bandwidth, compute, memory };
const char* to_string(Bound bound);

// Where the cost model knows its time for a step is weak on the profile it planned with
// (docs/cost-model.md, "Confidence"): why, one reason each, and by how many seconds the
// prediction may be off (a calibrated fit's worst residual times the time it predicts; the 15%
// band the model is judged by where nothing measured bounds it). `run` adds what only a run
// knows (ranks time-sliced on fewer cores, a profile of other hardware). No reasons: nothing
// known against it.
struct Confidence {
  std::vector<std::string> why;
  double uncertainty_s = 0;
  bool low() const { return !why.empty(); }
  // Another reason about the same time: kept once, the larger uncertainty stands.
  void add(const std::string& reason, double uncertainty_s);
  // Another part of the step (a ring's transfers beside its GEMMs): the uncertainties add.
  void add_part(const Confidence& part);
};
// The share of a time a weak prediction is taken to be off by where nothing measured bounds
// it: the band of the model's goal (issue 31: predicted / measured within 0.85..1.15).
inline constexpr double kModelBand = 0.15;

struct Step {
  OpKind op = OpKind::einsum;
  AxisList axes;                    // the collective's group (empty for einsum)
  int dim = -1;                     // dimension index in `from` (gather, slice, reduce_scatter, all_to_all source,
                                    // a padding to_partial);
                                    // all_gather_einsum: in the gathered operand; einsum_reduce_scatter: in `to`
  int dst_dim = -1;                 // all_to_all destination dimension index
  std::string tensor;               // the tensor this step produces or transforms
  int operand = 0;                  // which: 0 the first input (or a reshard's tensor), 1 the second, 2 the output
  ReduceOp reduce = ReduceOp::sum;  // all_reduce: how the members' values combine (costed alike)
  Spec from;                        // layout before (einsum: the A operand)
  Spec from_b;                      // einsum only: the B operand
  Spec to;                          // layout after
  std::int64_t bytes_sent = 0;      // per device, the most any device sends
  std::int64_t bytes_received = 0;  // per device, the most any device receives
  double flops = 0;                 // per device, the most any device computes
  double time_s = 0;                // predicted (collective matmuls: overlapped, see docs/cost-model.md)
  Bound bound = Bound::none;        // which term of the model sets time_s
  // local only.
  std::string function;           // what it computes: "gelu", "layer_norm", "adam", ...
  std::int64_t memory_bytes = 0;  // bytes it reads plus writes in the device's memory, the most any device
  std::int64_t elements = 0;      // the elements those bytes hold (memory_bytes / the dtype's size): what a
                                  // measured per-element rate multiplies (cost.h: local_op_cost)
  bool backward = false;          // in the backward pass: its rate is "<function> backward"'s
  // Collective matmuls only.
  int ring_operand = -1;       // all_gather_einsum: the gathered operand (0: from, 1: from_b)
  bool bidirectional = false;  // shards (all_gather_einsum) or partial sums (einsum_reduce_scatter)
                               // travel both ways round the ring
  int ring_steps = 0;          // steps of the ring; each multiplies one or two chunks
  double comm_time_s = 0;      // the ring's transfers alone, predicted
  double compute_time_s = 0;   // the einsum alone, predicted
  Confidence confidence;       // empty where the model knows nothing against time_s
};

// The step's op as printed: to_string(op), but "all_reduce(max)" for a maximum and a local
// step's function ("gelu").
std::string op_name(const Step& step);

// An all_gather_einsum whose gathered dimension is contracted: each shard's product adds into
// all of C rather than filling its own rows.
bool gathers_contracted(const Step& step);

// Whether every range of dimension `dim` of a block with extents `block` is one contiguous
// run (row-major): the dimensions before `dim` have extent 1, or one of them 0 (an empty
// block, whose ranges are all empty: no device stages what the largest one does not).
bool contiguous_along(const std::vector<std::int64_t>& block, int dim);

// The staging buffers the executor uses around a collective step on a device whose blocks
// have extents `in_local` (before) and `out_local` (after), in elements; absent where the
// collective works on the blocks in place. A gather into (or a scatter from) a block is in
// place when it is contiguous_along the step's dimension: each member's piece is then one
// run. all_to_all sends in place by that rule on its destination dimension and receives in
// place by it on its source dimension. exchange always stages (its pieces are boxes, one per
// member, and a block may go to several members): the executor sizes those buffers itself.
struct Staging {
  std::optional<std::int64_t> send, recv;
};
Staging staging_of(const Step& step, const std::vector<std::int64_t>& in_local,
                   const std::vector<std::int64_t>& out_local);

// Elements the executor copies within one device's memory for a collective step, besides
// what the collective itself moves as calibration measures it (all_gather and all_reduce in
// place, reduce_scatter and all_to_all between contiguous buffers): packing into and
// unpacking from staging, and the input's copy into the output where the collective cannot
// work on its input in place (all_gather's own piece, all_reduce's whole block). 0 for the
// steps that are not collectives; an exchange's copies depend on its pieces (logic_error).
std::int64_t local_copy_elements(const Step& step, const std::vector<std::int64_t>& in_local,
                                 const std::vector<std::int64_t>& out_local);

struct Plan {
  std::string description;  // e.g. "all_gather A over X, then local einsum"
  std::vector<Step> steps;
  Spec output;  // the layout the plan delivers
  double comm_time_s = 0;
  double compute_time_s = 0;
  double total_time_s = 0;       // the sum of the steps' times: comm + compute, except that
                                 // collective matmul steps count at their overlapped time
  double overlapped_time_s = 0;  // with perfect overlap: max(comm, compute)
  std::int64_t peak_bytes_per_device = 0;
  bool fits_memory = true;  // within the planning memory limit
};

// How often a plan makes its group's members meet: once per collective, once per step of a
// collective matmul ring. Each meeting waits for the group's slowest member, which the cost
// model does not price (docs/cost-model.md, "Near ties").
int synchronizations(const Plan& plan);
// One step's share of that: 1 for a collective, its ring's steps for a collective matmul.
int synchronizations(const Step& step);

}  // namespace shardmm
