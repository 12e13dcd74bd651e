// solve_program: build the choice problem, solve it exactly (dynamic programming when no
// memory limit binds, else the integer program), cost the answer as `shardmm program` does,
// and put it beside the named strategies and each choice's runner-up.
#include "shardmm/solve/solve.h"

#include <algorithm>
#include <functional>
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

// "the least any sharding needs is 1.20 GiB (params 512 MiB, ...); its largest tensors: ...",
// for a memory limit nothing fits.
std::string least_memory_text(const Graph& g, const ProgramChoices& c, const SolveOutcome& least,
                              const nn::ProgramOptions& options) {
  const std::vector<Spec> specs = specs_of(c, least.best);
  const nn::ProgramMemory m = nn::predict_program(pinned_graph(g, specs, regathered_of(c, least.best)), options).memory;
  const nn::ProgramMemoryPoint& peak = m.timeline.at(m.peak_point);
  std::string out = "the least peak any sharding reaches is " + bytes_text(peak.total()) + " (params " +
                    bytes_text(peak.params) + ", inputs " + bytes_text(peak.inputs) + ", gradients " +
                    bytes_text(peak.gradients) + ", optimizer state " + bytes_text(peak.optimizer_state) +
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

// The best assignment of `p` within the limits: dynamic programming first (exact, fast, blind
// to memory), the integer program when memory binds, exclusions apply or the tables grow too big.
SolveOutcome best_of(const ChoiceProblem& p, const SolveLimits& limits) {
  if (limits.excluded.empty()) {
    if (std::optional<SolveOutcome> dp = solve_elimination(p)) {
      if (dp->status == SolveStatus::infeasible) return *dp;
      if (!limits.memory_limit || dp->value.memory <= *limits.memory_limit) return *dp;
    }
  }
  return solve_mip(p, limits);
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

std::vector<NamedStrategy> named_strategies(const Graph& g, const ProgramChoices& c, const SolveLimits& limits) {
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
  const int m = g.mesh.rank();
  // Every role per axis up to two axes; past that the same role on every axis.
  std::vector<std::vector<std::string>> plans;
  if (m <= 2) {
    std::vector<std::string> roles(static_cast<std::size_t>(m));
    std::vector<std::size_t> at(static_cast<std::size_t>(m), 0);
    while (true) {
      for (int a = 0; a < m; ++a) roles[static_cast<std::size_t>(a)] = roles_here[at[static_cast<std::size_t>(a)]];
      plans.push_back(roles);
      int a = 0;
      while (a < m && ++at[static_cast<std::size_t>(a)] == roles_here.size()) at[static_cast<std::size_t>(a++)] = 0;
      if (a == m) break;
    }
  } else {
    for (const std::string& r : roles_here) plans.push_back(std::vector<std::string>(static_cast<std::size_t>(m), r));
  }
  std::vector<NamedStrategy> out;
  for (const std::vector<std::string>& roles : plans) {
    NamedStrategy s;
    for (int a = 0; a < m; ++a) {
      s.name += (a ? "+" : "") + roles[static_cast<std::size_t>(a)] + "(" + g.mesh.axis(a).name + ")";
    }
    const bool fsdp = std::find(roles.begin(), roles.end(), "fsdp") != roles.end();
    Kept keep(c.values.size());
    for (std::size_t v = 0; v < c.values.size(); ++v) {
      const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
      if (t.role == Role::computed) continue;
      const bool twins = std::any_of(c.regathered[v].begin(), c.regathered[v].end(), [](char r) { return r != 0; });
      for (std::size_t value = 0; value < c.values[v].size(); ++value) {
        const Spec& spec = c.values[v][value];
        bool allowed = !(t.role == Role::param && !t.regathered && (c.regathered[v][value] != 0) != fsdp && twins);
        for (int a = 0; a < m && allowed; ++a)
          allowed = leaf_allows(t, spec, a, roles[static_cast<std::size_t>(a)], letters);
        keep[v].push_back(allowed ? 1 : 0);
      }
    }
    s.outcome = best_of(restricted(c.problem, keep), limits);
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(), [](const NamedStrategy& a, const NamedStrategy& b) {
    const bool fa = !a.outcome.best.empty(), fb = !b.outcome.best.empty();
    if (fa != fb) return fa;
    return fa && a.outcome.value.time < b.outcome.value.time;
  });
  return out;
}

}  // namespace

SolveResult solve_program(const Graph& g, const SolveOptions& options) {
  SolveResult r;
  r.choices = build_choices(g, options.program, {options.seconds, options.progress});
  const ProgramChoices& c = r.choices;
  SolveLimits limits;
  limits.memory_limit = options.memory_limit;
  limits.seconds = options.seconds;
  for (std::size_t v = 0; v < c.chosen.size(); ++v) {
    if (c.chosen[v]) limits.distinct_on.push_back(static_cast<int>(v));
  }

  r.outcome = best_of(c.problem, limits);
  if (options.memory_limit) {
    SolveLimits free = limits;
    free.memory_limit.reset();
    r.unconstrained = best_of(c.problem, free);
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
      SolveLimits least;
      least.minimize_memory = true;
      least.seconds = options.seconds;
      const SolveOutcome o = solve_mip(c.problem, least);
      if (!o.best.empty()) why += ": " + least_memory_text(g, c, o, options.program);
    }
    throw InputError("solve: " + why);
  }
  r.specs = specs_of(c, r.outcome.best);
  r.regathered = regathered_of(c, r.outcome.best);
  r.prediction = nn::predict_program(pinned_graph(g, r.specs, r.regathered), options.program);
  // Where the answer's regathered param gathers nothing again (its kept twin tied), it is
  // reported kept: the same step, and a file that says only what matters.
  std::vector<char> gathers_again(c.values.size(), 0);
  for (const autodiff::TapeEvent& e : r.prediction.events) {
    if (e.phase != autodiff::Phase::backward || e.step.op != OpKind::all_gather) continue;
    const int t = g.find(e.step.tensor);
    if (t >= 0) gathers_again[static_cast<std::size_t>(c.var_of_tensor[static_cast<std::size_t>(t)])] = 1;
  }
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (!g.tensors[t].regathered && !gathers_again[static_cast<std::size_t>(c.var_of_tensor[t])]) r.regathered[t] = 0;
  }

  if (r.outcome.method == "dynamic programming") {
    // Each part of the K-best search is solved as fast as the optimum was.
    r.top = solve_top(c.problem, limits, r.outcome, options.top, best_of);
  } else {
    // The integer program takes exclusions directly: one solve per answer, not one per part.
    r.top.push_back(r.outcome);
    SolveLimits next = limits;
    for (int k = 1; k < options.top; ++k) {
      next.excluded.push_back(r.top.back().best);
      SolveOutcome o = solve_mip(c.problem, next);
      if (o.best.empty()) break;
      r.top.push_back(std::move(o));
    }
  }

  if (options.named) r.named = named_strategies(g, c, limits);

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
      const SolveOutcome o = best_of(restricted(c.problem, keep), limits);
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
