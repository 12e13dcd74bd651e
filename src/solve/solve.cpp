// solve_program: build the choice problem, solve it exactly (dynamic programming when no
// memory limit binds, else the integer program), cost the answer as `shardmm program` does,
// and put it beside the named strategies and each choice's runner-up.
#include "shardmm/solve/solve.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <functional>
#include <future>
#include <sstream>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"

namespace shardmm::solve {

using program::Graph;
using program::Role;

namespace {

std::string bytes_text(std::int64_t b) {
  std::ostringstream os;
  os.precision(3);
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  os << v << " " << units[u];
  return os.str();
}

// "the least peak any sharding reaches is 1.20 GiB (params 512 MiB, ...); its largest tensors
// ...", for a memory limit nothing fits (`proven`: the integer program's least, else a search's).
std::string least_memory_text(const Graph& g, const ProgramChoices& c, const SolveOutcome& least,
                              const nn::ProgramOptions& options, bool proven) {
  const std::vector<Spec> specs = specs_of(c, least.best);
  const nn::ProgramMemory m = nn::predict_program(pinned_graph(g, specs, regathered_of(c, least.best)), options).memory;
  const nn::ProgramMemoryPoint& peak = m.timeline.at(m.peak_point);
  std::string out =
      std::string(proven ? "the least peak any sharding reaches is " : "the least peak the search found is ") +
      bytes_text(peak.total()) + " (params " + bytes_text(peak.params) + ", inputs " + bytes_text(peak.inputs) +
      ", gradients " + bytes_text(peak.gradients) + ", optimizer state " + bytes_text(peak.optimizer_state) +
      ", activations " + bytes_text(peak.activations) + ", transient " + bytes_text(peak.transient) +
      "); its largest tensors, per device:";
  std::vector<std::pair<std::int64_t, std::string>> sizes;
  for (std::size_t v = 0; v < c.values.size(); ++v) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    const Spec& s = specs[static_cast<std::size_t>(c.tensor_of_var[v])];
    Spec named = s;
    named.tensor = t.source_name;
    sizes.emplace_back(local_elements(g.mesh, s, t.shape, 0) * dtype_bytes(options.dtype), format_spec(named, g.mesh));
  }
  std::sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; i < std::min<std::size_t>(3, sizes.size()); ++i) {
    out += std::string(i ? "," : "") + " " + sizes[i].second + " " + bytes_text(sizes[i].first);
  }
  return out;
}

// The best assignment of restricted(p, keep) (no lists: of `p`) within the limits: dynamic
// programming first (exact, fast, blind to memory; on p's own entries), the integer program
// when memory binds, exclusions apply or the tables grow too big.
SolveOutcome best_of(const ChoiceProblem& p, const Kept& keep, const SolveLimits& limits) {
  if (limits.excluded.empty()) {
    if (std::optional<SolveOutcome> dp = solve_elimination(p, keep)) {
      if (dp->status == SolveStatus::infeasible) return *dp;
      if (!limits.memory_limit || dp->value.memory <= *limits.memory_limit) return *dp;
    }
  }
  return keep.empty() ? solve_mip(p, limits) : solve_mip(restricted(p, keep), limits);
}

// ---- Named strategies: a role per mesh axis, as restrictions on the leaves' specs.
//   dp    inputs split by the axis along their batch letter (the first input's first letter);
//         params not split by it
//   fsdp  inputs as dp; params split by the axis along some letter, gathered where used and
//         regathered in backward (no gathered copy kept between the passes)
//   tp    inputs not split by the axis; params split by it (Megatron's tensor parallelism)
//   sp    inputs split by the axis along their sequence letter (the first input's second);
//         params split by it
//   ep    (a program with a route) inputs as dp; params with the experts' letter (the route's
//         over=) split by the axis along it, the others not split by it
// A param the file does not mark regathered is regathered exactly when some axis is fsdp's.
const std::vector<std::string> kRoles = {"dp", "fsdp", "tp", "sp"};

struct Letters {
  std::string batch, sequence, experts;
};

bool leaf_allows(const program::Tensor& t, const Spec& s, int axis, const std::string& role, const Letters& l) {
  if (role.empty()) return true;  // a size-1 axis: no role
  const int dim = s.dim_of_axis(axis);
  const std::string letter = dim >= 0 ? s.dims[static_cast<std::size_t>(dim)].name : "";
  if (t.role == Role::param) {
    if (role == "ep") {
      const bool expert = std::find(t.letters.begin(), t.letters.end(), l.experts) != t.letters.end();
      return expert ? letter == l.experts : dim < 0;
    }
    return role == "dp" ? dim < 0 : dim >= 0;
  }
  const std::string& want = role == "sp" ? l.sequence : role == "tp" ? std::string() : l.batch;
  const bool has = !want.empty() && std::find(t.letters.begin(), t.letters.end(), want) != t.letters.end();
  return has ? letter == want : dim < 0;
}

// The program's batch, sequence and experts letters, and the roles its named strategies take.
std::pair<Letters, std::vector<std::string>> named_roles(const Graph& g) {
  Letters letters;
  for (int i : g.leaves()) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(i)];
    if (t.role != Role::input || t.letters.empty()) continue;
    letters.batch = t.letters[0];
    letters.sequence = t.letters.size() > 1 ? t.letters[1] : "";
    break;
  }
  std::vector<std::string> roles_here = kRoles;
  for (const program::GraphOp& op : g.ops) {
    if (op.op.kind != program::OpKind::route) continue;
    letters.experts = op.op.over;
    roles_here.push_back("ep");
    break;
  }
  return {letters, roles_here};
}

// The named strategies' roles, a role per mesh axis ("": none, a size-1 axis's; placed_axes):
// every combination up to two placed axes; past that the same role on every placed axis.
std::vector<std::vector<std::string>> named_plans(const Graph& g) {
  const std::vector<std::string> roles_here = named_roles(g).second;
  std::vector<std::size_t> placed;
  for (int a = 0; a < g.mesh.rank(); ++a) {
    if (placed_axes(g.mesh) >> a & 1) placed.push_back(static_cast<std::size_t>(a));
  }
  const std::size_t m = placed.size();
  std::vector<std::vector<std::string>> plans;
  std::vector<std::string> roles(static_cast<std::size_t>(g.mesh.rank()));
  if (m <= 2) {
    std::vector<std::size_t> at(m, 0);
    while (true) {
      for (std::size_t i = 0; i < m; ++i) roles[placed[i]] = roles_here[at[i]];
      plans.push_back(roles);
      std::size_t i = 0;
      while (i < m && ++at[i] == roles_here.size()) at[i++] = 0;
      if (i == m) break;
    }
  } else {
    for (const std::string& r : roles_here) {
      for (std::size_t a : placed) roles[a] = r;
      plans.push_back(roles);
    }
  }
  return plans;
}

std::string named_text(const Graph& g, const std::vector<std::string>& roles) {
  std::string name;
  for (int a = 0; a < g.mesh.rank(); ++a) {
    const std::string& role = roles[static_cast<std::size_t>(a)];
    if (!role.empty()) name += (name.empty() ? "" : "+") + role + "(" + g.mesh.axis(a).name + ")";
  }
  return name;
}

// Why a named strategy found no sharding (NamedStrategy::why_not): a pinned leaf its roles do
// not allow, a leaf none of whose specs (`keep`, where the whole space was built) they allow,
// or, failing those, the memory limit or some op's specs.
std::string why_none(const Graph& g, const std::vector<std::string>& roles, const SolveLimits& limits,
                     const ProgramChoices* c = nullptr, const Kept* keep = nullptr) {
  const Letters letters = named_roles(g).first;
  for (int i : g.leaves()) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(i)];
    if (!t.pinned) continue;
    for (int a = 0; a < g.mesh.rank(); ++a) {
      const std::string& role = roles[static_cast<std::size_t>(a)];
      if (!leaf_allows(t, *t.pinned, a, role, letters))
        return "contradicts " + t.source_name + "'s pin " + format_spec(*t.pinned, g.mesh) + " (" + role + " on " +
               g.mesh.axis(a).name + ")";
    }
  }
  for (std::size_t v = 0; c && keep && v < keep->size(); ++v) {
    const auto& allowed = (*keep)[v];
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c->tensor_of_var[v])];
    if (t.role != Role::computed && std::none_of(allowed.begin(), allowed.end(), [](char k) { return k != 0; })) {
      std::string shape;
      for (std::int64_t n : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
      return "fits no spec of " + format_spec(program::replicated_spec(t), g.mesh) + " (shape [" + shape + "])";
    }
  }
  if (limits.memory_limit) return "nothing fits the memory limit";
  return "leaves some op no specs it can hold";
}

// The values of `c` a named strategy's roles allow (its leaves' specs).
Kept named_keep(const Graph& g, const ProgramChoices& c, const std::vector<std::string>& roles) {
  const Letters letters = named_roles(g).first;
  const bool fsdp = std::find(roles.begin(), roles.end(), "fsdp") != roles.end();
  Kept keep(c.values.size());
  for (std::size_t v = 0; v < c.values.size(); ++v) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    if (t.role == Role::computed) continue;
    const bool twins = std::any_of(c.regathered[v].begin(), c.regathered[v].end(), [](char r) { return r != 0; });
    for (std::size_t value = 0; value < c.values[v].size(); ++value) {
      const Spec& spec = c.values[v][value];
      bool allowed = !(t.role == Role::param && !t.regathered && (c.regathered[v][value] != 0) != fsdp && twins);
      for (int a = 0; a < g.mesh.rank() && allowed; ++a)
        allowed = leaf_allows(t, spec, a, roles[static_cast<std::size_t>(a)], letters);
      keep[v].push_back(allowed ? 1 : 0);
    }
  }
  return keep;
}

// A search's builds free their caches as they go: one left to the exit would live on beside
// the next build's (a higher peak), and which build is the last is not known.
BuildLimits build_limits(const SolveOptions& options, double seconds, bool searching) {
  BuildLimits limits;
  limits.seconds = seconds;
  limits.progress = options.progress;
  limits.leave_caches_to_exit = options.leave_caches_to_exit && !searching;
  return limits;
}

void sort_named(std::vector<NamedStrategy>& named) {
  std::stable_sort(named.begin(), named.end(), [](const NamedStrategy& a, const NamedStrategy& b) {
    const bool fa = !a.outcome.best.empty(), fb = !b.outcome.best.empty();
    if (fa != fb) return fa;
    return fa && a.outcome.value.time < b.outcome.value.time;
  });
}

// `seconds_left` gives each integer program what is left of the time limit.
std::vector<NamedStrategy> named_strategies(const Graph& g, const ProgramChoices& c, SolveLimits limits,
                                            const std::function<double()>& seconds_left) {
  std::vector<NamedStrategy> out;
  for (const std::vector<std::string>& roles : named_plans(g)) {
    limits.seconds = seconds_left();
    const Kept keep = named_keep(g, c, roles);
    NamedStrategy s{named_text(g, roles), best_of(c.problem, keep, limits), {}, {}};
    if (!s.outcome.best.empty()) s.specs = specs_of(c, s.outcome.best);
    if (s.outcome.status == SolveStatus::infeasible) s.why_not = why_none(g, roles, limits, &c, &keep);
    out.push_back(std::move(s));
  }
  sort_named(out);
  return out;
}

// ---- Meshes whose whole search space is too large to build (an einsum on three axes has a
// million combinations of its operands' specs). The search moves by exact steps instead: from
// a sharding to the best of its neighbourhood where some mesh axes take any place and the
// others stay (Neighbourhood, solved as above), each set of axes in turn, until no set improves
// it. Each neighbourhood holds the sharding it starts from, so no step makes it worse.

using Clock = std::chrono::steady_clock;

struct Found {
  ProgramChoices choices;  // the neighbourhood it was found in
  SolveOutcome outcome;    // empty best: nothing found
  bool fits = false;       // within the memory limit
};

// Within the memory limit first, then faster, then less memory.
bool improves(const SolveOutcome& o, bool fits, const Found& than) {
  if (than.outcome.best.empty() || fits != than.fits) return fits || than.outcome.best.empty();
  const double t = o.value.time, u = than.outcome.value.time;
  if (fits && t < u - 1e-12 * std::abs(u)) return true;
  const bool tied = !fits || std::abs(t - u) <= 1e-12 * std::abs(u);
  return tied && o.value.memory < than.outcome.value.memory;
}

// Every tensor as pinned, or replicated.
std::vector<Spec> replicated_specs(const Graph& g) {
  std::vector<Spec> out;
  for (const program::Tensor& t : g.tensors) out.push_back(t.pinned ? *t.pinned : program::replicated_spec(t));
  return out;
}

// A sharding the roles allow: each leaf split by an axis where its role says (a param by the
// letter with the largest pieces left), the rest replicated.
std::vector<Spec> named_start(const Graph& g, const std::vector<std::string>& roles) {
  const Letters l = named_roles(g).first;
  std::vector<Spec> out = replicated_specs(g);
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    const program::Tensor& t = g.tensors[i];
    if (t.pinned || t.role == Role::computed) continue;
    Spec& s = out[i];
    const auto parts = [&](std::size_t d) {
      std::int64_t n = 1;
      for (int a : s.dims[d].axes) n *= g.mesh.size(a);
      return n;
    };
    const auto letter_at = [&](const std::string& letter) {
      return static_cast<int>(std::find(t.letters.begin(), t.letters.end(), letter) - t.letters.begin());
    };
    for (int a = 0; a < g.mesh.rank(); ++a) {
      const std::string& role = roles[static_cast<std::size_t>(a)];
      if (role.empty()) continue;
      int d = static_cast<int>(t.letters.size());  // none
      if (t.role == Role::param && role == "ep") {
        d = letter_at(l.experts);
      } else if (t.role == Role::param && role != "dp") {
        double largest = 0;
        for (std::size_t j = 0; j < t.letters.size(); ++j) {
          const double piece = static_cast<double>(t.shape[j]) / static_cast<double>(parts(j) * g.mesh.size(a));
          if (piece >= 1 && piece > largest) largest = piece, d = static_cast<int>(j);
        }
      } else if (t.role == Role::input && role != "tp") {
        d = letter_at(role == "sp" ? l.sequence : l.batch);
      }
      if (d < static_cast<int>(t.letters.size()) &&
          parts(static_cast<std::size_t>(d)) * g.mesh.size(a) <= t.shape[static_cast<std::size_t>(d)])
        s.dims[static_cast<std::size_t>(d)].axes.push_back(a);
    }
  }
  return out;
}

// The gradient variables' values of what was found.
std::vector<int> gradient_values(const Found& f) { return gradient_partials(f.choices, f.outcome.best); }

struct Searched {
  Found best;
  bool converged = false;
};

// From `around`, the neighbourhoods of every set of `axes` mesh axes in turn until none
// improves the sharding (or the deadline passes), within `roles` when given (a named strategy);
// their builds record into `recordings` where given.
Searched search_neighbourhoods(const Graph& g, const SolveOptions& options, const SolveLimits& limits,
                               std::vector<Spec> around, std::vector<int> partials, int axes,
                               const std::vector<std::string>* roles, Clock::time_point deadline,
                               NeighbourhoodSearch& tally, const std::shared_ptr<RecordingCache>& recordings) {
  std::function<bool(const program::Tensor&, const Spec&)> allows;
  if (roles) {
    allows = [&g, roles, letters = named_roles(g).first](const program::Tensor& t, const Spec& s) {
      for (int a = 0; a < g.mesh.rank(); ++a) {
        if (!leaf_allows(t, s, a, (*roles)[static_cast<std::size_t>(a)], letters)) return false;
      }
      return true;
    };
  }
  std::vector<int> sets;  // bit masks of `axes` axes
  for (int mask = 1; mask < 1 << g.mesh.rank(); ++mask) {
    if (std::popcount(static_cast<unsigned>(mask)) == axes && !(mask & ~placed_axes(g.mesh))) sets.push_back(mask);
  }
  Searched out;
  // Neighbourhoods since the last improvement (the one it came from counts: it is its best).
  std::size_t unimproved = 0;
  for (std::size_t i = 0; unimproved < sets.size(); i = (i + 1) % sets.size()) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return out;
    const Neighbourhood n{around, sets[i], partials, allows};
    ProgramChoices c;
    try {
      BuildLimits build = build_limits(options, left, true);
      build.recordings = recordings;
      c = build_choices(g, options.program, build, &n);
    } catch (const SearchTooLarge&) {
      return out;  // the time limit: the best so far (nothing, if this was the first)
    } catch (const InputError&) {
      if (!roles) throw;
      out.converged = true;  // the roles allow none of some leaf's specs: they do not apply
      return out;
    }
    ++tally.builds;
    tally.recordings += c.evaluations;
    tally.build_seconds += c.build_seconds;
    const Kept keep = roles ? named_keep(g, c, *roles) : Kept{};
    SolveLimits step = limits;
    step.seconds = left;
    SolveOutcome o;
    bool fits = true;
    if (limits.memory_limit && !out.best.fits) {
      // Nothing found so far fits the limit: the least memory here first. It fits (then the
      // fastest within the limit is searched for) or is where the search goes on from: one
      // integer program where nothing fits, not a proof of infeasibility and then the least.
      SolveLimits least = step;
      least.memory_limit.reset();
      least.minimize_memory = true;
      o = keep.empty() ? solve_mip(c.problem, least) : solve_mip(restricted(c.problem, keep), least);
      fits = !o.best.empty() && o.value.memory <= *limits.memory_limit;
      if (fits) {
        SolveOutcome fastest = best_of(c.problem, keep, step);
        if (!fastest.best.empty()) o = std::move(fastest);
      }
    } else {
      o = best_of(c.problem, keep, step);
      fits = !o.best.empty();
    }
    if (!o.best.empty() && improves(o, fits, out.best)) {
      around = specs_of(c, o.best);
      out.best = {std::move(c), std::move(o), fits};
      partials = gradient_values(out.best);
      unimproved = 1;
    } else {
      ++unimproved;
    }
  }
  out.converged = true;
  return out;
}

// The neighbourhood search (SolveResult::search): the named strategies one axis at a time,
// then from the best of them (or from replicated) two axes at a time.
Found solve_by_neighbourhoods(const Graph& g, const SolveOptions& options, const SolveLimits& limits,
                              Clock::time_point deadline, SolveResult& r) {
  const auto start = Clock::now();
  NeighbourhoodSearch& tally = r.search.emplace();
  std::vector<Spec> around = replicated_specs(g);
  std::vector<int> partials;     // the gradients' of `around`: every layout until a search has found one
  std::optional<Found> fastest;  // of the named strategies: the answer if the time limit cuts the rest
  // One axis's neighbourhoods, the named strategies' included, ask for many of the same
  // recordings; two axes' share few (the 2-layer decoder on 2x2x2, every neighbourhood's kept:
  // 18.9 s of builds against 18.4 s, 600 MB against 354 MB): theirs are not kept.
  std::shared_ptr<RecordingCache> one_axis_recordings = recording_cache(g, options.program);
  if (options.named) {
    for (const std::vector<std::string>& roles : named_plans(g)) {
      Searched s = search_neighbourhoods(g, options, limits, named_start(g, roles), {}, 1, &roles, deadline, tally,
                                         one_axis_recordings);
      NamedStrategy named{named_text(g, roles), s.best.outcome, {}, {}};
      if (!s.best.fits) {
        named.outcome = {};
        named.outcome.status = s.converged ? SolveStatus::infeasible : SolveStatus::unknown;
        if (s.converged) named.why_not = why_none(g, roles, limits);
      } else {
        named.outcome.status = s.converged ? SolveStatus::local : SolveStatus::feasible;
        named.outcome.method = "neighbourhood search";
        named.specs = specs_of(s.best.choices, s.best.outcome.best);
        if (!fastest || improves(s.best.outcome, true, *fastest)) {
          around = named.specs;
          partials = gradient_values(s.best);
          fastest = std::move(s.best);
        }
      }
      r.named.push_back(std::move(named));
    }
    sort_named(r.named);
  }
  // One axis at a time first: its neighbourhoods are a few times smaller than two axes'.
  Searched best =
      search_neighbourhoods(g, options, limits, around, partials, 1, nullptr, deadline, tally, one_axis_recordings);
  one_axis_recordings.reset();
  tally.converged_axes = best.converged ? 1 : 0;
  tally.one_axis_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (best.converged && !best.best.outcome.best.empty()) {
    Searched pairs = search_neighbourhoods(g, options, limits, specs_of(best.best.choices, best.best.outcome.best),
                                           gradient_values(best.best), 2, nullptr, deadline, tally, nullptr);
    if (pairs.converged) tally.converged_axes = 2;
    if (!pairs.best.outcome.best.empty()) best.best = std::move(pairs.best);
  }
  if (best.best.outcome.best.empty() && fastest) best.best = std::move(*fastest);
  tally.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Not fitting, its assignment (kept) holds the least memory the search found.
  if (!best.best.fits) {
    best.best.outcome.status = tally.converged_axes ? SolveStatus::infeasible : SolveStatus::unknown;
  } else {
    best.best.outcome.status = tally.converged_axes ? SolveStatus::local : SolveStatus::feasible;
  }
  best.best.outcome.method = "neighbourhood search";
  best.best.outcome.seconds = tally.seconds;
  return std::move(best.best);
}

}  // namespace

// The compute bound (docs/solve.md, "Meshes of more than two axes"): the program recorded
// replicated, nothing communicated, every device computing everything. Any sharding computes
// each einsum's products and each local op's elements (forward, backward, the update)
// somewhere, so its busiest device does at least 1/N of them, and moves 1/N of each einsum's
// operands and result; no GEMM runs faster than the fastest rate the profile knows, and a local
// op's time is proportional to the elements it touches.
double compute_bound(const Graph& g, const nn::ProgramOptions& options) {
  std::vector<Spec> replicated;
  for (const program::Tensor& t : g.tensors) replicated.push_back(program::replicated_spec(t));
  const nn::ProgramPrediction whole = nn::predict_program(pinned_graph(g, replicated), options);
  const HardwareProfile& hw = options.hw;
  double rate = hw.flops_for(options.dtype);
  if (hw.calibration) {
    for (const GemmRate& r : hw.calibration->gemm) {
      if (r.dtype == options.dtype) rate = std::max(rate, r.flops_per_s);
    }
  }
  const auto devices = static_cast<double>(g.mesh.device_count());
  const auto bytes = [&](const Spec& s) {
    double n = dtype_bytes(options.dtype);
    for (const DimSpec& d : s.dims) n *= static_cast<double>(g.dims.at(d.name));
    return n;
  };
  double bound = 0;
  for (const autodiff::TapeEvent& e : whole.events) {
    const Step& s = e.step;
    if (s.op == OpKind::local) bound += s.time_s / devices;
    // An einsum's devices together hold each operand and result element at least once.
    if (s.op == OpKind::einsum)
      bound += std::max(s.flops / rate, (bytes(s.from) + bytes(s.from_b) + bytes(s.to)) / hw.hbm_bandwidth) / devices;
  }
  return bound;
}

SolveResult solve_program(const Graph& g, const SolveOptions& options) {
  // A profile without the dtype's peak rate fails every einsum's costing, which the build takes
  // for specs the op cannot hold ("no sharding fits"): its own message instead.
  if (std::any_of(g.ops.begin(), g.ops.end(),
                  [](const program::GraphOp& op) { return op.op.kind == program::OpKind::einsum; }))
    options.program.hw.flops_for(options.program.dtype);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.seconds));
  // --time-limit bounds the whole solve: each integer program gets what is left of it (CBC
  // answers at once, with what it has, when that is nothing).
  const auto seconds_left = [deadline] {
    return std::max(1e-3, std::chrono::duration<double>(deadline - Clock::now()).count());
  };
  SolveResult r;
  SolveLimits limits;
  limits.memory_limit = options.memory_limit;
  // Past two axes the whole space is tried with a quarter of the time: it is built only for
  // small programs, and the build says within its first ops when it cannot be.
  const bool fall_back = options.search == SolveOptions::Search::automatic &&
                         std::popcount(static_cast<unsigned>(placed_axes(g.mesh))) > 2;
  bool whole = options.search != SolveOptions::Search::neighbourhoods;
  if (whole) {
    try {
      r.choices = build_choices(g, options.program,
                                build_limits(options, fall_back ? options.seconds / 4 : options.seconds, false));
    } catch (const SearchTooLarge&) {
      if (!fall_back) throw;
      whole = false;
    }
  }
  std::optional<Found> searched;
  if (!whole) {
    searched = solve_by_neighbourhoods(g, options, limits, deadline, r);
    r.choices = std::move(searched->choices);
  }
  const ProgramChoices& c = r.choices;
  for (std::size_t v = 0; v < c.chosen.size(); ++v) {
    if (c.chosen[v]) limits.distinct_on.push_back(static_cast<int>(v));
  }

  if (searched) {
    r.outcome = searched->outcome;
    if (!searched->fits) r.outcome.best.clear();
  } else {
    limits.seconds = seconds_left();
    r.outcome = best_of(c.problem, {}, limits);
    if (options.memory_limit) {
      SolveLimits free = limits;
      free.memory_limit.reset();
      free.seconds = seconds_left();
      r.unconstrained = best_of(c.problem, {}, free);
    }
  }
  if (r.outcome.best.empty()) {
    if (r.outcome.status == SolveStatus::unknown) {
      std::ostringstream seconds;
      seconds << options.seconds;
      throw InputError("solve: no sharding found within " + field("time_limit") + " " + seconds.str() +
                       " s; give more time, pin some tensors or use fewer mesh axes");
    }
    std::string why = "no sharding of the program fits";
    if (options.memory_limit) {
      why += " in " + field("mem_limit") + " " + bytes_text(*options.memory_limit) + " per device";
      if (searched) {
        // The search's least: not proven the least there is.
        if (!searched->outcome.best.empty())
          why += ": " + least_memory_text(g, c, searched->outcome, options.program, /*proven=*/false);
      } else {
        SolveLimits least;
        least.minimize_memory = true;
        least.seconds = seconds_left();
        const SolveOutcome o = solve_mip(c.problem, least);
        if (!o.best.empty()) {
          why += ": " + least_memory_text(g, c, o, options.program, /*proven=*/o.status == SolveStatus::optimal);
        } else {
          std::ostringstream seconds;
          seconds << options.seconds;
          why += " (the least peak any sharding reaches was not found within " + field("time_limit") + " " +
                 seconds.str() + " s)";
        }
      }
    }
    throw InputError("solve: " + why);
  }
  r.specs = specs_of(c, r.outcome.best);
  r.regathered = regathered_of(c, r.outcome.best);
  // The answer's step recorded in full on a core of its own while the next best and the named
  // strategies are solved (a tenth of a second each for a 32-layer decoder on a 2-D mesh).
  std::future<nn::ProgramPrediction> prediction =
      std::async(std::launch::async, [&g, &options, pinned = pinned_graph(g, r.specs, r.regathered)] {
        return nn::predict_program(pinned, options.program);
      });

  if (r.outcome.method == "dynamic programming" || searched) {
    // Each part of the K-best search is solved as fast as the optimum was (in a search: its
    // neighbourhood's optimum, the answer).
    limits.seconds = seconds_left();
    r.top = solve_top(c.problem, limits, r.outcome, options.top, best_of);
  } else {
    // The integer program takes exclusions directly: one solve per answer, not one per part.
    r.top.push_back(r.outcome);
    SolveLimits next = limits;
    for (int k = 1; k < options.top; ++k) {
      next.excluded.push_back(r.top.back().best);
      next.seconds = seconds_left();
      SolveOutcome o = solve_mip(c.problem, next);
      if (o.best.empty()) break;
      r.top.push_back(std::move(o));
    }
  }

  if (options.named && !searched) r.named = named_strategies(g, c, limits, seconds_left);
  r.prediction = prediction.get();
  // Reported kept where it gathers nothing again: the same step, and a file that says only what
  // matters.
  r.regathered = regathering_that_gathers(g, c, std::move(r.regathered), r.prediction.events);
  if (searched) {
    // The next distinct shardings are the answer's neighbourhood's: local like it. Nothing
    // here proves more than the compute bound, which holds for every sharding.
    const double bound = compute_bound(g, options.program);
    for (SolveOutcome& o : r.top) {
      if (o.status == SolveStatus::optimal) o.status = SolveStatus::local;
      o.method = r.outcome.method;
      o.lower_bound = bound;
    }
    for (NamedStrategy& s : r.named) {
      if (!s.outcome.best.empty()) s.outcome.lower_bound = bound;
    }
    r.outcome.lower_bound = bound;
  } else if (r.outcome.status == SolveStatus::feasible) {
    // The integer program's time limit passed: its bound, or the compute bound where higher.
    const double bound = compute_bound(g, options.program);
    r.outcome.lower_bound = std::max(r.outcome.lower_bound, bound);
    if (!r.top.empty()) r.top.front().lower_bound = r.outcome.lower_bound;
  }

  if (options.explain) {
    for (int v : limits.distinct_on) {
      Alternative alt;
      alt.tensor = c.tensor_of_var[static_cast<std::size_t>(v)];
      const int chosen = r.outcome.best[static_cast<std::size_t>(v)];
      // Another layout: a param's regathered twin is its chosen spec again.
      const std::vector<Spec>& values = c.values[static_cast<std::size_t>(v)];
      Kept keep(c.values.size());
      for (const Spec& value : values)
        keep[static_cast<std::size_t>(v)].push_back(!(value == values[static_cast<std::size_t>(chosen)]));
      limits.seconds = seconds_left();
      const SolveOutcome o = best_of(c.problem, keep, limits);
      if (!o.best.empty()) {
        alt.exists = true;
        alt.spec = c.values[static_cast<std::size_t>(v)][static_cast<std::size_t>(o.best[static_cast<std::size_t>(v)])];
        alt.extra_time = o.value.time - r.outcome.value.time;
        alt.extra_memory = o.value.memory - r.outcome.value.memory;
      }
      r.alternatives.push_back(std::move(alt));
    }
  }
  return r;
}

// Every tensor pinned as `specs` says except the nested expressions (a program file cannot
// pin them; their ops' rules give them the same layouts again).
Graph pinned_graph(const Graph& g, const std::vector<Spec>& specs, const std::vector<char>& regathered) {
  Graph out = g;
  for (std::size_t t = 0; t < out.tensors.size(); ++t) {
    if (!out.tensors[t].temporary) out.tensors[t].pinned = specs[t];
    if (!regathered.empty()) out.tensors[t].regathered = regathered[t] != 0;
  }
  return out;
}

program::Program pinned_program(const program::Program& program, const Graph& g, const std::vector<Spec>& specs,
                                const std::vector<char>& regathered) {
  program::Program out = program;
  out.mesh = g.mesh.to_string();
  std::string dims;
  for (const auto& [letter, size] : g.dims) dims += (dims.empty() ? "" : ", ") + letter + "=" + std::to_string(size);
  out.dims = dims;
  // A statement's tensors are the graph's with its location; every copy has the same spec.
  const auto pin = [&](program::Statement& s) {
    if (s.name == "loss" && s.letters.empty()) return;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const program::Tensor& tensor = g.tensors[t];
      if (tensor.temporary || tensor.where.line != s.where.line || tensor.where.column != s.where.column) continue;
      Spec spec = specs[t];
      spec.tensor = s.name;
      s.spec = format_spec(spec, g.mesh);
      if (!regathered.empty() && s.role == Role::param) s.regathered = regathered[t] != 0;
      return;
    }
  };
  std::function<void(std::vector<program::Item>&)> walk = [&](std::vector<program::Item>& items) {
    for (program::Item& item : items) {
      if (item.kind == program::Item::Kind::repeat) {
        walk(item.body);
      } else if (item.kind == program::Item::Kind::statement) {
        pin(item.statement);
      }
    }
  };
  walk(out.items);
  return out;
}

}  // namespace shardmm::solve
