// Ops that move data or contract shards: einsum (local and planned), the collectives,
// slice, reshard. Their backwards are the rules of tape.h: a layout change passes its
// gradient on unchanged; an einsum aligns its gradient and contracts it locally.
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <stdexcept>

#include "autodiff/local_ops.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/step_builder.h"

namespace shardmm::autodiff {

namespace {

std::string label(const Spec& s) { return s.tensor.empty() ? std::string("the tensor") : s.tensor; }

bool is_suffix(const AxisList& s, const AxisList& of) {
  return !s.empty() && s.size() <= of.size() &&
         std::equal(s.begin(), s.end(), of.end() - static_cast<std::ptrdiff_t>(s.size()));
}

// InputError when a letter of both a and b has a different size in each.
void check_sizes(const Mesh& mesh, const Spec& a, const Shape& a_shape, const Spec& b, const Shape& b_shape) {
  for (std::size_t i = 0; i < b.dims.size(); ++i) {
    const int j = a.find_dim(b.dims[i].name);
    if (j >= 0 && a_shape[static_cast<std::size_t>(j)] != b_shape[i]) {
      throw InputError("einsum: dimension '" + b.dims[i].name + "' has size " +
                       std::to_string(a_shape[static_cast<std::size_t>(j)]) + " in " + format_spec(a, mesh) + " but " +
                       std::to_string(b_shape[i]) + " in " + format_spec(b, mesh));
    }
  }
}

// Global sizes of every letter of a and b; InputError when a letter's sizes differ.
DimSizes letter_sizes(const Mesh& mesh, const Spec& a, const Shape& a_shape, const Spec& b, const Shape& b_shape) {
  check_sizes(mesh, a, a_shape, b, b_shape);
  DimSizes sizes;
  for (std::size_t i = 0; i < a.dims.size(); ++i) sizes[a.dims[i].name] = a_shape[i];
  for (std::size_t i = 0; i < b.dims.size(); ++i) sizes.emplace(b.dims[i].name, b_shape[i]);
  return sizes;
}

// Whether `letter` is one of letters[0, end): compared inline (a symbolic tape checks the letters
// of every einsum it records, a few characters each).
bool among(const std::vector<std::string>& letters, std::size_t end, std::string_view letter) {
  for (std::size_t i = 0; i < end; ++i) {
    if (same_letter(letters[i], letter)) return true;
  }
  return false;
}

// The two-operand contractions the planner handles: every letter of an operand is in the
// other operand or in the output, every output letter in an operand, none repeated.
void check_letters(const Mesh& mesh, const Spec& a, const Spec& b, const std::vector<std::string>& out_dims) {
  for (std::size_t i = 0; i < out_dims.size(); ++i) {
    if (among(out_dims, i, out_dims[i])) {
      throw InputError("einsum: output dimension '" + out_dims[i] + "' is named twice");
    }
    if (a.find_dim(out_dims[i]) < 0 && b.find_dim(out_dims[i]) < 0) {
      throw InputError("einsum: output dimension '" + out_dims[i] + "' is in neither " + format_spec(a, mesh) +
                       " nor " + format_spec(b, mesh));
    }
  }
  for (const auto& [x, y] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    for (const DimSpec& d : x->dims) {
      if (y->find_dim(d.name) < 0 && !among(out_dims, out_dims.size(), d.name)) {
        throw InputError("einsum: dimension '" + d.name + "' of " + format_spec(*x, mesh) +
                         " is in neither the other operand nor the output; sum it out first");
      }
    }
  }
}

// A costed reshard-type step applied to x: a node whose backward passes the gradient on.
Var step_node(Var x, Step step, Gathered keep = Gathered::kept) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& in = t.node(x);
  step.tensor = in.value.spec.tensor;
  Value out = t.run_step(step, in.value, in.shape);
  out.spec.tensor = in.value.spec.tensor;
  const Shape shape = in.shape;
  Var y = t.add_node(tape, std::move(out), shape, {x.id()}, [](Tape::Impl& impl, const Node& self, const Value& grad) {
    impl.accumulate(self.inputs[0], grad);
  });
  if (keep == Gathered::regathered) t.node(y).regather = step;
  return y;
}

Var single_step(Var x, OpKind op, AxisList axes, int dim = -1, int dst_dim = -1, Gathered keep = Gathered::kept) {
  Tape::Impl& t = x.tape().impl();
  Step step = make_step(op, x.spec(), std::move(axes), dim, dst_dim);
  t.cost(step, x.shape());
  return step_node(x, std::move(step), keep);
}

void check_axes(const Mesh& mesh, const AxisList& axes, const char* op) {
  if (axes.empty()) throw InputError(std::string(op) + ": no mesh axes given");
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= mesh.rank()) {
      throw InputError(std::string(op) + ": mesh axis index " + std::to_string(axes[i]) + " is not in mesh " +
                       mesh.to_string());
    }
    if (std::find(axes.begin(), axes.begin() + static_cast<std::ptrdiff_t>(i), axes[i]) !=
        axes.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw InputError(std::string(op) + ": mesh axis " + mesh.axis(axes[i]).name + " is named twice");
    }
  }
}

}  // namespace

Spec local_einsum_spec(const Mesh& mesh, const Spec& a, const Shape& a_shape, const Spec& b, const Shape& b_shape,
                       const std::vector<std::string>& out_dims, Shape* out_shape) {
  // A symbolic tape runs this for every einsum it records: the letters' sizes are read off the
  // shapes (no map built), the operands formatted only for a message.
  check_sizes(mesh, a, a_shape, b, b_shape);
  check_letters(mesh, a, b, out_dims);
  const auto what = [&] { return "einsum " + format_spec(a, mesh) + " @ " + format_spec(b, mesh); };
  const auto same_in_both = [&](const std::string& name, const char* role) {
    const AxisList& x = a.dims[static_cast<std::size_t>(a.find_dim(name))].axes;
    const AxisList& y = b.dims[static_cast<std::size_t>(b.find_dim(name))].axes;
    if (x != y) {
      throw InputError(what() + " cannot run locally: " + role + " dimension '" + name +
                       "' must be sharded alike in both operands (" + (x.empty() ? "replicated" : mesh.axis_names(x)) +
                       " vs " + (y.empty() ? "replicated" : mesh.axis_names(y)) +
                       "); reshard one, or use planned_einsum");
    }
    return x;
  };
  Spec c;
  c.tensor = a.tensor + b.tensor;
  if (out_shape) out_shape->clear();
  for (const std::string& n : out_dims) {
    const bool in_a = a.find_dim(n) >= 0, in_b = b.find_dim(n) >= 0;
    AxisList axes = in_a && in_b ? same_in_both(n, "batch")
                                 : (in_a ? a : b).dims[static_cast<std::size_t>((in_a ? a : b).find_dim(n))].axes;
    c.dims.push_back({n, std::move(axes)});
    if (out_shape)
      out_shape->push_back(in_a ? a_shape[static_cast<std::size_t>(a.find_dim(n))]
                                : b_shape[static_cast<std::size_t>(b.find_dim(n))]);
  }
  for (const DimSpec& d : a.dims) {
    if (b.find_dim(d.name) >= 0 && !among(out_dims, out_dims.size(), d.name)) {
      const AxisList axes = same_in_both(d.name, "contracted");
      c.unreduced.insert(c.unreduced.end(), axes.begin(), axes.end());
    }
  }
  for (int x : a.unreduced) {
    if (b.is_unreduced(x)) {
      throw InputError(what() + ": both operands are unreduced over " + mesh.axis(x).name +
                       "; the product of two partial sums is not the partial sum of the product (reduce one first)");
    }
  }
  c.unreduced.insert(c.unreduced.end(), a.unreduced.begin(), a.unreduced.end());
  c.unreduced.insert(c.unreduced.end(), b.unreduced.begin(), b.unreduced.end());
  std::sort(c.unreduced.begin(), c.unreduced.end());
  try {
    validate_spec(c, mesh);
  } catch (const InputError& e) {
    throw InputError(what() + " cannot run locally: its output would be " + format_spec(c, mesh) + ", and " +
                     e.headline(field) + "; reshard an operand, or use planned_einsum");
  }
  return c;
}

// The backward of C = A (x) B, the node `self` over the operands A and B: dA = dC (x) B and
// dB = A (x) dC, each contracted locally in its operand's own dimension order and contributed to
// it. `g` is dC in the layout the contraction made it; `seen[i]`, where given, is operand i as
// the contraction read it (a ring's gathered copy), else the operand's saved value.
void contraction_backward(Tape::Impl& impl, const Node& self, const Value& g, std::array<const Value*, 2> seen) {
  for (std::size_t t = 0; t < 2; ++t) {
    const int target = self.inputs[t], other = self.inputs[1 - t];
    const Node& tn = impl.node(target);
    if (!tn.requires_grad) continue;
    const Value& ov = seen[1 - t] ? *seen[1 - t] : impl.saved_value(other);
    const Shape& os = impl.node(other).shape;
    const bool target_first = t == 0;
    const Value& x = target_first ? g : ov;
    const Value& y = target_first ? ov : g;
    const Shape& xs = target_first ? self.shape : os;
    const Shape& ys = target_first ? os : self.shape;
    Spec spec = local_einsum_spec(impl.mesh, x.spec, xs, y.spec, ys, dim_names(tn.value.spec), nullptr);
    spec.tensor = "d" + tn.value.spec.tensor;
    impl.accumulate(target, impl.run_einsum(x, xs, y, ys, spec, tn.shape));
  }
}

Var einsum(Var a, Var b, const std::vector<std::string>& out_dims) {
  Tape& tape = same_tape(a, b, "einsum");
  Tape::Impl& t = tape.impl();
  Shape shape;
  const Spec out = local_einsum_spec(t.mesh, a.spec(), a.shape(), b.spec(), b.shape(), out_dims, &shape);
  Value c = t.run_einsum(t.node(a).value, a.shape(), t.node(b).value, b.shape(), out, shape);
  Node& na = t.node(a);
  Node& nb = t.node(b);
  // Each operand's gradient is contracted from the other operand's value.
  if (nb.requires_grad) na.saved = true;
  if (na.requires_grad) nb.saved = true;
  const Var out_var = t.add_node(tape, std::move(c), shape, {a.id(), b.id()},
                                 [](Tape::Impl& impl, const Node& self, const Value& grad) {
                                   contraction_backward(impl, self, impl.align(grad, self.value.spec, self.shape), {});
                                 });
  t.node(out_var).contraction = true;
  return out_var;
}

// A collective matmul ring (plan/step.h) as one node over the operands a and b; its backward
// is the unfused pair's (planned_einsum in tape.h says where that holds).
Var ring_node(Var a, Var b, const Step& ring, const std::vector<std::string>& out_dims) {
  Tape& tape = same_tape(a, b, "ring");
  Tape::Impl& t = tape.impl();
  Node& na = t.node(a);
  Node& nb = t.node(b);
  if (nb.requires_grad) na.saved = true;
  if (na.requires_grad) nb.saved = true;
  const DimSizes sizes = letter_sizes(t.mesh, a.spec(), a.shape(), b.spec(), b.shape());
  Shape shape;
  for (const std::string& n : out_dims) shape.push_back(sizes.at(n));
  Value c = t.record(Step(ring), sizes, na.value, &nb.value, shape);
  c.spec = ring.to;
  return t.add_node(tape, std::move(c), shape, {a.id(), b.id()},
                    [ring](Tape::Impl& impl, const Node& self, const Value& grad) {
                      if (ring.op == OpKind::einsum_reduce_scatter) {
                        // The reduce_scatter's backward gathers the gradient back to the product's
                        // layout, where the einsum's takes it.
                        Spec product = ring.to;
                        AxisList& axes = product.dims[static_cast<std::size_t>(ring.dim)].axes;
                        axes.resize(axes.size() - ring.axes.size());  // the scattered axes are its minor ones
                        contraction_backward(impl, self, impl.align(grad, product, self.shape), {});
                        return;
                      }
                      const int r = ring.ring_operand;
                      const int gathered_id = self.inputs[static_cast<std::size_t>(r)];
                      std::optional<Value> gathered;
                      if (impl.node(self.inputs[static_cast<std::size_t>(1 - r)]).requires_grad) {
                        const Node& source = impl.node(gathered_id);
                        Step gather = make_step(OpKind::all_gather, source.value.spec, ring.axes, ring.dim);
                        const Shape source_shape = source.shape;
                        impl.cost(gather, source_shape);
                        gather.tensor = source.value.spec.tensor;
                        gathered = impl.run_step(gather, impl.saved_value(gathered_id), source_shape);
                        gathered->spec.tensor = impl.node(gathered_id).value.spec.tensor;
                      }
                      std::array<const Value*, 2> seen{};
                      if (gathered) seen[static_cast<std::size_t>(r)] = &*gathered;
                      contraction_backward(impl, self, impl.align(grad, self.value.spec, self.shape), seen);
                    });
}

bool RingUse::allows(const Step& ring) const {
  if (ring.op == OpKind::einsum_reduce_scatter) return scatter;
  return ring.op == OpKind::all_gather_einsum && gather[ring.ring_operand == 1 ? 1 : 0];
}

Plan tape_plan(const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const PlanOptions& options,
               PlannerMemo* memo, const RingUse& rings) {
  // Without rings the planner weighs and builds serial plans only; with some allowed, the
  // cheapest whose rings are may be any candidate.
  const bool any_ring = rings.scatter || rings.gather[0] || rings.gather[1];
  MatmulPlanning planning = plan_matmul(mesh, c, sizes, options, memo, any_ring ? Candidates::all : Candidates::serial);
  const auto usable = [&](const Plan& p) {
    return std::all_of(p.steps.begin(), p.steps.end(),
                       [&](const Step& s) { return !is_collective_matmul(s.op) || rings.allows(s); });
  };
  // Moved out, not copied: solve plans tens of thousands of contractions.
  if (planning.chosen >= 0 && usable(planning.candidates[static_cast<std::size_t>(planning.chosen)])) {
    return std::move(planning.candidates[static_cast<std::size_t>(planning.chosen)]);
  }
  for (Plan& p : planning.candidates) {
    if (p.fits_memory && usable(p)) return std::move(p);
  }
  throw InputError("planned_einsum: no plan for " + format_contraction(c, mesh));
}

Var planned_einsum(Var a, Var b, const Spec& out, Gathered keep_a, Gathered keep_b) {
  Tape& tape = same_tape(a, b, "planned_einsum");
  Tape::Impl& t = tape.impl();
  validate_spec(out, t.mesh);
  Contraction c;
  c.a = a.spec();
  c.b = b.spec();
  c.out = out;
  c.out_tensor = out.tensor.empty() ? c.a.tensor + c.b.tensor : out.tensor;
  for (const DimSpec& d : out.dims) c.out_dims.push_back(d.name);
  check_letters(t.mesh, c.a, c.b, c.out_dims);
  const DimSizes sizes = letter_sizes(t.mesh, c.a, a.shape(), c.b, b.shape());
  RingUse rings;
  if (t.options.rings) {
    rings.scatter = true;
    // all_gather_einsum's backward gathers its operand again: the unfused pair's where that one is
    // regathered anyway, or where no backward reads it (the other operand needs no gradient).
    rings.gather[0] = keep_a == Gathered::regathered || !t.node(b).requires_grad;
    rings.gather[1] = keep_b == Gathered::regathered || !t.node(a).requires_grad;
  }
  std::string key;
  if (t.options.plans && t.options.plans->keeps_contractions()) {
    key = format_contraction(c, t.mesh) + " " + to_string(t.plan_options.dtype);
    for (const auto& [letter, size] : sizes) key += " " + letter + "=" + std::to_string(size);
    key += " rings " + std::to_string(rings.scatter) + std::to_string(rings.gather[0]) + std::to_string(rings.gather[1]);
  }
  const std::shared_ptr<const Plan> shared =
      t.options.plans ? t.options.plans->plan(key, t.plan_options.dtype,
                                              [&](PlannerMemo& memo) {
                                                return tape_plan(t.mesh, c, sizes, t.plan_options, &memo, rings);
                                              })
                      : std::make_shared<const Plan>(tape_plan(t.mesh, c, sizes, t.plan_options, nullptr, rings));
  const Plan& plan = *shared;
  Var current[3] = {a, b, Var()};
  for (const Step& step : plan.steps) {
    if (multiplies(step.op)) {
      current[2] = step.op == OpKind::einsum ? einsum(current[0], current[1], c.out_dims)
                                             : ring_node(current[0], current[1], step, c.out_dims);
      t.node(current[2]).value.spec.tensor = c.out_tensor;
      if (!(current[2].spec() == step.to)) {
        throw std::logic_error(std::string("planned_einsum: the planner's ") + to_string(step.op) + " gives " +
                               format_spec(step.to, t.mesh) + ", the tape's " + format_spec(current[2].spec(), t.mesh));
      }
    } else {
      Var& x = current[static_cast<std::size_t>(step.operand)];
      const Gathered keep = step.operand == 0 ? keep_a : step.operand == 1 ? keep_b : Gathered::kept;
      x = step_node(x, step, step.op == OpKind::all_gather ? keep : Gathered::kept);
    }
  }
  return current[2];
}

Var all_gather(Var x, std::string_view dim, const AxisList& axes, Gathered keep) {
  const Mesh& mesh = x.tape().mesh();
  check_axes(mesh, axes, "all_gather");
  const int d = dim_index(x.spec(), dim, mesh, "all_gather");
  if (!is_suffix(axes, x.spec().dims[static_cast<std::size_t>(d)].axes)) {
    throw InputError("all_gather over " + mesh.axis_names(axes) + " on " + format_spec(x.spec(), mesh) +
                     ": the axes must be the minor-most ones sharding dimension '" + std::string(dim) +
                     "' (use reshard for other moves)");
  }
  return single_step(x, OpKind::all_gather, axes, d, -1, keep);
}

Var reduce_scatter(Var x, std::string_view dim, const AxisList& axes) {
  const Mesh& mesh = x.tape().mesh();
  check_axes(mesh, axes, "reduce_scatter");
  const int d = dim_index(x.spec(), dim, mesh, "reduce_scatter");
  for (int a : axes) {
    if (!x.spec().is_unreduced(a)) {
      throw InputError("reduce_scatter over " + mesh.axis_names(axes) + " on " + format_spec(x.spec(), mesh) + ": " +
                       label(x.spec()) + " is not unreduced over " + mesh.axis(a).name + " (nothing to sum)");
    }
  }
  return single_step(x, OpKind::reduce_scatter, axes, d);
}

Var all_reduce(Var x, const AxisList& axes) {
  const Mesh& mesh = x.tape().mesh();
  check_axes(mesh, axes, "all_reduce");
  for (int a : axes) {
    if (!x.spec().is_unreduced(a)) {
      throw InputError("all_reduce over " + mesh.axis_names(axes) + " on " + format_spec(x.spec(), mesh) + ": " +
                       label(x.spec()) + " is not unreduced over " + mesh.axis(a).name + " (nothing to sum)");
    }
  }
  AxisList sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  return single_step(x, OpKind::all_reduce, sorted);
}

Var all_to_all(Var x, std::string_view from_dim, std::string_view to_dim, const AxisList& axes) {
  const Mesh& mesh = x.tape().mesh();
  check_axes(mesh, axes, "all_to_all");
  const int d = dim_index(x.spec(), from_dim, mesh, "all_to_all");
  const int e = dim_index(x.spec(), to_dim, mesh, "all_to_all");
  if (d == e) throw InputError("all_to_all: source and destination are both dimension '" + std::string(from_dim) + "'");
  if (!is_suffix(axes, x.spec().dims[static_cast<std::size_t>(d)].axes)) {
    throw InputError("all_to_all over " + mesh.axis_names(axes) + " on " + format_spec(x.spec(), mesh) +
                     ": the axes must be the minor-most ones sharding dimension '" + std::string(from_dim) + "'");
  }
  return single_step(x, OpKind::all_to_all, axes, d, e);
}

Var slice(Var x, std::string_view dim, const AxisList& axes) {
  const Mesh& mesh = x.tape().mesh();
  check_axes(mesh, axes, "slice");
  const int d = dim_index(x.spec(), dim, mesh, "slice");
  for (int a : axes) {
    if (x.spec().uses(a)) {
      throw InputError("slice over " + mesh.axis_names(axes) + " on " + format_spec(x.spec(), mesh) + ": mesh axis " +
                       mesh.axis(a).name + " is already in use (a mesh axis can shard only one dimension)");
    }
  }
  return single_step(x, OpKind::slice, axes, d);
}

Var reshard(Var x, const Spec& to) {
  Tape::Impl& t = x.tape().impl();
  validate_spec(to, t.mesh);
  check_same_tensor(x.spec(), to, t.mesh);
  const std::shared_ptr<const Plan> plan = t.reshard_plan(x.spec(), to, x.shape());
  for (const Step& s : plan->steps) x = step_node(x, s);
  return x;
}

}  // namespace shardmm::autodiff
