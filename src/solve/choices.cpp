// The choice problem's evaluation, the exhaustive solver and the dynamic program (min-sum
// variable elimination). The integer program is in cbc_solver.cpp, the one file that sees CBC.
#include "shardmm/solve/choices.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "shardmm/core/error.h"
#include "solve/factor_index.h"

namespace shardmm::solve {

const char* to_string(SolveStatus s) {
  switch (s) {
    case SolveStatus::optimal:
      return "optimal";
    case SolveStatus::feasible:
      return "feasible";
    case SolveStatus::infeasible:
      return "infeasible";
    case SolveStatus::unknown:
      return "unknown";
  }
  return "?";
}

FactorIndex::FactorIndex(const ChoiceProblem& p, const Factor& f) : vars(f.vars) {
  std::int64_t size = 1;
  for (int v : f.vars) {
    strides.push_back(size);
    size *= p.domain.at(static_cast<std::size_t>(v));
  }
  entry_of.assign(static_cast<std::size_t>(size), -1);
  for (std::size_t e = 0; e < f.entries.size(); ++e) {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < f.vars.size(); ++i) at += strides[i] * f.entries[e].values[i];
    entry_of[static_cast<std::size_t>(at)] = static_cast<int>(e);
  }
}

int FactorIndex::entry(const Assignment& a) const {
  std::int64_t at = 0;
  for (std::size_t i = 0; i < vars.size(); ++i) at += strides[i] * a[static_cast<std::size_t>(vars[i])];
  return entry_of[static_cast<std::size_t>(at)];
}

namespace {

// The peak over the timeline's points: `chosen` has each factor's entry.
void timeline_peak(const ChoiceProblem& p, const Assignment& a, const std::vector<int>& chosen,
                   const std::vector<char>& used_shared, Evaluation& out) {
  out.memory = 0;
  for (std::size_t i = 0; i < p.points.size(); ++i) {
    std::int64_t bytes = 0;
    for (const PointTerm& t : p.points[i].terms) {
      const auto at = static_cast<std::size_t>(t.index);
      switch (t.kind) {
        case PointTerm::Kind::figure:
          bytes +=
              t.count *
              p.factors[at].entries[static_cast<std::size_t>(chosen[at])].figures[static_cast<std::size_t>(t.figure)];
          break;
        case PointTerm::Kind::value:
          bytes += t.count * p.value_bytes[at][static_cast<std::size_t>(a[at])];
          break;
        case PointTerm::Kind::shared: {
          const auto var = static_cast<std::size_t>(p.shared[at].var);
          if (used_shared[at]) bytes += t.count * p.value_bytes[var][static_cast<std::size_t>(a[var])];
          break;
        }
      }
    }
    if (out.peak_point < 0 || bytes > out.memory) {
      out.memory = bytes;
      out.peak_point = static_cast<int>(i);
    }
  }
}

Evaluation evaluate_indexed(const ChoiceProblem& p, const std::vector<FactorIndex>& index, const Assignment& a,
                            std::vector<char>& used_shared) {
  Evaluation out;
  std::fill(used_shared.begin(), used_shared.end(), 0);
  std::vector<int> chosen(p.factors.size());
  for (std::size_t k = 0; k < p.factors.size(); ++k) {
    const int e = index[k].entry(a);
    if (e < 0) return out;
    chosen[k] = e;
    const FactorEntry& entry = p.factors[k].entries[static_cast<std::size_t>(e)];
    out.time += entry.time;
    out.memory += entry.memory;
    for (int s : entry.shared) used_shared[static_cast<std::size_t>(s)] = 1;
  }
  for (std::size_t s = 0; s < p.shared.size(); ++s) {
    if (used_shared[s])
      out.memory += p.shared[s].bytes[static_cast<std::size_t>(a[static_cast<std::size_t>(p.shared[s].var)])];
  }
  if (!p.points.empty()) timeline_peak(p, a, chosen, used_shared, out);
  out.allowed = true;
  return out;
}

bool excluded(const SolveLimits& limits, const Assignment& a) {
  for (const Assignment& x : limits.excluded) {
    bool same = true;
    if (limits.distinct_on.empty()) {
      same = x == a;
    } else {
      for (int v : limits.distinct_on) same = same && x[static_cast<std::size_t>(v)] == a[static_cast<std::size_t>(v)];
    }
    if (same) return true;
  }
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<FactorIndex> index_factors(const ChoiceProblem& p) {
  std::vector<FactorIndex> out;
  out.reserve(p.factors.size());
  for (const Factor& f : p.factors) out.emplace_back(p, f);
  return out;
}

Evaluation evaluate(const ChoiceProblem& p, const Assignment& a) {
  if (a.size() != p.domain.size())
    throw InputError("evaluate: the assignment has a value for " + std::to_string(a.size()) +
                     " variables, the problem has " + std::to_string(p.domain.size()));
  std::vector<char> used(p.shared.size());
  return evaluate_indexed(p, index_factors(p), a, used);
}

SolveOutcome solve_exhaustive(const ChoiceProblem& p, const SolveLimits& limits, std::int64_t max_assignments) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<FactorIndex> index = index_factors(p);
  // Depth first, each next variable the one sharing the most factors with those before it,
  // so that a factor is checked (as soon as its last variable has a value) early and a
  // disallowed tuple prunes every completion of it.
  const std::size_t n = p.domain.size();
  std::vector<std::size_t> order;
  std::vector<char> placed(n, 0);
  while (order.size() < n) {
    std::size_t pick = n;
    int pick_links = -1;
    for (std::size_t v = 0; v < n; ++v) {
      if (placed[v]) continue;
      int links = 0;
      for (const Factor& f : p.factors) {
        const bool has = std::find(f.vars.begin(), f.vars.end(), static_cast<int>(v)) != f.vars.end();
        bool touches = false;
        for (int u : f.vars) touches = touches || placed[static_cast<std::size_t>(u)];
        links += has && touches ? 1 : 0;
      }
      if (links > pick_links || (links == pick_links && p.domain[v] < p.domain[pick])) {
        pick = v;
        pick_links = links;
      }
    }
    placed[pick] = 1;
    order.push_back(pick);
  }
  std::vector<std::size_t> position(n);
  for (std::size_t i = 0; i < n; ++i) position[order[i]] = i;
  std::vector<std::vector<std::size_t>> closes(n);  // by position: factors complete there
  for (std::size_t k = 0; k < p.factors.size(); ++k) {
    std::size_t last = 0;
    for (int v : p.factors[k].vars) last = std::max(last, position[static_cast<std::size_t>(v)]);
    if (!p.factors[k].vars.empty()) closes[last].push_back(k);
  }
  std::vector<char> used(p.shared.size());
  SolveOutcome out;
  out.method = "exhaustive";
  Assignment a(p.domain.size(), 0);
  std::int64_t complete = 0;
  bool any_allowed = false;
  const std::function<void(std::size_t)> visit = [&](std::size_t i) {
    if (i == n) {
      if (++complete > max_assignments) {
        throw InputError("the exhaustive solver met more than " + std::to_string(max_assignments) +
                         " allowed assignments");
      }
      const Evaluation e = evaluate_indexed(p, index, a, used);
      if (e.allowed && !excluded(limits, a) && (!limits.memory_limit || e.memory <= *limits.memory_limit)) {
        any_allowed = true;
        if (out.best.empty() || e.time < out.value.time) {
          out.best = a;
          out.value = e;
        }
      }
      return;
    }
    const std::size_t v = order[i];
    for (int x = 0; x < p.domain[v]; ++x) {
      a[v] = x;
      bool allowed = true;
      for (std::size_t k : closes[i]) allowed = allowed && index[k].entry(a) >= 0;
      if (allowed) visit(i + 1);
    }
  };
  visit(0);
  out.status = any_allowed ? SolveStatus::optimal : SolveStatus::infeasible;
  out.lower_bound = any_allowed ? out.value.time : 0;
  out.seconds = seconds_since(start);
  return out;
}

// ---- Variable elimination

namespace {

constexpr double kNotAllowed = std::numeric_limits<double>::infinity();

// A dense table over `vars` (first variable fastest), +inf where not allowed.
struct Table {
  std::vector<int> vars;
  std::vector<std::int64_t> strides;
  std::vector<double> cost;
};

Table make_table(const ChoiceProblem& p, std::vector<int> vars) {
  Table t;
  t.vars = std::move(vars);
  std::int64_t size = 1;
  for (int v : t.vars) {
    t.strides.push_back(size);
    size *= p.domain[static_cast<std::size_t>(v)];
  }
  t.cost.assign(static_cast<std::size_t>(size), 0.0);
  return t;
}

// The position in `t` of the tuple that `values` (indexed by variable) gives.
std::int64_t offset_in(const Table& t, const std::vector<int>& values) {
  std::int64_t at = 0;
  for (std::size_t i = 0; i < t.vars.size(); ++i) at += t.strides[i] * values[static_cast<std::size_t>(t.vars[i])];
  return at;
}

// Calls fn(values) for every tuple of `vars` (values indexed by variable), first variable fastest.
template <typename Fn>
void for_each_tuple(const ChoiceProblem& p, const std::vector<int>& vars, std::vector<int>& values, Fn fn) {
  for (int v : vars) values[static_cast<std::size_t>(v)] = 0;
  while (true) {
    fn();
    std::size_t i = 0;
    while (i < vars.size()) {
      int& x = values[static_cast<std::size_t>(vars[i])];
      if (++x < p.domain[static_cast<std::size_t>(vars[i])]) break;
      x = 0;
      ++i;
    }
    if (i == vars.size()) return;
  }
}

std::optional<SolveOutcome> eliminate(const ChoiceProblem& p, std::int64_t max_table) {
  const auto start = std::chrono::steady_clock::now();
  const std::size_t n = p.domain.size();
  std::vector<Table> tables;
  for (const Factor& f : p.factors) {
    Table t = make_table(p, f.vars);
    std::fill(t.cost.begin(), t.cost.end(), kNotAllowed);
    for (const FactorEntry& e : f.entries) {
      std::int64_t at = 0;
      for (std::size_t i = 0; i < f.vars.size(); ++i) at += t.strides[i] * e.values[i];
      t.cost[static_cast<std::size_t>(at)] = e.time + kSecondsPerByteTieBreak * static_cast<double>(e.memory);
    }
    tables.push_back(std::move(t));
  }
  std::vector<char> eliminated(n, 0);
  // For back substitution: each eliminated variable's best value given the rest of its bucket.
  struct Step {
    int var;
    Table best_value;  // over the bucket's other variables; cost holds the value (as a double)
  };
  std::vector<Step> steps;
  std::vector<int> values(n, 0);
  for (std::size_t round = 0; round < n; ++round) {
    // The variable whose bucket joins the smallest table (min-size greedy order).
    int pick = -1;
    double pick_size = 0;
    std::vector<int> pick_scope;
    for (std::size_t v = 0; v < n; ++v) {
      if (eliminated[v]) continue;
      std::vector<int> scope;
      for (const Table& t : tables) {
        if (std::find(t.vars.begin(), t.vars.end(), static_cast<int>(v)) == t.vars.end()) continue;
        for (int u : t.vars) {
          if (std::find(scope.begin(), scope.end(), u) == scope.end()) scope.push_back(u);
        }
      }
      double size = 1;
      for (int u : scope) size *= p.domain[static_cast<std::size_t>(u)];
      if (pick < 0 || size < pick_size) {
        pick = static_cast<int>(v);
        pick_size = size;
        pick_scope = scope;
      }
    }
    if (pick_size > static_cast<double>(max_table)) return std::nullopt;
    eliminated[static_cast<std::size_t>(pick)] = 1;
    std::vector<Table> bucket, rest;
    for (Table& t : tables) {
      (std::find(t.vars.begin(), t.vars.end(), pick) != t.vars.end() ? bucket : rest).push_back(std::move(t));
    }
    std::vector<int> others;
    for (int u : pick_scope) {
      if (u != pick) others.push_back(u);
    }
    Table reduced = make_table(p, others);
    Table best = make_table(p, others);
    for_each_tuple(p, others, values, [&] {
      double low = kNotAllowed;
      int arg = 0;
      for (int x = 0; x < p.domain[static_cast<std::size_t>(pick)]; ++x) {
        values[static_cast<std::size_t>(pick)] = x;
        double sum = 0;
        for (const Table& t : bucket) sum += t.cost[static_cast<std::size_t>(offset_in(t, values))];
        if (sum < low) {
          low = sum;
          arg = x;
        }
      }
      const auto at = static_cast<std::size_t>(offset_in(reduced, values));
      reduced.cost[at] = low;
      best.cost[at] = arg;
    });
    rest.push_back(std::move(reduced));
    tables = std::move(rest);
    steps.push_back({pick, std::move(best)});
  }
  SolveOutcome out;
  out.method = "dynamic programming";
  double total = 0;
  for (const Table& t : tables) total += t.cost.at(0);  // every remaining table is a scalar
  if (std::isinf(total)) {
    out.status = SolveStatus::infeasible;
    out.seconds = seconds_since(start);
    return out;
  }
  Assignment a(n, 0);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    a[static_cast<std::size_t>(it->var)] =
        static_cast<int>(it->best_value.cost[static_cast<std::size_t>(offset_in(it->best_value, a))]);
  }
  out.best = a;
  out.value = evaluate(p, a);
  out.status = SolveStatus::optimal;
  out.lower_bound = out.value.time;
  out.seconds = seconds_since(start);
  return out;
}

}  // namespace

Reduced reduce_domains(const ChoiceProblem& p) {
  const std::size_t n = p.domain.size();
  std::vector<std::vector<char>> alive(n);
  for (std::size_t v = 0; v < n; ++v) alive[v].assign(static_cast<std::size_t>(p.domain[v]), 1);
  // A value no entry of some factor of its variable supports (among entries whose values are
  // all alive) is never part of an allowed assignment: drop it, until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (const Factor& f : p.factors) {
      std::vector<std::vector<char>> supported(f.vars.size());
      for (std::size_t i = 0; i < f.vars.size(); ++i)
        supported[i].assign(alive[static_cast<std::size_t>(f.vars[i])].size(), 0);
      for (const FactorEntry& e : f.entries) {
        bool ok = true;
        for (std::size_t i = 0; i < f.vars.size() && ok; ++i)
          ok = alive[static_cast<std::size_t>(f.vars[i])][static_cast<std::size_t>(e.values[i])];
        if (!ok) continue;
        for (std::size_t i = 0; i < f.vars.size(); ++i) supported[i][static_cast<std::size_t>(e.values[i])] = 1;
      }
      for (std::size_t i = 0; i < f.vars.size(); ++i) {
        std::vector<char>& a = alive[static_cast<std::size_t>(f.vars[i])];
        for (std::size_t x = 0; x < a.size(); ++x) {
          if (a[x] && !supported[i][x]) {
            a[x] = 0;
            changed = true;
          }
        }
      }
    }
  }
  Reduced r;
  r.kept.resize(n);
  std::vector<std::vector<int>> index(n);
  for (std::size_t v = 0; v < n; ++v) {
    index[v].assign(alive[v].size(), -1);
    for (std::size_t x = 0; x < alive[v].size(); ++x) {
      if (!alive[v][x]) continue;
      index[v][x] = static_cast<int>(r.kept[v].size());
      r.kept[v].push_back(static_cast<int>(x));
    }
    if (r.kept[v].empty()) return {};  // nothing allowed: `empty` says so
    r.problem.domain.push_back(static_cast<int>(r.kept[v].size()));
  }
  for (const Factor& f : p.factors) {
    Factor g;
    g.vars = f.vars;
    for (const FactorEntry& e : f.entries) {
      FactorEntry x = e;
      bool ok = true;
      for (std::size_t i = 0; i < f.vars.size() && ok; ++i) {
        x.values[i] = index[static_cast<std::size_t>(f.vars[i])][static_cast<std::size_t>(e.values[i])];
        ok = x.values[i] >= 0;
      }
      if (ok) g.entries.push_back(std::move(x));
    }
    r.problem.factors.push_back(std::move(g));
  }
  for (const SharedTerm& s : p.shared) {
    SharedTerm t{s.var, {}};
    for (int x : r.kept[static_cast<std::size_t>(s.var)]) t.bytes.push_back(s.bytes[static_cast<std::size_t>(x)]);
    r.problem.shared.push_back(std::move(t));
  }
  r.problem.points = p.points;
  for (std::size_t v = 0; v < p.value_bytes.size(); ++v) {
    std::vector<std::int64_t>& bytes = r.problem.value_bytes.emplace_back();
    for (int x : r.kept[v]) bytes.push_back(p.value_bytes[v][static_cast<std::size_t>(x)]);
  }
  r.empty = false;
  return r;
}

Assignment Reduced::original(const Assignment& a) const {
  Assignment out(a.size());
  for (std::size_t v = 0; v < a.size(); ++v) out[v] = kept[v][static_cast<std::size_t>(a[v])];
  return out;
}

std::optional<SolveOutcome> solve_elimination(const ChoiceProblem& p, std::int64_t max_table) {
  const Reduced r = reduce_domains(p);
  if (r.empty) {
    SolveOutcome out;
    out.method = "dynamic programming";
    out.status = SolveStatus::infeasible;
    return out;
  }
  std::optional<SolveOutcome> out = eliminate(r.problem, max_table);
  if (out && !out->best.empty()) {
    out->best = r.original(out->best);
    out->value = evaluate(p, out->best);
  }
  return out;
}

}  // namespace shardmm::solve
