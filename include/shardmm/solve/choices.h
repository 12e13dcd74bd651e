// A choice problem: pick one value per variable to minimize a sum of factor costs, subject
// to a memory limit; what `shardmm solve` reduces a program to (solve/solve.h), and what its
// three solvers share.
//
//   ChoiceProblem p;
//   p.domain = {3, 2};                                  // variable 0 has 3 values, 1 has 2
//   p.factors.push_back({{0, 1}, {{{0, 0}, 1.5, 64}, {{2, 1}, 0.5, 128}}});  // only 2 of 6 pairs allowed
//   Assignment best = solve_exhaustive(p, {}).best;    // {2, 1}, time 0.5
//   solve_elimination(p);                               // the same, by dynamic programming
//   solve_mip(p, {.memory_limit = 100});                // {0, 0}: the other pair uses 128 bytes
//
// A factor lists the tuples of its variables' values that are allowed, each with its time
// and memory; a tuple a factor does not list is not allowed. A shared term is memory that
// several factors may each need but that is held once (an activation that two consumers keep
// for the backward pass): a tuple names the shared terms it needs, and the term's bytes,
// which depend on its variable's value, count once if any chosen tuple names it.
//
// Memory is that sum unless the problem has a timeline (`points`): then it is the peak, the
// most bytes any point holds, each point's bytes a sum of terms (PointTerm). A program's
// step (solve.h) has a point per op forward and backward, per leaf reduction and the update.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace shardmm::solve {

struct FactorEntry {
  std::vector<int> values;            // one per variable of the factor, in its order
  double time = 0;                    // seconds
  std::int64_t memory = 0;            // bytes
  std::vector<int> shared;            // indices into ChoiceProblem::shared
  std::vector<std::int64_t> figures;  // bytes the timeline's points may take (PointTerm::figure)
};

struct Factor {
  std::vector<int> vars;  // distinct variable indices
  std::vector<FactorEntry> entries;
};

struct SharedTerm {
  int var = -1;
  std::vector<std::int64_t> bytes;  // by the variable's value
};

// `count` times one of: the chosen entry's figures[figure] of factor `index` (figure); the
// bytes of variable `index`'s value, value_bytes (value); the same when shared term `index`
// is held, of its variable's value (shared).
struct PointTerm {
  enum class Kind { figure, value, shared };
  Kind kind = Kind::value;
  int index = -1;
  int figure = 0;
  std::int64_t count = 1;
};

struct TimelinePoint {
  std::vector<PointTerm> terms;
};

struct ChoiceProblem {
  std::vector<int> domain;  // number of values per variable (each >= 1)
  std::vector<Factor> factors;
  std::vector<SharedTerm> shared;
  // The timeline (empty: memory is the sum above); value_bytes by variable and value.
  std::vector<TimelinePoint> points;
  std::vector<std::vector<std::int64_t>> value_bytes;
};

using Assignment = std::vector<int>;  // a value per variable

struct Evaluation {
  bool allowed = false;  // every factor lists the assignment's tuple
  double time = 0;
  std::int64_t memory = 0;  // the sum, or with a timeline its peak
  int peak_point = -1;      // with a timeline: the first point that holds `memory`
};
Evaluation evaluate(const ChoiceProblem& p, const Assignment& a);

struct SolveLimits {
  std::optional<std::int64_t> memory_limit;  // bytes; none: unconstrained
  double seconds = 60;                       // the MIP's time limit
  // Assignments the answer must differ from (top-K: each found one excluded in turn), on the
  // variables listed in `distinct_on` (all when empty).
  std::vector<Assignment> excluded;
  std::vector<int> distinct_on;
  // The integer program only: minimize memory instead of time (the least memory any
  // assignment needs, for a limit nothing fits).
  bool minimize_memory = false;
};

enum class SolveStatus {
  optimal,     // proven optimal
  feasible,    // found, with a gap to the proven lower bound
  local,       // the best of every neighbourhood around it (solve.h), no bound proven
  infeasible,  // no assignment is allowed within the memory limit (proven)
  unknown,     // the time limit passed before any assignment was found
};
const char* to_string(SolveStatus s);

struct SolveOutcome {
  SolveStatus status = SolveStatus::unknown;
  Assignment best;  // empty unless optimal or feasible
  Evaluation value;
  double lower_bound = 0;  // proven: no allowed assignment is faster
  std::string method;      // "exhaustive", "dynamic programming", "integer program (CBC)"
  double seconds = 0;      // the solver's wall time
};

// Between assignments equally fast (within a nanosecond per GiB), the dynamic program and the
// integer program prefer the one that holds less memory: each byte adds this to their objective.
inline constexpr double kSecondsPerByteTieBreak = 1e-18;

// Every allowed assignment (depth first, pruned by each factor as soon as its variables have
// values), for tests and small problems: InputError past `max_assignments` allowed ones.
// Ties are not broken by memory: compare times.
SolveOutcome solve_exhaustive(const ChoiceProblem& p, const SolveLimits& limits,
                              std::int64_t max_assignments = 5'000'000);

// Min-sum variable elimination (exact dynamic programming) over sparse tables: a table holds
// only the tuples its factors allow, so an elimination costs the tuples its join meets, not the
// product of the domains it spans; chains and trees are linear. Ignores memory (but for the
// tie-break below) and exclusions. Returns nullopt when an elimination would join more than
// `max_table` tuples.
std::optional<SolveOutcome> solve_elimination(const ChoiceProblem& p, std::int64_t max_table = 4'000'000);

// By variable, by value: whether a restriction keeps it (a variable with no list: every value).
using Kept = std::vector<std::vector<char>>;
// solve_elimination of restricted(p, keep) without making it: the values `keep` refuses are
// dropped where the tables are built from p's entries (a solve asks for tens of restrictions
// of one problem: the named strategies, --explain's runners-up, --top's parts).
std::optional<SolveOutcome> solve_elimination(const ChoiceProblem& p, const Kept& keep,
                                              std::int64_t max_table = 4'000'000);

// The problem without the values no allowed assignment can take (a value some factor of its
// variable allows with no tuple of live values), repeated until nothing changes: what both
// solvers work on. `empty`: some variable has no value left (nothing is allowed).
struct Reduced {
  ChoiceProblem problem;
  std::vector<std::vector<int>> kept;  // by variable: its original values, in order
  bool empty = true;
  Assignment original(const Assignment& a) const;  // back to the original values
};
Reduced reduce_domains(const ChoiceProblem& p);

// The integer program (one-hot values, one-hot tuples per factor, marginal consistency,
// memory as a linear row with the shared terms as OR variables, or a row per timeline point
// that can be the peak), solved by CBC. Its status and lower bound are CBC's.
SolveOutcome solve_mip(const ChoiceProblem& p, const SolveLimits& limits);

// `p` without the assignments where some variable takes a value `keep` refuses: the factor
// entries kept are copied once, however many variables it restricts; a restricted variable no
// factor names gets a factor of its kept values (time and memory 0).
ChoiceProblem restricted(const ChoiceProblem& p, const Kept& keep);

// An exact solver of restricted(p, keep) within limits (memory, time; not exclusions): what
// solve_top asks for each part of the search.
using BestOf = std::function<SolveOutcome(const ChoiceProblem& p, const Kept& keep, const SolveLimits&)>;

// The `k` best assignments, best first, whose values on `limits.distinct_on` (every variable when
// empty) differ pairwise; fewer when fewer exist. `first` is `best(p, {}, limits)`, already found.
// Lawler and Murty's partition: the assignments left after an answer x are split into disjoint
// parts, the i-th with x's values on the first i - 1 distinct-on variables and another value on
// the i-th; each part is solved by `best` (restricted to those values), and
// the best part found so far gives the next answer. Exact whenever `best` is: no exclusion
// constraints (parts are restrictions), so the dynamic program stays usable. `limits.excluded` must be empty.
std::vector<SolveOutcome> solve_top(const ChoiceProblem& p, const SolveLimits& limits, SolveOutcome first, int k,
                                    const BestOf& best);

}  // namespace shardmm::solve
