// Reverse-mode autodiff over sharded programs (SPMD): every rank records the same tape
// over its own shards and its own communicator, then runs it backwards.
//
//   // A two-rank FFN worked by hand: column-parallel A, ReLU, row-parallel B, one all_reduce.
//   run_threads(Mesh::parse("X=2"), [](Communicator& comm) {
//     autodiff::Tape tape(comm, {DType::f64});
//     autodiff::Var x = tape.input("X[N, D]", {{"N", 1}, {"D", 2}}, x_values, /*requires_grad=*/true);
//     autodiff::Var a = tape.input("A[D, F_X]", {{"D", 2}, {"F", 4}}, a_values, true);
//     autodiff::Var b = tape.input("B[F_X, E]", {{"F", 4}, {"E", 2}}, b_values, true);
//     autodiff::Var h = relu(einsum(x, a, {"N", "F"}));        // [N, F_X]: no communication
//     autodiff::Var y = all_reduce(einsum(h, b, {"N", "E"}), tape.axes("X"));  // [N, E]{U_X} -> [N, E]
//     tape.backward(sum(y));
//     tape.grad(x);     // [N, D], replicated: the backward all_reduce came out of the rule
//     tape.events();    // forward all_reduce, backward all_reduce, with bytes and times
//   });
//
//   // The same program without data: specs, shapes, collectives, FLOPs, memory.
//   autodiff::Tape plan(Mesh::parse("X=2"), {DType::bf16, builtin_profile("h100")});
//   ... the same calls, `input` ignoring its generator ...
//
// Gradient layouts. A gradient is a DistTensor of the logical dL/dv, in a spec of its own
// that may carry unreduced axes {U_G} (each member holds a partial sum of the gradient).
//   * An op that computes locally from its values (einsum, elementwise, softmax, layer
//     norm, sum) first brings its output gradient to the output's dimension sharding,
//     whole (pending sums resolved), using the reshard planner. Its input gradients come
//     out in whatever layout the local rule gives: a replicated operand of a sharded
//     contraction gets a gradient unreduced over the contracted axes, summed where it
//     next meets a local op or its leaf (Megatron's f: identity forward, all_reduce
//     backward); layer norm's scale and bias get gradients unreduced over the axes that
//     split the rows.
//   * Collectives, reshard, slice and to_partial change the layout, not the logical
//     tensor: their backward passes the gradient on unchanged, and the dual collective
//     (all_gather <-> reduce_scatter or slice, all_to_all(d->e) <-> all_to_all(e->d),
//     all_reduce <-> identity) is what the planner emits where the gradient is next
//     aligned. A gradient nobody needs is never moved.
//   * A value used twice: its gradients are brought to one layout (their common dimension
//     sharding, else the value's, with the union of their unreduced axes: free) and added
//     locally.
//   * A leaf's final gradient is delivered in the leaf's own spec: data parallel's
//     all_reduce and FSDP's reduce_scatter. Nothing is summed twice, nothing divided by
//     the rank count.
// docs/autodiff.md has each op's rule.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/core/contraction.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"
#include "shardmm/plan/step.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm::autodiff {

class Tape;
struct Value;  // a value as the tape holds it (private: src/autodiff/tape_impl.h)

// A value on a tape: a handle, cheap to copy. Valid while its tape lives.
class Var {
 public:
  Var() = default;
  const Spec& spec() const;
  const Shape& shape() const;       // global
  const DistTensor& value() const;  // this rank's shard; executed tapes only
  Tape& tape() const;
  bool valid() const { return tape_ != nullptr; }
  int id() const { return id_; }  // its index on the tape, in recording order

 private:
  friend class Tape;
  Var(Tape* tape, int id) : tape_(tape), id_(id) {}
  Tape* tape_ = nullptr;
  int id_ = -1;
};

// update: the optimizer's step after backward (programs record it: Tape::update).
enum class Phase { forward, backward, update };
const char* to_string(Phase phase);

// One step the program ran, or (symbolic) would run: a collective, a local slice or
// to_partial, an einsum, or an op's work on each rank's own blocks (OpKind::local: one per op
// forward and one per op's backward, more where a norm's statistics over a sharded letter
// interrupt it with their all_reduce; the update's, one per param). `step` holds the plan
// layer's figures: bytes per device are the most any device sends/receives (a local step's
// memory_bytes the most any device reads plus writes), flops the most any device computes,
// time_s the prediction on the tape's hardware profile. Executed tapes add this rank's
// measurement (bytes it moved; start/end in seconds since the tape was built; a local step's
// span is the wall time of its computation).
struct TapeEvent {
  Phase phase = Phase::forward;
  Step step;
  bool executed = false;
  TraceEvent measured;
  int scope = -1;  // Tape::set_scope's label when it was recorded (backward: its node's)
};

// Per-device memory of the program, in bytes, as the tape holds it (executed: this rank;
// symbolic: the tape's device, by default device 0, which holds the largest shards).
struct TapeMemory {
  std::int64_t leaves = 0;       // inputs and parameters
  std::int64_t activations = 0;  // non-leaf values kept for the backward pass
  std::int64_t gradients = 0;    // leaf gradients, in the leaves' specs (after backward)
};

// Every function a local step (OpKind::local) can name, with the passes it runs in: forward
// (the forward pass, or the update for the optimizers) and backward. The tape refuses any other
// (std::logic_error), so that a new function is listed here and the calibration measures its rate
// (nn::measure_local_rates; docs/calibration.md, "Local functions"). data_from's and update's
// callers name theirs: "route" (nn's MoE routing), "sgd" and "adam".
struct LocalFunction {
  const char* name;
  bool forward;
  bool backward;
};
const std::vector<LocalFunction>& local_functions();

// The blocks that adding a second contribution to a value's gradient reads and writes: a copy
// of the first (2) and the add of the second (3). The tape records it as a local step
// ("accumulate") in the backward of the op whose contribution comes second.
inline constexpr int kGradientSumBlocks = 5;

// The plans tapes ask the planners for, shared by tapes that record the same contraction or
// reshard again (solve records each op once per combination of specs, and ops alike in what
// they contract): planned_einsum's by the contraction, its sizes and the dtype; reshards' by
// the two specs (names included: the steps carry them), the shape and the dtype, compared as
// they are (no text made for a key: a solve looks reshards up millions of times). A reshard's
// plan does not depend on the names: one asked under names it was not planned with is a plan
// of the same layouts renamed, where there is one (an op's tensors' reshards are mostly other
// ops' renamed). A contraction it has not seen is planned with one of its PlannerMemos (each
// thread planning takes one of its own), so the contractions share their reshards and step
// costs too. Thread-safe; one cache serves tapes of one mesh, hardware profile and memory limit.
class PlanCache {
 public:
  // Which plans it keeps: the contractions' too, or (for a caller that asks for each
  // contraction about once: solve's recorder keeps whole recordings) only the reshards and
  // the planner memos: 28,000 contraction plans nobody asked for again were a third of a
  // 32-layer solve's memory, and touching it a tenth of its time.
  enum class Keep { all, reshards_and_memos };
  explicit PlanCache(Keep keep = Keep::all);
  ~PlanCache();
  bool keeps_contractions() const { return keep_ == Keep::all; }
  // The plans are shared, not copied: a recording reads each of them a few times. `key` is
  // unused (may be empty) where it keeps no contraction.
  std::shared_ptr<const Plan> plan(const std::string& key, DType dtype, const std::function<Plan(PlannerMemo&)>& make);
  // plan_reshard(mesh, from, to, shape, options), remembered.
  std::shared_ptr<const Plan> reshard(const Mesh& mesh, const Spec& from, const Spec& to, const Shape& shape,
                                      const PlanOptions& options);
  // Drops the plans it keeps under the names of tensors (contractions, reshards) and what its
  // memos keep of contractions (each memo's forget_contractions), for a caller done with the
  // tensors they name; not while a tape plans with it. The steps' costs, and a reshard plan of
  // each pair of layouts, to rename, stay.
  void forget_contractions();

 private:
  // A reshard as asked: the key kept (Reshard) and the one looked up (ReshardQuery), alike,
  // each with its hash (reshard_hash, of the layouts alone), worked out once per lookup: it
  // picks the part and the bucket in both of the part's maps.
  struct Reshard {
    Spec from, to;
    Shape shape;
    DType dtype;
    std::size_t hash;
  };
  struct ReshardQuery {
    const Spec& from;
    const Spec& to;
    const Shape& shape;
    DType dtype;
    std::size_t hash;
  };
  static std::size_t reshard_hash(const Spec& from, const Spec& to, const Shape& shape, DType dtype);
  struct ReshardHash {
    using is_transparent = void;
    std::size_t operator()(const Reshard& r) const { return r.hash; }
    std::size_t operator()(const ReshardQuery& q) const { return q.hash; }
  };
  static bool same_layout(const Spec& a, const Spec& b) {
    if (a.dims.size() != b.dims.size() || !(a.unreduced == b.unreduced)) return false;
    for (std::size_t d = 0; d < a.dims.size(); ++d) {
      if (!(a.dims[d].axes == b.dims[d].axes)) return false;
    }
    return true;
  }
  // The same layouts, whatever the names.
  struct SameLayouts {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return same_layout(a.from, b.from) && same_layout(a.to, b.to) && a.shape == b.shape && a.dtype == b.dtype;
    }
  };
  // The same specs, names included.
  struct SameSpecs {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return a.from.tensor == b.from.tensor && a.from == b.from && a.to.tensor == b.to.tensor && a.to == b.to &&
             a.shape == b.shape && a.dtype == b.dtype;
    }
  };
  // `plan`, planned for `planned`, under the names of `from`: its steps and output name the
  // source tensor (plan_reshard's) and the source's dimensions.
  static Plan renamed(const Plan& plan, const Reshard& planned, const Spec& from);

  const Keep keep_;
  std::mutex mutex_;  // plans_ and idle_
  // Hashed: the keys are long texts that share long beginnings (a map compares them by bytes).
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans_;
  // Split by the key's hash, each part with its own lock: a solve's threads look reshards up
  // millions of times, and one lock for all had them waiting for each other.
  struct ReshardPart {
    std::mutex mutex;
    std::unordered_map<Reshard, std::shared_ptr<const Plan>, ReshardHash, SameSpecs> named;
    std::unordered_map<Reshard, std::shared_ptr<const Plan>, ReshardHash, SameLayouts> unnamed;  // the first asked
  };
  std::array<ReshardPart, 16> reshards_;
  struct IdleMemo {
    DType dtype;
    std::thread::id thread;  // the last to hold it
    std::unique_ptr<PlannerMemo> memo;
  };
  std::vector<IdleMemo> idle_;  // memos no thread holds now
};

// One point of the memory timeline (Tape::memory_timeline): the bytes one device holds while
// an op runs, forward or backward. Forward ops are the nodes recorded under one scope in a row
// (a single node where the scope is -1); backward runs them in reverse, each a point, and each
// leaf's gradient brought into the leaf's spec is one more.
//   leaves       every input and param, for the whole step
//   activations  forward values live: from the op that makes one through its last reader in
//                forward, or, when some op's backward reads it (and backward ran), until backward
//                has run the op that made it; an op's statistics kept for backward (layer norm's)
//                likewise; a regathered all_gather from its last forward reader's op only, and
//                in backward again from where it is gathered again
//   gradients    from the op whose backward makes a value's gradient through the op that passes
//                it on (its maker); a leaf's to the end of the step
//   transient    forward: the most bytes at once of the op's own values that die inside it (a
//                gathered operand, a product nobody keeps); backward: the largest buffer one of
//                its steps makes (a resharded gradient, a product before it is added; not
//                the relabelling of partial sums when two contributions to one gradient add)
// A value the op reads or makes counts in the whole op: points are what is live at the op's
// start and end together, plus its transient. Executed tapes count their buffers' bytes,
// symbolic ones the specs' shards: the same figures.
struct MemoryPoint {
  Phase phase = Phase::forward;
  int scope = -1;      // Tape::set_scope's label of the op
  std::string tensor;  // the value the op made last (forward), or whose backward ran last
  std::int64_t leaves = 0;
  std::int64_t activations = 0;
  std::int64_t gradients = 0;
  std::int64_t transient = 0;
  std::int64_t total() const { return leaves + activations + gradients + transient; }
};

struct TapeOptions {
  DType dtype = DType::f32;                      // executed: f32 or f64; symbolic: any (it sizes bytes and FLOP/s)
  HardwareProfile hw = builtin_profile("h100");  // for predicted times
  std::int64_t device = 0;                       // symbolic only: whose shards the memory figures count
  PlanCache* plans = nullptr;                    // shared with other tapes when given (kept alive by the caller)
  // planned_einsum may run the planner's collective matmul rings (see there); false: the
  // cheapest plan without one.
  bool rings = false;
};

// How all_gather keeps its output for the backward pass.
enum class Gathered {
  kept,        // the gathered value stays in memory until backward
  regathered,  // dropped after the forward pass and gathered again in backward (FSDP)
};

class Tape {
 public:
  // Executed: ops compute this rank's shards and run collectives on `comm`.
  Tape(Communicator& comm, TapeOptions options);
  // Symbolic: ops propagate specs and shapes over `mesh`, computing nothing; the events
  // and memory figures are those an executed run records.
  Tape(const Mesh& mesh, TapeOptions options);
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Symbolic tapes: back to the end of the forward pass, as if backward (and the updates after
  // it) had never run, to run it again another way (solve runs backward from each layout of an
  // op's result gradient after one forward pass). Nothing to undo: no change.
  void rewind();
  // The value recorded `id`-th (Var::id).
  Var var(int id);

  bool symbolic() const;
  const Mesh& mesh() const;
  DType dtype() const;

  // Parses a spec or a list of mesh axis names ("X", "XY", "dp,tp") against the mesh;
  // InputError on bad text.
  Spec spec(std::string_view text) const;
  AxisList axes(std::string_view names) const;

  // A leaf. Executed tapes fill this rank's shard with `value` (DistTensor::filled);
  // symbolic tapes ignore it. The spec has no unreduced axes (a symbolic tape's may: partial
  // sums, to cost an op alone on the values another op leaves it). With requires_grad,
  // grad() returns its gradient after backward().
  Var input(const Spec& spec, Shape shape, const DistTensor::Generator& value, bool requires_grad = false);
  Var input(std::string_view spec, const DimSizes& sizes, const DistTensor::Generator& value,
            bool requires_grad = false);
  // Executed tapes only: a shard this rank already holds.
  Var input(DistTensor value, bool requires_grad = false);

  // Runs the tape backwards from `loss`, a rank-0 value, seeding dloss/dloss = 1 on every
  // rank. Call once per tape.
  void backward(Var loss);
  // Symbolic tapes: runs backward from `out`'s gradient, in out's dimension sharding and
  // partial over `unreduced` (what `out`'s consumers would deliver): costs an op alone.
  void backward_from(Var out, const AxisList& unreduced);
  // A backward pass in two halves, for symbolic tapes that cost one op's backward from each
  // layout its result's gradient may arrive in (solve). A contraction (einsum) brings the
  // gradient it receives to its own dimension sharding, nothing pending, before anything else:
  // what its backward and everything below it then do is the same whichever layout the
  // gradient arrived in, and runs once.
  struct Below;  // the pass below a contraction (private: src/autodiff/tape_impl.h)
  // The node of the one plain contraction recorded under `scope` (einsum(), not a ring), if it
  // has exactly one.
  std::optional<Var> contraction_in(int scope);
  // The pass below `contraction` (contraction_in): backward_from(contraction, {}) run and kept,
  // then the tape rewound. Throws what that pass throws (the tape rewound).
  std::shared_ptr<const Below> backward_below(Var contraction);
  // backward_from(out, unreduced) down to `below`'s contraction, whose gradient is aligned as
  // its backward begins; then `below` spliced on: the tape as the whole pass leaves it (its
  // events, memory figures and gradients). False, the pass left midway (rewind the tape), where
  // the halves would not make the whole: a value below the contraction received its gradient
  // before the contraction ran, a leaf's gradient was reduced above it, or a value regathered.
  bool backward_from(Var out, const AxisList& unreduced, const Below& below);
  // After backward: the axes a leaf's gradient was partial over when it arrived, before it
  // was reduced into the leaf's spec (its consumers' share of that reduction).
  AxisList gradient_arrived_unreduced(Var leaf) const;
  // A leaf's gradient in the leaf's spec (executed tapes, after backward; a leaf that the
  // loss does not depend on gets zeros).
  const DistTensor& grad(Var leaf) const;

  // Names `v` (its spec's tensor name) as the steps that move it, and its gradient's ("d" +
  // name), will call it; ops name their results after their operands ("gelu(u)") otherwise.
  void set_name(Var v, std::string name);

  // Labels what is recorded from now on with `scope`, a number of the caller's (a program's
  // op): the events of the forward pass, and those each node's backward runs later. -1: none.
  void set_scope(int scope);

  // The optimizer's step on leaf `param` after backward (a program calls it for each param):
  // one local step `function` ("sgd", "adam") in Phase::update, scope -1, named after the
  // param, reading plus writing `blocks` blocks of the param's layout (sgd: w and its gradient
  // read, w written: 3). Executed tapes run `update` (this rank's shard) and time it.
  void update(Var param, std::string function, int blocks, const std::function<void()>& update);

  // Everything run so far, forward then backward, in order.
  const std::vector<TapeEvent>& events() const;
  TapeMemory memory() const;
  // The memory timeline so far (MemoryPoint): forward only until backward() has run, and then
  // values some backward reads count as kept through the forward pass too.
  std::vector<MemoryPoint> memory_timeline() const;
  // For costing one op alone (solve/): what the nodes recorded under `scope` add to the
  // timeline's points beside `result` (which its consumers count) and the leaves, as when
  // backward runs (`train`) or not. Their figures where the op sits in a whole program:
  struct OpMemory {
    std::int64_t kept = 0;                   // its own values and statistics kept for backward
    std::int64_t transient = 0;              // forward: its transient, result not counted
    std::int64_t transient_with_result = 0;  // forward: its transient when nothing reads result
    std::int64_t backward = 0;               // its backward's transient and its own values' gradients
  };
  OpMemory op_memory(int scope, Var result, bool train) const;
  // The bytes of `v`'s shard (as memory() counts it) when some op's backward reads `v`, else 0.
  std::int64_t bytes_saved_for_backward(Var v) const;

  // The recording machinery, for the op functions below; not for users.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  friend class Var;
  static Var make_var(Tape* tape, int id) { return Var(tape, id); }
  // Down to node `stop` (-1: the whole pass), whose gradient is then left unused.
  void run_backward(Var from, Value seed, int stop = -1);
  std::unique_ptr<Impl> impl_;
};

// ---- Ops. Each records itself on its operands' tape (operands must share one tape).
// Dimensions are named by the spec's letters; `axes` are mesh axes, major to minor.

// Local einsum on compatible shards, no communication: batch and contracted dimensions
// sharded alike in both operands, unreduced axes of the operands disjoint. Output
// dimensions `out_dims`, sharded as the operands shard them; contracted axes become
// unreduced ({U_...}). InputError names the axis that breaks the rule.
Var einsum(Var a, Var b, const std::vector<std::string>& out_dims);
// The planner's cheapest plan (plan_matmul) for A @ B -> `out`, recorded step by step
// (reshards, local einsum, reshards) so that its backward is automatic. `keep_a` and `keep_b`:
// how each operand's all_gathers keep their output for the backward pass (regathered: FSDP's
// weights, gathered again in backward).
// A collective matmul ring (TapeOptions::rings) is one node whose backward is its unfused
// pair's: einsum_reduce_scatter's gathers the gradient and contracts it, as a local einsum and
// a reduce_scatter would; all_gather_einsum's gathers its operand again (the ring never holds
// it whole) and contracts, which is the unfused pair's backward only where that operand is
// regathered anyway or nothing reads it in backward (the other operand needs no gradient).
// A plan whose ring is not one of those, or any ring without TapeOptions::rings, gives way to
// the cheapest candidate whose rings are.
Var planned_einsum(Var a, Var b, const Spec& out, Gathered keep_a = Gathered::kept, Gathered keep_b = Gathered::kept);
// Which collective matmul rings tape_plan may choose.
struct RingUse {
  bool scatter = false;                // einsum_reduce_scatter
  bool gather[2] = {false, false};     // all_gather_einsum gathering operand 0 (A) or 1 (B)
  bool allows(const Step& ring) const;
};
// The plan planned_einsum records for `c`: plan_matmul's choice when its rings are ones `rings`
// allows, else its cheapest candidate whose rings are and that fits (InputError when none does).
// `memo`: plan_matmul's.
Plan tape_plan(const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const PlanOptions& options,
               PlannerMemo* memo = nullptr, const RingUse& rings = {});

// The collectives (plan/step.h's transitions), each one step.
//   all_gather(x, d, G)        [.., D_{P G}, ..]  -> [.., D_P, ..]    G a suffix of d's axes
//   reduce_scatter(x, d, G)    [.., D_P, ..]{U_G} -> [.., D_{P G}, ..]
//   all_reduce(x, G)           [..]{U_G}          -> [..]
//   all_to_all(x, d, e, G)     [D_{P G}, E_Q]     -> [D_P, E_{Q G}]   G a suffix of d's axes
//   slice(x, d, G)             [.., D_P, ..]      -> [.., D_{P G}, ..] local; G unused by x
Var all_gather(Var x, std::string_view dim, const AxisList& axes, Gathered keep = Gathered::kept);
Var reduce_scatter(Var x, std::string_view dim, const AxisList& axes);
Var all_reduce(Var x, const AxisList& axes);
Var all_to_all(Var x, std::string_view from_dim, std::string_view to_dim, const AxisList& axes);
Var slice(Var x, std::string_view dim, const AxisList& axes);
// Any layout to any other of the same dimensions (plan_reshard), step by step.
Var reshard(Var x, const Spec& to);

// Elementwise, on whole values (no unreduced axes: ReLU(a + b) != ReLU(a) + ReLU(b)).
Var relu(Var x);
Var gelu(Var x);  // tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
Var silu(Var x);  // x * sigmoid(x)
Var tanh(Var x);
Var exp(Var x);
// SwiGLU's pairing: silu(gate) * up, both in the same spec.
Var swiglu(Var gate, Var up);
// a * b elementwise (gating), both in the same spec, whole. (Broadcasting: shape_ops.h's binary.)
Var mul(Var a, Var b);
// a + b, both in the same spec (unreduced axes allowed: partial sums add).
Var add(Var a, Var b);
// factor * x (unreduced axes allowed: it is linear), e.g. attention's 1/sqrt(d).
Var scale(Var x, double factor);
// The same tensor with dimension `from` named `to` (self-attention contracts a sequence
// with itself: rename T to S for the keys). No communication.
Var rename(Var x, std::string_view from, std::string_view to);
// Data each rank computes from its own shard of x, outside differentiation: x gets no
// gradient through it, nor does what is computed from such data alone (MoE routing's
// dispatch mask: which slot a token takes is a choice, not a function to differentiate).
// `fill` writes this rank's shard of the result (`spec`, global `shape`, zeros to start) from
// x's shard; symbolic tapes record the layout only. No communication: a local step named
// `function` (what fill computes, e.g. "route") that reads x's block and writes the result's.
using LocalData = std::function<void(const DistTensor& x, DistTensor& out)>;
Var data_from(Var x, const Spec& spec, Shape shape, const LocalData& fill, std::string function);

// Over the last dimension; no unreduced axes. The last dimension may be sharded: its rows'
// statistics are then all-reduced (reductions.h has these over any dimension).
Var softmax(Var x);
// (x - mean) / sqrt(var + eps) * scale + bias over the last dimension (biased variance);
// scale and bias are 1-D over that dimension, replicated (where the dimension is sharded,
// their gradients are also unreduced over its axes).
Var layer_norm(Var x, Var scale, Var bias, double eps = 1e-5);

// Rank-0 losses over all elements. The result is unreduced over the axes that shard x
// (and x's own unreduced axes): the logical loss is the sum over ranks of their parts.
Var sum(Var x);
Var mean(Var x);  // sum / global element count

}  // namespace shardmm::autodiff
