// The choice problem as an integer program, solved by CBC (the only file that includes it).
//
// Columns: x[v][d] (variable v takes value d), y[f][e] (factor f uses its entry e), both
// binary; w[s][d] binary too (shared term s is held, its variable at d). Rows:
//   sum_d x[v][d] = 1;   sum_e y[f][e] = 1;
//   for each variable u of f and value d: sum_{e: u = d} y[f][e] = x[u][d]   (marginals agree)
//   for each shared term s, factor f naming it, value d: w[s][d] >= sum_{e in f names s, var = d} y[f][e]
//   sum y * memory + sum w * bytes <= limit                                  (with a limit)
//   or, with a timeline: F[f][i] = sum_e y[f][e] * figures_e[i] (a column per figure a point
//   names), and for each point that can be the peak: its terms <= P, P <= limit
//   (P: the peak, a column)
//   each excluded assignment: sum_{v in distinct_on} x[v][A_v] <= |distinct_on| - 1
// Objective: sum y * time, in microseconds (CBC's tolerances are absolute), plus the memory
// tie-break (choices.h) on y's and w's bytes, or on P where it has a row per point; or (minimize_memory)
// the memory row itself, or P.
#include <coin/CbcModel.hpp>
#include <coin/CbcSolver.hpp>
#include <coin/ClpEventHandler.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "shardmm/core/error.h"
#include "shardmm/solve/choices.h"

namespace shardmm::solve {

namespace {

constexpr double kScale = 1e6;                                     // seconds -> microseconds
constexpr double kUnbounded = std::numeric_limits<double>::max();  // CBC reads it as infinity (COIN_DBL_MAX)

using SparseRow = std::vector<std::pair<int, double>>;  // (column, coefficient), by column

// Whether every coefficient of `a` is at most `b`'s (a column `b` lacks counts as 0).
bool dominated(const SparseRow& a, const SparseRow& b) {
  std::size_t j = 0;
  for (const auto& [col, coef] : a) {
    while (j < b.size() && b[j].first < col) ++j;
    if (j == b.size() || b[j].first != col || b[j].second < coef) return false;
  }
  return true;
}

// The timeline's points as rows over the columns, without those another point's row implies:
// every column is non-negative (x, y, w in [0, 1], a figure column a sum of them times bytes),
// so a row whose every coefficient is at most another's never binds first. Points that differ
// only in a repeat's iteration (their live values the same, fewer kept ones) go this way.
std::vector<SparseRow> peak_candidates(std::vector<SparseRow> rows) {
  std::sort(rows.begin(), rows.end(), [](const SparseRow& a, const SparseRow& b) { return a.size() > b.size(); });
  std::vector<SparseRow> kept;
  for (SparseRow& r : rows) {
    const bool implied = std::any_of(kept.begin(), kept.end(),
                                     [&](const SparseRow& k) { return k.size() >= r.size() && dominated(r, k); });
    if (!implied) kept.push_back(std::move(r));
  }
  return kept;
}

// The program's columns and rows as they are made, loaded into the solver at once.
class IntegerProgram {
 public:
  int column(double lb, double ub, double obj, bool integer) {
    lower_.push_back(lb);
    upper_.push_back(ub);
    objective_.push_back(obj);
    if (integer) integers_.push_back(static_cast<int>(objective_.size()) - 1);
    return static_cast<int>(objective_.size()) - 1;
  }
  void add(const std::vector<int>& cols, const std::vector<double>& coefs, char sense, double rhs) {
    starts_.push_back(static_cast<CoinBigIndex>(indices_.size()));
    lengths_.push_back(static_cast<int>(cols.size()));
    indices_.insert(indices_.end(), cols.begin(), cols.end());
    values_.insert(values_.end(), coefs.begin(), coefs.end());
    row_lower_.push_back(sense == 'L' ? -kUnbounded : rhs);
    row_upper_.push_back(sense == 'G' ? kUnbounded : rhs);
  }
  void load_into(OsiClpSolverInterface& solver) const {
    const CoinPackedMatrix rows(false, static_cast<int>(objective_.size()), static_cast<int>(lengths_.size()),
                                static_cast<CoinBigIndex>(values_.size()), values_.data(), indices_.data(),
                                starts_.data(), lengths_.data());
    solver.loadProblem(rows, lower_.data(), upper_.data(), objective_.data(), row_lower_.data(), row_upper_.data());
    solver.setInteger(integers_.data(), static_cast<int>(integers_.size()));
  }

 private:
  std::vector<double> lower_, upper_, objective_, values_, row_lower_, row_upper_;
  std::vector<int> integers_, indices_, lengths_;
  std::vector<CoinBigIndex> starts_;
};

// Stops Clp's simplex at its first iteration past the deadline. CBC's own time limit is
// checked between its phases and nodes, not inside an LP: a root LP of a large program ran
// minutes past it. `stopped` says that it struck (an LP cut short may have been taken as
// solved or infeasible: nothing CBC then says is proven).
class Deadline : public ClpEventHandler {
 public:
  Deadline(std::chrono::steady_clock::time_point at, std::atomic<bool>* stopped) : at_(at), stopped_(stopped) {}
  int event(Event which) override {
    if (which != endOfIteration || std::chrono::steady_clock::now() < at_) return -1;
    *stopped_ = true;
    return 0;  // Clp stops with status 5, "stopped by event"
  }
  ClpEventHandler* clone() const override { return new Deadline(*this); }

 private:
  std::chrono::steady_clock::time_point at_;
  std::atomic<bool>* stopped_;
};

SolveOutcome mip(const ChoiceProblem& p, const SolveLimits& limits) {
  const auto start = std::chrono::steady_clock::now();
  IntegerProgram lp;
  // The timeline's rows only where memory is constrained or minimized: they cost CBC time, and
  // without them ties between equally fast shardings go to the memory held at once.
  const bool peak_rows = !p.points.empty() && (limits.memory_limit || limits.minimize_memory);
  std::vector<std::vector<int>> x(p.domain.size());
  for (std::size_t v = 0; v < p.domain.size(); ++v) {
    for (int d = 0; d < p.domain[v]; ++d) x[v].push_back(lp.column(0, 1, 0, true));
  }
  std::vector<std::vector<int>> y(p.factors.size());
  for (std::size_t f = 0; f < p.factors.size(); ++f) {
    for (const FactorEntry& e : p.factors[f].entries) {
      const double memory = peak_rows ? 0.0 : static_cast<double>(e.memory);  // else P has it
      const double cost = limits.minimize_memory ? memory : (e.time + kSecondsPerByteTieBreak * memory) * kScale;
      y[f].push_back(lp.column(0, 1, cost, true));
    }
  }
  std::vector<std::vector<int>> w(p.shared.size());
  for (std::size_t s = 0; s < p.shared.size(); ++s) {
    const int dom = p.domain[static_cast<std::size_t>(p.shared[s].var)];
    for (int d = 0; d < dom; ++d) {
      const double bytes = static_cast<double>(p.shared[s].bytes[static_cast<std::size_t>(d)]);
      const double memory = peak_rows ? 0.0 : bytes;
      // Binary, though an OR of binaries needs no integrality: continuous, with the tie-break's
      // tiny costs (1e-11 against times of 1e3), CBC's preprocessing and cuts cut off the optimum
      // of some problems (Solvers.AgreeWithExhaustiveSearchOnRandomProblems at 10x, trial 2575:
      // 1,456 us "optimal" where 1,311 us fits).
      w[s].push_back(
          lp.column(0, 1, limits.minimize_memory ? memory : kSecondsPerByteTieBreak * memory * kScale, true));
    }
  }

  for (std::size_t v = 0; v < p.domain.size(); ++v) lp.add(x[v], std::vector<double>(x[v].size(), 1.0), 'E', 1);
  std::vector<int> cols;
  std::vector<double> coefs;
  for (std::size_t f = 0; f < p.factors.size(); ++f) {
    const Factor& factor = p.factors[f];
    lp.add(y[f], std::vector<double>(y[f].size(), 1.0), 'E', 1);
    for (std::size_t i = 0; i < factor.vars.size(); ++i) {
      const auto u = static_cast<std::size_t>(factor.vars[i]);
      for (int d = 0; d < p.domain[u]; ++d) {
        cols = {x[u][static_cast<std::size_t>(d)]};
        coefs = {-1.0};
        for (std::size_t e = 0; e < factor.entries.size(); ++e) {
          if (factor.entries[e].values[i] == d) {
            cols.push_back(y[f][e]);
            coefs.push_back(1.0);
          }
        }
        lp.add(cols, coefs, 'E', 0);
      }
    }
    // Shared terms this factor names: w[s][d] covers every entry naming s with s's variable at d.
    std::map<std::pair<int, int>, std::vector<int>> naming;  // (s, d) -> entries
    for (std::size_t e = 0; e < factor.entries.size(); ++e) {
      for (int s : factor.entries[e].shared) {
        const int var = p.shared[static_cast<std::size_t>(s)].var;
        const auto pos = std::find(factor.vars.begin(), factor.vars.end(), var);
        if (pos == factor.vars.end())
          throw InputError("solve_mip: a factor names a shared term whose variable it does not hold");
        naming[{s, factor.entries[e].values[static_cast<std::size_t>(pos - factor.vars.begin())]}].push_back(
            static_cast<int>(e));
      }
    }
    for (const auto& [key, entries] : naming) {
      cols = {w[static_cast<std::size_t>(key.first)][static_cast<std::size_t>(key.second)]};
      coefs = {1.0};
      for (int e : entries) {
        cols.push_back(y[f][static_cast<std::size_t>(e)]);
        coefs.push_back(-1.0);
      }
      lp.add(cols, coefs, 'G', 0);
    }
  }
  double most_peak = 0;  // no point holds more, whatever the choices (for the time bound)
  if (peak_rows) {
    std::map<std::pair<int, int>, int> figure_column;
    // -1: every entry's figure is 0 (no column).
    const auto figure = [&](int f, int i) {
      const auto [it, fresh] = figure_column.emplace(std::pair{f, i}, -1);
      if (!fresh) return it->second;
      const auto& all = p.factors[static_cast<std::size_t>(f)].entries;
      if (std::all_of(all.begin(), all.end(),
                      [i](const FactorEntry& e) { return e.figures[static_cast<std::size_t>(i)] == 0; })) {
        return -1;
      }
      it->second = lp.column(0, kUnbounded, 0, false);
      std::vector<int> c = {it->second};
      std::vector<double> k = {-1.0};
      const auto& entries = p.factors[static_cast<std::size_t>(f)].entries;
      for (std::size_t e = 0; e < entries.size(); ++e) {
        const auto bytes = static_cast<double>(entries[e].figures[static_cast<std::size_t>(i)]);
        if (bytes == 0) continue;
        c.push_back(y[static_cast<std::size_t>(f)][e]);
        k.push_back(bytes);
      }
      lp.add(c, k, 'E', 0);
      return it->second;
    };
    std::vector<SparseRow> points;
    for (const TimelinePoint& point : p.points) {
      std::map<int, double> row;
      for (const PointTerm& t : point.terms) {
        const auto at = static_cast<std::size_t>(t.index);
        const auto count = static_cast<double>(t.count);
        if (t.kind == PointTerm::Kind::figure) {
          if (const int col = figure(t.index, t.figure); col >= 0) row[col] += count;
          continue;
        }
        const auto var = t.kind == PointTerm::Kind::value ? at : static_cast<std::size_t>(p.shared[at].var);
        for (std::size_t d = 0; d < p.value_bytes[var].size(); ++d) {
          row[(t.kind == PointTerm::Kind::value ? x[var] : w[at])[d]] +=
              count * static_cast<double>(p.value_bytes[var][d]);
        }
      }
      SparseRow sparse;
      for (const auto& [col, coef] : row) {
        if (coef != 0) sparse.emplace_back(col, coef);
      }
      points.push_back(std::move(sparse));
    }
    for (const TimelinePoint& point : p.points) {
      double most = 0;
      for (const PointTerm& t : point.terms) {
        const auto at = static_cast<std::size_t>(t.index);
        std::int64_t m = 0;
        if (t.kind == PointTerm::Kind::figure) {
          for (const FactorEntry& e : p.factors[at].entries)
            m = std::max(m, e.figures[static_cast<std::size_t>(t.figure)]);
        } else {
          const auto& bytes =
              p.value_bytes[t.kind == PointTerm::Kind::value ? at : static_cast<std::size_t>(p.shared[at].var)];
          m = *std::max_element(bytes.begin(), bytes.end());
        }
        most += static_cast<double>(t.count) * static_cast<double>(m);
      }
      most_peak = std::max(most_peak, most);
    }
    const int peak = lp.column(0, limits.memory_limit ? static_cast<double>(*limits.memory_limit) : kUnbounded,
                               limits.minimize_memory ? 1.0 : kSecondsPerByteTieBreak * kScale, false);
    for (const SparseRow& r : peak_candidates(std::move(points))) {
      cols = {peak};
      coefs = {-1.0};
      for (const auto& [col, coef] : r) {
        cols.push_back(col);
        coefs.push_back(coef);
      }
      lp.add(cols, coefs, 'L', 0);
    }
  } else if (limits.memory_limit) {
    cols.clear();
    coefs.clear();
    for (std::size_t f = 0; f < p.factors.size(); ++f) {
      for (std::size_t e = 0; e < p.factors[f].entries.size(); ++e) {
        if (p.factors[f].entries[e].memory == 0) continue;
        cols.push_back(y[f][e]);
        coefs.push_back(static_cast<double>(p.factors[f].entries[e].memory));
      }
    }
    for (std::size_t s = 0; s < p.shared.size(); ++s) {
      for (std::size_t d = 0; d < w[s].size(); ++d) {
        cols.push_back(w[s][d]);
        coefs.push_back(static_cast<double>(p.shared[s].bytes[d]));
      }
    }
    lp.add(cols, coefs, 'L', static_cast<double>(*limits.memory_limit));
  }
  for (const Assignment& a : limits.excluded) {
    cols.clear();
    std::vector<int> on = limits.distinct_on;
    if (on.empty()) {
      for (std::size_t v = 0; v < p.domain.size(); ++v) on.push_back(static_cast<int>(v));
    }
    for (int v : on)
      cols.push_back(x[static_cast<std::size_t>(v)][static_cast<std::size_t>(a[static_cast<std::size_t>(v)])]);
    lp.add(cols, std::vector<double>(cols.size(), 1.0), 'L', static_cast<double>(on.size()) - 1);
  }

  // As CBC's C interface sets a model up (CbcMain0 before the problem, CbcMain1 to solve it),
  // with the deadline's handler in the LP solver (CbcModel's copies of it clone the handler).
  std::atomic<bool> stopped{false};
  CbcModel model{OsiClpSolverInterface()};
  CbcSolverUsefulData data;
  CbcMain0(model, data);
  auto& solver = dynamic_cast<OsiClpSolverInterface&>(*model.solver());
  lp.load_into(solver);
  const Deadline deadline(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(limits.seconds)),
                          &stopped);
  solver.getModelPtr()->passInEventHandler(&deadline);
  model.setLogLevel(0);
  model.setMaximumSeconds(limits.seconds);
  model.setAllowableGap(1e-7);  // microseconds: 0.1 ps, below any step's resolution
  model.setAllowableFractionGap(1e-9);
  // CBC prunes what cannot beat the incumbent by its cutoff increment (1e-5 by default: 10 ps
  // here), which is more than the memory tie-break separates equally fast shardings by.
  const char* argv[] = {"shardmm", "-increment", "1e-9", "-timeMode", "elapsed", "-solve", "-quit"};
  CbcMain1(static_cast<int>(std::size(argv)), argv, model, nullptr, data);

  // CBC's bound is on time plus the tie-break; no assignment's tie-break exceeds the largest
  // peak any point could hold, or the largest memory every factor and shared term could add.
  const auto time_bound = [&] {
    double most = most_peak;
    if (!peak_rows) {
      for (const Factor& f : p.factors) {
        std::int64_t m = 0;
        for (const FactorEntry& e : f.entries) m = std::max(m, e.memory);
        most += static_cast<double>(m);
      }
      for (const SharedTerm& s : p.shared)
        most += static_cast<double>(*std::max_element(s.bytes.begin(), s.bytes.end()));
    }
    // None proven (COIN's infinity: CBC stopped before its bound), or none to trust (stopped).
    const double bound = model.getBestPossibleObjValue();
    if (stopped || !(std::abs(bound) < 1e30)) return 0.0;
    return std::max(0.0, bound / kScale - kSecondsPerByteTieBreak * most);
  };
  SolveOutcome out;
  out.method = "integer program (CBC)";
  const double* sol = model.getColSolution();
  const bool proven_optimal = !stopped && model.isProvenOptimal();
  const bool found = model.numberSavedSolutions() > 0 || (proven_optimal && sol != nullptr);
  if (!stopped && model.isProvenInfeasible()) {
    out.status = SolveStatus::infeasible;
  } else if (found && sol != nullptr) {
    out.best.assign(p.domain.size(), 0);
    for (std::size_t v = 0; v < p.domain.size(); ++v) {
      for (std::size_t d = 0; d < x[v].size(); ++d) {
        if (sol[x[v][d]] > 0.5) out.best[v] = static_cast<int>(d);
      }
    }
    out.value = evaluate(p, out.best);
    out.status = proven_optimal ? SolveStatus::optimal : SolveStatus::feasible;
    out.lower_bound = out.status == SolveStatus::optimal || limits.minimize_memory
                          ? out.value.time
                          : std::min(out.value.time, time_bound());
  } else {
    out.status = SolveStatus::unknown;
    out.lower_bound = time_bound();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

SolveOutcome solve_mip(const ChoiceProblem& p, const SolveLimits& limits) {
  const Reduced r = reduce_domains(p);
  if (r.empty) {
    SolveOutcome out;
    out.method = "integer program (CBC)";
    out.status = SolveStatus::infeasible;
    return out;
  }
  // Exclusions in the reduced values; one with a value no assignment can take excludes nothing.
  SolveLimits reduced = limits;
  reduced.excluded.clear();
  std::vector<int> on = limits.distinct_on;
  if (on.empty()) {
    for (std::size_t v = 0; v < p.domain.size(); ++v) on.push_back(static_cast<int>(v));
  }
  for (const Assignment& a : limits.excluded) {
    Assignment x(a.size(), 0);
    bool live = true;
    for (std::size_t i = 0; i < on.size() && live; ++i) {
      const auto v = static_cast<std::size_t>(on[i]);
      const std::vector<int>& kept = r.kept[v];
      const auto at = std::find(kept.begin(), kept.end(), a[v]);
      live = at != kept.end();
      if (live) x[v] = static_cast<int>(at - kept.begin());
    }
    if (live) reduced.excluded.push_back(std::move(x));
  }
  SolveOutcome out = mip(r.problem, reduced);
  if (!out.best.empty()) {
    out.best = r.original(out.best);
    out.value = evaluate(p, out.best);
  }
  return out;
}

}  // namespace shardmm::solve
