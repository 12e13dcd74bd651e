#include "solve/arc_consistency.h"

namespace shardmm::solve {

ArcConsistency::ArcConsistency(const std::vector<int>& domain) : factors_of_(domain.size()), unions_of_(domain.size()) {
  for (int n : domain) live_.emplace_back(static_cast<std::size_t>(n), 1);
}

void ArcConsistency::add(const Factor& f) {
  const std::size_t id = factors_.size();
  Watched& w = factors_.emplace_back();
  w.factor = &f;
  for (int v : f.vars) factors_of_[static_cast<std::size_t>(v)].push_back(id);
  factor_queued_.push_back(1);
  factor_queue_.push_back(id);
}

void ArcConsistency::add_union(std::vector<int> vars) {
  const std::size_t id = unions_.size();
  for (int v : vars) unions_of_[static_cast<std::size_t>(v)].push_back(id);
  unions_.push_back(std::move(vars));
  union_queued_.push_back(1);
  union_queue_.push_back(id);
}

void ArcConsistency::restrict(int var, const std::vector<char>& allowed) {
  std::vector<char> supported(live_[static_cast<std::size_t>(var)].size(), 0);
  for (std::size_t x = 0; x < supported.size() && x < allowed.size(); ++x) supported[x] = allowed[x];
  keep_only(var, supported);
}

// Worklist order: a long program's factors are each swept again only where a neighbour's drop
// reaches them (sweeping every factor until nothing changes took a sweep per factor of a chain
// that the drops walk along: most of a 120-op chain's solve, 2026-12-08).
void ArcConsistency::settle() {
  while (!factor_queue_.empty() || !union_queue_.empty()) {
    if (!factor_queue_.empty()) {
      const std::size_t id = factor_queue_.front();
      factor_queue_.pop_front();
      factor_queued_[id] = 0;
      sweep(factors_[id]);
    } else {
      const std::size_t u = union_queue_.front();
      union_queue_.pop_front();
      union_queued_[u] = 0;
      sweep_union(unions_[u]);
    }
  }
}

void ArcConsistency::sweep(Watched& w) {
  const Factor& f = *w.factor;
  std::vector<std::vector<char>> supported(f.vars.size());
  for (std::size_t i = 0; i < f.vars.size(); ++i)
    supported[i].assign(live_[static_cast<std::size_t>(f.vars[i])].size(), 0);
  // Whether entry `at` has all its values live; then it supports them.
  const auto supports = [&](std::uint32_t at) {
    const std::vector<int>& values = f.entries[at].values;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!live(f.vars[i], values[i])) return false;
    }
    for (std::size_t i = 0; i < values.size(); ++i) supported[i][static_cast<std::size_t>(values[i])] = 1;
    return true;
  };
  if (!w.swept) {
    for (std::size_t at = 0; at < f.entries.size(); ++at) {
      if (supports(static_cast<std::uint32_t>(at))) w.alive.push_back(static_cast<std::uint32_t>(at));
    }
    w.swept = true;
  } else {
    std::size_t kept = 0;
    for (const std::uint32_t at : w.alive) {
      if (supports(at)) w.alive[kept++] = at;
    }
    w.alive.resize(kept);
  }
  for (std::size_t i = 0; i < f.vars.size(); ++i) keep_only(f.vars[i], supported[i]);
}

// Each part's mask must make, with one live mask of every other part, a live mask of the union,
// and the union's must be one that live masks of the parts make.
void ArcConsistency::sweep_union(const std::vector<int>& u) {
  const std::size_t parts = u.size() - 1, masks = live_[static_cast<std::size_t>(u[0])].size();
  const auto unions_of = [&](const std::vector<char>& a, const std::vector<char>& b) {
    std::vector<char> out(masks, 0);
    for (std::size_t x = 0; x < masks; ++x) {
      for (std::size_t y = 0; a[x] && y < masks; ++y) {
        if (b[y]) out[x | y] = 1;
      }
    }
    return out;
  };
  // The unions of live masks of the parts before part i (before[i]) and after it (after[i + 1]).
  std::vector<char> nothing(masks, 0);
  nothing[0] = 1;
  std::vector<std::vector<char>> before(parts + 1, nothing), after(parts + 1, nothing);
  for (std::size_t i = 0; i < parts; ++i)
    before[i + 1] = unions_of(before[i], live_[static_cast<std::size_t>(u[i + 1])]);
  for (std::size_t i = parts; i-- > 0;) after[i] = unions_of(after[i + 1], live_[static_cast<std::size_t>(u[i + 1])]);
  keep_only(u[0], before[parts]);
  for (std::size_t i = 0; i < parts; ++i) {
    const std::vector<char> others = unions_of(before[i], after[i + 1]);
    const std::vector<char>& whole = live_[static_cast<std::size_t>(u[0])];
    std::vector<char> supported(masks, 0);
    for (std::size_t m = 0; m < masks; ++m) {
      for (std::size_t o = 0; !supported[m] && o < masks; ++o) supported[m] = others[o] && whole[o | m];
    }
    keep_only(u[i + 1], supported);
  }
}

// Drops the values of `var` not supported; what else constrains the variable is swept again.
void ArcConsistency::keep_only(int var, const std::vector<char>& supported) {
  bool dropped = false;
  std::vector<char>& l = live_[static_cast<std::size_t>(var)];
  for (std::size_t x = 0; x < l.size(); ++x) {
    if (l[x] && !supported[x]) {
      l[x] = 0;
      dropped = true;
    }
  }
  if (!dropped) return;
  for (const std::size_t id : factors_of_[static_cast<std::size_t>(var)]) {
    if (!factor_queued_[id]) factor_queue_.push_back(id);
    factor_queued_[id] = 1;
  }
  for (const std::size_t u : unions_of_[static_cast<std::size_t>(var)]) {
    if (!union_queued_[u]) union_queue_.push_back(u);
    union_queued_[u] = 1;
  }
}

}  // namespace shardmm::solve
