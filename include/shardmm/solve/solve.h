// `shardmm solve`: the cheapest sharding of a whole program on a mesh, within a memory limit,
// found by an exact solver and checked by costing the answer as `shardmm program` does.
//
//   program::Program p = program::parse_program(text, "block.prog");
//   program::Graph g = program::bind(p, {});
//   solve::SolveOptions o;
//   o.program.dtype = DType::bf16;
//   o.memory_limit = 8LL << 30;
//   solve::SolveResult r = solve::solve_program(g, o);
//   r.outcome.status;                       // optimal, or feasible with the proven gap
//   r.specs[g.find("w_in")];                // the chosen layout of every tensor
//   r.prediction.memory.total();            // as `shardmm program` predicts the answer
//   program::format_program(solve::pinned_program(p, g, r.specs));  // every spec pinned
//
// The search space (docs/solve.md): a spec for every input and param and for every einsum's
// result (each mesh axis shards one of the tensor's letters, holds partial sums where an
// einsum's result may, or is unused; multi-axis subscripts in either order; uneven splits
// legal, no letter split into more pieces than it has elements); every other tensor follows
// from its op as the program's rules say. Each op is costed, forward and backward, by
// recording it alone on a symbolic tape with its operands and result in the candidate specs:
// the same planner, duals and memory accounting as `shardmm program`. A repeat block's
// iterations share their choices (the block is solved once, whatever its count).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"
#include "shardmm/solve/choices.h"

namespace shardmm::solve {

// A program's choice problem: one variable per tensor (a repeat's copies share one), then one
// per differentiated tensor for the axes its gradient arrives partial over.
struct ProgramChoices {
  ChoiceProblem problem;
  std::vector<std::vector<Spec>> values;  // by variable: the specs it may take
  // By variable, beside values: 1 where a param's value regathers its gathered copies in
  // backward (FSDP; `param w[..] regathered`) rather than keeping them. A split param (train)
  // has each of its specs twice, kept and regathered, unless the file says regathered.
  std::vector<std::vector<char>> regathered;
  std::vector<int> tensor_of_var;  // by variable: its first tensor in the graph
  std::vector<int> var_of_tensor;  // by graph tensor
  std::vector<char> chosen;        // by variable: a choice (leaf or einsum result), not
                                   // a consequence of its op
  std::vector<char> on_loss_path;  // by graph op: differentiated (train)
  // By graph tensor: the variable (after the tensor variables) holding the mesh axes its
  // gradient is partial over when it reaches its producer or its reduction (a bit mask), or
  // -1 when it gets no gradient. A repeat's copies share one where the same statements read them.
  // After the gradient variables come those of the parts of a gradient several ops read (each
  // reader's, what it leaves), and of their unions, partial too.
  std::vector<int> gradient_var;
  std::int64_t evaluations = 0;  // distinct op recordings that filled the factors
  double build_seconds = 0;      // wall time of the build (recording the ops, filling the factors)
};
// The ops' recordings of one program and its options (ProgramOptions), kept for the next build
// of the same (BuildLimits::recordings): a recording depends on the op and its specs, not on the
// neighbourhood that asked for it, and one axis's neighbourhoods of a search ask for many of the
// same (the 8,192-device decoder's search of one axis at a time: 39,104 recordings and 9.2 s
// each build its own, 22,720 and 5.5 s sharing them; medians of four runs).
class RecordingCache;
std::shared_ptr<RecordingCache> recording_cache(const program::Graph& g, const nn::ProgramOptions& options);

// How building a choice problem is going: reported after each batch of recordings.
struct BuildProgress {
  std::string op;              // the statement being recorded, as the file writes it
  std::int64_t recorded = 0;   // combinations of specs recorded so far, all ops
  double remaining_of_op = 0;  // this op's combinations not yet visited
  double seconds = 0;          // since the build began
};
struct BuildLimits {
  // The build stops with an InputError once it is past this many seconds, or as soon as the
  // rate it has reached says the op it is on cannot be finished within them.
  double seconds = std::numeric_limits<double>::infinity();
  std::function<void(const BuildProgress&)> progress;  // may be empty
  // At most this many recordings wait at once (an op's next combinations of specs): a mesh
  // of three or four axes gives an einsum millions. The problem does not depend on it.
  std::size_t batch = std::size_t{1} << 16;
  // Leave what the build remembered (the ops' recordings, the tapes' plans, the planner's memo:
  // some 10^6 small allocations, a tenth of a second or more to free) to the process's end
  // instead of freeing it on return: for a command that exits right after, as compilers do.
  // Only the latest build's are left (an earlier one's are freed when the next returns).
  bool leave_caches_to_exit = false;
  // Where given, the build records into it, and takes what an earlier build recorded: it must
  // be of the same graph and options (the same objects). ProgramChoices::evaluations counts
  // the ops this build recorded. Not left to exit: its owner frees it.
  std::shared_ptr<RecordingCache> recordings;
};
// The build's search is too large for its time limit (BuildLimits::seconds).
class SearchTooLarge : public InputError {
 public:
  using InputError::InputError;
};

// A neighbourhood of a sharding: every chosen tensor keeps `around`'s spec (by graph tensor)
// on the mesh axes outside `free_axes` (the letter each shards, or its partial sums, and their
// order within a letter); the free axes take any place. On meshes of more than two axes the
// whole space is too large to build; solve_program searches it by neighbourhoods.
struct Neighbourhood {
  std::vector<Spec> around;
  int free_axes = 0;  // a bit per mesh axis
  // By gradient variable (ProgramChoices::gradient_var, less the tensor variables; empty:
  // every one), the axes around's gradient is partial over: on the fixed axes it stays so.
  std::vector<int> partials;
  std::function<bool(const program::Tensor&, const Spec&)> leaf_allows;  // may be empty: all
};

// The mesh axes the search places (a bit per axis): those of size above 1. A size-1 axis
// splits nothing (a spec sharded over it costs what the same spec without it does): the
// search leaves it unused, but where a pin or a neighbourhood's start uses it, and the named
// strategies give it no role. A mesh of size-1 axes only (one device) keeps them all.
int placed_axes(const Mesh& mesh);

// The choice problem of `g`: the whole search space, or only `neighbourhood`'s; throws
// SearchTooLarge when the limits say it cannot be built in time.
ProgramChoices build_choices(const program::Graph& g, const nn::ProgramOptions& options, const BuildLimits& limits = {},
                             const Neighbourhood* neighbourhood = nullptr);

// A named strategy: a role per mesh axis ("dp", "fsdp", "tp", "sp", and "ep" for a program
// with a route), as restrictions on the leaves' specs (docs/solve.md); the rest of the program
// is solved within them.
struct NamedStrategy {
  std::string name;      // "dp(X)+tp(Y)"
  SolveOutcome outcome;  // infeasible when the roles do not apply to the program
  std::vector<Spec> specs;  // by graph tensor, when found
  // Infeasible: why, as a phrase ("contradicts x's pin x[B, T_X, D] (dp on X)", "fits no
  // spec of x[B, T, D] (shape [4, 8, 16])", "nothing fits the memory limit").
  std::string why_not;
};

struct Alternative {  // --explain: a tensor's runner-up
  int tensor = -1;
  Spec spec;                      // its next best spec
  double extra_time = 0;          // seconds the best program with it adds
  std::int64_t extra_memory = 0;  // bytes it adds (may be negative)
  bool exists = false;
};

struct SolveOptions {
  nn::ProgramOptions program;                // dtype, hw, train, optimizer
  std::optional<std::int64_t> memory_limit;  // per device, bytes
  int top = 1;                               // the K best distinct shardings
  bool explain = false;
  bool named = true;    // cost the named strategies
  double seconds = 60;  // building the problem's time limit, and each integer program's
  std::function<void(const BuildProgress&)> progress;  // building the problem (may be empty)
  bool leave_caches_to_exit = false;                   // BuildLimits::leave_caches_to_exit (not a search's builds)
  // automatic: the whole space on up to two axes; past two, the whole space if it can be built
  // in a quarter of the time limit, else by neighbourhoods (NeighbourhoodSearch). whole: the
  // whole space (SearchTooLarge when it cannot be built in time). neighbourhoods: always so.
  enum class Search { automatic, whole, neighbourhoods };
  Search search = Search::automatic;
};

// How the search went on a mesh whose whole search space is too large to build (more than
// two axes): from the best named strategy (each found by neighbourhoods of one axis), the best
// of each neighbourhood where one axis takes any place, in turn, until none improves it; then
// the same with two axes, as long as the time limit allows.
struct NeighbourhoodSearch {
  int builds = 0;          // neighbourhoods built and solved, the named strategies' included
  int converged_axes = 0;  // 2: no neighbourhood of one or two axes improves the answer; 1: none
                           // of one axis; 0: the time limit ended the search before
  double seconds = 0;
  double one_axis_seconds = 0;  // until the search of one axis at a time ended
  std::int64_t recordings = 0;  // op recordings, all neighbourhoods'
  double build_seconds = 0;     // building the neighbourhoods' problems, all of them
};

struct SolveResult {
  // The choice problem the answer is an assignment of: the whole space, or the neighbourhood
  // where the search found it (then top-K and the runner-ups are within it).
  ProgramChoices choices;
  SolveOutcome outcome;              // the best
  std::vector<Spec> specs;           // by graph tensor, the best's
  std::vector<char> regathered;      // by graph tensor, the best's: the params it regathers
  nn::ProgramPrediction prediction;  // the best, costed as `shardmm program` costs it
  std::vector<SolveOutcome> top;     // the best first, then the next distinct ones (top > 1)
  std::vector<NamedStrategy> named;
  std::vector<Alternative> alternatives;      // explain: one per chosen variable
  std::optional<SolveOutcome> unconstrained;  // with a memory limit: the best without it (exact only)
  std::optional<NeighbourhoodSearch> search;  // when the space was searched by neighbourhoods
};

// InputError when no sharding fits the memory limit (naming what the fastest one needs).
SolveResult solve_program(const program::Graph& g, const SolveOptions& options);

// A step time no sharding of `g` beats (pins aside): its compute divided evenly over the
// mesh's devices with nothing communicated. The bound a neighbourhood search reports.
double compute_bound(const program::Graph& g, const nn::ProgramOptions& options);

// The gradient variables' values of an assignment, by gradient variable (less the tensor
// variables): the axes each gradient is partial over, as Neighbourhood::partials takes them.
std::vector<int> gradient_partials(const ProgramChoices& c, const Assignment& a);
// The graph's tensors in the specs of an assignment (by graph tensor).
std::vector<Spec> specs_of(const ProgramChoices& c, const Assignment& a);
// The graph's params an assignment regathers (by graph tensor: 1 or 0).
std::vector<char> regathered_of(const ProgramChoices& c, const Assignment& a);
// `regathered` without the params the step never gathers again in backward (`events`: the
// step's, in those specs and flags), but for those the file says regather: a regathered value
// that tied its kept twin (nothing to gather again) is the same step as the kept one.
std::vector<char> regathering_that_gathers(const program::Graph& g, const ProgramChoices& c,
                                           std::vector<char> regathered,
                                           const std::vector<autodiff::TapeEvent>& events);

// `g` with every tensor pinned to `specs` except the nested expressions (a program file
// cannot pin them; their ops' rules give them the same layouts again).
// `regathered` (by tensor, when given) sets which params regather.
program::Graph pinned_graph(const program::Graph& g, const std::vector<Spec>& specs,
                            const std::vector<char>& regathered = {});

// `program` with every statement's spec pinned to `specs` (by tensor of `g`, the graph bound
// from it): `shardmm program` accepts it as is and costs it as the solver did. The mesh and
// dims lines are `g`'s; `regathered` (when given) marks the params the answer regathers.
program::Program pinned_program(const program::Program& program, const program::Graph& g,
                                const std::vector<Spec>& specs, const std::vector<char>& regathered = {});

}  // namespace shardmm::solve
