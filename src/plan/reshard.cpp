#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "plan/steps.h"
#include "shardmm/core/error.h"

namespace shardmm {

void check_same_tensor(const Spec& from, const Spec& to, const Mesh& mesh) {
  bool same = from.dims.size() == to.dims.size();
  for (std::size_t i = 0; same && i < from.dims.size(); ++i) same = from.dims[i].name == to.dims[i].name;
  if (!same) {
    throw InputError(
        "cannot reshard " + format_spec(from, mesh) + " to " + format_spec(to, mesh) +
        ": a reshard keeps the tensor's dimensions; both specs must name the same dimensions in the same order");
  }
}

namespace detail {
namespace {

bool is_prefix(const AxisList& p, const AxisList& of) {
  return p.size() <= of.size() && std::equal(p.begin(), p.end(), of.begin());
}

// One greedy move towards `to`, or none. Moves are tried cheapest first.
class ReshardStepper {
 public:
  explicit ReshardStepper(const Spec& to) : to_(to) {}

  bool next(const Spec& s, std::vector<Step>& out) const {
    return reduce_scatter(s, out) || all_to_all(s, out) || slice(s, out) || to_partial(s, out) || all_reduce(s, out) ||
           all_gather(s, out);
  }

 private:
  const AxisList& want(std::size_t d) const { return to_.dims[d].axes; }
  bool pending_reduction(const Spec& s, int a) const { return s.is_unreduced(a) && !to_.is_unreduced(a); }

  // The run of axes that dimension d wants next, each satisfying `ok`.
  template <class Ok>
  AxisList next_run(const Spec& s, std::size_t d, Ok ok) const {
    AxisList run;
    if (!is_prefix(s.dims[d].axes, want(d))) return run;
    for (std::size_t i = s.dims[d].axes.size(); i < want(d).size() && ok(want(d)[i]); ++i) run.push_back(want(d)[i]);
    return run;
  }

  // {U_X} -> X sharding the dimension that wants it next: sums and splits in one collective.
  bool reduce_scatter(const Spec& s, std::vector<Step>& out) const {
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      AxisList run = next_run(s, d, [&](int a) { return pending_reduction(s, a); });
      if (!run.empty()) {
        out.push_back(make_step(OpKind::reduce_scatter, s, run, static_cast<int>(d)));
        return true;
      }
    }
    return false;
  }

  // The minor-most axes of one dimension, wanted next by another: move them.
  bool all_to_all(const Spec& s, std::vector<Step>& out) const {
    for (std::size_t a = 0; a < s.dims.size(); ++a) {
      const AxisList& have = s.dims[a].axes;
      const std::size_t keep = common_prefix(have, want(a));
      if (keep == have.size()) continue;
      for (std::size_t b = 0; b < s.dims.size(); ++b) {
        if (b == a || !is_prefix(s.dims[b].axes, want(b))) continue;
        // Longest suffix of `have` (beyond what a keeps) equal to what b wants next.
        const std::size_t at = s.dims[b].axes.size();
        for (std::size_t k = have.size() - keep; k > 0; --k) {
          const AxisList suffix(have.end() - static_cast<std::ptrdiff_t>(k), have.end());
          if (at + k <= want(b).size() &&
              std::equal(suffix.begin(), suffix.end(), want(b).begin() + static_cast<std::ptrdiff_t>(at))) {
            out.push_back(make_step(OpKind::all_to_all, s, suffix, static_cast<int>(a), static_cast<int>(b)));
            return true;
          }
        }
      }
    }
    return false;
  }

  // A dimension wants next an axis nobody uses: take my piece locally.
  bool slice(const Spec& s, std::vector<Step>& out) const {
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      AxisList run = next_run(s, d, [&](int a) { return !s.uses(a); });
      if (!run.empty()) {
        out.push_back(make_step(OpKind::slice, s, run, static_cast<int>(d)));
        return true;
      }
    }
    return false;
  }

  // Sums the target leaves pending over axes nobody uses: coordinate 0 keeps the value. Over
  // the minor-most axes of a dimension: each device pads its block with zeros, so the sum over
  // them is the whole dimension, with no gather.
  bool to_partial(const Spec& s, std::vector<Step>& out) const {
    AxisList axes;
    for (int a : to_.unreduced) {
      if (!s.uses(a)) axes.push_back(a);
    }
    if (!axes.empty()) {
      out.push_back(make_step(OpKind::to_partial, s, axes));
      return true;
    }
    const auto wanted_pending = [&](int a) { return to_.is_unreduced(a) && !s.is_unreduced(a); };
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      const AxisList& have = s.dims[d].axes;
      std::size_t from = have.size();
      while (from > 0 && wanted_pending(have[from - 1])) --from;
      if (from < have.size()) {
        out.push_back(make_step(OpKind::to_partial, s,
                                AxisList(have.begin() + static_cast<std::ptrdiff_t>(from), have.end()),
                                static_cast<int>(d)));
        return true;
      }
    }
    return false;
  }

  // Pending sums that no dimension of the target wants as a sharding.
  bool all_reduce(const Spec& s, std::vector<Step>& out) const {
    AxisList axes;
    for (int a : s.unreduced) {
      if (pending_reduction(s, a) && to_.dim_of_axis(a) < 0) axes.push_back(a);
    }
    if (axes.empty()) return false;
    out.push_back(make_step(OpKind::all_reduce, s, axes));
    return true;
  }

  // Drop the axes of a dimension beyond what it keeps (its minor-most ones, so one gather).
  bool all_gather(const Spec& s, std::vector<Step>& out) const {
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      const AxisList& have = s.dims[d].axes;
      const std::size_t keep = common_prefix(have, want(d));
      if (keep < have.size()) {
        out.push_back(make_step(OpKind::all_gather, s,
                                AxisList(have.begin() + static_cast<std::ptrdiff_t>(keep), have.end()),
                                static_cast<int>(d)));
        return true;
      }
    }
    // Every dimension is a prefix of its target, yet pending sums remain that wait for an
    // axis still in use elsewhere: resolve them in place.
    AxisList axes;
    for (int a : s.unreduced) {
      if (pending_reduction(s, a)) axes.push_back(a);
    }
    if (axes.empty()) return false;
    out.push_back(make_step(OpKind::all_reduce, s, axes));
    return true;
  }

  const Spec& to_;
};

}  // namespace

std::vector<Step> reshard_steps(const Mesh& mesh, const Spec& from, const Spec& to) {
  std::vector<Step> steps;
  Spec state = from;
  ReshardStepper stepper(to);
  // Each move removes or places at least one axis for good, so 4 moves per axis is ample.
  for (int guard = 0; !(state == to); ++guard) {
    if (guard > 4 * mesh.rank() + 4 || !stepper.next(state, steps)) {
      throw std::logic_error("reshard planner made no progress from " + format_spec(state, mesh) + " to " +
                             format_spec(to, mesh));
    }
    state = steps.back().to;
  }
  return steps;
}

}  // namespace detail

Plan plan_reshard(const Mesh& mesh, const Spec& from, const Spec& to, const std::vector<std::int64_t>& shape,
                  const PlanOptions& options) {
  detail::StepCoster coster(mesh, options);
  return detail::plan_reshard(coster, from, to, shape, options);
}

Plan detail::plan_reshard(StepCoster& coster, const Spec& from, const Spec& to, const std::vector<std::int64_t>& shape,
                          const PlanOptions& options) {
  const Mesh& mesh = coster.mesh();
  validate_spec(from, mesh);
  validate_spec(to, mesh);
  check_same_tensor(from, to, mesh);
  // The shape comes from the caller, not from global_shape: check it the same way, so that
  // no shard size below can overflow.
  if (shape.size() != from.dims.size()) {
    throw UsageError("plan_reshard: a shape of " + std::to_string(shape.size()) + " extents for " +
                     format_spec(from, mesh));
  }
  std::int64_t elements = 1;
  for (std::int64_t n : shape) {
    if (n < 0) throw UsageError("plan_reshard: negative extent " + std::to_string(n));
    elements = checked_mul(elements, n,
                           "the element count of " + (from.tensor.empty() ? std::string("the tensor") : from.tensor));
  }
  const auto costed = [&](std::vector<Step> steps) {
    Plan plan;
    plan.steps = std::move(steps);
    plan.output = to;
    plan.output.tensor = from.tensor;
    // The caller's source and every step's buffers, all held for the whole run (plan/memory.h).
    std::vector<StepMemory> memory;
    for (Step& s : plan.steps) {
      s.tensor = from.tensor;
      memory.push_back(coster.cost(s, shape));
    }
    plan.peak_bytes_per_device =
        peak_bytes(input_bytes(mesh, from, shape, options.dtype), memory, options.reduction_workspace);
    plan.description = plan.steps.empty() ? "nothing to do: the layouts are equal" : "";
    for (const Step& s : plan.steps) {
      if (!plan.description.empty()) plan.description += ", then ";
      plan.description += std::string(to_string(s.op)) + (s.axes.empty() ? "" : " over " + mesh.axis_names(s.axes));
    }
    detail::total_up(plan, options);
    return plan;
  };
  Plan chain = costed(detail::reshard_steps(mesh, from, to));
  // The chain moves one axis run at a time. Where it communicates and resolves no pending sum,
  // one exchange may move less (a permutation of the devices' blocks instead of a gather) or
  // hold less (no gathered array): straight to `to`, or, where `to` adds pending sums over
  // axes that `from` shards with, to `to` with those axes kept at the end of the dimension
  // they shard, which padding to_partials then turn into the sums (no gather at all). It wins
  // where it fits and the chain does not, or where it is no worse in bytes moved, time and
  // peak memory and moves or holds less. (Where it only times lower, as an all_gather or
  // all_to_all done as an exchange can, that is the model's formulas differing, and the
  // chain's steps are the Scaling Book's collectives.)
  const auto moved = [](const Plan& p) {
    std::int64_t bytes = 0;
    for (const Step& s : p.steps) bytes = saturating_add(bytes, std::max(s.bytes_sent, s.bytes_received));
    return bytes;
  };
  // Whether `alternative` replaces `plan` (the rule above); one whose byte counts overflow 64
  // bits where the plan's fit is no option.
  const auto replaces = [&](std::vector<Step> alternative, const Plan& plan) -> std::optional<Plan> {
    Plan other;
    try {
      other = costed(std::move(alternative));
    } catch (const InputError&) {
      return std::nullopt;
    }
    const bool fits_better = other.fits_memory && !plan.fits_memory;
    const bool no_worse = other.fits_memory == plan.fits_memory && moved(other) <= moved(plan) &&
                          other.total_time_s <= plan.total_time_s &&
                          other.peak_bytes_per_device <= plan.peak_bytes_per_device;
    const bool better = moved(other) < moved(plan) || other.peak_bytes_per_device < plan.peak_bytes_per_device;
    if (fits_better || (no_worse && better)) return other;
    return std::nullopt;
  };
  const bool resolves_sums =
      std::any_of(from.unreduced.begin(), from.unreduced.end(), [&](int a) { return !to.is_unreduced(a); });
  // A chain of one step is one of the Scaling Book's collectives (a gather or an all_to_all where it
  // communicates), whose bytes and memory an exchange can only equal.
  if (chain.steps.size() < 2 || moved(chain) == 0 || resolves_sums) return chain;
  Spec via = to;
  via.tensor = from.tensor;
  via.unreduced = from.unreduced;
  for (std::size_t d = 0; d < from.dims.size(); ++d) {
    for (int a : from.dims[d].axes) {
      if (to.is_unreduced(a) && !from.is_unreduced(a)) via.dims[d].axes.push_back(a);
    }
  }
  // To `via`: the Scaling Book's moves, unless one exchange does better there too.
  std::vector<Step> steps = detail::reshard_steps(mesh, from, via);
  if (!steps.empty()) {
    if (const auto exchange = replaces({detail::make_exchange(from, via)}, costed(steps))) steps = exchange->steps;
  }
  for (Step& s : detail::reshard_steps(mesh, via, to)) steps.push_back(std::move(s));
  if (auto other = replaces(std::move(steps), chain)) return std::move(*other);
  return chain;
}

}  // namespace shardmm
