// The tape: nodes, steps run through the runtime's executor, gradient layouts, backward.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "autodiff/tape_impl.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/step_builder.h"
#include "shardmm/runtime/kernels.h"

namespace shardmm::autodiff {

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::update:
      return "update";
  }
  return "?";
}

PlanCache::PlanCache(Keep keep) : keep_(keep) {}
PlanCache::~PlanCache() = default;

std::shared_ptr<const Plan> PlanCache::plan(const std::string& key, DType dtype,
                                            const std::function<Plan(PlannerMemo&)>& make) {
  std::unique_ptr<PlannerMemo> memo;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (keeps_contractions()) {
      if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    // The memo this thread gave back last, if idle: threads given runs of related contractions
    // then find what they planned before (each memo learns its own thread's).
    const auto ours = [&](const IdleMemo& m) { return m.dtype == dtype && m.thread == std::this_thread::get_id(); };
    auto idle = std::find_if(idle_.begin(), idle_.end(), ours);
    if (idle == idle_.end())
      idle = std::find_if(idle_.begin(), idle_.end(), [&](const IdleMemo& m) { return m.dtype == dtype; });
    if (idle != idle_.end()) {
      memo = std::move(idle->memo);
      idle_.erase(idle);
    }
  }
  if (!memo) memo = std::make_unique<PlannerMemo>();
  // Given back however planning ends: what it remembers is complete entries only.
  struct GiveBack {
    PlanCache& cache;
    DType dtype;
    std::unique_ptr<PlannerMemo>& memo;
    ~GiveBack() {
      const std::lock_guard<std::mutex> lock(cache.mutex_);
      cache.idle_.push_back({dtype, std::this_thread::get_id(), std::move(memo)});
    }
  } give_back{*this, dtype, memo};
  // Outside the lock: tapes on other threads plan other contractions meanwhile.
  auto made = std::make_shared<const Plan>(make(*memo));
  if (!keeps_contractions()) return made;
  const std::lock_guard<std::mutex> lock(mutex_);
  return plans_.emplace(key, std::move(made)).first->second;
}

void PlanCache::forget_contractions() {
  const std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
  for (IdleMemo& m : idle_) m.memo->forget_contractions();
  for (ReshardPart& part : reshards_) {
    const std::lock_guard<std::mutex> part_lock(part.mutex);
    part.named.clear();
  }
}

std::size_t PlanCache::reshard_hash(const Spec& from, const Spec& to, const Shape& shape, DType dtype) {
  // FNV-1a over the numbers: the layouts, the shape and the dtype (SameLayouts' key).
  std::uint64_t h = 14695981039346656037ull;
  const auto add = [&h](std::uint64_t n) { h = (h ^ n) * 1099511628211ull; };
  const auto add_axes = [&](const AxisList& axes) {
    for (int a : axes) add(static_cast<std::uint64_t>(a));
    add(~std::uint64_t{0});
  };
  for (const Spec* s : {&from, &to}) {
    for (const DimSpec& d : s->dims) add_axes(d.axes);
    add_axes(s->unreduced);
  }
  for (std::int64_t n : shape) add(static_cast<std::uint64_t>(n));
  add(static_cast<std::uint64_t>(dtype));
  return static_cast<std::size_t>(h);
}

Plan PlanCache::renamed(const Plan& plan, const Reshard& planned, const Spec& from) {
  const auto rename = [&](Spec& s) {
    if (s.tensor != planned.from.tensor || s.dims.size() != from.dims.size())
      throw std::logic_error("PlanCache: a reshard plan of " + planned.from.tensor + " names " + s.tensor +
                             " or other dimensions; it cannot be renamed");
    s.tensor = from.tensor;
    for (std::size_t d = 0; d < s.dims.size(); ++d) s.dims[d].name = from.dims[d].name;
  };
  Plan out = plan;
  for (Step& step : out.steps) {
    step.tensor = from.tensor;
    rename(step.from);
    rename(step.to);
  }
  rename(out.output);
  return out;
}

std::shared_ptr<const Plan> PlanCache::reshard(const Mesh& mesh, const Spec& from, const Spec& to, const Shape& shape,
                                               const PlanOptions& options) {
  const ReshardQuery query{from, to, shape, options.dtype, reshard_hash(from, to, shape, options.dtype)};
  ReshardPart& part = reshards_[query.hash % reshards_.size()];
  const Reshard* planned = nullptr;  // the plan of the same layouts: kept as long as the cache
  std::shared_ptr<const Plan> plan;
  {
    const std::lock_guard<std::mutex> lock(part.mutex);
    if (const auto it = part.named.find(query); it != part.named.end()) return it->second;
    if (const auto it = part.unnamed.find(query); it != part.unnamed.end()) {
      planned = &it->first;
      plan = it->second;
    }
  }
  std::shared_ptr<const Plan> made;
  if (planned) {
    // What plan_reshard checks of the names before it plans.
    validate_spec(from, mesh);
    validate_spec(to, mesh);
    check_same_tensor(from, to, mesh);
    made = std::make_shared<const Plan>(renamed(*plan, *planned, from));
  } else {
    made = std::make_shared<const Plan>(plan_reshard(mesh, from, to, shape, options));
  }
  const std::lock_guard<std::mutex> lock(part.mutex);
  part.unnamed.try_emplace(Reshard{from, to, shape, options.dtype, query.hash}, made);
  return part.named.emplace(Reshard{from, to, shape, options.dtype, query.hash}, std::move(made)).first->second;
}

AxisList sharding_axes(const Spec& spec) {
  AxisList out;
  for (const DimSpec& d : spec.dims) out.insert(out.end(), d.axes.begin(), d.axes.end());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// Every dimension's global size by name, for the executor.
void add_sizes(DimSizes& sizes, const Spec& spec, const Shape& shape) {
  for (std::size_t i = 0; i < spec.dims.size(); ++i) sizes[spec.dims[i].name] = shape[i];
}

bool contains(const AxisList& list, int axis) { return std::find(list.begin(), list.end(), axis) != list.end(); }

template <class T>
void add_into(T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

// ---------------------------------------------------------------- Impl

Tape::Impl::Impl(Communicator* c, const Mesh& m, TapeOptions o) : comm(c), mesh(m), options(std::move(o)) {
  if (comm && options.dtype != DType::f32 && options.dtype != DType::f64) {
    throw InputError(std::string("an executed tape computes in f32 or f64; got ") + to_string(options.dtype));
  }
  if (!comm && (options.device < 0 || options.device >= mesh.device_count())) {
    throw InputError("the symbolic tape's device " + std::to_string(options.device) + " is not in mesh " +
                     mesh.to_string() + " (devices 0.." + std::to_string(mesh.device_count() - 1) + ")");
  }
  plan_options.dtype = options.dtype;
  plan_options.hw = options.hw;
  // Room for a recorded op's forward and backward at once (solve records tens of thousands of
  // tapes of one op each): growing the events a few at a time reallocated them 4-5 times a tape.
  events.reserve(32);
}

std::int64_t Tape::Impl::device() const { return comm ? comm->rank() : options.device; }

Node& Tape::Impl::node(Var v) {
  if (!v.valid()) throw InputError("an op was given an empty Var (default-constructed, never assigned)");
  return nodes[static_cast<std::size_t>(v.id())];
}

Var Tape::Impl::add_node(Tape& tape, Value value, Shape shape, std::vector<int> inputs, Backward backward) {
  if (backward_done) throw InputError("this tape has run backward(); record a new program on a new tape");
  Node n;
  n.value = std::move(value);
  n.shape = std::move(shape);
  for (int i : inputs) n.requires_grad = n.requires_grad || node(i).requires_grad;
  n.inputs = std::move(inputs);
  n.backward = std::move(backward);
  n.scope = scope;
  n.bytes = held_bytes(n.value, n.shape);
  const int id = static_cast<int>(nodes.size());
  for (int i : n.inputs) nodes[static_cast<std::size_t>(i)].last_reader = id;
  if (n.backward) {
    if (ops.empty() || scope < 0 || ops.back().scope != scope) ops.push_back({scope, id, id});
    ops.back().last_node = id;
    n.op = static_cast<int>(ops.size()) - 1;
  }
  nodes.push_back(std::move(n));
  return make_var(&tape, id);
}

std::shared_ptr<DistTensor> Tape::Impl::make_shard(const Spec& spec, const Shape& shape) const {
  return std::make_shared<DistTensor>(mesh, device(), spec, shape, options.dtype);
}

std::int64_t Tape::Impl::local_bytes(const Spec& spec, const Shape& shape) const {
  return checked_mul(local_elements(mesh, spec, shape, device()), dtype_bytes(options.dtype), "a shard's bytes");
}

std::int64_t Tape::Impl::held_bytes(const Value& v, const Shape& shape) const {
  return v.data ? v.data->buffer().bytes() : local_bytes(v.spec, shape);
}

void Tape::Impl::enter_unit(int id) {
  const Node& n = node(id);
  const bool same = !units.empty() && (n.leaf ? units.back().node == id
                                              : !node(units.back().node).leaf && node(units.back().node).op == n.op);
  if (!same) units.push_back({n.scope, id, id, 0});
  units.back().node = id;
  units.back().lowest_node = id;
}

void Tape::Impl::cost(Step& step, const Shape& shape) const { cost_step(step, mesh, shape, plan_options); }

Value Tape::Impl::record(Step&& step, const DimSizes& sizes, const Value& a, const Value* b, const Shape& shape) {
  Value out{step.to, nullptr};
  TraceEvent measured;
  if (!symbolic()) {
    Plan plan;
    plan.steps = {step};
    const double start = clock();
    Executor exec(*comm, plan, sizes, options.dtype);
    exec.run(*a.data, b ? b->data.get() : nullptr);
    out.data = std::make_shared<DistTensor>(exec.release());
    measured = exec.trace().at(0);
    measured.start_s = start;
    measured.end_s = clock();
  }
  if (phase == Phase::backward && !regathering && !units.empty()) {
    units.back().transient = std::max(units.back().transient, held_bytes(out, shape));
  }
  // The step moves into the event, made in place (not a temporary moved in): a symbolic
  // recording's events are most of what it copies.
  TapeEvent& event = events.emplace_back();
  event.phase = phase;
  event.step = std::move(step);
  event.executed = !symbolic();
  event.measured = std::move(measured);
  event.scope = scope;
  return out;
}

double Tape::Impl::clock() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

std::int64_t Tape::Impl::block_bytes(const Spec& spec, const Shape& shape) const {
  return checked_mul(max_local_elements(mesh, spec, shape), dtype_bytes(options.dtype), "a block's bytes");
}

const std::vector<LocalFunction>& local_functions() {
  static const std::vector<LocalFunction> functions = {
      {"relu", true, true},        {"gelu", true, true},        {"silu", true, true},
      {"tanh", true, true},        {"exp", true, true},         {"swiglu", true, true},
      {"scale", true, true},       {"rename", true, true},      {"add", true, true},
      {"sub", true, true},         {"mul", true, true},         {"transpose", true, true},
      {"split_dim", true, true},   {"merge_dims", true, true},  {"reduce_sum", true, true},
      {"reduce_mean", true, true}, {"reduce_max", true, true},  {"softmax", true, true},
      {"layer_norm", true, true},  {"rms_norm", true, true},    {"causal_mask", true, true},
      {"sum", true, true},         {"mean", true, true},        {"route", true, false},
      {"accumulate", false, true}, {"sgd", true, false},        {"adam", true, false},
  };
  return functions;
}

void Tape::Impl::record_local(std::string function, std::string tensor, std::int64_t bytes, double start_s) {
  const bool backward = phase == Phase::backward;
  const auto& known = local_functions();
  if (std::none_of(known.begin(), known.end(), [&](const LocalFunction& f) {
        return f.name == function && (backward ? f.backward : f.forward);
      })) {
    throw std::logic_error("record_local: '" + local_rate_key(function, backward) +
                           "' is not in autodiff::local_functions(); list it there so that calibration measures it");
  }
  TapeEvent ev{phase, local_step(std::move(function), std::move(tensor), backward, bytes, options.dtype, options.hw),
               false, {}, scope};
  if (!symbolic()) {
    ev.executed = true;
    ev.measured.op = OpKind::local;
    ev.measured.tensor = ev.step.tensor;
    ev.measured.start_s = start_s;
    ev.measured.end_s = clock();
  }
  events.push_back(std::move(ev));
}

Value Tape::Impl::run_step(Step step, const Value& in, const Shape& shape) {
  DimSizes sizes;  // for the executor only
  if (!symbolic()) add_sizes(sizes, step.from, shape);
  step.operand = 0;
  return record(std::move(step), sizes, in, nullptr, shape);
}

Value Tape::Impl::run_einsum(const Value& a, const Shape& a_shape, const Value& b, const Shape& b_shape,
                             const Spec& out, const Shape& out_shape) {
  Step step;
  step.op = OpKind::einsum;
  step.tensor = out.tensor;
  step.operand = 2;
  step.from = a.spec;
  step.from_b = b.spec;
  step.to = out;
  cost_einsum(step, mesh, a_shape, b_shape, out_shape, plan_options);
  DimSizes sizes;  // for the executor only
  if (!symbolic()) {
    add_sizes(sizes, a.spec, a_shape);
    add_sizes(sizes, b.spec, b_shape);
    add_sizes(sizes, out, out_shape);
  }
  return record(std::move(step), sizes, a, &b, out_shape);
}

std::shared_ptr<const Plan> Tape::Impl::reshard_plan(const Spec& from, const Spec& to, const Shape& shape) const {
  return options.plans ? options.plans->reshard(mesh, from, to, shape, plan_options)
                       : std::make_shared<const Plan>(plan_reshard(mesh, from, to, shape, plan_options));
}

Value Tape::Impl::reshard(const Value& v, const Spec& to, const Shape& shape) {
  if (v.spec == to) return v;
  const std::shared_ptr<const Plan> plan = reshard_plan(v.spec, to, shape);
  Value current = v;
  for (const Step& s : plan->steps) current = run_step(s, current, shape);
  current.spec.tensor = v.spec.tensor;
  return current;
}

Value Tape::Impl::align(const Value& grad, const Spec& spec, const Shape& shape) {
  Spec target;
  target.tensor = grad.spec.tensor;
  target.dims = spec.dims;
  return reshard(grad, target, shape);
}

void Tape::Impl::accumulate(int id, Value grad) {
  Node& n = nodes[static_cast<std::size_t>(id)];
  if (!n.requires_grad) return;
  grad.spec.tensor = "d" + n.value.spec.tensor;
  // Every contribution is first brought to the value's dimension sharding (the reshard is the
  // contributing op's, decided by it alone); the contributions then add up as partial sums
  // over the union of their unreduced axes, which takes no step: a contribution not pending
  // over some of those axes is added where to_partial would keep it (group rank 0 over them)
  // and nowhere else. A value's gradient thus reaches its producer in the value's layout,
  // partial over exactly the axes some consumer left it partial over, whatever order they ran
  // in, and each contribution costs what its op costs alone (solve/ relies on both).
  Spec whole;
  whole.tensor = grad.spec.tensor;
  whole.dims = n.value.spec.dims;
  Spec mine = whole;
  const AxisList used = sharding_axes(mine);
  for (int a : grad.spec.unreduced) {
    if (!contains(used, a)) mine.unreduced.push_back(a);
  }
  // Pending sums stay pending (other contributions may share their reduction) unless
  // reducing them on the way costs no more than moving them and reducing them after: a
  // contribution to gather is reduced first, while it is small.
  if (!(mine == whole) && !(grad.spec == mine)) {
    const auto time = [&](const Spec& from, const Spec& to) {
      return from == to ? 0.0 : reshard_plan(from, to, n.shape)->total_time_s;
    };
    if (time(grad.spec, whole) <= time(grad.spec, mine) + time(mine, whole)) mine = whole;
  }
  grad = reshard(grad, mine, n.shape);
  if (!n.grad) {
    n.grad_bytes = held_bytes(grad, n.shape);
    n.grad_from = static_cast<int>(units.size()) - 1;
    n.grad = std::move(grad);
    return;
  }
  Value& have = *n.grad;
  Spec target = mine;
  for (int a : have.spec.unreduced) {
    if (!contains(target.unreduced, a)) target.unreduced.push_back(a);
  }
  std::sort(target.unreduced.begin(), target.unreduced.end());
  // The sum is a local step (kGradientSumBlocks): a copy of the first contribution (or zeros)
  // and an add of the second.
  const double start = clock();
  Value sum{target, nullptr};
  if (!symbolic()) {
    const auto kept_here = [&](const Spec& s) {
      AxisList missing;
      for (int a : target.unreduced) {
        if (!contains(s.unreduced, a)) missing.push_back(a);
      }
      return missing.empty() || mesh.group_rank(device(), missing) == 0;
    };
    auto data = make_shard(target, n.shape);
    const auto bytes = static_cast<std::size_t>(data->buffer().bytes());
    if (kept_here(have.spec)) {
      std::memcpy(data->data(), have.data->data(), bytes);
    } else {
      std::memset(data->data(), 0, bytes);
    }
    if (kept_here(grad.spec)) {
      if (options.dtype == DType::f32) {
        add_into(data->buffer().as<float>(), grad.data->buffer().as<float>(), data->elements());
      } else {
        add_into(data->buffer().as<double>(), grad.data->buffer().as<double>(), data->elements());
      }
    }
    sum.data = std::move(data);
  }
  record_local("accumulate", grad.spec.tensor,
               checked_mul(kGradientSumBlocks, block_bytes(target, n.shape), "a gradient sum's bytes"), start);
  n.grad = std::move(sum);
}

const Value& Tape::Impl::saved_value(int id) {
  Node& n = nodes[static_cast<std::size_t>(id)];
  if (n.regather && phase == Phase::backward && !n.regathered) {
    const int source = n.inputs.at(0);
    const Value& from = saved_value(source);
    regathering = true;
    n.value = run_step(*n.regather, from, node(source).shape);
    regathering = false;
    n.regathered = true;
    n.regathered_in = static_cast<int>(units.size()) - 1;
  }
  return n.value;
}

// ---------------------------------------------------------------- Tape, Var

Tape::Tape(Communicator& comm, TapeOptions options)
    : impl_(std::make_unique<Impl>(&comm, comm.mesh(), std::move(options))) {}
Tape::Tape(const Mesh& mesh, TapeOptions options) : impl_(std::make_unique<Impl>(nullptr, mesh, std::move(options))) {}
Tape::~Tape() = default;

void Tape::rewind() {
  Impl& t = *impl_;
  // An executed tape's gradients and updates have changed its ranks' data.
  if (!symbolic()) throw std::logic_error("Tape::rewind: only a symbolic tape goes back");
  if (!t.backward_done) return;
  for (Node& n : t.nodes) {
    n.grad.reset();
    n.arrived_unreduced.clear();
    n.regathered = false;
    n.grad_bytes = 0;
    n.grad_from = -1;
    n.grad_to = -1;
    n.regathered_in = -1;
  }
  for (auto& [id, value] : t.forward_values) t.nodes[static_cast<std::size_t>(id)].value = std::move(value);
  t.forward_values.clear();
  t.events.resize(t.forward_events);
  t.units.clear();
  t.phase = Phase::forward;
  t.scope = t.forward_scope;
  t.regathering = false;
  t.backward_done = false;
}

Var Tape::var(int id) {
  if (id < 0 || id >= static_cast<int>(impl_->nodes.size())) {
    throw std::logic_error("Tape::var: no value " + std::to_string(id) + " on a tape of " +
                           std::to_string(impl_->nodes.size()));
  }
  return Var(this, id);
}

bool Tape::symbolic() const { return impl_->symbolic(); }
const Mesh& Tape::mesh() const { return impl_->mesh; }
DType Tape::dtype() const { return impl_->options.dtype; }

Spec Tape::spec(std::string_view text) const { return parse_spec(text, impl_->mesh); }

AxisList Tape::axes(std::string_view names) const {
  const Mesh& mesh = impl_->mesh;
  // "dp,tp" names axes by comma; "XY" is a run of one-character names.
  std::vector<std::string> parts;
  if (names.find(',') != std::string_view::npos || !mesh.single_char_names()) {
    std::size_t from = 0;
    while (true) {
      const std::size_t to = std::min(names.find(',', from), names.size());
      parts.emplace_back(names.substr(from, to - from));
      if (to == names.size()) break;
      from = to + 1;
    }
  } else {
    for (char c : names) parts.emplace_back(1, c);
  }
  AxisList out;
  for (const std::string& p : parts) {
    const std::optional<int> a = mesh.find(p);
    if (!a)
      throw InputError("mesh axis '" + p + "' in '" + std::string(names) + "' is not in mesh " + mesh.to_string());
    if (contains(out, *a)) throw InputError("mesh axis '" + p + "' appears twice in '" + std::string(names) + "'");
    out.push_back(*a);
  }
  if (out.empty()) throw InputError("no mesh axes named; write axes as X, XY or dp,tp");
  return out;
}

Var Tape::input(const Spec& spec, Shape shape, const DistTensor::Generator& value, bool requires_grad) {
  validate_spec(spec, impl_->mesh);
  if (!spec.unreduced.empty() && !impl_->symbolic()) {
    throw InputError("input " + format_spec(spec, impl_->mesh) +
                     " is unreduced: a leaf holds whole values (make partial sums with an op, e.g. einsum)");
  }
  if (shape.size() != spec.dims.size()) {
    throw InputError("input " + format_spec(spec, impl_->mesh) + " has " + std::to_string(spec.dims.size()) +
                     " dimensions but a shape of " + std::to_string(shape.size()) + " extents");
  }
  for (std::int64_t n : shape) {
    if (n < 0)
      throw InputError("input " + format_spec(spec, impl_->mesh) + " has a negative extent " + std::to_string(n));
  }
  Value v{spec, nullptr};
  if (!impl_->symbolic()) {
    v.data = std::make_shared<DistTensor>(
        DistTensor::filled(impl_->mesh, impl_->device(), spec, shape, impl_->options.dtype, value));
  }
  Var var = impl_->add_node(*this, std::move(v), std::move(shape), {}, nullptr);
  Node& n = impl_->node(var);
  n.leaf = true;
  n.requires_grad = requires_grad;
  return var;
}

Var Tape::input(std::string_view spec_text, const DimSizes& sizes, const DistTensor::Generator& value,
                bool requires_grad) {
  const Spec s = spec(spec_text);
  return input(s, global_shape(s, sizes), value, requires_grad);
}

Var Tape::input(DistTensor value, bool requires_grad) {
  if (impl_->symbolic()) throw InputError("a symbolic tape holds no data; use input(spec, shape, generator)");
  if (value.device() != impl_->device() || value.dtype() != impl_->options.dtype) {
    throw InputError("input shard is for device " + std::to_string(value.device()) + " in " + to_string(value.dtype()) +
                     "; this tape runs device " + std::to_string(impl_->device()) + " in " +
                     to_string(impl_->options.dtype));
  }
  const Spec spec = value.spec();
  const Shape shape = value.global_shape();
  Var var = input(
      spec, shape, [](const Index&, std::int64_t) { return 0.0; }, requires_grad);
  impl_->node(var).value.data = std::make_shared<DistTensor>(std::move(value));
  return var;
}

void Tape::backward(Var loss) {
  Impl& t = *impl_;
  const Node& l = t.node(loss);
  if (&loss.tape() != this) throw InputError("backward(loss): the loss belongs to another tape");
  if (!l.shape.empty()) {
    throw InputError("backward(loss): the loss must be a rank-0 value (use sum or mean); got " +
                     format_spec(l.value.spec, t.mesh));
  }
  Spec seed_spec;
  seed_spec.tensor = "d" + l.value.spec.tensor;
  Value seed{seed_spec, nullptr};
  if (!t.symbolic()) {
    auto one = t.make_shard(seed_spec, {});
    if (t.options.dtype == DType::f32) {
      one->buffer().as<float>()[0] = 1.0f;
    } else {
      one->buffer().as<double>()[0] = 1.0;
    }
    seed.data = std::move(one);
  }
  run_backward(loss, std::move(seed));
}

namespace {

// backward_from's seed: `out`'s gradient in its dimension sharding, partial over `unreduced`.
Value gradient_seed(const Tape& tape, const Tape::Impl& t, Var out, const AxisList& unreduced) {
  if (&out.tape() != &tape) throw InputError("backward_from(out): the value belongs to another tape");
  if (!t.symbolic()) throw InputError("backward_from(): only a symbolic tape starts backward from a chosen layout");
  const Node& o = t.node(out.id());
  Spec seed_spec;
  seed_spec.tensor = "d" + o.value.spec.tensor;
  seed_spec.dims = o.value.spec.dims;
  seed_spec.unreduced = unreduced;
  std::sort(seed_spec.unreduced.begin(), seed_spec.unreduced.end());
  validate_spec(seed_spec, t.mesh);
  return Value{seed_spec, nullptr};
}

}  // namespace

void Tape::backward_from(Var out, const AxisList& unreduced) {
  run_backward(out, gradient_seed(*this, *impl_, out, unreduced));
}

std::optional<Var> Tape::contraction_in(int scope) {
  const Impl& t = *impl_;
  std::optional<Var> found;
  for (const ForwardOp& op : t.ops) {
    if (op.scope != scope) continue;
    for (int id = op.first_node; id <= op.last_node; ++id) {
      if (!t.node(id).contraction) continue;
      if (found) return std::nullopt;
      found = var(id);
    }
  }
  return found;
}

std::shared_ptr<const Tape::Below> Tape::backward_below(Var contraction) {
  Impl& t = *impl_;
  const int c = contraction.id();
  if (&contraction.tape() != this || !t.node(c).contraction)
    throw std::logic_error("Tape::backward_below: not a contraction of this tape");
  if (!t.symbolic()) throw InputError("backward_below(): only a symbolic tape runs backward in halves");
  rewind();
  try {
    backward_from(contraction, {});
  } catch (...) {
    rewind();
    throw;
  }
  auto below = std::make_shared<Below>();
  below->tape = &t;
  below->forward_nodes = t.nodes.size();
  below->contraction = c;
  below->aligned = t.node(c).value.spec;
  below->aligned.unreduced.clear();
  below->events.assign(t.events.begin() + static_cast<std::ptrdiff_t>(t.forward_events), t.events.end());
  below->units = t.units;
  for (int id = 0; id < static_cast<int>(t.nodes.size()); ++id) {
    const Node& n = t.node(id);
    if (id == c || (id > c && !n.leaf)) continue;
    if (!n.grad && n.grad_from < 0 && n.grad_to < 0 && !n.regathered && n.arrived_unreduced.empty()) continue;
    below->nodes.push_back({id, n.grad, n.arrived_unreduced, n.regathered, n.grad_bytes, n.grad_from, n.grad_to,
                            n.regathered_in, n.regathered ? std::optional<Value>(n.value) : std::nullopt});
  }
  below->scope = t.scope;
  rewind();
  return below;
}

bool Tape::backward_from(Var out, const AxisList& unreduced, const Below& below) {
  Impl& t = *impl_;
  if (below.tape != &t || below.forward_nodes != t.nodes.size())
    throw std::logic_error("Tape::backward_from: the pass below is of another tape, or of a shorter forward pass");
  const int c = below.contraction;
  run_backward(out, gradient_seed(*this, t, out, unreduced), c);
  Node& n = t.nodes[static_cast<std::size_t>(c)];
  if (!n.grad) return false;
  for (int id = 0; id < static_cast<int>(t.nodes.size()); ++id) {
    const Node& m = t.node(id);
    if (m.regathered || (id < c && m.grad) || (id > c && m.leaf && m.grad)) return false;
  }
  // The contraction's backward as run_backward starts it, up to its alignment.
  t.scope = n.scope;
  t.enter_unit(c);
  const Value grad = std::move(*n.grad);
  n.grad.reset();
  n.grad_to = static_cast<int>(t.units.size()) - 1;
  if (!(t.align(grad, n.value.spec, n.shape).spec == below.aligned)) return false;
  // Then what the pass below it did, its units counted on from the contraction's.
  const int base = static_cast<int>(t.units.size()) - 1;
  BackwardUnit& unit = t.units.back();
  unit.transient = std::max(unit.transient, below.units.front().transient);
  unit.node = below.units.front().node;
  unit.lowest_node = below.units.front().lowest_node;
  t.units.insert(t.units.end(), below.units.begin() + 1, below.units.end());
  t.events.insert(t.events.end(), below.events.begin(), below.events.end());
  const auto shifted = [base](int unit_index) { return unit_index < 0 ? unit_index : unit_index + base; };
  for (const Below::Changed& changed : below.nodes) {
    Node& m = t.nodes[static_cast<std::size_t>(changed.id)];
    m.grad = changed.grad;
    m.arrived_unreduced = changed.arrived_unreduced;
    m.regathered = changed.regathered;
    m.grad_bytes = changed.grad_bytes;
    m.grad_from = shifted(changed.grad_from);
    m.grad_to = shifted(changed.grad_to);
    m.regathered_in = shifted(changed.regathered_in);
    if (changed.value) m.value = *changed.value;
  }
  t.scope = below.scope;
  return true;
}

void Tape::run_backward(Var from, Value seed, int stop) {
  Impl& t = *impl_;
  if (t.backward_done) throw InputError("backward() runs once per tape");
  t.phase = Phase::backward;
  t.backward_done = true;
  t.forward_events = t.events.size();
  t.forward_scope = t.scope;
  // Regathered values leave memory now; a backward that needs one gathers it again.
  for (std::size_t id = 0; id < t.nodes.size(); ++id) {
    Node& n = t.nodes[id];
    if (!n.regather) continue;
    if (t.symbolic()) t.forward_values.emplace_back(static_cast<int>(id), n.value);
    n.value.data.reset();
  }
  t.enter_unit(from.id());
  t.accumulate(from.id(), std::move(seed));
  for (int id = static_cast<int>(t.nodes.size()) - 1; id >= 0; --id) {
    if (id == stop) return;
    Node& n = t.nodes[static_cast<std::size_t>(id)];
    if (!n.grad) continue;
    t.scope = n.scope;
    t.enter_unit(id);
    if (n.leaf) {
      n.arrived_unreduced = n.grad->spec.unreduced;
      *n.grad = t.reshard(*n.grad, n.value.spec, n.shape);
      continue;
    }
    const Value grad = std::move(*n.grad);
    n.grad.reset();  // an intermediate's gradient is not kept once passed on
    n.grad_to = static_cast<int>(t.units.size()) - 1;
    n.backward(t, n, grad);
  }
  // Leaves the loss does not reach get zeros in their own spec.
  for (Node& n : t.nodes) {
    if (!n.leaf || !n.requires_grad || n.grad) continue;
    Value zero{n.value.spec, nullptr};
    zero.spec.tensor = "d" + n.value.spec.tensor;
    if (!t.symbolic()) {
      auto data = t.make_shard(zero.spec, n.shape);
      std::memset(data->data(), 0, static_cast<std::size_t>(data->buffer().bytes()));
      zero.data = std::move(data);
    }
    n.grad_bytes = t.held_bytes(zero, n.shape);
    n.grad_from = static_cast<int>(t.units.size());  // made after backward: live at the update only
    n.grad = std::move(zero);
  }
}

void Tape::set_scope(int scope) { impl_->scope = scope; }

void Tape::update(Var param, std::string function, int blocks, const std::function<void()>& update) {
  Impl& t = *impl_;
  const Node& n = t.node(param);
  if (!n.leaf) throw InputError("update(): only a leaf (a param) is updated; got " + format_spec(n.value.spec, t.mesh));
  if (!t.backward_done) throw InputError("update(): the update follows backward(); run it first");
  t.phase = Phase::update;
  t.scope = -1;
  const double start = t.clock();
  if (!t.symbolic() && update) update();
  t.record_local(std::move(function), n.value.spec.tensor,
                 checked_mul(blocks, t.block_bytes(n.value.spec, n.shape), "the update's bytes"), start);
}

void Tape::set_name(Var v, std::string name) {
  Impl& t = *impl_;
  Node& n = t.node(v);
  // The local steps that made v (its op's, recorded last in its scope) take the name too.
  for (auto e = t.events.rbegin(); e != t.events.rend() && e->phase == t.phase && e->scope == n.scope; ++e) {
    if (e->step.op == OpKind::local && e->step.tensor == n.value.spec.tensor) {
      e->step.tensor = name;
      e->measured.tensor = name;
    }
  }
  n.value.spec.tensor = std::move(name);
}

const DistTensor& Tape::grad(Var leaf) const {
  const Node& n = impl_->node(leaf);
  if (!n.leaf || !n.requires_grad) {
    throw InputError("grad(): only leaves made with requires_grad = true have a gradient");
  }
  if (!n.grad) throw InputError("grad(): call backward(loss) first");
  if (!n.grad->data) throw InputError("grad(): a symbolic tape computes no gradients");
  return *n.grad->data;
}

const std::vector<TapeEvent>& Tape::events() const { return impl_->events; }

TapeMemory Tape::memory() const {
  TapeMemory m;
  for (const Node& n : impl_->nodes) {
    const std::int64_t bytes = impl_->local_bytes(n.value.spec, n.shape);
    if (n.leaf) {
      m.leaves += bytes;
      if (n.requires_grad && n.grad) m.gradients += bytes;
    } else {
      if (n.saved && !n.regather) m.activations += bytes;
      m.activations += n.extra_saved_bytes;
    }
  }
  return m;
}

AxisList Tape::gradient_arrived_unreduced(Var leaf) const {
  const Node& n = impl_->node(leaf);
  if (!n.leaf) throw InputError("gradient_arrived_unreduced(): only a leaf's gradient is delivered");
  return n.arrived_unreduced;
}

namespace {

// The most bytes at once of an op's `internal` nodes (each live from its making to its last
// reader, all inside the op), over the op's nodes in recording order.
std::int64_t internal_peak(const Tape::Impl& t, const ForwardOp& op, const std::vector<int>& internal) {
  std::int64_t peak = 0;
  for (int m = op.first_node; m <= op.last_node; ++m) {
    std::int64_t live = 0;
    for (int id : internal) {
      const Node& n = t.node(id);
      if (id <= m && m <= std::max(id, n.last_reader)) live += n.bytes;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace

Tape::OpMemory Tape::op_memory(int scope, Var result, bool train) const {
  const Impl& t = *impl_;
  OpMemory out;
  const auto op = std::find_if(t.ops.begin(), t.ops.end(), [scope](const ForwardOp& o) { return o.scope == scope; });
  if (op == t.ops.end()) return out;
  const int index = static_cast<int>(op - t.ops.begin());
  std::vector<int> internal;
  for (int id = op->first_node; id <= op->last_node; ++id) {
    const Node& n = t.node(id);
    if (n.leaf || n.op != index) continue;
    const bool kept = train && n.saved && !n.regather;
    if (train) out.kept += n.extra_saved_bytes;
    // A regathered copy (FSDP) lives again in the op's own backward, from its gather on.
    if (n.regathered_in >= 0) out.backward += n.bytes;
    if (id == result.id()) continue;
    if (kept) out.kept += n.bytes;
    const bool read_later = n.last_reader >= 0 && t.node(n.last_reader).op != index;
    if (!kept && !read_later) internal.push_back(id);
    if (n.grad_from >= 0) out.backward += n.grad_bytes;
  }
  out.transient = internal_peak(t, *op, internal);
  const Node& r = t.node(result.id());
  if (!(train && r.saved && !r.regather)) internal.push_back(result.id());
  std::sort(internal.begin(), internal.end());
  out.transient_with_result = internal_peak(t, *op, internal);
  for (const BackwardUnit& u : t.units) {
    if (!t.node(u.node).leaf && t.node(u.node).op == index) out.backward += u.transient;
  }
  return out;
}

std::vector<MemoryPoint> Tape::memory_timeline() const {
  const Impl& t = *impl_;
  const auto ops = static_cast<int>(t.ops.size());
  const auto units = static_cast<int>(t.units.size());
  std::int64_t leaves = 0;
  // Bytes added over a range of forward points (diff arrays), and per backward unit.
  std::vector<std::int64_t> fwd_values(static_cast<std::size_t>(ops) + 1, 0),
      fwd_transient(static_cast<std::size_t>(ops), 0);
  std::vector<std::int64_t> bwd_values(static_cast<std::size_t>(units) + 1, 0),
      bwd_grads(static_cast<std::size_t>(units) + 2, 0);
  const auto add = [](std::vector<std::int64_t>& diff, int from, int to, std::int64_t bytes) {
    if (from > to) return;
    diff[static_cast<std::size_t>(from)] += bytes;
    diff[static_cast<std::size_t>(to) + 1] -= bytes;
  };
  // A kept value is freed once backward has run the op that made it (every op reading it ran
  // backward before): it lives through the units whose nodes are not below that op's first.
  const auto kept_until = [&](const Node& n) {
    const int first = t.ops[static_cast<std::size_t>(n.op)].first_node;
    const auto past = std::partition_point(t.units.begin(), t.units.end(),
                                           [first](const BackwardUnit& b) { return b.lowest_node >= first; });
    return static_cast<int>(past - t.units.begin()) - 1;
  };
  // The nodes of each op that die inside it, for its transient peak: live from their making to
  // their last reader, all within the op.
  std::vector<std::vector<int>> internal(static_cast<std::size_t>(ops));
  for (std::size_t id = 0; id < t.nodes.size(); ++id) {
    const Node& n = t.nodes[id];
    if (n.leaf) {
      leaves += n.bytes;
      if (n.grad_from >= 0) add(bwd_grads, std::min(n.grad_from, units), units, n.grad_bytes);
      continue;
    }
    const bool kept = t.backward_done && n.saved && !n.regather;
    const int read_until = n.last_reader >= 0 ? t.nodes[static_cast<std::size_t>(n.last_reader)].op : n.op;
    const int freed = t.backward_done ? kept_until(n) : -1;
    if (kept) {
      add(fwd_values, n.op, ops - 1, n.bytes);
      add(bwd_values, 0, freed, n.bytes);
    } else if (read_until > n.op) {
      add(fwd_values, n.op, read_until, n.bytes);
    } else {
      internal[static_cast<std::size_t>(n.op)].push_back(static_cast<int>(id));
    }
    if (t.backward_done && n.extra_saved_bytes > 0) {
      add(fwd_values, n.op, ops - 1, n.extra_saved_bytes);
      add(bwd_values, 0, freed, n.extra_saved_bytes);
    }
    if (n.regathered_in >= 0) add(bwd_values, n.regathered_in, freed, n.bytes);
    if (n.grad_from >= 0) add(bwd_grads, n.grad_from, n.grad_to, n.grad_bytes);
  }
  for (int g = 0; g < ops; ++g) {
    fwd_transient[static_cast<std::size_t>(g)] =
        internal_peak(t, t.ops[static_cast<std::size_t>(g)], internal[static_cast<std::size_t>(g)]);
  }
  std::vector<MemoryPoint> out;
  std::int64_t values = 0, grads = 0;
  for (int g = 0; g < ops; ++g) {
    const ForwardOp& op = t.ops[static_cast<std::size_t>(g)];
    values += fwd_values[static_cast<std::size_t>(g)];
    out.push_back({Phase::forward, op.scope, t.nodes[static_cast<std::size_t>(op.last_node)].value.spec.tensor, leaves,
                   values, 0, fwd_transient[static_cast<std::size_t>(g)]});
  }
  values = 0;
  for (int u = 0; u < units; ++u) {
    const BackwardUnit& unit = t.units[static_cast<std::size_t>(u)];
    values += bwd_values[static_cast<std::size_t>(u)];
    grads += bwd_grads[static_cast<std::size_t>(u)];
    out.push_back({Phase::backward, unit.scope, t.nodes[static_cast<std::size_t>(unit.node)].value.spec.tensor, leaves,
                   values, grads, unit.transient});
  }
  return out;
}

std::int64_t Tape::bytes_saved_for_backward(Var v) const {
  const Node& n = impl_->node(v);
  return n.saved && !n.regather ? impl_->local_bytes(n.value.spec, n.shape) : 0;
}

const Spec& Var::spec() const { return tape_->impl_->node(*this).value.spec; }
const Shape& Var::shape() const { return tape_->impl_->node(*this).shape; }
Tape& Var::tape() const {
  if (!tape_) throw InputError("an empty Var (default-constructed, never assigned) has no tape");
  return *tape_;
}
const DistTensor& Var::value() const {
  const Node& n = tape_->impl_->node(*this);
  if (!n.value.data) {
    throw InputError(tape_->symbolic() ? "value(): a symbolic tape holds no data"
                                       : "value(): this gathered value was dropped for the backward pass");
  }
  return *n.value.data;
}

}  // namespace shardmm::autodiff
