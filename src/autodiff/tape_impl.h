// The tape's insides, shared by the op files (private to the autodiff layer).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/plan/planner.h"

namespace shardmm::autodiff {

// A tensor as the tape sees it: its layout and, on executed tapes, this rank's shard.
// Shards are shared, never modified after they are made: one gradient may feed several
// inputs (add passes its gradient to both operands).
struct Value {
  Spec spec;
  std::shared_ptr<const DistTensor> data;  // null on symbolic tapes
};

struct Node;
// Receives the output gradient (any layout) and contributes the inputs' gradients
// through Tape::Impl::accumulate.
using Backward = std::function<void(Tape::Impl&, const Node&, const Value& grad)>;

struct Node {
  Value value;
  Shape shape;
  bool leaf = false;
  bool requires_grad = false;
  // Some op's backward reads this value (counted in TapeMemory::activations).
  bool saved = false;
  // Bytes an op keeps beside its inputs for the backward pass (layer norm's statistics).
  std::int64_t extra_saved_bytes = 0;
  // all_gather(.., Gathered::regathered): dropped when backward starts, then this step
  // run again from `inputs[0]` when a backward needs the value.
  std::optional<Step> regather;
  bool regathered = false;  // in this backward pass
  std::vector<int> inputs;
  Backward backward;
  // einsum()'s: its backward begins by aligning its gradient (Tape::backward_below).
  bool contraction = false;
  int scope = -1;              // Tape::set_scope's label when recorded
  std::optional<Value> grad;   // accumulated during backward
  AxisList arrived_unreduced;  // a leaf's: what its gradient was partial over before its reduction
  // The memory timeline (tape.h: Tape::memory_timeline), from what the tape holds: the bytes
  // of this rank's shard when it was made (executed: its buffer's), the forward op it is part
  // of, the last node that reads it, and the backward units its gradient lived in.
  std::int64_t bytes = 0;
  int op = -1;           // index into Impl::ops; leaves belong to none
  int last_reader = -1;  // the highest node id with this one among its inputs
  std::int64_t grad_bytes = 0;
  int grad_from = -1;      // index into Impl::units where its gradient appeared
  int grad_to = -1;        // where a non-leaf's gradient was passed on (a leaf's lives to the update)
  int regathered_in = -1;  // where a regathered value was gathered again
};

// A forward op on the timeline: consecutive nodes recorded under one scope (>= 0), or a single
// node recorded under none.
struct ForwardOp {
  int scope = -1;
  int first_node = 0;
  int last_node = 0;
};

// A backward unit on the timeline: a forward op's nodes run backwards, or a leaf's gradient
// brought into the leaf's spec.
struct BackwardUnit {
  int scope = -1;
  int node = -1;               // the node whose backward (or reduction) ran last
  int lowest_node = 0;         // the lowest node id it ran
  std::int64_t transient = 0;  // the largest buffer a step of it made
};

// What a backward pass below a contraction changed (Tape::backward_below), to splice onto a
// pass run down to it: the fields Tape::rewind resets, unit indices counted from the
// contraction's unit.
struct Tape::Below {
  struct Changed {
    int id = -1;
    std::optional<Value> grad;
    AxisList arrived_unreduced;
    bool regathered = false;
    std::int64_t grad_bytes = 0;
    int grad_from = -1, grad_to = -1, regathered_in = -1;
    std::optional<Value> value;  // a regathered one's
  };
  const Tape::Impl* tape = nullptr;  // whose forward pass, of `forward_nodes` nodes
  std::size_t forward_nodes = 0;
  int contraction = -1;
  Spec aligned;                     // the contraction's gradient as its backward begins
  std::vector<TapeEvent> events;    // recorded below
  std::vector<BackwardUnit> units;  // the first continues the contraction's
  std::vector<Changed> nodes;       // below the contraction, and the leaves above it
  int scope = -1;                   // the tape's after the pass
};

struct Tape::Impl {
  Communicator* comm = nullptr;  // null: symbolic
  Mesh mesh;
  TapeOptions options;
  PlanOptions plan_options;
  // A deque: references to nodes (Var::spec(), a backward's `self`) survive new nodes.
  std::deque<Node> nodes;
  std::vector<TapeEvent> events;
  std::vector<ForwardOp> ops;
  std::vector<BackwardUnit> units;
  bool regathering = false;  // a regather's step is no transient: its node counts it
  Phase phase = Phase::forward;
  int scope = -1;  // the label of what is recorded now (tape.h: set_scope)
  bool backward_done = false;
  // What backward changes beyond the nodes' gradient fields, for Tape::rewind: the events the
  // forward pass recorded, its last scope, and the regathered nodes' values before they were
  // gathered again.
  std::size_t forward_events = 0;
  int forward_scope = -1;
  std::vector<std::pair<int, Value>> forward_values;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  Impl(Communicator* c, const Mesh& m, TapeOptions o);

  bool symbolic() const { return comm == nullptr; }
  std::int64_t device() const;

  // ---- recording
  Node& node(Var v);
  const Node& node(int id) const { return nodes[static_cast<std::size_t>(id)]; }
  // A new node computed from `inputs`; requires_grad when any input does.
  Var add_node(Tape& tape, Value value, Shape shape, std::vector<int> inputs, Backward backward);
  // The value a backward reads, regathered first when it was dropped.
  const Value& saved_value(int id);

  // ---- steps (collectives, slice, to_partial, einsum): costed, recorded, executed
  // Runs one reshard-type step on `in` (already costed).
  Value run_step(Step step, const Value& in, const Shape& shape);
  // Runs a local einsum step (costed here) on a and b, producing `out` dims.
  Value run_einsum(const Value& a, const Shape& a_shape, const Value& b, const Shape& b_shape, const Spec& out,
                   const Shape& out_shape);
  // Records a costed step and, on executed tapes, runs it through a one-step Executor.
  Value record(Step&& step, const DimSizes& sizes, const Value& a, const Value* b, const Shape& shape);
  // plan_reshard, through options.plans when given.
  std::shared_ptr<const Plan> reshard_plan(const Spec& from, const Spec& to, const Shape& shape) const;
  // reshard_plan and run its steps; `v` unchanged when already in `to`.
  Value reshard(const Value& v, const Spec& to, const Shape& shape);
  // Costs a single reshard-type step with the plan layer's figures.
  void cost(Step& step, const Shape& shape) const;

  // ---- local work (OpKind::local): what ops compute on this rank's blocks (local_ops.h: LocalWork)
  // Seconds since the tape was built: executed events' start and end.
  double clock() const;
  // The bytes of the largest block of a value laid out as `spec` (device 0's): a local op's
  // traffic counts these, the same figure on every rank and on symbolic tapes.
  std::int64_t block_bytes(const Spec& spec, const Shape& shape) const;
  // Records a local step in the current phase and scope; executed tapes measure it from
  // `start_s` (clock()) to now.
  void record_local(std::string function, std::string tensor, std::int64_t bytes, double start_s);

  // ---- gradients
  // The gradient of a value in `spec`, brought to what a local backward needs: spec's
  // dimension sharding, whole (pending sums resolved here, as Megatron's f does).
  Value align(const Value& grad, const Spec& spec, const Shape& shape);
  void accumulate(int id, Value grad);
  // A new shard on this rank (executed tapes only).
  std::shared_ptr<DistTensor> make_shard(const Spec& spec, const Shape& shape) const;
  std::int64_t local_bytes(const Spec& spec, const Shape& shape) const;
  // The bytes `v` holds on this rank: its buffer's on executed tapes, its spec's shard's on
  // symbolic ones (the same figure: tests compare the two timelines).
  std::int64_t held_bytes(const Value& v, const Shape& shape) const;
  // The backward unit that `id`'s backward belongs to, opened when it is not the current one.
  void enter_unit(int id);
};

// The output spec of a local einsum on compatible shards (see einsum in tape.h); throws
// InputError naming the axis or dimension that breaks the rule.
Spec local_einsum_spec(const Mesh& mesh, const Spec& a, const Shape& a_shape, const Spec& b, const Shape& b_shape,
                       const std::vector<std::string>& out_dims, Shape* out_shape);

// Axes that shard a dimension of `spec`, in mesh order.
AxisList sharding_axes(const Spec& spec);

}  // namespace shardmm::autodiff
