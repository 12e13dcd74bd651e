#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <vector>

#include "plan/steps.h"
#include "shardmm/core/error.h"

namespace shardmm {
namespace {

std::string axis_name(const Mesh& mesh, int axis) { return mesh.axis(axis).name; }

AxisCase classify_axis(const Mesh& mesh, const Contraction& c, int x) {
  const std::string X = axis_name(mesh, x);
  const Spec& a = c.a;
  const Spec& b = c.b;
  const int da = a.dim_of_axis(x), db = b.dim_of_axis(x);
  const std::string la = da >= 0 ? a.dims[static_cast<std::size_t>(da)].name : "";
  const std::string lb = db >= 0 ? b.dims[static_cast<std::size_t>(db)].name : "";
  const bool ca = !la.empty() && c.role(la) == DimRole::contracted;
  const bool cb = !lb.empty() && c.role(lb) == DimRole::contracted;
  AxisCase out{x, 1, ""};
  if (a.is_unreduced(x) || b.is_unreduced(x)) {
    const Spec& partial = a.is_unreduced(x) ? a : b;
    const Spec& other = a.is_unreduced(x) ? b : a;
    out.case_number = 3;
    out.reason = partial.tensor + " holds partial sums over " + X + " ({U_" + X + "}); the einsum is linear, so " +
                 (other.uses(x) ? other.tensor + " must stop using " + X + " or " + partial.tensor + " be reduced first"
                                : "the result is a partial sum over " + X + " too") +
                 ", to be reduced with all_reduce or reduce_scatter, or kept unreduced";
  } else if (ca && cb && la == lb) {
    out.case_number = 3;
    out.reason = "both " + a.tensor + " and " + b.tensor + " shard the contracting dimension " + la + " over " + X +
                 ": each device multiplies its matching " + la + "-blocks into a partial sum " + c.out_tensor + "{U_" +
                 X + "}, reduced by all_reduce (replicated result), reduce_scatter (sharded result) or kept unreduced";
  } else if (ca || cb) {
    const Spec& sharded = ca ? a : b;
    const Spec& other = ca ? b : a;
    const std::string& j = ca ? la : lb;
    const std::string& ol = ca ? lb : la;
    out.case_number = 2;
    out.reason = "only " + sharded.tensor + " shards the contracting dimension " + j + " over " + X + ": all_gather " +
                 sharded.tensor + "'s " + j + " before the einsum, or slice " + other.tensor + "'s " + j +
                 " locally to match and reduce the partial sums after it";
    if (!ol.empty()) {
      out.reason += " (" + other.tensor + " uses " + X + " for " + ol + ", which must give it up first)";
    }
  } else if (!la.empty() && !lb.empty()) {
    if (la == lb) {
      out.reason = "both inputs shard the batch dimension " + la + " over " + X +
                   ": the blocks line up and each device computes its own block with no communication";
    } else {
      out.case_number = 4;
      out.reason = a.tensor + " shards " + la + " and " + b.tensor + " shards " + lb + " over the same axis " + X +
                   ": each device would hold only a diagonal block of " + c.out_tensor + "[" + la + ", " + lb +
                   "] and a mesh axis can shard only one dimension, so all_gather one side over " + X + " first";
    }
  } else if (!la.empty() || !lb.empty()) {
    const std::string& l = la.empty() ? lb : la;
    out.reason = (la.empty() ? b.tensor : a.tensor) + " shards " + l + " over " + X +
                 ", which is not contracted: each device computes its own block of " + c.out_tensor +
                 " with no communication";
  } else {
    out.reason = X + " shards neither input: the einsum is replicated over " + X;
  }
  return out;
}

// A mesh axis's part in the local einsum.
struct Role {
  enum Kind { none, dim, unreduced_a, unreduced_b } kind = none;
  std::string letter;  // for `dim`
  bool operator<(const Role& o) const { return std::tie(kind, letter) < std::tie(o.kind, o.letter); }
};

class MatmulPlanner {
 public:
  MatmulPlanner(const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const PlanOptions& options,
                PlannerMemo::Impl* memo)
      : mesh_(mesh),
        c_(c),
        sizes_(sizes),
        options_(options),
        unlimited_(options),
        memo_(memo ? memo : &own_memo_),
        coster_(mesh, options, &memo_->steps) {
    unlimited_.mem_limit_bytes.reset();
    a_shape_ = global_shape(c.a, sizes);
    b_shape_ = global_shape(c.b, sizes);
    Spec out_dims_only;
    out_dims_only.tensor = c.out_tensor;
    for (const std::string& d : c.out_dims) out_dims_only.dims.push_back({d, {}});
    c_shape_ = global_shape(out_dims_only, sizes);
    letters_ = c.all_dims();
    for (const std::string& d : c.out_dims) {
      if (std::find(letters_.begin(), letters_.end(), d) == letters_.end()) letters_.push_back(d);
    }
    for (const std::string& l : letters_) {
      letter_ids_.push_back(id(l));
      sizes_key_.insert(sizes_key_.end(), {letter_ids_.back(), sizes.at(l)});
    }
    named_ = {{{&c.a.tensor, id(c.a.tensor)}, {&c.b.tensor, id(c.b.tensor)}, {&c.out_tensor, id(c.out_tensor)}}};
    std::vector<std::int64_t> contraction;
    for (const Spec* s : {&c.a, &c.b}) {
      contraction.push_back(tensor_id(s->tensor));
      append_layout(contraction, *s);
    }
    contraction.push_back(tensor_id(c.out_tensor));
    for (const std::string& d : c.out_dims) contraction.push_back(letter_ids_[letter(d)]);
    contraction.push_back(-4);
    contraction.insert(contraction.end(), sizes_key_.begin(), sizes_key_.end());
    contraction_id_ = signature_id(std::move(contraction));
    if (c.out) {
      out_targets_.push_back(*c.out);
      std::vector<std::int64_t> pin{-5, tensor_id(c.out_tensor), tensor_id(c.out->tensor)};
      append_layout(pin, *c.out);
      pin.insert(pin.end(), c_shape_.begin(), c_shape_.end());
      pin_id_ = signature_id(std::move(pin));
    }
    inputs_ = saturating_add(input_bytes(mesh, c.a, a_shape_, options.dtype),
                             input_bytes(mesh, c.b, b_shape_, options.dtype));
  }

  // Every candidate weighed, sorted and chosen from; those `built` asks for built in full.
  MatmulPlanning plan(Candidates built) {
    rings_ = built == Candidates::all;
    // No output requested: the search covers every output layout, each axis sharding any of
    // C's letters too, unless that is past the limit on combinations; then it covers the
    // layouts the inputs' axes give, and says so (MatmulPlanning::every_output_layout).
    const auto roles = [this](bool any_output_letter) {
      std::vector<std::vector<Role>> options(static_cast<std::size_t>(mesh_.rank()));
      for (int x = 0; x < mesh_.rank(); ++x) options[static_cast<std::size_t>(x)] = roles_for(x, any_output_letter);
      return options;
    };
    std::vector<std::vector<Role>> options = roles(!c_.out);
    if (!c_.out && combinations(options) > kMaxRoleCombinations) {
      options = roles(false);
      every_output_layout_ = false;
    }
    refuse_too_many_layouts(options);
    std::vector<Role> chosen(options.size());
    enumerate_roles(options, chosen, 0);
    MatmulPlanning out;
    out.every_output_layout = every_output_layout_;
    if (built == Candidates::serial) {
      // Only the chosen one is built: picked without sorting the rest (the same one).
      if (const Candidate* chosen = choose_unsorted(options_.tie_margin)) {
        out.chosen = 0;
        out.candidates.push_back(build_plan(*chosen));
      }
      return out;
    }
    std::stable_sort(candidates_.begin(), candidates_.end(),
                     [this](const Candidate& p, const Candidate& q) { return ranks_before(p, q); });
    out.chosen = choose(options_.tie_margin);
    for (const Candidate& c : candidates_) out.candidates.push_back(build_plan(c));
    return out;
  }

 private:
  std::vector<Role> roles_for(int x, bool any_output_letter) const {
    std::set<Role> roles{Role{}};
    if (any_output_letter) {
      for (const std::string& d : c_.out_dims) roles.insert({Role::dim, d});
    }
    for (const Spec* s : {&c_.a, &c_.b}) {
      if (int d = s->dim_of_axis(x); d >= 0) roles.insert({Role::dim, s->dims[static_cast<std::size_t>(d)].name});
    }
    if (c_.out) {
      if (int d = c_.out->dim_of_axis(x); d >= 0)
        roles.insert({Role::dim, c_.out->dims[static_cast<std::size_t>(d)].name});
      // A requested partial sum can come straight from splitting a contracted dimension.
      if (c_.out->is_unreduced(x)) {
        for (const std::string& j : c_.contracted()) roles.insert({Role::dim, j});
      }
    }
    if (c_.a.is_unreduced(x)) roles.insert({Role::unreduced_a, ""});
    if (c_.b.is_unreduced(x)) roles.insert({Role::unreduced_b, ""});
    return {roles.begin(), roles.end()};
  }

  // Every combination of the axes' roles is planned and costed (tens of microseconds each),
  // so each mesh axis the tensors use multiplies the work: 10 axes take seconds, 40 would
  // take years. Past kMaxRoleCombinations the planner refuses instead of hanging.
  static constexpr std::size_t kMaxRoleCombinations = 1024;

  // The number of combinations of the axes' roles, counted up to kMaxRoleCombinations + 1.
  static std::size_t combinations(const std::vector<std::vector<Role>>& options) {
    std::size_t n = 1;
    for (const std::vector<Role>& roles : options) n = std::min(n * roles.size(), kMaxRoleCombinations + 1);
    return n;
  }

  void refuse_too_many_layouts(const std::vector<std::vector<Role>>& options) const {
    int used = 0;
    for (const std::vector<Role>& roles : options) used += roles.size() > 1;
    if (combinations(options) > kMaxRoleCombinations) {
      throw InputError("cannot plan " + format_contraction(c_, mesh_) + ": its tensors use " + std::to_string(used) +
                       " mesh axes, whose roles (shard a dimension, hold partial sums, or neither) combine in more "
                       "than " +
                       std::to_string(kMaxRoleCombinations) +
                       " ways, the most the planner weighs; shard over fewer, larger mesh axes");
    }
  }

  void enumerate_roles(const std::vector<std::vector<Role>>& options, std::vector<Role>& chosen, std::size_t x) {
    if (x == options.size()) {
      enumerate_orders(chosen);
      return;
    }
    for (const Role& r : options[x]) {
      chosen[x] = r;
      enumerate_roles(options, chosen, x + 1);
    }
  }

  // The orders (major to minor) in which a letter's axes may shard it: as the output, A or B
  // already order them, the rest in mesh order; without an output spec, every order.
  // Into `orders`, emptied first.
  void orders_for(const std::string& letter, const AxisList& axes, std::vector<AxisList>& orders) const {
    std::array<const AxisList*, 3> sources{};
    std::size_t n = 0;
    if (c_.out && c_.out->find_dim(letter) >= 0)
      sources[n++] = &c_.out->dims[static_cast<std::size_t>(c_.out->find_dim(letter))].axes;
    for (const Spec* s : {&c_.a, &c_.b}) {
      if (s->find_dim(letter) >= 0) sources[n++] = &s->dims[static_cast<std::size_t>(s->find_dim(letter))].axes;
    }
    orders.clear();
    const auto add = [&](const AxisList* source) {
      AxisList order;
      if (source) {
        for (int a : *source) {
          if (std::find(axes.begin(), axes.end(), a) != axes.end()) order.push_back(a);
        }
      }
      for (int a : axes) {
        if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
      }
      if (std::find(orders.begin(), orders.end(), order) == orders.end()) orders.push_back(order);
    };
    for (std::size_t i = 0; i < n; ++i) add(sources[i]);
    if (orders.empty()) add(nullptr);
    // With no output spec, every output layout: each order of the letter's axes.
    if (!c_.out) {
      AxisList order = axes;
      std::sort(order.begin(), order.end());
      do {
        if (std::find(orders.begin(), orders.end(), order) == orders.end()) orders.push_back(order);
      } while (std::next_permutation(order.begin(), order.end()));
    }
  }

  // The buffers are the planner's, reused: a planner enumerates tens of role combinations, and
  // solve plans hundreds of thousands of contractions.
  void enumerate_orders(const std::vector<Role>& roles) {
    const std::size_t letters = letters_.size();
    per_letter_.resize(letters);
    for (std::size_t i = 0; i < letters; ++i) {
      AxisList axes;
      for (int x = 0; x < mesh_.rank(); ++x) {
        const Role& r = roles[static_cast<std::size_t>(x)];
        if (r.kind == Role::dim && same_letter(r.letter, letters_[i])) axes.push_back(x);
      }
      if (axes.size() > 1) {
        orders_for(letters_[i], axes, per_letter_[i]);
      } else {
        per_letter_[i].assign(1, axes);
      }
    }
    pick_.assign(letters, 0);
    layout_.resize(letters);  // by letter (letters_)
    while (true) {
      for (std::size_t i = 0; i < letters; ++i) layout_[i] = per_letter_[i][pick_[i]];
      build(roles, layout_);
      std::size_t i = 0;
      while (i < letters && ++pick_[i] == per_letter_[i].size()) pick_[i++] = 0;
      if (i == letters) break;
    }
  }

  // A letter's index in letters_.
  std::size_t letter(const std::string& name) const {
    std::size_t i = 0;
    while (i < letters_.size() && !same_letter(letters_[i], name)) ++i;
    return i;
  }

  Spec operand(const Spec& original, const std::vector<AxisList>& layout, const AxisList& unreduced) const {
    Spec s;
    s.tensor = original.tensor;
    s.dims.reserve(original.dims.size());
    for (const DimSpec& d : original.dims) s.dims.push_back({d.name, layout[letter(d.name)]});
    s.unreduced = unreduced;
    return s;
  }

  void build(const std::vector<Role>& roles, const std::vector<AxisList>& layout) {
    std::vector<std::int64_t>& key = layout_key_;  // copied into the memo on a miss only
    key.clear();
    key.push_back(contraction_id_);
    for (const Role& r : roles)
      key.insert(key.end(), {r.kind, r.kind == Role::dim ? letter_ids_[letter(r.letter)] : -1});
    for (const AxisList& axes : layout) {
      for (const Axis a : axes) key.push_back(a);
      key.push_back(-1);
    }
    auto it = memo_->layouts.find(key);
    if (it == memo_->layouts.end()) it = memo_->layouts.emplace(key, made_layout(roles, layout)).first;
    detail::MatmulLayout& made = it->second;
    Local& local = locals_.emplace_back();
    local.layout = &made;
    if (c_.out) {
      local.targets = &out_targets_;
    } else {
      if (made.free_targets.empty()) made.free_targets = free_targets(made.einsum->to);
      local.targets = &made.free_targets;
    }
    if (!out_of_reach(made)) add_plans(local);
  }

  // Serial plans only: whether the layout's local einsum alone takes longer than a candidate
  // already weighed that fits, by more than the tie margin. Every candidate of the layout
  // takes at least as long as its einsum (a sum of the steps' times, none negative), so none
  // of them could be chosen, or be within the margin of the one chosen: the choice is the
  // same without them. (A candidate the layout shares with another, the same steps, has the
  // same einsum, out of reach too.)
  bool out_of_reach(detail::MatmulLayout& layout) {
    if (rings_ || !fastest_fitting_s_) return false;
    if (!layout.costed) {
      try {
        layout.costed = &costed_einsum(*layout.einsum);
      } catch (const InputError&) {
        return false;  // figures that overflow: thrown where a candidate needs them, as before
      }
    }
    return layout.costed->einsum.step.time_s > *fastest_fitting_s_ * (1 + options_.tie_margin);
  }

  detail::MatmulLayout made_layout(const std::vector<Role>& roles, const std::vector<AxisList>& layout) {
    AxisList ua, ub, uc;
    for (int x = 0; x < mesh_.rank(); ++x) {
      const Role& r = roles[static_cast<std::size_t>(x)];
      if (r.kind == Role::unreduced_a) ua.push_back(x);
      if (r.kind == Role::unreduced_b) ub.push_back(x);
      if (r.kind != Role::none && (r.kind != Role::dim || c_.role(r.letter) == DimRole::contracted)) uc.push_back(x);
    }
    Step einsum = make_step(OpKind::einsum, operand(c_.a, layout, ua), {});
    einsum.tensor = c_.out_tensor;
    einsum.operand = 2;
    einsum.from_b = operand(c_.b, layout, ub);
    einsum.to = Spec();
    einsum.to.tensor = c_.out_tensor;
    for (const std::string& d : c_.out_dims) einsum.to.dims.push_back({d, layout[letter(d)]});
    einsum.to.unreduced = uc;
    detail::MatmulLayout made;
    made.einsum = &memo_->einsum_steps.try_emplace(einsum_key(einsum), std::move(einsum)).first->second;
    // A's and B's reshards are the same for every target.
    made.a_ways = &reshard_options(c_.a, made.einsum->from, a_shape_, RingEnd::last_all_gather);
    made.b_ways = &reshard_options(c_.b, made.einsum->from_b, b_shape_, RingEnd::last_all_gather);
    std::vector<std::int64_t> c_layout;
    append_layout(c_layout, made.einsum->to);
    made.c_layout = signature_id(std::move(c_layout));
    return made;
  }

  // No output requested: any fully reduced sharding will do; each pending sum is either
  // all-reduced or reduce-scattered onto one of the output's dimensions, the axes a dimension
  // takes in any order after those it has.
  static std::vector<Spec> free_targets(const Spec& result) {
    std::vector<Spec> targets{result};
    targets[0].unreduced.clear();
    for (int x : result.unreduced) {
      std::vector<Spec> next;
      for (const Spec& t : targets) {
        next.push_back(t);
        for (std::size_t d = 0; d < t.dims.size(); ++d) {
          const AxisList& axes = t.dims[d].axes;
          for (std::size_t at = result.dims[d].axes.size(); at <= axes.size(); ++at) {
            Spec rs = t;
            AxisList& to = rs.dims[d].axes;
            to.insert(to.begin() + static_cast<std::ptrdiff_t>(at), x);
            next.push_back(std::move(rs));
          }
        }
      }
      targets.swap(next);
    }
    return targets;
  }

  // A layout's local einsum (A, B and C as the layout shards them) and the outputs it may be
  // resharded to; its figures are looked up or worked out for the first candidate that is no
  // duplicate (costing may throw on figures that overflow: a layout no candidate needs stays quiet).
  struct Local {
    detail::MatmulLayout* layout = nullptr;
    const std::vector<Spec>* targets = nullptr;  // out_targets_, or the layout's free_targets
  };

  // A collective matmul that takes the place of a serial candidate's einsum and one of its
  // collectives: the last step of A's (0) or B's (1) reshard, or the first of the result's (2).
  struct Fused {
    const detail::CostedStep* made = nullptr;
    int part = 0;
  };

  // A candidate as the planner weighs it: what it is made of, and its figures. Only those the
  // caller asks for are built into a Plan (build_plan).
  struct Candidate {
    std::array<const detail::CostedSteps*, 3> parts{};  // A's, B's and the result's reshards
    const Local* local = nullptr;
    std::size_t target = 0;  // into local->targets
    const Fused* fused = nullptr;
    double total_time_s = 0;
    std::int64_t peak_bytes = 0;
    std::size_t steps = 0;
    int synchronizations = 0;
    bool fits_memory = true;
    // Worked out for ties only.
    mutable std::optional<std::string> description, output;
  };

  // fn(step, operand, memory) for each of the candidate's steps in order: A's reshard, B's, the
  // einsum, the result's; a collective matmul in the einsum's place, without the collective it fuses.
  template <class Fn>
  void for_each_step(const Candidate& c, Fn&& fn) const {
    for (int part = 0; part < 3; ++part) {
      if (part == 2) {
        if (c.fused) {
          fn(c.fused->made->step, 2, c.fused->made->memory);
        } else {
          fn(c.local->layout->costed->einsum.step, 2, c.local->layout->costed->einsum.memory);
        }
      }
      const detail::CostedSteps& reshard = *c.parts[static_cast<std::size_t>(part)];
      const std::size_t n = reshard.steps.size();
      for (std::size_t i = 0; i < n; ++i) {
        const bool fused_away = c.fused && c.fused->part == part && i == (part == 2 ? 0 : n - 1);
        if (!fused_away) fn(reshard.steps[i], part, reshard.memory[i]);
      }
    }
  }

  // Its figures, summed in its steps' order as a built plan's are (plan/memory.h, total_up).
  void weigh(Candidate& c) const {
    detail::PlanTimes times;
    PeakBytes peak(inputs_);
    for_each_step(c, [&](const Step& s, int, const StepMemory& m) {
      times.add(s);
      peak.add(m);
      c.synchronizations += synchronizations(s);
      ++c.steps;
    });
    c.total_time_s = times.total_s();
    c.peak_bytes = peak.peak(options_.reduction_workspace);
    c.fits_memory = !options_.mem_limit_bytes || c.peak_bytes <= *options_.mem_limit_bytes;
  }

  Plan build_plan(const Candidate& c) const {
    Plan plan;
    plan.steps.reserve(c.steps);
    for_each_step(c,
                  [&](const Step& s, int operand, const StepMemory&) { plan.steps.emplace_back(s).operand = operand; });
    plan.peak_bytes_per_device = c.peak_bytes;
    plan.output = (*c.local->targets)[c.target];
    plan.output.tensor = c_.out_tensor;
    plan.description = description(c);
    detail::total_up(plan, options_);
    return plan;
  }

  // One candidate per way of resharding A, B and the result: the chain of the Scaling Book's moves
  // (whose last all_gather or first reduce_scatter a ring can fuse with the einsum), and,
  // where plan_reshard takes an exchange instead, that too. Asked without the memory limit,
  // so that the limit picks among the candidates but does not change them.
  void add_plans(Local& local) {
    const Step& einsum = *local.layout->einsum;
    const detail::ReshardWays& a_ways = *local.layout->a_ways;
    const detail::ReshardWays& b_ways = *local.layout->b_ways;
    const int c_layout = local.layout->c_layout;
    for (std::size_t t = 0; t < local.targets->size(); ++t) {
      const detail::ReshardWays& c_ways = result_ways(einsum.to, c_layout, (*local.targets)[t]);
      for (std::size_t a = 0; a < a_ways.ways.size(); ++a) {
        for (std::size_t b = 0; b < b_ways.ways.size(); ++b) {
          for (std::size_t c = 0; c < c_ways.ways.size(); ++c) {
            // A candidate by its steps' layouts: another role combination may give the same one.
            if (!seen_.insert({a_ways.signatures[a], b_ways.signatures[b], c_ways.signatures[c], c_layout}).second)
              continue;
            add_plan(local, t, {&a_ways.ways[a], &b_ways.ways[b], &c_ways.ways[c]});
          }
        }
      }
    }
  }

  // A letter's or tensor's number in the memo.
  int id(const std::string& name) {
    return memo_->ids.try_emplace(name, static_cast<int>(memo_->ids.size())).first->second;
  }

  // A tensor's number: A's, B's and the result's without looking them up again.
  int tensor_id(const std::string& name) {
    for (const auto& [known, number] : named_) {
      if (*known == name) return number;
    }
    return id(name);
  }

  // A signature's number in the memo.
  int signature_id(std::vector<std::int64_t> signature) {
    return memo_->signatures.try_emplace(std::move(signature), static_cast<int>(memo_->signatures.size()))
        .first->second;
  }

  // A spec as numbers (each dimension's letter and axes, then the pending sums), for keys:
  // the planner looks its reshards and plans up thousands of times per call.
  void append_layout(std::vector<std::int64_t>& key, const Spec& s) const {
    for (const DimSpec& d : s.dims) {
      key.push_back(letter_ids_[letter(d.name)]);
      for (const Axis a : d.axes) key.push_back(a);
      key.push_back(-1);
    }
    for (const Axis a : s.unreduced) key.push_back(a);
    key.push_back(-2);
  }

  // Remembered: the role combinations, and the calls that plan contractions of the same
  // tensors, share most of their reshards. Each step is costed here, once, for every
  // candidate that takes it. `ring_end`: which of its steps a ring may fuse.
  enum class RingEnd { last_all_gather, first_reduce_scatter };
  const detail::ReshardWays& reshard_options(const Spec& from, const Spec& to, const std::vector<std::int64_t>& shape,
                                             RingEnd ring_end) {
    std::vector<std::int64_t> key;
    key.reserve(3 + 2 * (2 + 2 * from.dims.size() + static_cast<std::size_t>(mesh_.rank())) + shape.size());
    key.push_back(static_cast<int>(ring_end));
    for (const Spec* s : {&from, &to}) {
      key.push_back(tensor_id(s->tensor));
      append_layout(key, *s);
    }
    key.insert(key.end(), shape.begin(), shape.end());
    if (const auto it = memo_->reshards.find(key); it != memo_->reshards.end()) return it->second;
    detail::ReshardWays r;
    // plan_reshard's steps are the chain itself unless it took an exchange.
    std::vector<Step> planned = detail::plan_reshard(coster_, from, to, shape, unlimited_).steps;
    if (std::any_of(planned.begin(), planned.end(), [](const Step& s) { return s.op == OpKind::exchange; })) {
      r.ways.push_back({detail::reshard_steps(mesh_, from, to), {}});
    }
    r.ways.push_back({std::move(planned), {}});
    for (std::size_t w = 0, n = r.ways.size(); w < n; ++w) add_split_ways(r, w, ring_end);
    for (detail::CostedSteps& way : r.ways) {
      for (Step& s : way.steps) way.memory.push_back(coster_.cost(s, shape));
      std::vector<std::int64_t> signature;
      for (const Step& s : way.steps) {
        append_layout(signature, s.from);
        append_layout(signature, s.to);
        signature.push_back(static_cast<int>(s.op));
      }
      signature.push_back(-3);
      r.signatures.push_back(signature_id(std::move(signature)));
    }
    return memo_->reshards.emplace(std::move(key), std::move(r)).first->second;
  }

  // The ways of resharding the local einsum's result (layout number `c_layout`) to `target`:
  // for the pin, looked up by two numbers (reshard_options' key spells both specs out).
  const detail::ReshardWays& result_ways(const Spec& result, int c_layout, const Spec& target) {
    if (!c_.out) return reshard_options(result, target, c_shape_, RingEnd::first_reduce_scatter);
    const std::uint64_t key =
        static_cast<std::uint64_t>(static_cast<std::uint32_t>(c_layout)) << 32 | static_cast<std::uint32_t>(pin_id_);
    const auto [it, added] = memo_->result_ways.try_emplace(key, nullptr);
    if (added) it->second = &reshard_options(result, target, c_shape_, RingEnd::first_reduce_scatter);
    return *it->second;
  }

  // Beside a way whose step at `ring_end` (an operand's last all_gather, the result's first
  // reduce_scatter: add_collective_matmuls) is a collective over several axes, that
  // collective split in two, each half over a group of two or more: a ring can then take the
  // leading axes alone (a dimension's leading axes are scattered first and gathered last),
  // where a ring over all of them pays more steps' latency than it hides. Without the ring
  // the split is a candidate of its own, as every ring's serialized twin is. Whatever the
  // letter's role: a memo's ways serve every contraction of the tensor alike.
  void add_split_ways(detail::ReshardWays& r, std::size_t way, RingEnd ring_end) const {
    const std::vector<Step> steps = r.ways[way].steps;  // a copy: adding ways moves them
    if (steps.empty()) return;
    const bool gather = ring_end == RingEnd::last_all_gather;
    const Step& whole = gather ? steps.back() : steps.front();
    if (whole.op != (gather ? OpKind::all_gather : OpKind::reduce_scatter)) return;
    for (std::size_t k = 1; k < whole.axes.size(); ++k) {
      if (mesh_.size(whole.axes[k - 1]) == 1) continue;  // the same groups as the cut before it
      const AxisList leading(whole.axes.begin(), whole.axes.begin() + static_cast<std::ptrdiff_t>(k));
      const AxisList trailing(whole.axes.begin() + static_cast<std::ptrdiff_t>(k), whole.axes.end());
      if (mesh_.group_size(leading) < 2 || mesh_.group_size(trailing) < 2) continue;
      std::vector<Step> split;
      split.reserve(steps.size() + 1);
      if (gather) {
        split.assign(steps.begin(), steps.end() - 1);
        split.push_back(make_step(OpKind::all_gather, whole.from, trailing, whole.dim));
        split.push_back(make_step(OpKind::all_gather, split.back().to, leading, whole.dim));
      } else {
        split.push_back(make_step(OpKind::reduce_scatter, whole.from, leading, whole.dim));
        split.push_back(make_step(OpKind::reduce_scatter, split.back().to, trailing, whole.dim));
        split.insert(split.end(), steps.begin() + 1, steps.end());
      }
      r.ways.push_back({std::move(split), {}});
    }
  }

  void add_plan(Local& local, std::size_t target, const std::array<const detail::CostedSteps*, 3>& parts) {
    if (!local.layout->costed) local.layout->costed = &costed_einsum(*local.layout->einsum);
    Candidate serial;
    serial.parts = parts;
    serial.local = &local;
    serial.target = target;
    weigh(serial);
    if (serial.fits_memory && (!fastest_fitting_s_ || serial.total_time_s < *fastest_fitting_s_))
      fastest_fitting_s_ = serial.total_time_s;
    candidates_.push_back(serial);
    if (rings_) add_collective_matmuls(serial);
  }

  // A local einsum by its names, its three layouts and the letters' sizes.
  std::vector<std::int64_t> einsum_key(const Step& einsum) {
    std::vector<std::int64_t> key;
    key.reserve(1 + 3 * (2 + 2 * letters_.size() + static_cast<std::size_t>(mesh_.rank())) + sizes_key_.size());
    key.push_back(tensor_id(einsum.tensor));
    for (const Spec* s : {&einsum.from, &einsum.from_b, &einsum.to}) {
      key.push_back(tensor_id(s->tensor));
      append_layout(key, *s);
    }
    key.insert(key.end(), sizes_key_.begin(), sizes_key_.end());
    return key;
  }

  // Remembered: the calls that plan contractions of the same tensors in other output layouts
  // share most of their local einsums.
  detail::CostedEinsum& costed_einsum(const Step& einsum) {
    std::vector<std::int64_t> key = einsum_key(einsum);
    if (const auto it = memo_->einsums.find(key); it != memo_->einsums.end()) return it->second;
    detail::CostedEinsum made{{einsum, {}}, {}};
    coster_.cost_einsum(made.einsum.step, sizes_);
    made.einsum.memory = coster_.memory(made.einsum.step, sizes_);
    return memo_->einsums.emplace(std::move(key), std::move(made)).first->second;
  }

  // Whether each axis of `group` shards one of `spec`'s dimensions: no two members hold the
  // same block.
  static bool shards_every_axis(const Spec& spec, const AxisList& group) {
    return std::all_of(group.begin(), group.end(), [&](int axis) { return spec.dim_of_axis(axis) >= 0; });
  }

  // Whether `letter` is free in operand `operand` (0 A, 1 B): in it and the output, not in the other.
  bool free_in(const std::string& letter, int operand) const {
    return c_.role(letter) == (operand == 0 ? DimRole::free_a : DimRole::free_b);
  }

  // The collective matmul variants of `serial` (plan/step.h): its operand's last all_gather
  // fused into the einsum, or the einsum fused into the reduce_scatter that follows it.
  // Each is a candidate of its own, costed as a ring; the serialized plan stays one too.
  void add_collective_matmuls(const Candidate& serial) {
    detail::CostedEinsum& costed = *serial.local->layout->costed;
    const Step& einsum = costed.einsum.step;
    // The fused step of `part`'s reshard, made by make() unless the memo has it.
    const auto add = [&](int part, bool both_ways, const auto& make) {
      const auto key = std::make_tuple(serial.parts[static_cast<std::size_t>(part)], part, both_ways);
      auto it = costed.fused.find(key);
      if (it == costed.fused.end()) {
        detail::CostedStep made{make(), {}};
        made.memory = coster_.memory(made.step, sizes_);
        it = costed.fused.emplace(key, std::move(made)).first;
      }
      Fused& f = fused_.emplace_back();
      f.made = &it->second;
      f.part = part;
      Candidate ring = serial;
      ring.fused = &f;
      ring.steps = 0;
      ring.synchronizations = 0;
      weigh(ring);
      candidates_.push_back(ring);
    };
    for (int operand = 0; operand < 2; ++operand) {
      const std::vector<Step>& steps = serial.parts[static_cast<std::size_t>(operand)]->steps;
      if (steps.empty()) continue;
      const Step& gather = steps.back();
      if (gather.op != OpKind::all_gather || mesh_.group_size(gather.axes) < 2) continue;
      // A free letter: each shard fills its own rows of C. A contracted one: each adds into all
      // of C (the other operand holds the letter as the gather leaves it, the einsum's rule),
      // each member in its own ring order, so the members must hold different blocks of C:
      // replicas summed in different orders would differ in their last bits.
      const std::string& letter = gather.from.dims[static_cast<std::size_t>(gather.dim)].name;
      const bool contracted = c_.role(letter) == DimRole::contracted && shards_every_axis(einsum.to, gather.axes);
      if (!free_in(letter, operand) && !contracted) continue;
      for (bool both_ways : ring_ways(gather.axes)) {
        add(operand, both_ways,
            [&] { return detail::fuse_all_gather_einsum(gather, einsum, operand, both_ways, sizes_, coster_); });
      }
    }
    const std::vector<Step>& result_steps = serial.parts[2]->steps;
    if (!result_steps.empty()) {
      // Only a reduce_scatter has a dimension to look at (an all_reduce's `dim` is -1).
      const Step& scatter = result_steps.front();
      if (scatter.op == OpKind::reduce_scatter && mesh_.group_size(scatter.axes) >= 2) {
        const std::string& letter = scatter.to.dims[static_cast<std::size_t>(scatter.dim)].name;
        if (free_in(letter, 0) || free_in(letter, 1)) {
          for (bool both_ways : ring_ways(scatter.axes)) {
            add(2, both_ways,
                [&] { return detail::fuse_einsum_reduce_scatter(einsum, scatter, both_ways, sizes_, coster_); });
          }
        }
      }
    }
  }

  // The ways round a ring over `group`: one way, and both ways where that can help, which
  // needs a ring of direct links that carry both directions at once (behind a switch the two
  // transfers share one port) and a third member.
  std::vector<bool> ring_ways(const AxisList& group) const {
    if (options_.hw.bidirectional && options_.hw.topology == "torus" && mesh_.group_size(group) >= 3) {
      return {false, true};
    }
    return {false};
  }

  const std::string& description(const Candidate& c) const {
    if (!c.description) {
      std::string out;
      for_each_step(c, [&](const Step& s, int, const StepMemory&) {
        if (!out.empty()) out += ", then ";
        if (s.op == OpKind::einsum) {
          out += "local einsum";
        } else if (s.op == OpKind::all_gather_einsum) {
          out += "all_gather " + (s.ring_operand == 0 ? s.from : s.from_b).tensor + " over " +
                 mesh_.axis_names(s.axes) + " overlapped with the local einsum (" +
                 (s.bidirectional ? "bidirectional " : "") + "ring of " + std::to_string(s.ring_steps) + " steps)";
        } else if (s.op == OpKind::einsum_reduce_scatter) {
          out += "local einsum overlapped with reduce_scatter " + s.tensor + " over " + mesh_.axis_names(s.axes) +
                 " (" + (s.bidirectional ? "bidirectional " : "") + "ring of " + std::to_string(s.ring_steps) +
                 " steps)";
        } else {
          out += std::string(to_string(s.op)) + " " + s.tensor;
          if (!s.axes.empty()) out += " over " + mesh_.axis_names(s.axes);
          // The other steps' layouts follow from the op and its axes; an exchange's does not.
          if (s.op == OpKind::exchange) out += " to " + format_spec(s.to, mesh_);
        }
      });
      c.description = std::move(out);
    }
    return *c.description;
  }

  const std::string& output_text(const Candidate& c) const {
    if (!c.output) {
      Spec output = (*c.local->targets)[c.target];
      output.tensor = c_.out_tensor;
      c.output = format_spec(output, mesh_);
    }
    return *c.output;
  }

  // The order candidates are listed in: cheapest first; ties go to the smaller footprint, then
  // to fewer steps, then by name (the names worked out only for such ties).
  bool ranks_before(const Candidate& p, const Candidate& q) const {
    if (p.total_time_s != q.total_time_s) return p.total_time_s < q.total_time_s;
    if (p.peak_bytes != q.peak_bytes) return p.peak_bytes < q.peak_bytes;
    if (p.steps != q.steps) return p.steps < q.steps;
    if (description(p) != description(q)) return description(p) < description(q);
    return output_text(p) < output_text(q);
  }

  // PlanOptions::tie_margin (default 0): a near tie goes to the plan whose members meet least
  // often, for machines whose skew between members the calibration does not see. Of the
  // candidates sorted by ranks_before.
  int choose(double tie_margin) const {
    const auto cheapest =
        std::find_if(candidates_.begin(), candidates_.end(), [](const Candidate& c) { return c.fits_memory; });
    if (cheapest == candidates_.end()) return -1;
    const double tied = cheapest->total_time_s * (1 + tie_margin);
    auto best = cheapest;
    for (auto p = cheapest; p != candidates_.end() && p->total_time_s <= tied; ++p) {
      if (p->fits_memory && p->synchronizations < best->synchronizations) best = p;
    }
    return static_cast<int>(best - candidates_.begin());
  }

  // What choose() picks, from the candidates unsorted: the first in ranks_before's order of
  // those that fit within the tie margin of the cheapest that fits with the fewest
  // synchronizations (a stable sort keeps equal candidates in the order they were added).
  const Candidate* choose_unsorted(double tie_margin) const {
    const Candidate* cheapest = nullptr;
    for (const Candidate& c : candidates_) {
      if (c.fits_memory && (!cheapest || ranks_before(c, *cheapest))) cheapest = &c;
    }
    if (!cheapest) return nullptr;
    const double tied = cheapest->total_time_s * (1 + tie_margin);
    const Candidate* best = cheapest;
    for (const Candidate& c : candidates_) {
      if (!c.fits_memory || c.total_time_s > tied) continue;
      if (c.synchronizations < best->synchronizations ||
          (c.synchronizations == best->synchronizations && ranks_before(c, *best)))
        best = &c;
    }
    return best;
  }

  const Mesh& mesh_;
  const Contraction& c_;
  const DimSizes& sizes_;
  const PlanOptions& options_;
  PlanOptions unlimited_;
  PlannerMemo::Impl own_memo_;  // without a memo shared with other calls
  PlannerMemo::Impl* memo_;
  detail::StepCoster coster_;
  std::vector<std::int64_t> a_shape_, b_shape_, c_shape_;
  std::vector<std::int64_t> sizes_key_;      // the letters' numbers and sizes, for the memo's keys
  int contraction_id_ = 0;  // the number of what the memo's layouts are keyed by before the layout itself
  int pin_id_ = 0;          // the pin's, with the result's name and shape (result_ways)
  std::vector<Spec> out_targets_;            // the output spec, when given
  std::int64_t inputs_ = 0;  // A's and B's blocks, the caller's
  std::deque<Local> locals_;
  std::deque<Fused> fused_;
  std::vector<Candidate> candidates_;
  std::vector<std::string> letters_;          // the contraction's: A's, B's not in A, then C's in neither
  std::vector<int> letter_ids_;               // by letter: its number in the memo
  // enumerate_orders's and build's buffers: by letter, the orders its axes may take, the one
  // picked and its axes; the memo key of a layout.
  std::vector<std::vector<AxisList>> per_letter_;
  std::vector<std::size_t> pick_;
  std::vector<AxisList> layout_;
  std::vector<std::int64_t> layout_key_;
  std::array<std::pair<const std::string*, int>, 3> named_;  // A's, B's and the result's names, numbered
  std::set<std::array<int, 4>> seen_;                        // plans added, by their reshards' and result's signatures
  std::optional<double> fastest_fitting_s_;                  // of the candidates weighed (out_of_reach)
  bool every_output_layout_ = true;
  bool rings_ = true;  // whether collective matmuls are weighed (Candidates::all)
};

}  // namespace

PlannerMemo::PlannerMemo() : impl_(std::make_unique<Impl>()) {}
PlannerMemo::~PlannerMemo() = default;

void PlannerMemo::forget_contractions() {
  // The layouts point into the reshards and einsum steps; all go together.
  impl_->layouts.clear();
  impl_->result_ways.clear();
  impl_->reshards.clear();
  impl_->einsums.clear();
  impl_->einsum_steps.clear();
  impl_->signatures.clear();
}

MatmulPlanning plan_matmul(const Mesh& mesh, const Contraction& c, const DimSizes& sizes, const PlanOptions& options,
                           PlannerMemo* memo, Candidates built) {
  validate_spec(c.a, mesh);
  validate_spec(c.b, mesh);
  if (c.out) validate_spec(*c.out, mesh);
  PlannerMemo::Impl* shared = memo ? &memo->impl() : nullptr;
  if (shared) {
    const std::string costs = std::string(to_string(options.dtype)) + " on " + options.hw.name +
                              (options.reduction_workspace ? " with a reduction workspace" : "");
    if (!shared->mesh) {
      shared->mesh = mesh;
      shared->costs = costs;
    }
    if (!(*shared->mesh == mesh) || shared->costs != costs) {
      throw std::logic_error("plan_matmul: a PlannerMemo of mesh " + shared->mesh->to_string() + ", " +
                             shared->costs + ", asked to plan on mesh " + mesh.to_string() + ", " + costs);
    }
  }
  MatmulPlanning result = MatmulPlanner(mesh, c, sizes, options, shared).plan(built);
  if (built == Candidates::all) {
    for (int x = 0; x < mesh.rank(); ++x) result.cases.push_back(classify_axis(mesh, c, x));
  }
  return result;
}

double uncertainty_s(const Plan& plan) {
  double u = 0;
  for (const Step& s : plan.steps) u += s.confidence.uncertainty_s;
  return u;
}

std::optional<NearTie> near_tie(const MatmulPlanning& planning) {
  if (planning.chosen < 0) return std::nullopt;
  const Plan& chosen = planning.candidates[static_cast<std::size_t>(planning.chosen)];
  std::optional<NearTie> nearest;
  for (std::size_t i = 0; i < planning.candidates.size(); ++i) {
    const Plan& other = planning.candidates[i];
    if (static_cast<int>(i) == planning.chosen || !other.fits_memory) continue;
    const double difference = std::abs(other.total_time_s - chosen.total_time_s);
    if (!nearest || difference < nearest->difference_s) {
      nearest = NearTie{static_cast<int>(i), difference, uncertainty_s(chosen) + uncertainty_s(other)};
    }
  }
  if (nearest && nearest->difference_s < nearest->uncertainty_s) return nearest;
  return std::nullopt;
}

const Plan* find_candidate(const MatmulPlanning& planning, const std::vector<OpKind>& ops,
                           std::optional<bool> bidirectional) {
  for (const Plan& plan : planning.candidates) {
    const bool same = std::equal(plan.steps.begin(), plan.steps.end(), ops.begin(), ops.end(),
                                 [](const Step& s, OpKind op) { return s.op == op; });
    if (same && (!bidirectional || (!plan.steps.empty() && plan.steps.front().bidirectional == *bidirectional))) {
      return &plan;
    }
  }
  return nullptr;
}

}  // namespace shardmm
