// A program as a choice problem: a variable per tensor (a repeat's copies share one) and one
// per differentiated tensor for the axes its gradient arrives partial over; a factor per op
// whose entries are the op recorded alone on a symbolic tape in each combination of those
// variables' values; a factor per leaf for the memory it holds (the leaf, its gradient,
// Adam's moments) and one for reducing its gradient into its spec.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <iomanip>
#include <locale>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/solve/solve.h"
#include "solve/arc_consistency.h"

namespace shardmm::solve {

using program::Graph;
using program::OpKind;
using program::Role;

namespace {

// A tensor's name without its repeat iterations (`x.3'` -> `x'`, `p.0~1` -> `p~1`), and how
// many there were: the copies of one statement across iterations share a key.
std::string group_key(const std::string& name) {
  std::string out;
  int depth = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '.' && i + 1 < name.size() && std::isdigit(static_cast<unsigned char>(name[i + 1]))) {
      ++depth;
      ++i;
      while (i + 1 < name.size() && std::isdigit(static_cast<unsigned char>(name[i + 1]))) ++i;
      continue;
    }
    out += name[i];
  }
  return out + "#" + std::to_string(depth);
}

// Every spec of `t` on the mesh: each axis shards one letter, is unreduced (when allowed) or
// unused; a letter's axes in every order; no letter split into more pieces than its size.
// With `around`, only its neighbourhood: the axes outside `free_axes` stay as `around` has
// them (their letter, or partial sums, and their order within a letter).
std::vector<Spec> all_specs(const program::Tensor& t, const Mesh& mesh, bool allow_unreduced,
                            const Spec* around = nullptr, int free_axes = 0) {
  const int m = mesh.rank();
  // The axes it picks a place for: the placed ones (of the free ones, in a neighbourhood).
  const int moving = placed_axes(mesh) & (around ? free_axes : ~0);
  const int rank = static_cast<int>(t.letters.size());
  const int choices = rank + 1 + (allow_unreduced ? 1 : 0);  // a letter, unused, unreduced
  // By axis: where `around` puts it (a letter's place, rank: unused, rank + 1: unreduced).
  const auto place_in_around = [&](int a) {
    const int d = around->dim_of_axis(a);
    return d >= 0 ? d : around->is_unreduced(a) ? rank + 1 : rank;
  };
  // The orders a letter's axes may take in the neighbourhood: around's, or its fixed axes in
  // around's order with the free ones before or after them in mesh order (fewer orders than
  // every interleaving: two free axes on a letter with two fixed ones have 12).
  const auto in_neighbourhood = [&](int d, const AxisList& axes) {
    const AxisList& was = around->dims[static_cast<std::size_t>(d)].axes;
    if (axes == was) return true;
    AxisList fixed, moved;
    for (int a : axes) (free_axes >> a & 1 ? moved : fixed).push_back(a);
    AxisList want;
    for (int a : was) {
      if (!(free_axes >> a & 1)) want.push_back(a);
    }
    if (fixed != want || !std::is_sorted(moved.begin(), moved.end())) return false;
    const auto first_moved = std::find_if(axes.begin(), axes.end(), [&](int a) { return free_axes >> a & 1; });
    return fixed.empty() || moved.empty() || first_moved == axes.begin() ||
           static_cast<std::size_t>(first_moved - axes.begin()) == fixed.size();
  };
  std::vector<Spec> out;
  std::vector<int> pick(static_cast<std::size_t>(m), 0);
  for (int a = 0; a < m; ++a) {
    if (!(moving >> a & 1)) pick[static_cast<std::size_t>(a)] = around ? place_in_around(a) : rank;
  }
  while (true) {
    std::vector<AxisList> dims(static_cast<std::size_t>(rank));
    AxisList unreduced;
    for (int a = 0; a < m; ++a) {
      const int c = pick[static_cast<std::size_t>(a)];
      if (c < rank) dims[static_cast<std::size_t>(c)].push_back(a);
      if (c == rank + 1) unreduced.push_back(a);
    }
    bool fits = true;
    for (int d = 0; d < rank; ++d) {
      std::int64_t parts = 1;
      for (int a : dims[static_cast<std::size_t>(d)]) parts *= mesh.size(a);
      fits = fits && parts <= std::max<std::int64_t>(1, t.shape[static_cast<std::size_t>(d)]);
    }
    if (fits) {
      // Every order of every letter's axes: the cartesian product of their permutations.
      std::vector<std::vector<AxisList>> orders(static_cast<std::size_t>(rank));
      for (int d = 0; d < rank; ++d) {
        AxisList axes = dims[static_cast<std::size_t>(d)];
        do {
          if (!around || in_neighbourhood(d, axes)) orders[static_cast<std::size_t>(d)].push_back(axes);
        } while (std::next_permutation(axes.begin(), axes.end()));
      }
      std::vector<std::size_t> at(static_cast<std::size_t>(rank), 0);
      while (true) {
        Spec s = program::replicated_spec(t);
        for (int d = 0; d < rank; ++d)
          s.dims[static_cast<std::size_t>(d)].axes =
              orders[static_cast<std::size_t>(d)][at[static_cast<std::size_t>(d)]];
        s.unreduced = unreduced;
        out.push_back(std::move(s));
        int d = 0;
        while (d < rank && ++at[static_cast<std::size_t>(d)] == orders[static_cast<std::size_t>(d)].size())
          at[static_cast<std::size_t>(d++)] = 0;
        if (d == rank) break;
      }
    }
    // The next pick of the moving axes.
    int a = 0;
    while (a < m) {
      if (!(moving >> a & 1)) {
        ++a;
      } else if (++pick[static_cast<std::size_t>(a)] == choices) {
        pick[static_cast<std::size_t>(a++)] = 0;
      } else {
        break;
      }
    }
    if (a == m) break;
  }
  return out;
}

// The einsum results the search considers: each mesh axis shards the letter an operand
// shards with it, holds the partial sums of a contracted letter an operand shards with it,
// or is unused. (Any other layout is one of these followed by a slice, which costs nothing
// and which the consumer does as well.) With collective matmul rings, an axis holding partial
// sums may also scatter a letter of the result: a reduce_scatter ring under the einsum is
// cheaper than the consumer's reduce_scatter after it.
bool follows_operands(const Spec& result, const std::vector<Spec>& operands, const program::Tensor& t, bool rings) {
  // Whether some operand's sums over `axis` are partial in the result.
  const auto contracted_over = [&](int axis) {
    bool contracted = false;
    for (const Spec& o : operands) {
      const int j = o.dim_of_axis(axis);
      contracted = contracted || (j >= 0 && std::find(t.letters.begin(), t.letters.end(),
                                                      o.dims[static_cast<std::size_t>(j)].name) == t.letters.end());
      contracted = contracted || o.is_unreduced(axis);
    }
    return contracted;
  };
  for (std::size_t d = 0; d < result.dims.size(); ++d) {
    for (int axis : result.dims[d].axes) {
      bool found = false;
      for (const Spec& o : operands) {
        const int j = o.dim_of_axis(axis);
        found = found || (j >= 0 && o.dims[static_cast<std::size_t>(j)].name == result.dims[d].name);
      }
      if (!found && !(rings && contracted_over(axis))) return false;
    }
  }
  for (int axis : result.unreduced) {
    if (!contracted_over(axis)) return false;
  }
  return true;
}

std::int64_t local_bytes(const Graph& g, const Spec& s, const Shape& shape, DType dtype) {
  return local_elements(g.mesh, s, shape, 0) * dtype_bytes(dtype);
}

// The ops whose results the loss depends on (they run backward in a training step).
std::vector<char> loss_path(const Graph& g) {
  std::vector<char> on(g.ops.size(), 0);
  if (g.loss < 0) return on;
  std::vector<char> needed(g.tensors.size(), 0);
  needed[static_cast<std::size_t>(g.loss)] = 1;
  for (std::size_t k = g.ops.size(); k-- > 0;) {
    // A route's dispatch, and what only it feeds, get no gradient: their ops run no backward.
    const program::Tensor& result = g.tensors[static_cast<std::size_t>(g.ops[k].result)];
    if (!needed[static_cast<std::size_t>(g.ops[k].result)] || !result.differentiable) continue;
    on[k] = 1;
    for (int x : g.ops[k].operands) needed[static_cast<std::size_t>(x)] = 1;
  }
  return on;
}

// A set of mesh axes as a bit mask (a gradient variable's value: the axes it is partial over).
AxisList axes_of(int mask, int rank) {
  AxisList out;
  for (int a = 0; a < rank; ++a) {
    if (mask & (1 << a)) out.push_back(a);
  }
  return out;
}

int mask_of(const AxisList& axes) {
  int m = 0;
  for (int a : axes) m |= 1 << a;
  return m;
}

int used_mask(const Spec& s) {
  int m = 0;
  for (const DimSpec& d : s.dims) m |= mask_of(d.axes);
  return m;
}

// What a recording says of one of the op's distinct operands.
struct OperandCost {
  bool saved = false;       // kept for the backward pass
  bool gathered = false;    // all-gathered in forward
  bool regathered = false;  // gathered again in backward
  int partial = 0;          // the axes its gradient is left partial over
};

// What one op costs, recorded alone: its operands as leaves in their specs, its result
// pinned (or left to its rule), backward started from the result's gradient as its consumers
// deliver it (the result's layout, partial over `result_partial`). Tens of thousands are kept
// (OpRecorder's memo): the recordings of one forward pass share its result spec.
struct OpCost {
  bool allowed = false;
  std::shared_ptr<const Spec> result;  // the forward pass's (none where the op cannot hold the specs)
  double time = 0;                     // the op's forward and backward steps (bringing its
                                       // operands' gradients to their layouts; not reducing them)
  std::int64_t internal_memory = 0;    // activations its own intermediate values keep
  std::vector<OperandCost> operands;   // by distinct operand
  bool result_saved = false;           // its own backward keeps its result (softmax)
  autodiff::Tape::OpMemory memory;     // its figures on the step's timeline (factor entries' figures)
};

// The figures an op factor's entries carry (FactorEntry::figures), from Tape::OpMemory.
enum Figure { kKept, kTransient, kTransientWithResult, kBackward };

class OpRecorder {
 public:
  OpRecorder(const Graph& g, const nn::ProgramOptions& options)
      : g_(g), options_(options), op_keys_(op_keys(g)), letter_keys_(letter_keys(g)) {}

  // Op k in these specs, once for each of `result_partials` (the layouts of its result's
  // gradient: nullopt, no backward). Ops alike in everything the tape sees (a transformer's q,
  // k and v projections; a block's two residual adds) are recorded once: the tape's cost does
  // not depend on names (a cost's result spec is named after the op that recorded it first).
  std::vector<std::shared_ptr<const OpCost>> costs(int k, const std::vector<int>& operands,
                                                   const std::vector<Spec>& operand_specs,
                                                   const std::vector<char>& operand_regathered,
                                                   const std::optional<Spec>& result_pin,
                                                   const std::vector<std::optional<int>>& result_partials) const {
    const std::string key = signature(k, operands, operand_specs, operand_regathered, result_pin);
    // By the gradient's layout: none first, then each mask.
    const auto slot = [](const std::optional<int>& partial) {
      return partial ? static_cast<std::size_t>(*partial) + 1 : 0;
    };
    std::vector<std::shared_ptr<const OpCost>> out(result_partials.size());
    std::vector<std::size_t> missing;
    {
      const std::lock_guard<std::mutex> lock(memo_mutex_);
      const auto it = memo_.find(key);
      for (std::size_t i = 0; i < result_partials.size(); ++i) {
        if (it != memo_.end() && it->second[slot(result_partials[i])]) {
          out[i] = it->second[slot(result_partials[i])];
        } else {
          missing.push_back(i);
        }
      }
    }
    if (missing.empty()) return out;
    std::vector<std::optional<int>> partials;
    for (std::size_t i : missing) partials.push_back(result_partials[i]);
    std::vector<OpCost> recorded = record(k, operands, operand_specs, operand_regathered, result_pin, partials);
    const std::lock_guard<std::mutex> lock(memo_mutex_);
    auto& memo = memo_.try_emplace(key, (std::size_t{1} << g_.mesh.rank()) + 1).first->second;
    for (std::size_t j = 0; j < missing.size(); ++j) {
      std::shared_ptr<const OpCost>& at = memo[slot(partials[j])];
      if (!at) {
        at = std::make_shared<const OpCost>(std::move(recorded[j]));
        ++recordings_;
      }
      out[missing[j]] = at;
    }
    return out;
  }

  // Called once an op's combinations are all recorded (never while one is). The plans its
  // recordings made name its tensors, and the next op finds little there but the steps' costs
  // and a reshard plan of each pair of layouts (renamed for its tensors), which stay. Keeping
  // every op's plans took two to four times the memory (a 2-layer decoder's search on 2x2x2:
  // 746 MB against 378 MB; the 32-layer one's on 8,192 devices: 2.2 GB against 0.6 GB); the
  // time is the same either way.
  void forget_plans() { plans_.forget_contractions(); }

  std::int64_t recordings() const {
    const std::lock_guard<std::mutex> lock(memo_mutex_);
    return recordings_;
  }

  // Reducing a leaf's gradient, partial over `partial`, into the leaf's spec `s`: its time,
  // and its largest step's output (the transient of the leaf's backward point).
  std::pair<double, std::int64_t> reduce(const program::Tensor& t, const Spec& s, int partial) const {
    autodiff::Tape tape(g_.mesh, nn::tape_options(options_));
    Spec from = s;
    from.unreduced = axes_of(partial, g_.mesh.rank());
    const autodiff::Var v = tape.input(from, t.shape, {}, false);
    autodiff::reshard(v, s);
    double time = 0;
    std::int64_t largest = 0;
    for (const autodiff::TapeEvent& e : tape.events()) {
      time += e.step.time_s;
      largest = std::max(largest, local_bytes(g_, e.step.to, t.shape, options_.dtype));
    }
    return {time, largest};
  }

 private:
  // Everything of op k and its specs that the tape sees: the op, each operand's role,
  // letters, spec, whether it is differentiable and regathered (by position, repeats
  // included), the result's letters and pin; no tensor names. (The result's gradient: costs().)
  // The parts that do not depend on the specs are worked out once (op_keys_, letter_keys_).
  std::string signature(int k, const std::vector<int>& operands, const std::vector<Spec>& operand_specs,
                        const std::vector<char>& operand_regathered, const std::optional<Spec>& result_pin) const {
    const program::GraphOp& op = g_.ops[static_cast<std::size_t>(k)];
    // A spec without its tensor's name: each letter and its axes' numbers, then the pending
    // sums' (format_spec validates the spec and names the axes: work a key does not need).
    const auto add_unnamed = [](std::string& out, const Spec& s) {
      const auto add_axis = [&out](char tag, int a) {
        out += tag;
        if (a >= 10) out += static_cast<char>('0' + a / 10);
        out += static_cast<char>('0' + a % 10);
      };
      for (const DimSpec& d : s.dims) {
        out += d.name;
        for (int a : d.axes) add_axis('_', a);
        out += ',';
      }
      for (int a : s.unreduced) add_axis('U', a);
    };
    std::string key = op_keys_[static_cast<std::size_t>(k)];
    for (int x : op.operands) {
      const auto i = static_cast<std::size_t>(std::find(operands.begin(), operands.end(), x) - operands.begin());
      const program::Tensor& t = g_.tensors[static_cast<std::size_t>(x)];
      key += " | ";
      key += std::to_string(i);
      key += ' ';
      key += program::to_string(t.role);
      key += t.differentiable ? " d " : " n ";
      key += operand_regathered[i] ? "r " : "k ";
      key += letter_keys_[static_cast<std::size_t>(x)];
      key += ' ';
      add_unnamed(key, operand_specs[i]);
    }
    key += " -> ";
    key += letter_keys_[static_cast<std::size_t>(op.result)];
    key += ' ';
    if (result_pin) {
      add_unnamed(key, *result_pin);
    } else {
      key += "free";
    }
    return key;
  }

  // signature()'s parts that depend on the graph alone: an op's own (kind, function, constants,
  // renamed letters) and a tensor's letters.
  static std::vector<std::string> op_keys(const Graph& g) {
    // A constant in full (to_string keeps six decimals: 0.0883883 for two different scales).
    const auto exact = [](double x) {
      char text[32];
      std::snprintf(text, sizeof text, "%a", x);
      return std::string(text);
    };
    std::vector<std::string> keys;
    for (const program::GraphOp& op : g.ops) {
      std::string key = std::string(program::to_string(op.op.kind)) + " " + op.op.function + " " + op.op.over + " " +
                        exact(op.op.constant) + " " + std::to_string(op.op.top);
      for (const std::string& l : op.op.from) key += " <" + l;
      for (const std::string& l : op.op.to) key += " >" + l;
      keys.push_back(std::move(key));
    }
    return keys;
  }
  static std::vector<std::string> letter_keys(const Graph& g) {
    std::vector<std::string> keys;
    for (const program::Tensor& t : g.tensors) {
      std::string key;
      for (const std::string& l : t.letters) key += l + ",";
      keys.push_back(std::move(key));
    }
    return keys;
  }

  // Op k recorded alone, forward once; then backward from each of `result_partials`, the tape
  // rewound to the forward pass's end before each.
  std::vector<OpCost> record(int k, const std::vector<int>& operands, const std::vector<Spec>& operand_specs,
                             const std::vector<char>& operand_regathered, const std::optional<Spec>& result_pin,
                             const std::vector<std::optional<int>>& result_partials) const {
    const program::GraphOp& op = g_.ops[static_cast<std::size_t>(k)];
    Graph mini;
    mini.tensors.reserve(operands.size() + 1);
    mini.file = g_.file;
    mini.mesh = g_.mesh;
    mini.dims = g_.dims;
    for (std::size_t i = 0; i < operands.size(); ++i) {
      program::Tensor t = g_.tensors[static_cast<std::size_t>(operands[i])];
      if (t.role == Role::computed) t.role = Role::input;
      t.pinned = operand_specs[i];
      t.regathered = operand_regathered[i] != 0;
      t.producer = -1;
      t.consumers = {0};
      t.temporary = false;
      mini.tensors.push_back(std::move(t));
    }
    program::Tensor result = g_.tensors[static_cast<std::size_t>(op.result)];
    result.pinned = result_pin;
    result.producer = 0;
    result.consumers.clear();
    const int r = static_cast<int>(mini.tensors.size());
    mini.tensors.push_back(result);
    program::GraphOp only = op;
    only.result = r;
    only.operands.clear();
    for (int x : op.operands) {
      only.operands.push_back(static_cast<int>(std::find(operands.begin(), operands.end(), x) - operands.begin()));
    }
    mini.ops.push_back(only);
    std::vector<OpCost> out(result_partials.size());
    nn::ProgramOptions forward_only = options_;
    forward_only.train = false;
    try {
      autodiff::Tape tape(mini.mesh, nn::tape_options(options_, &plans_));
      const nn::ProgramRecord rec = nn::record_program(tape, mini, forward_only);
      auto result_spec = std::make_shared<Spec>(rec.specs[static_cast<std::size_t>(r)]);
      result_spec->tensor = g_.tensors[static_cast<std::size_t>(op.result)].source_name;
      // A gradient cannot be partial over its sharding axes.
      const auto runs_backward = [&](const std::optional<int>& partial) {
        return partial && !(*partial & used_mask(*result_spec));
      };
      const ForwardFigures forward = forward_figures(tape, rec, r, mini);
      // The pass below the op's contraction is the same from every layout of the result's
      // gradient: run once where there are several (2.7 an einsum on average for the 32-layer
      // decoder on dp=8,tp=8) and spliced onto each pass down to it.
      std::shared_ptr<const autodiff::Tape::Below> below;
      if (std::count_if(result_partials.begin(), result_partials.end(), runs_backward) > 1) {
        if (const std::optional<autodiff::Var> contraction = tape.contraction_in(0)) {
          try {
            below = tape.backward_below(*contraction);
          } catch (const InputError&) {
            // each pass runs whole, and fails where it does
          }
        }
      }
      for (std::size_t p = 0; p < result_partials.size(); ++p) {
        const std::optional<int>& partial = result_partials[p];
        OpCost& cost = out[p];
        cost.result = result_spec;
        if (partial && !runs_backward(partial)) continue;
        tape.rewind();
        try {
          measure(tape, rec, r, mini, forward, partial, below.get(), cost);
        } catch (const InputError&) {
          cost.allowed = false;  // its backward cannot bring the gradient back in these specs
        }
      }
    } catch (const InputError&) {
      // the op cannot hold these specs (a pin it cannot honour): none is allowed
    }
    return out;
  }

  // What the op's forward pass alone decides, the same for each of its backward passes: its
  // time, what it keeps for backward, which operands it gathers.
  struct ForwardFigures {
    double time = 0;
    bool result_saved = false;
    std::int64_t internal_memory = 0;
    std::vector<char> saved, gathered;  // by operand
  };
  ForwardFigures forward_figures(autodiff::Tape& tape, const nn::ProgramRecord& rec, int r, const Graph& mini) const {
    const auto var = [&](int i) { return tape.var(rec.values[static_cast<std::size_t>(i)].id()); };
    ForwardFigures f;
    for (const autodiff::TapeEvent& e : tape.events()) {
      if (e.scope == 0) f.time += e.step.time_s;
    }
    const std::int64_t result_kept = tape.bytes_saved_for_backward(var(r));
    f.result_saved = result_kept > 0;
    f.internal_memory = tape.memory().activations - result_kept;
    for (int i = 0; i < r; ++i) {
      f.saved.push_back(tape.bytes_saved_for_backward(var(i)) > 0);
      f.gathered.push_back(gathered_in(tape, mini, i, autodiff::Phase::forward));
    }
    return f;
  }

  // Whether operand i's param is all-gathered in `phase` (a regathered param's gather run again
  // in backward is a step on the param itself; the gradients' steps move `d` + its name).
  static bool gathered_in(const autodiff::Tape& tape, const Graph& mini, int i, autodiff::Phase phase) {
    const std::string& name = mini.tensors[static_cast<std::size_t>(i)].name;
    return std::any_of(tape.events().begin(), tape.events().end(), [&](const autodiff::TapeEvent& e) {
      return e.phase == phase && e.step.op == shardmm::OpKind::all_gather && e.step.tensor == name;
    });
  }

  // Backward from the result's gradient partial over `result_partial` (none: forward only) on
  // `tape`, which holds the op's forward pass as `rec` recorded it (with the figures `forward`
  // read off it), the pass below its contraction spliced on where `below` is given and makes the
  // whole; then the cost read off it.
  void measure(autodiff::Tape& tape, const nn::ProgramRecord& rec, int r, const Graph& mini,
               const ForwardFigures& forward, const std::optional<int>& result_partial,
               const autodiff::Tape::Below* below, OpCost& out) const {
    const auto var = [&](int i) { return tape.var(rec.values[static_cast<std::size_t>(i)].id()); };
    const autodiff::Var y = var(r);
    out.time = forward.time;
    if (result_partial) {
      const AxisList partial = axes_of(*result_partial, g_.mesh.rank());
      if (!below || !tape.backward_from(y, partial, *below)) {
        tape.rewind();
        tape.backward_from(y, partial);
      }
      for (const autodiff::TapeEvent& e : tape.events()) {
        if (e.phase == autodiff::Phase::backward && e.scope == 0) out.time += e.step.time_s;
      }
    }
    out.result_saved = forward.result_saved;
    out.internal_memory = forward.internal_memory;
    out.memory = tape.op_memory(0, y, options_.train && g_.loss >= 0);
    for (int i = 0; i < r; ++i) {
      OperandCost& operand = out.operands.emplace_back();
      operand.saved = forward.saved[static_cast<std::size_t>(i)] != 0;
      operand.partial = result_partial ? mask_of(tape.gradient_arrived_unreduced(var(i))) : 0;
      operand.gathered = forward.gathered[static_cast<std::size_t>(i)] != 0;
      operand.regathered = result_partial && gathered_in(tape, mini, i, autodiff::Phase::backward);
    }
    out.allowed = true;
  }

  const Graph& g_;
  const nn::ProgramOptions& options_;
  const std::vector<std::string> op_keys_, letter_keys_;  // signature()'s, by op and by tensor
  // The same reshards (backward's) plan once, those of other ops' tensors renamed; the
  // contractions share the planner's memos but are not kept (memo_ keeps each combination's
  // recording, which plans its contraction once). One op's (forget_plans).
  mutable autodiff::PlanCache plans_{autodiff::PlanCache::Keep::reshards_and_memos};
  mutable std::mutex memo_mutex_;
  // By signature(), then by the gradient's layout (costs()); hashed: 10^4 keys of a few hundred
  // bytes that differ late (a map compares them byte by byte at every step of its search).
  mutable std::unordered_map<std::string, std::vector<std::shared_ptr<const OpCost>>> memo_;
  mutable std::int64_t recordings_ = 0;
};

// A recorder kept, never freed, until the process ends (BuildLimits::leave_caches_to_exit): the
// latest one left; the one before it is freed here. Reachable from a static, so a leak checker
// does not report it.
void leave_to_exit(std::unique_ptr<OpRecorder> recorder) {
  static std::mutex mutex;
  static auto* const kept = new std::unique_ptr<OpRecorder>();
  std::unique_ptr<OpRecorder> previous;
  const std::lock_guard<std::mutex> lock(mutex);
  previous = std::exchange(*kept, std::move(recorder));
}

// A tuple of an op's operands' values, which the combinations of its result's pins share.
struct OperandValues {
  std::vector<int> tuple;        // the operands' values
  std::vector<Spec> specs;       // the operands' specs
  std::vector<char> regathered;  // the operands' (params: FSDP's regather)
  bool regathers = false;        // some operand is a regathered param
};

// One combination of an op's specs to record: its jobs (one per layout of the result's
// gradient) share one forward pass.
struct Combination {
  std::size_t operands = 0;      // into the batch's OperandValues
  std::optional<Spec> pin;       // the result's, when chosen
  int pin_at = 0;                // its place among the tuple's pins (a regathered twin's are the same)
  std::vector<std::size_t> jobs;
};

// One recording: a combination and its result gradient's layout, and what recording it gave.
struct Recording {
  std::size_t combination = 0;
  std::optional<int> partial;  // the result's gradient's pending axes (differentiated ops)
  std::shared_ptr<const OpCost> cost;
};

// A batch of an op's recordings: the tuples of operand values, their combinations with the
// result's pins, and the jobs.
struct Batch {
  std::vector<OperandValues> operand_values;
  std::vector<Combination> combos;
  std::vector<Recording> jobs;
};

// fn(0) .. fn(n - 1) on the machine's cores: recordings are independent (each its own
// symbolic tape) and they are what solving a program on a 2-D mesh spends its time on.
void for_each_parallel(std::size_t n, const std::function<void(std::size_t)>& fn) {
  const std::size_t threads = std::min<std::size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  // Runs of consecutive indices: neighbouring combinations share operand specs, whose plans
  // the planner memo of the thread that records them keeps (autodiff::PlanCache). At most 64,
  // and at least four runs a thread: a neighbourhood's ops have tens of combinations.
  const std::size_t run = std::clamp<std::size_t>(n / (4 * threads), 1, 64);
  const auto work = [&] {
    for (std::size_t first; (first = next.fetch_add(run)) < n;) {
      for (std::size_t i = first; i < std::min(n, first + run); ++i) {
        try {
          fn(i);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

// The build's time limit and progress, checked after each batch of recordings.
class BuildClock {
 public:
  explicit BuildClock(const BuildLimits& limits) : limits_(limits) {}

  // A batch of `jobs` recordings of op k is entered; about `jobs_left` more of the op's remain.
  void batch_done(const Graph& g, int k, std::int64_t jobs, double jobs_left) {
    const auto now = std::chrono::steady_clock::now();
    const double batch_seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    recorded_ += jobs;
    if (k != op_) {
      op_ = k;
      op_batches_ = 0;
    }
    ++op_batches_;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const program::GraphOp& op = g.ops[static_cast<std::size_t>(k)];
    const std::string statement = g.tensors[static_cast<std::size_t>(op.result)].source_name + " = " + op.expression;
    // The op's latest batch's rate (memo hits included) projects what its remaining
    // combinations take; not its first batch's, which finds the memos cold for the op's
    // tensors (on 8,192 devices a decoder's `att = o @ wo` recorded its first 515 at 1.6 ms
    // each, the next 1,024 at 0.3 ms, its last 27,000 at 0.08 ms).
    const double projected =
        op_batches_ < 2 ? seconds
                        : seconds + jobs_left * batch_seconds / static_cast<double>(std::max<std::int64_t>(1, jobs));
    if (seconds <= limits_.seconds && projected <= limits_.seconds) {
      if (limits_.progress) limits_.progress({statement, recorded_, jobs_left, seconds});
      return;
    }
    std::ostringstream out;
    out.imbue(std::locale::classic());
    out << "solve: the search is too large for " << field("time_limit") << " " << limits_.seconds << " s: after "
        << std::fixed << std::setprecision(1) << seconds << " s it had costed " << recorded_
        << " ops in candidate specs, and `" << statement << "` alone has about " << std::setprecision(0) << jobs_left
        << " combinations of specs more";
    if (projected > seconds) out << " (" << projected - seconds << " s at this rate)";
    out << "; pin some tensors (" << field("pin") << "), use fewer mesh axes or give more time";
    throw SearchTooLarge(out.str());
  }

 private:
  const BuildLimits& limits_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;  // the last batch's end
  std::int64_t recorded_ = 0;
  int op_ = -1;  // the op of the last batch, and how many of its batches were entered
  int op_batches_ = 0;
};

// A timeline point's terms being summed up: counts by variable, shared term and (factor, figure).
struct Terms {
  std::map<int, std::int64_t> value, shared;
  std::map<std::pair<int, int>, std::int64_t> figure;
  TimelinePoint point() const {
    TimelinePoint p;
    for (const auto& [v, n] : value) p.terms.push_back({PointTerm::Kind::value, v, 0, n});
    for (const auto& [s, n] : shared) p.terms.push_back({PointTerm::Kind::shared, s, 0, n});
    for (const auto& [f, n] : figure) p.terms.push_back({PointTerm::Kind::figure, f.first, f.second, n});
    return p;
  }
  // Whether this point is the midpoint of a and b: each count the mean of theirs.
  bool midpoint(const Terms& a, const Terms& b) const {
    const auto mean_of = [](const auto& m, const auto& x, const auto& y) {
      auto keys = m;
      for (const auto& [k, n] : x) keys.emplace(k, 0);
      for (const auto& [k, n] : y) keys.emplace(k, 0);
      const auto at = [](const auto& map, const auto& k) {
        const auto it = map.find(k);
        return it == map.end() ? std::int64_t{0} : it->second;
      };
      for (const auto& [k, n] : keys) {
        if (2 * at(m, k) != at(x, k) + at(y, k)) return false;
      }
      return true;
    };
    return mean_of(value, a.value, b.value) && mean_of(shared, a.shared, b.shared) &&
           mean_of(figure, a.figure, b.figure);
  }
};

// Each run's points into the problem, but those midway between their neighbours: a repeat's
// middle iterations, whose counts grow by the same step each iteration (kept values one way,
// gradients in flight the other). A point's bytes are linear in the counts, so a midpoint holds
// at most what one of its neighbours holds, and each dropped point lies between the two kept
// ends of its run of midpoints: the peak is the same.
void add_runs(ProgramChoices& c, const std::map<std::pair<int, int>, std::vector<Terms>>& runs) {
  for (const auto& [key, points] : runs) {
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (i > 0 && i + 1 < points.size() && points[i].midpoint(points[i - 1], points[i + 1])) continue;
      c.problem.points.push_back(points[i].point());
    }
  }
}

// The step's timeline as points of the choice problem, each point's bytes as
// autodiff::MemoryPoint defines them for the whole program's tape: the terms a program's
// structure fixes (which values are live at an op, whose gradients are in flight) over the
// variables' bytes, and each op's own figures (kept values, transients) from its factor.
void add_timeline(ProgramChoices& c, const Graph& g, const nn::ProgramOptions& options,
                  const std::vector<int>& factor_of, const std::map<int, int>& shared_of_var,
                  const std::vector<int>& reduce_factors) {
  const bool train = options.train && g.loss >= 0;
  const auto ops = static_cast<int>(g.ops.size());
  // By tensor: the last op reading it, and the last one on the loss path (its gradient's first).
  std::vector<int> last_reader(g.tensors.size(), -1), last_grad_reader(g.tensors.size(), -1);
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    for (int k : g.tensors[t].consumers) {
      last_reader[t] = std::max(last_reader[t], k);
      if (c.on_loss_path[static_cast<std::size_t>(k)]) last_grad_reader[t] = std::max(last_grad_reader[t], k);
    }
  }
  const auto var = [&](std::size_t t) { return c.var_of_tensor[t]; };
  const auto kept = [&](Terms& terms, std::size_t t) {
    if (const auto s = shared_of_var.find(var(t)); train && s != shared_of_var.end()) ++terms.shared[s->second];
  };
  // The points of one op statement in one phase, in step order: a repeat's copies.
  std::map<std::pair<int, int>, std::vector<Terms>> runs;
  // Every point: the leaves, and Adam's moments of the params.
  Terms base;
  for (int t : g.leaves()) {
    const bool moments =
        train && g.tensors[static_cast<std::size_t>(t)].role == Role::param && options.optimizer == nn::Optimizer::adam;
    base.value[var(static_cast<std::size_t>(t))] += moments ? 3 : 1;
  }
  const auto leaf_gradients = [&](Terms& terms, int from_op) {
    for (int t : g.leaves()) {
      if (last_grad_reader[static_cast<std::size_t>(t)] >= from_op) ++terms.value[var(static_cast<std::size_t>(t))];
    }
  };
  for (int k = 0; k < ops; ++k) {
    Terms terms = base;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const int p = g.tensors[t].producer;
      if (g.tensors[t].role != Role::computed || p > k) continue;
      if (last_reader[t] > p && k <= last_reader[t]) {
        ++terms.value[var(t)];
      } else {
        kept(terms, t);
      }
    }
    for (int j = 0; j <= k && train; ++j) ++terms.figure[{factor_of[static_cast<std::size_t>(j)], kKept}];
    const auto result = static_cast<std::size_t>(g.ops[static_cast<std::size_t>(k)].result);
    ++terms.figure[{factor_of[static_cast<std::size_t>(k)],
                    last_reader[result] > k ? kTransient : kTransientWithResult}];
    runs[{0, factor_of[static_cast<std::size_t>(k)]}].push_back(std::move(terms));
  }
  if (!train) return add_runs(c, runs);
  for (int k = ops - 1; k >= 0; --k) {
    if (!c.on_loss_path[static_cast<std::size_t>(k)]) continue;
    Terms terms = base;
    leaf_gradients(terms, k);
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const int p = g.tensors[t].producer;
      if (g.tensors[t].role != Role::computed || p > k) continue;
      kept(terms, t);
      // A gradient lives from its last reader's backward (the loss's: its own) to its maker's;
      // a value no gradient reaches (a route's dispatch) has none.
      const int first = static_cast<int>(t) == g.loss ? p : last_grad_reader[t];
      if (k <= first && g.tensors[t].differentiable) ++terms.value[var(t)];
    }
    for (int j = 0; j <= k; ++j) ++terms.figure[{factor_of[static_cast<std::size_t>(j)], kKept}];
    ++terms.figure[{factor_of[static_cast<std::size_t>(k)], kBackward}];
    runs[{1, factor_of[static_cast<std::size_t>(k)]}].push_back(std::move(terms));
  }
  add_runs(c, runs);
  // Each leaf's reduction (one point per reduction factor: the copies' points are alike), then the update.
  Terms reduced = base;
  leaf_gradients(reduced, 0);
  for (int f : reduce_factors) {
    Terms terms = reduced;
    ++terms.figure[{f, 0}];
    c.problem.points.push_back(terms.point());
  }
  Terms update = base;
  for (int t : g.leaves()) ++update.value[var(static_cast<std::size_t>(t))];
  c.problem.points.push_back(update.point());
}

}  // namespace

class RecordingCache {
 public:
  RecordingCache(const Graph& g, const nn::ProgramOptions& options) : recorder(g, options), g(g), options(options) {}
  OpRecorder recorder;
  const Graph& g;
  const nn::ProgramOptions& options;
};

std::shared_ptr<RecordingCache> recording_cache(const Graph& g, const nn::ProgramOptions& options) {
  return std::make_shared<RecordingCache>(g, options);
}

int placed_axes(const Mesh& mesh) {
  int placed = 0;
  for (int a = 0; a < mesh.rank(); ++a) {
    if (mesh.size(a) > 1) placed |= 1 << a;
  }
  return placed ? placed : (1 << mesh.rank()) - 1;
}

std::vector<int> gradient_partials(const ProgramChoices& c, const Assignment& a) {
  const int last = c.gradient_var.empty() ? -1 : *std::max_element(c.gradient_var.begin(), c.gradient_var.end());
  const auto first = static_cast<std::ptrdiff_t>(c.values.size());
  return {a.begin() + first, a.begin() + std::max(first, static_cast<std::ptrdiff_t>(last) + 1)};
}

std::vector<Spec> specs_of(const ProgramChoices& c, const Assignment& a) {
  std::vector<Spec> out;
  for (std::size_t t = 0; t < c.var_of_tensor.size(); ++t) {
    const auto v = static_cast<std::size_t>(c.var_of_tensor[t]);
    out.push_back(c.values[v][static_cast<std::size_t>(a[v])]);
  }
  return out;
}

std::vector<char> regathered_of(const ProgramChoices& c, const Assignment& a) {
  std::vector<char> out;
  for (std::size_t t = 0; t < c.var_of_tensor.size(); ++t) {
    const auto v = static_cast<std::size_t>(c.var_of_tensor[t]);
    out.push_back(c.regathered[v][static_cast<std::size_t>(a[v])]);
  }
  return out;
}

std::vector<char> regathering_that_gathers(const Graph& g, const ProgramChoices& c, std::vector<char> regathered,
                                           const std::vector<autodiff::TapeEvent>& events) {
  // By variable: a repeat's copies keep or drop the flag together.
  std::vector<char> gathers_again(c.values.size(), 0);
  for (const autodiff::TapeEvent& e : events) {
    if (e.phase != autodiff::Phase::backward || e.step.op != shardmm::OpKind::all_gather) continue;
    const int t = g.find(e.step.tensor);
    if (t >= 0) gathers_again[static_cast<std::size_t>(c.var_of_tensor[static_cast<std::size_t>(t)])] = 1;
  }
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (!g.tensors[t].regathered && !gathers_again[static_cast<std::size_t>(c.var_of_tensor[t])]) regathered[t] = 0;
  }
  return regathered;
}

ProgramChoices build_choices(const Graph& g, const nn::ProgramOptions& options, const BuildLimits& limits,
                             const Neighbourhood* neighbourhood) {
  const auto started = std::chrono::steady_clock::now();
  ProgramChoices c;
  const bool train = options.train && g.loss >= 0;
  c.on_loss_path = loss_path(g);
  if (!train) std::fill(c.on_loss_path.begin(), c.on_loss_path.end(), 0);

  // Variables: one per group key.
  std::map<std::string, int> var_by_key;
  std::vector<std::vector<int>> kept_twin;  // by variable and value: the kept value of its spec
  std::vector<int> copies;                  // by variable: how many tensors share it
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    const program::Tensor& tensor = g.tensors[t];
    const std::string key = group_key(tensor.name);
    auto [it, added] = var_by_key.emplace(key, static_cast<int>(c.values.size()));
    c.var_of_tensor.push_back(it->second);
    if (!added) {
      ++copies[static_cast<std::size_t>(it->second)];
      continue;
    }
    copies.push_back(1);
    c.tensor_of_var.push_back(static_cast<int>(t));
    const bool leaf = tensor.role != Role::computed;
    const bool einsum = !leaf && g.ops[static_cast<std::size_t>(tensor.producer)].op.kind == OpKind::einsum;
    std::vector<Spec> values;
    if (tensor.pinned) {
      values = {*tensor.pinned};
    } else if (leaf || (einsum && !tensor.temporary)) {
      values = neighbourhood ? all_specs(tensor, g.mesh, !leaf, &neighbourhood->around.at(t), neighbourhood->free_axes)
                             : all_specs(tensor, g.mesh, /*allow_unreduced=*/!leaf);
      if (leaf && neighbourhood && neighbourhood->leaf_allows)
        std::erase_if(values, [&](const Spec& s) { return !neighbourhood->leaf_allows(tensor, s); });
    }
    for (Spec& s : values) s.tensor = tensor.source_name;  // as written: `wq`, not `wq.0`
    std::vector<char> regathered(values.size(), tensor.regathered ? 1 : 0);
    std::vector<int> twin(values.size());
    std::iota(twin.begin(), twin.end(), 0);
    // A split param either keeps the copies its einsums gather for backward or gathers them
    // again there (FSDP): both, unless the file says which.
    if (tensor.role == Role::param && train && !tensor.regathered) {
      for (std::size_t i = 0, n = values.size(); i < n; ++i) {
        if (used_mask(values[i]) == 0) continue;
        values.push_back(values[i]);
        regathered.push_back(1);
        twin.push_back(static_cast<int>(i));
      }
    }
    kept_twin.push_back(std::move(twin));
    c.chosen.push_back(!tensor.pinned && (leaf || (einsum && !tensor.temporary)));
    c.values.push_back(std::move(values));  // a derived tensor's values come from its op
    c.regathered.push_back(std::move(regathered));
  }
  // (Specs compare without their names; a new value takes `name`.)
  const auto value_index = [&](int var, const Spec& s, const std::string& name) {
    std::vector<Spec>& vals = c.values[static_cast<std::size_t>(var)];
    for (std::size_t i = 0; i < vals.size(); ++i) {
      if (vals[i] == s) return static_cast<int>(i);
    }
    vals.push_back(s);
    vals.back().tensor = name;
    c.regathered[static_cast<std::size_t>(var)].push_back(0);
    return static_cast<int>(vals.size()) - 1;
  };

  // Gradient variables: the axes a differentiated tensor's gradient is partial over when it
  // reaches its producer (a leaf: its reduction), as a bit mask. Its readers each leave it
  // partial over some axes (their recordings say which); it is partial over their union. A
  // repeat's copies of a tensor share one when the same statements read them: the value the
  // last iteration carries out, read by what follows the block, has its own.
  const int tensor_vars = static_cast<int>(c.values.size());
  const int masks = 1 << g.mesh.rank();
  std::map<std::string, int> gradient_by_key;
  std::vector<int> readers;  // by gradient variable, from tensor_vars: the ops reading each copy
  c.gradient_var.assign(g.tensors.size(), -1);
  int next_var = tensor_vars;
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    std::set<int> ops;
    for (int k : g.tensors[t].consumers) {
      if (c.on_loss_path[static_cast<std::size_t>(k)]) ops.insert(k);
    }
    if (ops.empty()) continue;
    std::vector<std::string> statements;
    for (int k : ops)
      statements.push_back(
          group_key(g.tensors[static_cast<std::size_t>(g.ops[static_cast<std::size_t>(k)].result)].name));
    std::sort(statements.begin(), statements.end());
    std::string key = std::to_string(c.var_of_tensor[t]);
    for (const std::string& s : statements) key += " " + s;
    const auto [it, added] = gradient_by_key.emplace(key, next_var);
    if (added) {
      ++next_var;
      readers.push_back(static_cast<int>(ops.size()));
    }
    c.gradient_var[t] = it->second;
  }
  const int gradient_vars = next_var - tensor_vars;
  // A gradient several ops read reaches its producer partial over exactly the union of what
  // they leave it partial over (Tape::accumulate). Each reader's part is a variable of its own,
  // what its op leaves, and union factors tie the parts to the gradient's variable (letting each
  // reader's factor take any superset of its part instead was not exact: a producer whose
  // backward is cheaper from a more partial gradient, as from a result pinned unreduced, was
  // costed from one that no reader leaves). Parts are shared by the copies of a statement.
  std::map<std::pair<int, int>, int> part_var;                                   // by (op, tensor read)
  std::vector<std::vector<int>> parts(static_cast<std::size_t>(gradient_vars));  // by gradient variable
  std::vector<int> gradient_of_part;                                             // by part variable, from the first
  {
    std::map<std::tuple<int, std::string, int>, int> part_by_key;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      const int gv = c.gradient_var[t];
      if (gv < 0 || readers[static_cast<std::size_t>(gv - tensor_vars)] < 2) continue;
      std::set<int> ops;
      for (int k : g.tensors[t].consumers) {
        if (c.on_loss_path[static_cast<std::size_t>(k)]) ops.insert(k);
      }
      std::map<std::string, int> seen;  // a statement's readers so far (a statement may read it twice)
      for (int k : ops) {
        const std::string statement =
            group_key(g.tensors[static_cast<std::size_t>(g.ops[static_cast<std::size_t>(k)].result)].name);
        const auto [it, added] = part_by_key.emplace(std::tuple{gv, statement, seen[statement]++}, next_var);
        if (added) {
          parts[static_cast<std::size_t>(gv - tensor_vars)].push_back(next_var++);
          gradient_of_part.push_back(gv);
        }
        part_var[{k, static_cast<int>(t)}] = it->second;
      }
    }
  }
  // The variable of op k's part of the gradient of the tensor x it reads.
  const auto read_gradient_var = [&](int k, int x) {
    const auto it = part_var.find({k, x});
    return it != part_var.end() ? it->second : c.gradient_var[static_cast<std::size_t>(x)];
  };
  // In a neighbourhood, a gradient is partial over the fixed axes as around it.
  if (neighbourhood && !neighbourhood->partials.empty() &&
      neighbourhood->partials.size() != static_cast<std::size_t>(gradient_vars))
    throw UsageError("build_choices: the neighbourhood's partials are not the graph's gradients");
  const auto partial_in_neighbourhood = [&](int gradient_var, int mask) {
    if (!neighbourhood || neighbourhood->partials.empty()) return true;
    const int around = neighbourhood->partials[static_cast<std::size_t>(gradient_var - tensor_vars)];
    return ((mask ^ around) & ~neighbourhood->free_axes) == 0;
  };
  // ... and a part of it over no fixed axis that it is not partial over.
  const auto part_in_neighbourhood = [&](int gradient_var, int mask) {
    if (!neighbourhood || neighbourhood->partials.empty()) return true;
    const int around = neighbourhood->partials[static_cast<std::size_t>(gradient_var - tensor_vars)];
    return (mask & ~around & ~neighbourhood->free_axes) == 0;
  };
  const auto add_var = [](std::vector<int>& vars, int v) {
    if (v >= 0 && std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
  };

  // Factors: one per distinct (op statement, variables), its cost times its copies.
  struct OpFactor {
    int op = -1;                // the first op it stands for
    std::vector<int> operands;  // distinct operand tensors of that op
    std::vector<int> operand_vars;
    int result_var = -1;
    int result_gradient = -1;  // differentiated: its result's gradient variable (none: the loss)
    int count = 0;
    std::set<std::vector<int>> done;  // operand value tuples recorded
    Factor factor;
  };
  std::map<std::string, OpFactor> factors;
  std::vector<std::string> factor_of_op;
  for (std::size_t k = 0; k < g.ops.size(); ++k) {
    const program::GraphOp& op = g.ops[k];
    std::vector<int> operands;
    for (int x : op.operands) {
      if (std::find(operands.begin(), operands.end(), x) == operands.end()) operands.push_back(x);
    }
    // The copies of a statement share a factor when their specs' and gradients' variables agree.
    std::string key = group_key(g.tensors[static_cast<std::size_t>(op.result)].name) + (c.on_loss_path[k] ? "+" : "-") +
                      std::to_string(c.gradient_var[static_cast<std::size_t>(op.result)]);
    std::vector<int> vars;
    for (int x : operands) {
      vars.push_back(c.var_of_tensor[static_cast<std::size_t>(x)]);
      // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on " " + std::to_string(...) here.
      key += ' ';
      key += std::to_string(vars.back());
      key += '/';
      key += std::to_string(read_gradient_var(static_cast<int>(k), x));
    }
    OpFactor& f = factors[key];
    if (f.count++ == 0) {
      f.op = static_cast<int>(k);
      f.operands = operands;
      f.operand_vars = vars;
      f.result_var = c.var_of_tensor[static_cast<std::size_t>(op.result)];
      for (int v : vars) add_var(f.factor.vars, v);
      add_var(f.factor.vars, f.result_var);
      if (c.on_loss_path[k]) {
        f.result_gradient = c.gradient_var[static_cast<std::size_t>(op.result)];
        add_var(f.factor.vars, f.result_gradient);
        for (int x : operands) add_var(f.factor.vars, read_gradient_var(static_cast<int>(k), x));
      }
    }
    factor_of_op.push_back(key);
  }

  // Shared terms: a computed variable's activation, held once however many consumers keep it.
  std::map<int, int> shared_of_var;
  const auto shared_term = [&](int var) {
    auto [it, added] = shared_of_var.emplace(var, static_cast<int>(c.problem.shared.size()));
    if (added) c.problem.shared.push_back({var, {}});
    return it->second;
  };

  // By variable and value: a regathered param value that some recording gathered again in
  // backward. One that none did costs what its kept twin costs: dropped below.
  std::vector<std::vector<char>> regather_matters(c.values.size());
  for (std::size_t v = 0; v < c.values.size(); ++v) regather_matters[v].assign(c.values[v].size(), 0);

  if (limits.recordings && (&limits.recordings->g != &g || &limits.recordings->options != &options))
    throw UsageError("build_choices: the recordings given are of another graph or options");
  std::unique_ptr<OpRecorder> recorder_owned;
  if (!limits.recordings) recorder_owned = std::make_unique<OpRecorder>(g, options);
  OpRecorder& recorder = limits.recordings ? limits.recordings->recorder : *recorder_owned;
  const std::int64_t recorded_before = recorder.recordings();
  BuildClock clock(limits);
  // An op waits for its readers where its result's values are known before it is recorded
  // (pinned, or chosen and not carried from an operand): it is recorded after the others, last
  // first, each in only the values and gradient layouts arc consistency over the factors filled
  // before it keeps (below). Recorded in program order instead, a 2-D mesh's attention
  // scores were recorded from every layout of their gradient, which the softmax's backward
  // leaves in one.
  // Not in a whole build past two axes: solve tries one within a part of its time limit and
  // searches by neighbourhoods when the build says, within its first ops, that it cannot finish
  // (an einsum has millions of combinations on 2x2x2). In program order the first einsum comes
  // early; recorded after the others, the einsums came after seconds of the cheap ops.
  const bool readers_first = neighbourhood || std::popcount(static_cast<unsigned>(placed_axes(g.mesh))) <= 2;
  const auto waits = [&](const OpFactor& f) {
    const program::Tensor& result = g.tensors[static_cast<std::size_t>(g.ops[static_cast<std::size_t>(f.op)].result)];
    return readers_first && f.result_gradient >= 0 && !c.values[static_cast<std::size_t>(f.result_var)].empty() &&
           (result.pinned || c.chosen[static_cast<std::size_t>(f.result_var)]) &&
           std::find(f.operand_vars.begin(), f.operand_vars.end(), f.result_var) == f.operand_vars.end();
  };
  // Op k's factor given every new combination of its specs (only live values and gradient
  // layouts, where `live` is given); whether a derived variable gained a value.
  const auto fill = [&](std::size_t k, const ArcConsistency* live) {
    bool grew = false;
    OpFactor& f = factors[factor_of_op[k]];
    const program::Tensor& result = g.tensors[static_cast<std::size_t>(g.ops[k].result)];
    const bool choice_result = !c.values[static_cast<std::size_t>(f.result_var)].empty() &&
                               (result.pinned || c.chosen[static_cast<std::size_t>(f.result_var)]);
    const bool differentiated = c.on_loss_path[k] != 0;
    const int result_gradient = c.gradient_var[static_cast<std::size_t>(g.ops[k].result)];
    std::vector<std::optional<int>> result_partials;
    if (!differentiated) {
      result_partials = {std::nullopt};
    } else if (result_gradient < 0) {
      result_partials = {0};  // the loss: its gradient is the whole seed
    } else {
      for (int mask = 0; mask < masks; ++mask) {
        if (partial_in_neighbourhood(result_gradient, mask) && (!live || live->live(result_gradient, mask)))
          result_partials.push_back(mask);
      }
    }
    // Where each variable's value goes in the factor's entries.
    const auto slot = [&](int var) {
      return static_cast<std::size_t>(std::find(f.factor.vars.begin(), f.factor.vars.end(), var) -
                                      f.factor.vars.begin());
    };
    std::vector<std::size_t> operand_slots;
    for (int v : f.operand_vars) operand_slots.push_back(slot(v));
    const std::size_t result_slot = slot(f.result_var);
    // The operands whose gradients (or their parts: read_gradient_var) are variables: each
    // is partial over what this op leaves it partial over.
    struct OperandGradient {
      std::size_t operand = 0, slot = 0;
      int var = -1;
    };
    std::vector<OperandGradient> operand_gradients;
    for (std::size_t i = 0; differentiated && i < f.operands.size(); ++i) {
      const int gv = read_gradient_var(f.op, f.operands[i]);
      if (gv >= 0) operand_gradients.push_back({i, slot(gv), gv});
    }
    std::vector<int> tuple(f.operands.size(), 0);
    double combinations = 1;  // of the operands' values: may be far too many to hold at once
    for (int v : f.operand_vars) combinations *= static_cast<double>(c.values[static_cast<std::size_t>(v)].size());
    if (combinations == 0) return grew;
    // Every new combination of this op's specs, in batches: each recorded in parallel, then
    // entered in order, and the time limit checked.
    double visited = 0, batched = 0;
    // The kept combinations' costs, by JobKey (below): a regathered combination takes its
    // kept twin's, recorded in an earlier batch or earlier in its own.
    using JobKey = std::tuple<std::vector<int>, int, int>;
    std::map<JobKey, std::shared_ptr<const OpCost>> kept_costs;
    // A batch's recordings entered into the factor, in order: whether the result's variable
    // gained a value.
    const auto enter = [&](const Batch& b) {
      const std::vector<OperandValues>& operand_values = b.operand_values;
      const std::vector<Combination>& combos = b.combos;
      const std::vector<Recording>& jobs = b.jobs;
      bool gained = false;
      // A combination's jobs come one after another and share their result spec: looked up once.
      const Spec* last_result = nullptr;
      int last_result_value = -1;
      std::vector<int> value_of;
      for (const Recording& job : jobs) {
        const OpCost& cost = *job.cost;
        const Combination& combo = combos[job.combination];
        const std::vector<int>& tuple = operand_values[combo.operands].tuple;
        const std::vector<Spec>& specs = operand_values[combo.operands].specs;
        const std::optional<Spec>& pin = combo.pin;
        const std::optional<int>& partial = job.partial;
        if (!cost.allowed) continue;
        if (pin && !(*cost.result == *pin)) continue;  // the rule gives another layout
        for (std::size_t i = 0; i < tuple.size(); ++i) {
          if (cost.operands[i].regathered)
            regather_matters[static_cast<std::size_t>(f.operand_vars[i])][static_cast<std::size_t>(tuple[i])] = 1;
        }
        const std::size_t before = c.values[static_cast<std::size_t>(f.result_var)].size();
        // The entry's values by its factor's variables (-1: not set yet).
        value_of.assign(f.factor.vars.size(), -1);
        for (std::size_t i = 0; i < tuple.size(); ++i) value_of[operand_slots[i]] = tuple[i];
        if (cost.result.get() != last_result) {
          last_result = cost.result.get();
          last_result_value = value_index(f.result_var, *cost.result, result.source_name);
        }
        value_of[result_slot] = last_result_value;
        gained = gained || c.values[static_cast<std::size_t>(f.result_var)].size() > before;
        if (result_gradient >= 0 && partial) value_of[slot(result_gradient)] = *partial;
        FactorEntry e;
        e.time = cost.time * f.count;
        e.figures = {cost.memory.kept, cost.memory.transient, cost.memory.transient_with_result, cost.memory.backward};
        if (train) {
          e.memory = cost.internal_memory * f.count;
          for (std::size_t i = 0; i < f.operands.size(); ++i) {
            if (cost.operands[i].saved && g.tensors[static_cast<std::size_t>(f.operands[i])].role == Role::computed) {
              e.shared.push_back(shared_term(f.operand_vars[i]));
            }
          }
          if (cost.result_saved) e.shared.push_back(shared_term(f.result_var));
        }
        // Each operand's gradient takes the one mask this op leaves it partial over: no entry
        // where that mask is not allowed (it partials a sharding axis, or leaves the
        // neighbourhood), or where it disagrees with a value already set (the same variable
        // in two places).
        bool consistent = true;
        for (const OperandGradient& og : operand_gradients) {
          const int left = cost.operands[og.operand].partial;
          const int first_part = tensor_vars + gradient_vars;
          const bool fits =
              og.var >= first_part
                  ? part_in_neighbourhood(gradient_of_part[static_cast<std::size_t>(og.var - first_part)], left)
                  : partial_in_neighbourhood(og.var, left);
          int& at = value_of[og.slot];
          consistent = consistent && !(left & used_mask(specs[og.operand])) && fits && (at < 0 || at == left);
          at = left;
        }
        if (!consistent) continue;
        e.values = value_of;
        f.factor.entries.push_back(std::move(e));
      }
      return gained;
    };
    // A batch is entered on a thread of its own while the next one is enumerated and recorded
    // (entered between batches, it kept one core busy and the other idle), unless the op
    // carries its result into an operand: entering may add values the enumeration reads.
    const bool carries = std::find(f.operand_vars.begin(), f.operand_vars.end(), f.result_var) != f.operand_vars.end();
    Batch entering_batch;
    std::future<bool> entering;  // declared after what it reads: its destructor waits for it
    const auto entered = [&] {
      if (!entering.valid()) return;
      const bool gained = entering.get();
      grew = grew || gained;
    };
    // Small batches first: the first says soon how fast this op's recordings go.
    std::size_t batch = std::min<std::size_t>(512, limits.batch);
    for (bool more = true; more; batch = std::min(2 * batch, limits.batch)) {
      Batch current;
      std::vector<OperandValues>& operand_values = current.operand_values;
      std::vector<Combination>& combos = current.combos;
      std::vector<Recording>& jobs = current.jobs;
      while (more && jobs.size() < batch) {
        const auto dead = [&] {
          for (std::size_t i = 0; live && i < tuple.size(); ++i) {
            if (!live->live(f.operand_vars[i], tuple[i])) return true;
          }
          return false;
        };
        if (!dead() && f.done.insert(tuple).second) {
          OperandValues& values = operand_values.emplace_back();
          values.tuple = tuple;
          for (std::size_t i = 0; i < tuple.size(); ++i) {
            const auto v = static_cast<std::size_t>(f.operand_vars[i]);
            values.specs.push_back(c.values[v][static_cast<std::size_t>(tuple[i])]);
            values.regathered.push_back(c.regathered[v][static_cast<std::size_t>(tuple[i])]);
          }
          values.regathers =
              std::any_of(values.regathered.begin(), values.regathered.end(), [](char r) { return r != 0; });
          const std::vector<Spec>& specs = values.specs;
          // The result's spec: its own variable's when that is an operand too (a value carried
          // into the next iteration), else each of its choices, else what the op's rule gives.
          std::vector<std::optional<Spec>> pins;
          const auto same = std::find(f.operand_vars.begin(), f.operand_vars.end(), f.result_var);
          if (same != f.operand_vars.end()) {
            pins.push_back(specs[static_cast<std::size_t>(same - f.operand_vars.begin())]);
          } else if (choice_result) {
            const std::vector<Spec>& results = c.values[static_cast<std::size_t>(f.result_var)];
            for (std::size_t r = 0; r < results.size(); ++r) {
              if ((!live || live->live(f.result_var, static_cast<int>(r))) &&
                  (result.pinned || follows_operands(results[r], specs, result, options.rings)))
                pins.push_back(results[r]);
            }
          } else {
            pins.push_back(std::nullopt);
          }
          for (std::size_t p = 0; p < pins.size(); ++p) {
            Combination& combo = combos.emplace_back();
            combo.operands = operand_values.size() - 1;
            combo.pin = std::move(pins[p]);
            combo.pin_at = static_cast<int>(p);
            for (const std::optional<int>& partial : result_partials) {
              // A gradient is never partial over an axis that shards its value: known before
              // recording when the result is pinned.
              if (combo.pin && partial && (*partial & used_mask(*combo.pin))) continue;
              combo.jobs.push_back(jobs.size());
              jobs.push_back({combos.size() - 1, partial, nullptr});
            }
          }
        }
        ++visited;
        std::size_t i = 0;
        while (i < tuple.size() &&
               ++tuple[i] == static_cast<int>(c.values[static_cast<std::size_t>(f.operand_vars[i])].size()))
          tuple[i++] = 0;
        more = i < tuple.size();
      }
      // The kept combinations first; one with regathered params then takes its kept twin's
      // cost where that gathers none of them (regathering changes nothing there).
      const auto key = [&](const Recording& r, bool kept) {
        const Combination& combo = combos[r.combination];
        const OperandValues& values = operand_values[combo.operands];
        std::vector<int> t = values.tuple;
        for (std::size_t i = 0; kept && i < t.size(); ++i) {
          if (values.regathered[i])
            t[i] = kept_twin[static_cast<std::size_t>(f.operand_vars[i])][static_cast<std::size_t>(t[i])];
        }
        return JobKey{t, combo.pin_at, r.partial ? *r.partial : -1};
      };
      std::vector<std::size_t> kept_combos, twin_combos;
      for (std::size_t k = 0; k < combos.size(); ++k)
        (operand_values[combos[k].operands].regathers ? twin_combos : kept_combos).push_back(k);
      // A combination's jobs (of its result gradient's layouts) share one forward pass.
      const auto record = [&](const Combination& combo, const std::vector<std::size_t>& list) {
        if (list.empty()) return;
        std::vector<std::optional<int>> partials;
        for (std::size_t j : list) partials.push_back(jobs[j].partial);
        std::vector<std::shared_ptr<const OpCost>> costs =
            recorder.costs(f.op, f.operands, operand_values[combo.operands].specs,
                           operand_values[combo.operands].regathered, combo.pin, partials);
        for (std::size_t i = 0; i < list.size(); ++i) jobs[list[i]].cost = std::move(costs[i]);
      };
      for_each_parallel(kept_combos.size(), [&](std::size_t k) {
        const Combination& combo = combos[kept_combos[k]];
        record(combo, combo.jobs);
      });
      for (std::size_t k : kept_combos) {
        for (std::size_t j : combos[k].jobs) kept_costs.emplace(key(jobs[j], false), jobs[j].cost);
      }
      for_each_parallel(twin_combos.size(), [&](std::size_t k) {
        const Combination& combo = combos[twin_combos[k]];
        std::vector<std::size_t> to_record;
        for (std::size_t j : combo.jobs) {
          Recording& job = jobs[j];
          const auto kept = kept_costs.find(key(job, true));
          if (kept != kept_costs.end()) {
            const OpCost& twin = *kept->second;
            bool gathers = false;
            const std::vector<char>& regathered = operand_values[combo.operands].regathered;
            for (std::size_t i = 0; twin.allowed && i < regathered.size(); ++i)
              gathers = gathers || (regathered[i] && twin.operands[i].gathered);
            if (!gathers) {
              job.cost = kept->second;
              continue;
            }
          }
          to_record.push_back(j);
        }
        record(combo, to_record);
      });
      batched += static_cast<double>(jobs.size());
      clock.batch_done(g, f.op, static_cast<std::int64_t>(jobs.size()), (combinations - visited) * batched / visited);
      entered();
      entering_batch = std::move(current);
      if (carries || !more) {  // the op's last batch: nothing to record meanwhile
        // but forgetting the op's plans, on the other core (a few hundredths of a second of
        // freeing for a decoder on a 2-D mesh, which kept one core idle).
        std::future<void> forgetting;
        if (!more) forgetting = std::async(std::launch::async, [&recorder] { recorder.forget_plans(); });
        const bool gained = enter(entering_batch);
        grew = grew || gained;
      } else {
        entering = std::async(std::launch::async, enter, std::cref(entering_batch));
      }
    }
    entered();
    return grew;
  };
  // The others in program order until no derived variable gains a value (a repeat's later
  // iterations can feed values back to an earlier factor's operands), then those that wait.
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t k = 0; k < g.ops.size(); ++k) {
      const OpFactor& f = factors[factor_of_op[k]];
      if (f.op == static_cast<int>(k) && !waits(f)) grew = fill(k, nullptr) || grew;
    }
  }
  // Arc consistency over the factors filled so far, and the unions of the gradients' parts (a
  // gradient is partial over the union of what its readers leave); the factors filled are final
  // and each filled later only adds constraints, so what it drops has no place in any sharding.
  std::vector<int> domain;
  for (const std::vector<Spec>& v : c.values) domain.push_back(static_cast<int>(v.size()));
  domain.resize(static_cast<std::size_t>(next_var), masks);
  ArcConsistency live(domain);
  for (int gv = tensor_vars; gv < tensor_vars + gradient_vars; ++gv) {
    std::vector<char> allowed(static_cast<std::size_t>(masks));
    for (int mask = 0; mask < masks; ++mask)
      allowed[static_cast<std::size_t>(mask)] = partial_in_neighbourhood(gv, mask);
    live.restrict(gv, allowed);
    const std::vector<int>& of = parts[static_cast<std::size_t>(gv - tensor_vars)];
    if (of.empty()) continue;
    std::vector<int> with_parts{gv};
    with_parts.insert(with_parts.end(), of.begin(), of.end());
    live.add_union(std::move(with_parts));
  }
  for (const auto& [key, f] : factors) {
    if (!waits(f)) live.add(f.factor);
  }
  for (std::size_t k = g.ops.size(); k-- > 0;) {
    const OpFactor& f = factors[factor_of_op[k]];
    if (f.op != static_cast<int>(k) || !waits(f)) continue;
    live.settle();
    fill(k, &live);
    live.add(f.factor);
  }

  // Regathered twins that regather nothing leave the problem (they would only tie their twins).
  for (std::size_t v = 0; v < c.tensor_of_var.size(); ++v) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    if (t.role != Role::param || t.regathered) continue;
    std::vector<int> renumbered(c.values[v].size(), -1);
    std::vector<Spec> values;
    std::vector<char> regathered;
    for (std::size_t i = 0; i < c.values[v].size(); ++i) {
      if (c.regathered[v][i] && !regather_matters[v][i]) continue;
      renumbered[i] = static_cast<int>(values.size());
      values.push_back(c.values[v][i]);
      regathered.push_back(c.regathered[v][i]);
    }
    if (values.size() == c.values[v].size()) continue;
    for (auto& [key, f] : factors) {
      const auto at = std::find(f.factor.vars.begin(), f.factor.vars.end(), static_cast<int>(v));
      if (at == f.factor.vars.end()) continue;
      const auto j = static_cast<std::size_t>(at - f.factor.vars.begin());
      std::erase_if(f.factor.entries,
                    [&](const FactorEntry& e) { return renumbered[static_cast<std::size_t>(e.values[j])] < 0; });
      for (FactorEntry& e : f.factor.entries) e.values[j] = renumbered[static_cast<std::size_t>(e.values[j])];
    }
    c.values[v] = std::move(values);
    c.regathered[v] = std::move(regathered);
  }

  for (std::size_t v = 0; v < c.values.size(); ++v) {
    c.problem.domain.push_back(std::max<int>(1, static_cast<int>(c.values[v].size())));
    if (c.values[v].empty()) {
      const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
      if (t.producer < 0) throw InputError("solve: the neighbourhood allows no spec of " + t.name);
      throw InputError("solve: no sharding of the operands of " + t.name + " lets its op run (" +
                       g.ops[static_cast<std::size_t>(t.producer)].expression + ")");
    }
  }
  for (int v = tensor_vars; v < tensor_vars + gradient_vars; ++v) c.problem.domain.push_back(masks);
  std::map<std::string, int> factor_index;
  for (auto& [key, f] : factors) {
    factor_index[key] = static_cast<int>(c.problem.factors.size());
    c.problem.factors.push_back(std::move(f.factor));
  }
  for (SharedTerm& s : c.problem.shared) {
    const auto v = static_cast<std::size_t>(s.var);
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    for (const Spec& spec : c.values[v]) s.bytes.push_back(local_bytes(g, spec, t.shape, options.dtype) * copies[v]);
  }
  c.problem.value_bytes.resize(c.problem.domain.size());
  for (std::size_t v = 0; v < c.values.size(); ++v) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    for (const Spec& spec : c.values[v])
      c.problem.value_bytes[v].push_back(local_bytes(g, spec, t.shape, options.dtype));
  }
  for (int v = tensor_vars; v < tensor_vars + gradient_vars; ++v)
    c.problem.value_bytes[static_cast<std::size_t>(v)].assign(static_cast<std::size_t>(masks), 0);
  std::vector<int> reduce_factors;  // a leaf's gradient reductions
  // Leaves: the value, its gradient (train), Adam's two moments (params), and a param's update
  // (the tape's update step: Tape::update); and reducing the gradient into the leaf's spec from
  // the axes its readers left it partial over.
  for (std::size_t v = 0; v < c.values.size(); ++v) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
    if (t.role == Role::computed) continue;
    const bool updated = train && t.role == Role::param;
    const int per = 1 + (train ? 1 : 0) + (updated && options.optimizer == nn::Optimizer::adam ? 2 : 0);
    Factor f;
    f.vars = {static_cast<int>(v)};
    for (std::size_t i = 0; i < c.values[v].size(); ++i) {
      const std::int64_t bytes = local_bytes(g, c.values[v][i], t.shape, options.dtype);
      const double update =
          updated ? local_op_cost(options.hw, options.dtype, local_rate_key(nn::to_string(options.optimizer), false),
                                  checked_mul(nn::update_blocks(options.optimizer), bytes, "bytes"))
                        .time_s
                  : 0.0;
      f.entries.push_back({{static_cast<int>(i)}, update * copies[v], bytes * per * copies[v], {}, {}});
    }
    c.problem.factors.push_back(std::move(f));
    // One reduction per gradient variable of the leaf's copies (they share one unless other
    // statements read them), its time times the copies that have it.
    std::map<int, int> copies_of_gradient;
    for (std::size_t x = 0; x < g.tensors.size(); ++x) {
      if (c.var_of_tensor[x] == static_cast<int>(v) && c.gradient_var[x] >= 0) ++copies_of_gradient[c.gradient_var[x]];
    }
    for (const auto& [gv, n] : copies_of_gradient) {
      Factor reduce;
      reduce.vars = {static_cast<int>(v), gv};
      for (std::size_t i = 0; i < c.values[v].size(); ++i) {
        const int used = used_mask(c.values[v][i]);
        for (int mask = 0; mask < masks; ++mask) {
          if ((mask & used) || !partial_in_neighbourhood(gv, mask)) continue;
          const auto [time, largest] = recorder.reduce(t, c.values[v][i], mask);
          reduce.entries.push_back({{static_cast<int>(i), mask}, time * n, 0, {}, {largest}});
        }
      }
      reduce_factors.push_back(static_cast<int>(c.problem.factors.size()));
      c.problem.factors.push_back(std::move(reduce));
    }
  }
  // Summing a gradient's contributions: one local step per contribution after the first
  // (autodiff::kGradientSumBlocks of the value's block), whatever the op order. An op that reads
  // a value twice sums its two contributions in its own recording; the ops' sums are added here.
  if (train) {
    std::vector<std::int64_t> sums(c.values.size(), 0);  // by tensor variable, over its copies
    for (std::size_t t = 0; t < g.tensors.size(); ++t) {
      if (!g.tensors[t].differentiable) continue;
      std::set<int> contributing;
      for (int k : g.tensors[t].consumers) {
        // Routing is data: no gradient flows back through a route.
        if (c.on_loss_path[static_cast<std::size_t>(k)] && g.ops[static_cast<std::size_t>(k)].op.kind != OpKind::route)
          contributing.insert(k);
      }
      sums[static_cast<std::size_t>(c.var_of_tensor[t])] += std::max<std::int64_t>(0, std::ssize(contributing) - 1);
    }
    for (std::size_t v = 0; v < c.values.size(); ++v) {
      if (sums[v] == 0) continue;
      const program::Tensor& t = g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])];
      Factor f;
      f.vars = {static_cast<int>(v)};
      for (std::size_t i = 0; i < c.values[v].size(); ++i) {
        const std::int64_t bytes = local_bytes(g, c.values[v][i], t.shape, options.dtype);
        const double time =
            local_op_cost(options.hw, options.dtype, local_rate_key("accumulate", true),
                          checked_mul(autodiff::kGradientSumBlocks, bytes, "a gradient sum's bytes"))
                .time_s;
        f.entries.push_back({{static_cast<int>(i)}, time * static_cast<double>(sums[v]), 0, {}, {}});
      }
      c.problem.factors.push_back(std::move(f));
    }
  }
  // The union of a gradient's parts: a chain of factors, each taking one more part, through
  // variables of their own (a factor over every part at once would list masks^parts entries),
  // over only the values the parts take in their readers' entries (over every mask, a chain
  // multiplied the tables the dynamic program joins it with by up to masks).
  std::vector<std::set<int>> part_values(static_cast<std::size_t>(next_var - tensor_vars - gradient_vars));
  for (const Factor& f : c.problem.factors) {
    for (std::size_t i = 0; i < f.vars.size(); ++i) {
      const int first_part = tensor_vars + gradient_vars;
      if (f.vars[i] < first_part) continue;
      for (const FactorEntry& e : f.entries)
        part_values[static_cast<std::size_t>(f.vars[i] - first_part)].insert(e.values[i]);
    }
  }
  for (int gv = tensor_vars; gv < tensor_vars + gradient_vars; ++gv) {
    const std::vector<int>& of = parts[static_cast<std::size_t>(gv - tensor_vars)];
    const auto values_of = [&](int part) -> const std::set<int>& {
      return part_values[static_cast<std::size_t>(part - tensor_vars - gradient_vars)];
    };
    std::set<int> so_far_values = of.empty() ? std::set<int>{} : values_of(of[0]);
    for (std::size_t i = 1; i < of.size(); ++i) {
      const int so_far = i == 1 ? of[0] : next_var - 1;
      const int to = i + 1 == of.size() ? gv : next_var++;
      Factor u;
      u.vars = {so_far, of[i], to};
      std::set<int> to_values;
      for (int a : so_far_values) {
        for (int b : values_of(of[i])) {
          if (to == gv && !partial_in_neighbourhood(gv, a | b)) continue;
          u.entries.push_back({{a, b, a | b}, 0, 0, {}, {}});
          to_values.insert(a | b);
        }
      }
      so_far_values = std::move(to_values);
      c.problem.factors.push_back(std::move(u));
    }
  }
  for (int v = tensor_vars + gradient_vars; v < next_var; ++v) {
    c.problem.domain.push_back(masks);
    c.problem.value_bytes.emplace_back(static_cast<std::size_t>(masks), 0);
  }
  std::vector<int> factor_of(g.ops.size());
  for (std::size_t k = 0; k < g.ops.size(); ++k) factor_of[k] = factor_index.at(factor_of_op[k]);
  add_timeline(c, g, options, factor_of, shared_of_var, reduce_factors);
  c.evaluations = recorder.recordings() - recorded_before;
  c.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (limits.leave_caches_to_exit && recorder_owned) leave_to_exit(std::move(recorder_owned));
  return c;
}

}  // namespace shardmm::solve
