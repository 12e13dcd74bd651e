// The choice problem's evaluation, the exhaustive solver and the dynamic program (min-sum
// variable elimination). The integer program is in cbc_solver.cpp, the one file that sees CBC.
#include "shardmm/solve/choices.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <queue>

#include "shardmm/core/error.h"
#include "solve/arc_consistency.h"
#include "solve/factor_index.h"

namespace shardmm::solve {

const char* to_string(SolveStatus s) {
  switch (s) {
    case SolveStatus::optimal:
      return "optimal";
    case SolveStatus::feasible:
      return "feasible";
    case SolveStatus::local:
      return "local";
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

// `entry_of(k)`: the entry of factor k that `a` chooses, -1 when the factor does not allow it.
template <typename EntryOf>
Evaluation evaluate_with(const ChoiceProblem& p, const Assignment& a, EntryOf entry_of, std::vector<char>& used_shared) {
  Evaluation out;
  std::fill(used_shared.begin(), used_shared.end(), 0);
  std::vector<int> chosen(p.factors.size());
  for (std::size_t k = 0; k < p.factors.size(); ++k) {
    const int e = entry_of(k);
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
  // One assignment: a scan of the entries costs less than indexing the factors' dense products.
  std::vector<char> used(p.shared.size());
  return evaluate_with(
      p, a,
      [&](std::size_t k) {
        const Factor& f = p.factors[k];
        for (std::size_t e = f.entries.size(); e-- > 0;) {  // the last, as FactorIndex keeps
          bool match = true;
          for (std::size_t i = 0; i < f.vars.size() && match; ++i)
            match = f.entries[e].values[i] == a[static_cast<std::size_t>(f.vars[i])];
          if (match) return static_cast<int>(e);
        }
        return -1;
      },
      used);
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
      const Evaluation e = evaluate_with(p, a, [&](std::size_t k) { return index[k].entry(a); }, used);
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

// ---- Variable elimination over sparse tables. A program's factors allow a few thousand of
// the millions of tuples their domains span, so a table lists only its allowed tuples, a join
// meets them by hashing the variables they share, and each round eliminates the variable
// whose join is estimated smallest from the tables' real sizes.

namespace {

// The tuples a table allows over `vars` (a row of values each) and their costs.
struct Table {
  std::vector<int> vars;
  std::vector<int> rows;
  std::vector<double> cost;
  std::size_t size() const { return cost.size(); }
  const int* row(std::size_t r) const { return rows.data() + r * vars.size(); }
};

// Tuples of one width, numbered as they are first inserted (open addressing).
class TupleMap {
 public:
  explicit TupleMap(std::size_t width) : width_(width), slots_(16, -1) {}
  int size() const { return count_; }
  std::vector<int>& tuples() { return tuples_; }
  int find(const int* t) const {  // -1: absent
    const std::uint32_t h = hash(t);
    for (std::size_t s = h & mask();; s = (s + 1) & mask()) {
      const int at = slots_[s];
      if (at < 0 || equal(at, h, t)) return at;
    }
  }
  int insert(const int* t) {
    if (2 * (static_cast<std::size_t>(count_) + 1) > slots_.size()) grow();
    const std::uint32_t h = hash(t);
    std::size_t s = h & mask();
    for (; slots_[s] >= 0; s = (s + 1) & mask()) {
      if (equal(slots_[s], h, t)) return slots_[s];
    }
    slots_[s] = count_;
    tuples_.insert(tuples_.end(), t, t + width_);
    hashes_.push_back(h);
    return count_++;
  }

 private:
  std::size_t mask() const { return slots_.size() - 1; }
  std::uint32_t hash(const int* t) const {
    std::uint64_t h = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < width_; ++i) {
      h = (h ^ static_cast<std::uint32_t>(t[i])) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    return static_cast<std::uint32_t>(h ^ (h >> 29));
  }
  // Tuples of a few values, compared value by value after their hashes (a call to memcmp per
  // probe was a third of the dynamic program's time).
  bool equal(int at, std::uint32_t h, const int* t) const {
    if (hashes_[static_cast<std::size_t>(at)] != h) return false;
    const int* u = tuples_.data() + width_ * static_cast<std::size_t>(at);
    for (std::size_t i = 0; i < width_; ++i) {
      if (u[i] != t[i]) return false;
    }
    return true;
  }
  void grow() {
    slots_.assign(2 * slots_.size(), -1);
    for (int at = 0; at < count_; ++at) {
      std::size_t s = hashes_[static_cast<std::size_t>(at)] & mask();
      while (slots_[s] >= 0) s = (s + 1) & mask();
      slots_[s] = at;
    }
  }

  std::size_t width_;
  std::vector<int> slots_;  // -1: empty
  std::vector<int> tuples_;
  std::vector<std::uint32_t> hashes_;  // by tuple: its hash
  int count_ = 0;
};

// A table's rows grouped by their values in some of its columns: the rows that agree with
// what the join has chosen so far.
struct RowIndex {
  std::vector<int> cols;  // the key's columns of the table
  TupleMap keys;
  std::vector<int> start;  // by key: its first entry in `rows`; one more at the end
  std::vector<int> rows;

  RowIndex(const Table& t, std::vector<int> key_cols) : cols(std::move(key_cols)), keys(cols.size()) {
    std::vector<int> key(cols.size()), key_of(t.size());
    for (std::size_t r = 0; r < t.size(); ++r) {
      for (std::size_t i = 0; i < cols.size(); ++i) key[i] = t.row(r)[cols[i]];
      key_of[r] = keys.insert(key.data());
    }
    start.assign(static_cast<std::size_t>(keys.size()) + 1, 0);
    for (int k : key_of) ++start[static_cast<std::size_t>(k) + 1];
    for (std::size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    rows.resize(t.size());
    std::vector<int> next(start.begin(), start.end() - 1);
    for (std::size_t r = 0; r < t.size(); ++r) rows[static_cast<std::size_t>(next[key_of[r]]++)] = static_cast<int>(r);
  }
};

// The order a bucket's tables are joined in (the smallest first, then each time the one that
// the variables already joined narrow most) and the joined size it predicts, as if the
// tables' values were independent; never more than the dense product of their domains.
std::pair<std::vector<std::size_t>, double> join_order(const std::vector<int>& domain,
                                                       const std::vector<const Table*>& bucket) {
  std::vector<std::size_t> order;
  std::vector<int> joined;
  std::vector<char> taken(bucket.size(), 0);
  double size = 1, dense = 1;
  while (order.size() < bucket.size()) {
    std::size_t pick = bucket.size();
    double pick_growth = 0;
    for (std::size_t b = 0; b < bucket.size(); ++b) {
      if (taken[b]) continue;
      double growth = static_cast<double>(bucket[b]->size());
      if (!order.empty()) {
        for (int v : bucket[b]->vars) {
          if (std::find(joined.begin(), joined.end(), v) != joined.end()) growth /= domain[static_cast<std::size_t>(v)];
        }
      }
      if (pick == bucket.size() || growth < pick_growth) {
        pick = b;
        pick_growth = growth;
      }
    }
    taken[pick] = 1;
    order.push_back(pick);
    size *= pick_growth;
    for (int v : bucket[pick]->vars) {
      if (std::find(joined.begin(), joined.end(), v) != joined.end()) continue;
      joined.push_back(v);
      dense *= domain[static_cast<std::size_t>(v)];
    }
  }
  return {order, std::min(size, dense)};
}

// Joins a bucket's tables and takes the min over one variable: for each tuple of the others,
// the least summed cost and the value of the variable that reaches it.
class BucketJoin {
 public:
  BucketJoin(std::vector<const Table*> bucket, int var, std::size_t n)
      : tables_(std::move(bucket)), var_(var), values_(n) {
    std::vector<int> joined;
    for (const Table* table : tables_) {
      const Table& t = *table;
      std::vector<int> key_cols, fresh_cols;
      for (std::size_t c = 0; c < t.vars.size(); ++c) {
        const bool seen = std::find(joined.begin(), joined.end(), t.vars[c]) != joined.end();
        (seen ? key_cols : fresh_cols).push_back(static_cast<int>(c));
        if (!seen) joined.push_back(t.vars[c]);
      }
      indexes_.emplace_back(t, key_cols);
      fresh_.push_back(std::move(fresh_cols));
      keys_.emplace_back(key_cols.size());
    }
    for (int v : joined) {
      if (v != var) others_.push_back(v);
    }
    result_ = TupleMap(others_.size());
    tuple_.resize(others_.size());
  }

  // False when the join passes `max_joined` tuples.
  bool run(std::int64_t max_joined) {
    max_joined_ = max_joined;
    visit(0, 0.0);
    return joined_ <= max_joined_;
  }
  Table table() {
    Table t;
    t.vars = others_;
    t.rows = std::move(result_.tuples());
    t.cost = std::move(low_);
    return t;
  }
  const std::vector<int>& best() const { return best_; }

 private:
  void visit(std::size_t level, double cost) {
    if (joined_ > max_joined_) return;
    if (level == tables_.size()) {
      ++joined_;
      for (std::size_t i = 0; i < others_.size(); ++i) tuple_[i] = values_[static_cast<std::size_t>(others_[i])];
      const auto at = static_cast<std::size_t>(result_.insert(tuple_.data()));
      if (at == low_.size()) {
        low_.push_back(cost);
        best_.push_back(values_[static_cast<std::size_t>(var_)]);
      } else if (cost < low_[at]) {
        low_[at] = cost;
        best_[at] = values_[static_cast<std::size_t>(var_)];
      }
      return;
    }
    const Table& t = *tables_[level];
    const RowIndex& index = indexes_[level];
    std::vector<int>& key = keys_[level];
    for (std::size_t i = 0; i < key.size(); ++i) {
      key[i] = values_[static_cast<std::size_t>(t.vars[static_cast<std::size_t>(index.cols[i])])];
    }
    const int k = index.keys.find(key.data());
    if (k < 0) return;
    for (int at = index.start[static_cast<std::size_t>(k)]; at < index.start[static_cast<std::size_t>(k) + 1]; ++at) {
      const auto r = static_cast<std::size_t>(index.rows[static_cast<std::size_t>(at)]);
      for (int c : fresh_[level]) values_[static_cast<std::size_t>(t.vars[static_cast<std::size_t>(c)])] = t.row(r)[c];
      visit(level + 1, cost + t.cost[r]);
    }
  }

  std::vector<const Table*> tables_;
  int var_;
  std::vector<int> values_;  // by variable: the values the join has chosen
  std::vector<RowIndex> indexes_;
  std::vector<std::vector<int>> fresh_;  // by table: its columns no earlier table has
  std::vector<std::vector<int>> keys_;
  std::vector<int> others_, tuple_;
  TupleMap result_{0};
  std::vector<double> low_;
  std::vector<int> best_;
  std::int64_t joined_ = 0, max_joined_ = 0;
};

// A join is cut off past this many times its estimated size, or this many tuples if more.
constexpr double kJoinCapOverEstimate = 4;
constexpr double kLeastJoinCap = 1 << 16;

// The status and the best assignment of the variables of `domain` (their numbers of values)
// over `tables`, one per factor: the caller evaluates it.
std::optional<SolveOutcome> eliminate(const std::vector<int>& domain, std::vector<Table> tables,
                                      std::int64_t max_table) {
  const std::size_t n = domain.size();
  // For back substitution: each eliminated variable's best value by the tuple of the others.
  struct Step {
    int var;
    Table best_value;  // cost holds the value
  };
  std::vector<Step> steps;
  SolveOutcome out;
  out.method = "dynamic programming";
  const auto infeasible = [&] {
    out.status = SolveStatus::infeasible;
    return out;
  };
  // By variable: the tuples its join passed when cut off, until one of its tables changes.
  std::vector<double> joins_at_least(n, 0);
  while (true) {
    std::vector<std::vector<std::size_t>> holding(n);  // by variable: the tables that name it
    for (std::size_t k = 0; k < tables.size(); ++k) {
      for (int v : tables[k].vars) holding[static_cast<std::size_t>(v)].push_back(k);
    }
    // Each variable's bucket (its tables, in join order) and the size of its join: estimated,
    // or, once its join passed its cap, at least that.
    struct Candidate {
      int var;
      std::vector<std::size_t> order;
      double size;
    };
    std::vector<Candidate> candidates;
    for (std::size_t v = 0; v < n; ++v) {
      if (holding[v].empty()) continue;
      std::vector<const Table*> bucket;
      for (std::size_t k : holding[v]) bucket.push_back(&tables[k]);
      auto [order, size] = join_order(domain, bucket);
      for (std::size_t& b : order) b = holding[v][b];
      candidates.push_back({static_cast<int>(v), std::move(order), std::max(size, joins_at_least[v])});
    }
    if (candidates.empty()) break;
    // The estimate takes the tables' values as independent; where they are not, a join can be
    // many times larger (a gradient's union chain against its readers' tables: 78,000 estimated,
    // 1.7 million joined). A join is cut off at a few times its estimate, and the smallest
    // candidate then is tried, so a wrong estimate costs a bounded part of a join, not the join.
    std::optional<BucketJoin> join;
    Candidate* pick = nullptr;
    while (true) {
      pick = &*std::min_element(candidates.begin(), candidates.end(),
                                [](const Candidate& a, const Candidate& b) { return a.size < b.size; });
      if (pick->size > static_cast<double>(max_table)) return std::nullopt;
      const std::int64_t cap = static_cast<std::int64_t>(
          std::min(static_cast<double>(max_table), std::max(kLeastJoinCap, kJoinCapOverEstimate * pick->size)));
      std::vector<const Table*> bucket;
      for (std::size_t k : pick->order) bucket.push_back(&tables[k]);
      join.emplace(std::move(bucket), pick->var, n);
      if (join->run(cap)) break;
      pick->size = joins_at_least[static_cast<std::size_t>(pick->var)] = static_cast<double>(cap) + 1;
    }
    Table reduced = join->table();
    if (reduced.size() == 0) return infeasible();
    for (int v : reduced.vars) joins_at_least[static_cast<std::size_t>(v)] = 0;
    Table best = reduced;
    best.cost.assign(join->best().begin(), join->best().end());
    join.reset();
    std::vector<Table> rest;
    for (std::size_t k = 0; k < tables.size(); ++k) {
      if (std::find(pick->order.begin(), pick->order.end(), k) == pick->order.end())
        rest.push_back(std::move(tables[k]));
    }
    rest.push_back(std::move(reduced));
    tables = std::move(rest);
    steps.push_back({pick->var, std::move(best)});
  }
  for (const Table& t : tables) {  // each over no variables: a constant, or nothing allowed
    if (t.size() == 0) return infeasible();
  }
  Assignment a(n, 0);  // a variable no factor names takes its first value
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const Table& t = it->best_value;
    for (std::size_t r = 0; r < t.size(); ++r) {
      bool match = true;
      for (std::size_t i = 0; i < t.vars.size() && match; ++i) match = t.row(r)[i] == a[static_cast<std::size_t>(t.vars[i])];
      if (match) {
        a[static_cast<std::size_t>(it->var)] = static_cast<int>(t.cost[r]);
        break;
      }
    }
  }
  out.best = a;
  out.status = SolveStatus::optimal;
  return out;
}

// By variable and value: whether the value survives arc consistency (reduce_domains), the
// values `keep` refuses (where given) dropped first.
std::vector<std::vector<char>> supported_values(const ChoiceProblem& p, const Kept* keep = nullptr) {
  ArcConsistency ac(p.domain);
  for (std::size_t v = 0; keep && v < keep->size() && v < p.domain.size(); ++v) {
    if (!(*keep)[v].empty()) ac.restrict(static_cast<int>(v), (*keep)[v]);
  }
  for (const Factor& f : p.factors) ac.add(f);
  ac.settle();
  return ac.values();
}

// The surviving values renumbered: by variable, each original value's new number (-1: dropped)
// and each new number's original value; false when some variable keeps none.
bool renumber(const std::vector<std::vector<char>>& alive, std::vector<std::vector<int>>& index,
              std::vector<std::vector<int>>& kept) {
  const std::size_t n = alive.size();
  index.assign(n, {});
  kept.assign(n, {});
  for (std::size_t v = 0; v < n; ++v) {
    index[v].assign(alive[v].size(), -1);
    for (std::size_t x = 0; x < alive[v].size(); ++x) {
      if (!alive[v][x]) continue;
      index[v][x] = static_cast<int>(kept[v].size());
      kept[v].push_back(static_cast<int>(x));
    }
    if (kept[v].empty()) return false;
  }
  return true;
}

}  // namespace

Reduced reduce_domains(const ChoiceProblem& p) {
  const std::size_t n = p.domain.size();
  Reduced r;
  std::vector<std::vector<int>> index;
  if (!renumber(supported_values(p), index, r.kept)) return {};  // nothing allowed: `empty` says so
  for (std::size_t v = 0; v < n; ++v) r.problem.domain.push_back(static_cast<int>(r.kept[v].size()));
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

namespace {

// solve_elimination of `p`, or of restricted(p, *keep) where given.
std::optional<SolveOutcome> eliminate_within(const ChoiceProblem& p, const Kept* keep, std::int64_t max_table) {
  const auto start = std::chrono::steady_clock::now();
  // reduce_domains' problem without copying its entries: the tables straight from p's.
  std::vector<std::vector<int>> index, kept;
  std::optional<SolveOutcome> out;
  if (!renumber(supported_values(p, keep), index, kept)) {
    out.emplace();
    out->method = "dynamic programming";
    out->status = SolveStatus::infeasible;
  } else {
    std::vector<int> domain;
    for (const std::vector<int>& values : kept) domain.push_back(static_cast<int>(values.size()));
    // A variable left one value is no table's column: it would be joined only to be dropped
    // (a pass over every row of its tables: 0.4-0.6 s for one of 1.7 million rows).
    std::vector<Table> tables;
    for (const Factor& f : p.factors) {
      Table& t = tables.emplace_back();
      for (int v : f.vars) {
        if (domain[static_cast<std::size_t>(v)] > 1) t.vars.push_back(v);
      }
      for (const FactorEntry& e : f.entries) {
        const std::size_t at = t.rows.size();
        bool alive = true;
        for (std::size_t i = 0; i < f.vars.size() && alive; ++i) {
          const int x = index[static_cast<std::size_t>(f.vars[i])][static_cast<std::size_t>(e.values[i])];
          alive = x >= 0;
          if (domain[static_cast<std::size_t>(f.vars[i])] > 1) t.rows.push_back(x);
        }
        if (!alive) {
          t.rows.resize(at);
          continue;
        }
        t.cost.push_back(e.time + kSecondsPerByteTieBreak * static_cast<double>(e.memory));
      }
    }
    out = eliminate(domain, std::move(tables), max_table);
  }
  if (!out) return out;
  if (!out->best.empty()) {
    for (std::size_t v = 0; v < out->best.size(); ++v) out->best[v] = kept[v][static_cast<std::size_t>(out->best[v])];
    out->value = evaluate(p, out->best);
    out->lower_bound = out->value.time;
  }
  out->seconds = seconds_since(start);
  return out;
}

}  // namespace

std::optional<SolveOutcome> solve_elimination(const ChoiceProblem& p, std::int64_t max_table) {
  return eliminate_within(p, nullptr, max_table);
}

std::optional<SolveOutcome> solve_elimination(const ChoiceProblem& p, const Kept& keep, std::int64_t max_table) {
  return eliminate_within(p, &keep, max_table);
}

ChoiceProblem restricted(const ChoiceProblem& p, const Kept& keep) {
  ChoiceProblem out;
  out.domain = p.domain;
  out.shared = p.shared;
  out.points = p.points;
  out.value_bytes = p.value_bytes;
  out.factors.reserve(p.factors.size());
  std::vector<char> named(p.domain.size(), 0);
  for (const Factor& f : p.factors) {
    Factor& kept = out.factors.emplace_back();
    kept.vars = f.vars;
    std::vector<std::pair<std::size_t, const std::vector<char>*>> checks;  // (position, its variable's list)
    for (std::size_t i = 0; i < f.vars.size(); ++i) {
      const auto v = static_cast<std::size_t>(f.vars[i]);
      named[v] = 1;
      if (v < keep.size() && !keep[v].empty()) checks.push_back({i, &keep[v]});
    }
    for (const FactorEntry& e : f.entries) {
      const bool keeps = std::all_of(checks.begin(), checks.end(), [&](const auto& check) {
        return (*check.second)[static_cast<std::size_t>(e.values[check.first])] != 0;
      });
      if (keeps) kept.entries.push_back(e);
    }
  }
  // Appended after the others, so that the timeline's figure terms still name their factors.
  for (std::size_t v = 0; v < keep.size() && v < p.domain.size(); ++v) {
    if (named[v] || keep[v].empty()) continue;
    Factor& f = out.factors.emplace_back();
    f.vars = {static_cast<int>(v)};
    for (int x = 0; x < p.domain[v]; ++x) {
      if (keep[v][static_cast<std::size_t>(x)]) f.entries.push_back({{x}, 0, 0, {}, {}});
    }
  }
  return out;
}

std::vector<SolveOutcome> solve_top(const ChoiceProblem& p, const SolveLimits& limits, SolveOutcome first, int k,
                                    const BestOf& best) {
  if (!limits.excluded.empty()) throw UsageError("solve_top: limits.excluded must be empty (its parts replace them)");
  std::vector<SolveOutcome> out;
  if (k < 1 || first.best.empty()) return out;
  std::vector<int> on = limits.distinct_on;
  if (on.empty()) {
    on.resize(p.domain.size());
    std::iota(on.begin(), on.end(), 0);
  }
  struct Part {
    Kept allowed;
    SolveOutcome outcome;
  };
  // The best part on top; equally fast parts by memory, as the solvers break ties.
  const auto after = [](const Part& a, const Part& b) {
    if (a.outcome.value.time != b.outcome.value.time) return a.outcome.value.time > b.outcome.value.time;
    return a.outcome.value.memory > b.outcome.value.memory;
  };
  std::priority_queue<Part, std::vector<Part>, decltype(after)> parts(after);
  parts.push({Kept(p.domain.size()), std::move(first)});
  // A part whose solve found nothing in its time (or only with a gap) may hide a better answer
  // than the ones after it: those are then not proven the next best.
  bool proven = true;
  while (!parts.empty() && static_cast<int>(out.size()) < k) {
    Part part = parts.top();
    parts.pop();
    if (!proven && part.outcome.status == SolveStatus::optimal) part.outcome.status = SolveStatus::feasible;
    const Assignment x = part.outcome.best;
    out.push_back(std::move(part.outcome));
    if (static_cast<int>(out.size()) == k) break;
    Kept allowed = std::move(part.allowed);
    for (int v : on) {
      std::vector<char>& values = allowed[static_cast<std::size_t>(v)];
      if (values.empty()) values.assign(static_cast<std::size_t>(p.domain[static_cast<std::size_t>(v)]), 1);
      const auto xv = static_cast<std::size_t>(x[static_cast<std::size_t>(v)]);
      Kept other = allowed;
      other[static_cast<std::size_t>(v)][xv] = 0;
      const std::vector<char>& left = other[static_cast<std::size_t>(v)];
      if (std::find(left.begin(), left.end(), 1) != left.end()) {
        SolveOutcome o = best(p, other, limits);
        proven = proven && (o.status == SolveStatus::optimal || o.status == SolveStatus::infeasible);
        if (!o.best.empty()) parts.push({std::move(other), std::move(o)});
      }
      values.assign(values.size(), 0);
      values[xv] = 1;
    }
  }
  return out;
}

}  // namespace shardmm::solve
