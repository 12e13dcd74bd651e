#include "plan/steps.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"

namespace shardmm {

Step make_step(OpKind op, const Spec& from, AxisList axes, int dim, int dst_dim) {
  Step s;
  s.op = op;
  s.axes = std::move(axes);
  s.dim = dim;
  s.dst_dim = dst_dim;
  s.tensor = from.tensor;
  s.from = from;
  s.to = from;
  AxisList dummy;
  AxisList& to_axes = dim >= 0 ? s.to.dims[static_cast<std::size_t>(dim)].axes : dummy;
  const auto remove_unreduced = [&] {
    for (int a : s.axes) s.to.unreduced.erase(std::find(s.to.unreduced.begin(), s.to.unreduced.end(), a));
  };
  switch (op) {
    case OpKind::all_gather:
      to_axes.resize(to_axes.size() - s.axes.size());
      break;
    case OpKind::slice:
      to_axes.insert(to_axes.end(), s.axes.begin(), s.axes.end());
      break;
    case OpKind::all_to_all: {
      to_axes.resize(to_axes.size() - s.axes.size());
      AxisList& dst = s.to.dims[static_cast<std::size_t>(dst_dim)].axes;
      dst.insert(dst.end(), s.axes.begin(), s.axes.end());
      break;
    }
    case OpKind::reduce_scatter:
      remove_unreduced();
      to_axes.insert(to_axes.end(), s.axes.begin(), s.axes.end());
      break;
    case OpKind::all_reduce:
      remove_unreduced();
      break;
    case OpKind::to_partial:
      if (dim >= 0) to_axes.resize(to_axes.size() - s.axes.size());  // padded: the axes leave the dimension
      s.to.unreduced.insert(s.to.unreduced.end(), s.axes.begin(), s.axes.end());
      std::sort(s.to.unreduced.begin(), s.to.unreduced.end());
      break;
    case OpKind::einsum:
    case OpKind::all_gather_einsum:  // built by fusing costed steps (fuse_*), not here
    case OpKind::einsum_reduce_scatter:
    case OpKind::exchange:  // make_exchange
    case OpKind::local:     // local_step
      break;
  }
  return s;
}

void cost_step(Step& step, const Mesh& mesh, const std::vector<std::int64_t>& shape, const PlanOptions& options) {
  detail::StepCoster(mesh, options).cost(step, shape);
}

void cost_einsum(Step& step, const Mesh& mesh, const std::vector<std::int64_t>& a_shape,
                 const std::vector<std::int64_t>& b_shape, const std::vector<std::int64_t>& c_shape,
                 const PlanOptions& options) {
  detail::StepCoster(mesh, options).cost_einsum(step, a_shape, b_shape, c_shape);
}

Step local_step(std::string function, std::string tensor, bool backward, std::int64_t memory_bytes, DType dtype,
                const HardwareProfile& hw) {
  Step s;
  s.op = OpKind::local;
  const LocalOpCost cost = local_op_cost(hw, dtype, local_rate_key(function, backward), memory_bytes);
  s.function = std::move(function);
  s.tensor = std::move(tensor);
  s.backward = backward;
  s.memory_bytes = memory_bytes;
  s.elements = memory_bytes / dtype_bytes(dtype);
  s.time_s = cost.time_s;
  s.bound = cost.bound;
  return s;
}

}  // namespace shardmm

namespace shardmm::detail {

std::size_t common_prefix(const AxisList& a, const AxisList& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

Step make_exchange(const Spec& from, const Spec& to) {
  if (from.unreduced != to.unreduced) {
    throw std::logic_error("make_exchange: an exchange keeps the pending sums; they differ");
  }
  Step s;
  s.op = OpKind::exchange;
  s.tensor = from.tensor;
  s.from = from;
  s.to = to;
  s.to.tensor = from.tensor;
  // An axis in the prefix a dimension keeps splits both layouts the same way (nested
  // splits, under the mesh's one rule), so devices that differ on it never need each other's
  // data; an axis only `to` uses selects within what the group holds. The rest is the group.
  for (std::size_t d = 0; d < from.dims.size(); ++d) {
    const AxisList& have = from.dims[d].axes;
    const std::size_t keep = common_prefix(have, to.dims[d].axes);
    s.axes.insert(s.axes.end(), have.begin() + static_cast<std::ptrdiff_t>(keep), have.end());
  }
  std::sort(s.axes.begin(), s.axes.end());
  return s;
}

namespace {

// Calls fn(device) for each device whose coordinates are 0 off the axes `walk`: one device per
// combination of coordinates on `walk`, for figures that depend on those coordinates only.
template <typename Fn>
void for_each_device_on(const Mesh& mesh, const AxisList& walk, Fn fn) {
  std::vector<std::int64_t> coord(walk.size(), 0);
  while (true) {
    std::int64_t device = 0;
    for (std::size_t i = 0; i < walk.size(); ++i) device += coord[i] * mesh.stride(walk[i]);
    fn(device);
    std::size_t i = 0;
    while (i < walk.size() && ++coord[i] == mesh.size(walk[i])) coord[i++] = 0;
    if (i == walk.size()) return;
  }
}

}  // namespace

std::int64_t StepCoster::max_bytes(const Spec& spec, const std::vector<std::int64_t>& shape) const {
  return checked_mul(max_local_elements(mesh_, spec, shape), dtype_bytes(options_.dtype), "bytes per device");
}

StepMemory StepCoster::cost(Step& step, const std::vector<std::int64_t>& shape) {
  std::string key = std::string(to_string(step.op));
  for (const Spec* spec : {&step.from, &step.to}) append_spec_key(key, *spec);
  append_axes_key(key, step.axes);
  for (std::int64_t n : shape) key += std::to_string(n) + ",";
  const auto fill = [&step](const Cost& c) {
    step.bytes_sent = c.sent;
    step.bytes_received = c.received;
    step.flops = c.flops;
    step.time_s = c.time;
    step.bound = c.bound;
    step.confidence = c.confidence;
    return c.memory;
  };
  if (auto it = memo_->costs.find(key); it != memo_->costs.end()) return fill(it->second);
  DimSizes sizes;
  for (std::size_t d = 0; d < shape.size(); ++d) sizes[step.from.dims[d].name] = shape[d];
  if (step.op == OpKind::exchange) {
    const ExchangeTraffic traffic = exchange_traffic(mesh_, step, shape, &memo_->exchange_dims);
    Cost c = cost_exchange(step, traffic);
    c.memory = step_memory(mesh_, step, sizes, options_.dtype, &traffic, &memo_->workspaces);
    return fill(memo_->costs[key] = c);
  }
  const std::int64_t elem = dtype_bytes(options_.dtype);
  const std::int64_t group = mesh_.group_size(step.axes);
  // Local sizes factor over dimensions, and each dimension's extent depends only on the
  // coordinates of its own axes. Dimensions the step leaves alone contribute the same
  // factor before and after, largest on device 0 (either split rule puts the longer pieces
  // first: geometry.h); so the largest figures come from device-0 coordinates on those axes
  // and a walk over the coordinates of the axes of the dimensions that change.
  std::vector<std::size_t> changed;
  AxisList walk;
  std::int64_t unchanged = 1;
  for (std::size_t d = 0; d < step.from.dims.size(); ++d) {
    const AxisList& before = step.from.dims[d].axes;
    const AxisList& after = step.to.dims[d].axes;
    if (before == after) {
      unchanged = checked_mul(unchanged, shard_range(mesh_, shape[d], before, 0).extent, "a shard's element count");
      continue;
    }
    changed.push_back(d);
    for (const AxisList* list : {&before, &after}) {
      for (int a : *list) {
        if (std::find(walk.begin(), walk.end(), a) == walk.end()) walk.push_back(a);
      }
    }
  }
  std::int64_t sent = 0, received = 0, in_max = 0, out_max = 0;
  for_each_device_on(mesh_, walk, [&](std::int64_t device) {
    std::int64_t in = unchanged, out = unchanged, kept = unchanged;
    for (std::size_t d : changed) {
      const Range before = shard_range(mesh_, shape[d], step.from.dims[d].axes, device);
      const Range after = shard_range(mesh_, shape[d], step.to.dims[d].axes, device);
      in *= before.extent;
      out *= after.extent;
      kept *= overlap_extent(before, after);
    }
    in_max = std::max(in_max, in);
    out_max = std::max(out_max, out);
    std::int64_t s = 0, r = 0;
    switch (step.op) {
      case OpKind::all_gather:
        s = r = out - in;
        break;  // ring: every block but one passes by
      case OpKind::reduce_scatter:
        s = r = in - out;
        break;  // the transpose of all_gather
      case OpKind::all_reduce:
        s = r = checked_mul(2, in - in / group, "bytes per device");
        break;  // RS + AG
      case OpKind::all_to_all:
        s = in - kept;
        r = out - kept;
        break;
      default:
        break;
    }
    sent = std::max(sent, s);
    received = std::max(received, r);
  });
  Cost c{checked_mul(sent, elem, "bytes sent per device"),
         checked_mul(received, elem, "bytes received per device"),
         0,
         0,
         Bound::none,
         {},
         {}};
  in_max = checked_mul(in_max, elem, "bytes per device");
  out_max = checked_mul(out_max, elem, "bytes per device");
  const auto collective = [&](std::int64_t array_bytes) {
    const CollectiveCost cc = collective_cost(options_.hw, mesh_, step.op, step.axes, array_bytes);
    c.time = cc.time_s;
    c.bound = cc.bound();
    c.confidence = cc.confidence;
  };
  switch (step.op) {
    case OpKind::all_gather:
      collective(out_max);
      break;
    case OpKind::reduce_scatter:
    case OpKind::all_reduce:
    case OpKind::all_to_all:
      collective(in_max);
      break;
    case OpKind::slice:
    case OpKind::to_partial:
      c.time = local_copy_time(options_.hw, out_max);
      c.bound = c.time > 0 ? Bound::memory : Bound::none;
      break;
    case OpKind::local:              // local_step
    case OpKind::einsum:             // cost_einsum
    case OpKind::all_gather_einsum:  // fuse_*
    case OpKind::einsum_reduce_scatter:
    case OpKind::exchange:
      break;  // cost_exchange
  }
  // A calibrated profile describes this executor on this machine, whose time for a collective
  // also holds the copies it makes around it; device 0 holds the largest blocks.
  if (options_.hw.calibration && is_collective(step.op)) {
    const std::int64_t copied =
        local_copy_elements(step, local_shape(mesh_, step.from, shape, 0), local_shape(mesh_, step.to, shape, 0));
    c.time += local_copy_time(options_.hw, checked_mul(copied, elem, "bytes copied per device"));
    if (c.bound == Bound::none && c.time > 0) c.bound = Bound::memory;  // copies and no traffic
  }
  c.memory = step_memory(mesh_, step, sizes, options_.dtype, nullptr, &memo_->workspaces);
  return fill(memo_->costs[key] = c);
}

StepMemory StepCoster::memory(const Step& step, const DimSizes& sizes) {
  std::string key = std::string(to_string(step.op));
  for (const Spec* spec : {&step.from, &step.from_b, &step.to}) append_spec_key(key, *spec);
  append_axes_key(key, step.axes);
  key += std::to_string(step.dim) + "," + std::to_string(step.ring_operand);
  // An all_gather_einsum holds the same buffers one way round or both; einsum_reduce_scatter
  // keeps running sums per way.
  if (step.op == OpKind::einsum_reduce_scatter && step.bidirectional) key += ",both";
  // The letters' sizes: a shared memo serves other contractions too.
  for (const Spec* spec : {&step.from, &step.from_b, &step.to}) {
    for (const DimSpec& d : spec->dims) {
      key += ',';
      key += std::to_string(sizes.at(d.name));
    }
  }
  if (const auto it = memo_->multiplying.find(key); it != memo_->multiplying.end()) return it->second;
  // Remembered only once worked out: a step whose figures overflow throws, and is no entry.
  const StepMemory memory = step_memory(mesh_, step, sizes, options_.dtype, nullptr, &memo_->workspaces);
  return memo_->multiplying.emplace(std::move(key), memory).first->second;
}

namespace {

// What a device's block under one layout shares with the blocks under `members` of the members
// of its group (itself included). A box overlap is the product of its dimensions' overlaps, and
// a member's range in dimension k depends only on its coordinates on the group axes that split
// k under `members` (elsewhere it has the device's):
// the sum over members is the product over dimensions of the sums over those coordinates,
// times the size of the group axes that split nothing under `members`. Each dimension's sum
// depends on the device's coordinates on that dimension's axes only (exchange_traffic
// remembers it by them), and it walks only the members' shards that meet the device's range.
class GroupOverlap {
 public:
  // `members` the group's layout, `own` the device's.
  GroupOverlap(const Mesh& mesh, const Spec& members, const Spec& own, const std::vector<std::int64_t>& shape,
               const AxisList& group)
      : mesh_(mesh), members_(members), shape_(shape), varying_(shape.size()), covers_own_(shape.size()) {
    AxisList splitting_none = group;
    for (std::size_t k = 0; k < shape.size(); ++k) {
      const AxisList& axes = members.dims[k].axes;
      std::size_t fixed = 0;  // the leading axes outside the group
      for (int a : axes) {
        if (std::find(group.begin(), group.end(), a) == group.end()) {
          fixed += varying_[k].empty();
          continue;
        }
        varying_[k].push_back(a);
        splitting_none.erase(std::find(splitting_none.begin(), splitting_none.end(), a));
      }
      // The members' blocks tile the block of the axes outside the group, which holds the
      // device's own block where those axes lead both layouts: the overlap is the device's block.
      covers_own_[k] = fixed + varying_[k].size() == axes.size() && common_prefix(axes, own.dims[k].axes) >= fixed;
    }
    for (int a : splitting_none) multiplier_ = checked_mul(multiplier_, mesh.axis(a).size, kWhat);
  }

  // Dimension k's factor for `device`, whose range in k is `mine`: its overlap with the group's
  // blocks under `members`.
  std::int64_t dim_overlap(std::size_t k, std::int64_t device, const Range& mine) const {
    if (covers_own_[k]) return mine.extent;
    return overlap_with_shards(Range{0, shape_[k]}, members_.dims[k].axes, 0, varying_[k], device, mine);
  }
  // The factor of the overlap with the group's blocks that no dimension sets: the size of the
  // group axes that split nothing under `members`.
  std::int64_t multiplier() const { return multiplier_; }

  static constexpr const char* kWhat = "elements an exchange moves per device";

 private:
  // The sum, over the members' shards of `r` split along split[level..] (coordinates on the
  // axes not in `varying` being the device's), of their overlap with `mine`. It visits only
  // the shards that meet `mine`, and takes a range inside `mine` whole when every axis left
  // varies: about one step per shard met, where summing over every member, each key, is
  // quadratic in the group (a 256x256 mesh's reshard took 99.5 s that way).
  std::int64_t overlap_with_shards(Range r, const AxisList& split, std::size_t level, const AxisList& varying,
                                   std::int64_t device, const Range& mine) const {
    const std::int64_t met = overlap_extent(r, mine);
    if (met == 0 || level == split.size()) return met;
    const auto varies = [&](int a) { return std::find(varying.begin(), varying.end(), a) != varying.end(); };
    if (met == r.extent && std::all_of(split.begin() + static_cast<std::ptrdiff_t>(level), split.end(), varies)) {
      return r.extent;  // the members' shards tile r
    }
    const int axis = split[level];
    const std::int64_t parts = mesh_.size(axis);
    const SplitRule rule = mesh_.split_rule();
    if (!varies(axis)) {
      return overlap_with_shards(split_range(r, parts, mesh_.coord(device, axis), rule), split, level + 1, varying,
                                 device, mine);
    }
    // The children of r that meet `mine`: those holding its first and last elements in r, and
    // the ones between.
    const auto child_at = [&](std::int64_t position) {
      return split_index(r.extent, parts, position - r.offset, rule);
    };
    const std::int64_t first = child_at(std::max(r.offset, mine.offset));
    const std::int64_t last = child_at(std::min(r.end(), mine.end()) - 1);
    std::int64_t sum = 0;
    for (std::int64_t c = first; c <= last; ++c) {
      const Range child = split_range(r, parts, c, rule);
      sum = checked_add(sum, overlap_with_shards(child, split, level + 1, varying, device, mine), kWhat);
    }
    return sum;
  }

  const Mesh& mesh_;
  const Spec& members_;
  const std::vector<std::int64_t>& shape_;
  std::vector<AxisList> varying_;  // by dimension: the group axes that split it under `members`
  std::vector<bool> covers_own_;   // by dimension: whether the overlap is the device's own block
  std::int64_t multiplier_ = 1;
};

// Each dimension's factors by the device's coordinates on the axes that split it under either
// layout (ExchangeDimFactors), worked out once each, and walks over devices that keep every
// dimension's key up to date as a coordinate steps (an odometer): a visit is a few lookups and
// products, not a division per axis and dimension.
class DimFactors {
 public:
  // The tables in `memo` where given (found or added there), else the walker's own.
  DimFactors(const Mesh& mesh, const Step& step, const std::vector<std::int64_t>& shape, const GroupOverlap& sends,
             const GroupOverlap& receives, ExchangeDimMemo* memo)
      : mesh_(mesh), step_(step), shape_(shape), sends_(sends), receives_(receives) {
    own_.resize(memo ? 0 : shape.size());
    for (std::size_t k = 0; k < shape.size(); ++k) {
      AxisList axes;
      for (const Spec* spec : {&step.from, &step.to}) {
        for (int a : spec->dims[k].axes) {
          if (std::find(axes.begin(), axes.end(), a) == axes.end()) axes.push_back(a);
        }
      }
      ExchangeDimFactors* dim = memo ? nullptr : &own_[k];
      if (memo) {
        // Its extent, its axes under each layout, and those of them the group holds.
        std::vector<std::int64_t> key{shape[k]};
        for (const Spec* spec : {&step.from, &step.to}) {
          key.push_back(std::ssize(spec->dims[k].axes));
          key.insert(key.end(), spec->dims[k].axes.begin(), spec->dims[k].axes.end());
        }
        for (int a : step.axes) {
          if (std::find(axes.begin(), axes.end(), a) != axes.end()) key.push_back(a);
        }
        dim = &(*memo)[key];
      }
      if (dim->which.empty()) {
        dim->axes = std::move(axes);
        std::int64_t keys = 1;
        for (int a : dim->axes) keys *= mesh.size(a);  // at most the device count
        dim->which.assign(static_cast<std::size_t>(keys), 0);
      }
      dims_.push_back(dim);
    }
  }

  // Calls fn(f) for each device whose coordinates are 0 off `walk`, with f the product of the
  // factors of `dims` for it.
  template <typename Fn>
  void walk(const AxisList& walk, const std::vector<std::size_t>& dims, Fn fn) {
    // By walked axis, by dimension of `dims`: what a step of the axis adds to the dimension's key.
    std::vector<std::int64_t> key_step(walk.size() * dims.size(), 0);
    for (std::size_t j = 0; j < dims.size(); ++j) {
      std::int64_t stride = 1;
      const AxisList& axes = dims_[dims[j]]->axes;
      for (std::size_t i = axes.size(); i-- > 0;) {  // the first axis the most significant
        const auto at = std::find(walk.begin(), walk.end(), axes[i]);
        if (at != walk.end()) key_step[static_cast<std::size_t>(at - walk.begin()) * dims.size() + j] = stride;
        stride *= mesh_.size(axes[i]);
      }
    }
    std::vector<std::int64_t> coord(walk.size(), 0), key(dims.size(), 0);
    while (true) {
      ExchangeFactors f;
      for (std::size_t j = 0; j < dims.size(); ++j) f.times(at(dims[j], key[j]));
      fn(f);
      std::size_t i = 0;
      for (; i < walk.size(); ++i) {
        const std::int64_t size = mesh_.size(walk[i]);
        const std::int64_t* steps = &key_step[i * dims.size()];
        if (++coord[i] < size) {
          for (std::size_t j = 0; j < dims.size(); ++j) key[j] += steps[j];
          break;
        }
        coord[i] = 0;
        for (std::size_t j = 0; j < dims.size(); ++j) key[j] -= (size - 1) * steps[j];
      }
      if (i == walk.size()) return;
    }
  }

  // Dimension k's table, worked out for every key: an odometer over its axes that keeps the
  // device, the key and the device's pieces under both layouts (each layout's pieces split once,
  // not a split per axis for every key).
  const ExchangeDimFactors& complete(std::size_t k) {
    ExchangeDimFactors& dim = *dims_[k];
    if (dim.complete) return dim;
    const AxisList& from_axes = step_.from.dims[k].axes;
    const AxisList& to_axes = step_.to.dims[k].axes;
    const std::vector<Range> from = pieces(shape_[k], from_axes), to = pieces(shape_[k], to_axes);
    // By axis of the key (the last the least significant): what a step of its coordinate adds to
    // the key, the device, and the indices into `from` and `to`.
    const std::size_t n = dim.axes.size();
    std::vector<std::int64_t> key_step(n), device_step(n), from_step(n), to_step(n), coord(n, 0);
    const auto index_step = [&](const AxisList& axes, int axis) {
      std::int64_t stride = 1;
      for (std::size_t i = axes.size(); i-- > 0;) {
        if (axes[i] == axis) return stride;
        stride *= mesh_.size(axes[i]);
      }
      return std::int64_t{0};
    };
    std::int64_t stride = 1;
    for (std::size_t i = n; i-- > 0;) {
      const int axis = dim.axes[i];
      key_step[i] = stride;
      stride *= mesh_.size(axis);
      device_step[i] = mesh_.stride(axis);
      from_step[i] = index_step(from_axes, axis);
      to_step[i] = index_step(to_axes, axis);
    }
    std::int64_t key = 0, device = 0, in_from = 0, in_to = 0;
    while (true) {
      std::uint32_t& which = dim.which[static_cast<std::size_t>(key)];
      if (which == 0) {
        const Range& mine_from = from[static_cast<std::size_t>(in_from)];
        const Range& mine_to = to[static_cast<std::size_t>(in_to)];
        which = dim.number({sends_.dim_overlap(k, device, mine_from), receives_.dim_overlap(k, device, mine_to),
                            overlap_extent(mine_from, mine_to)}) +
                1;
      }
      std::size_t i = n;
      while (i-- > 0) {
        const std::int64_t size = mesh_.size(dim.axes[i]);
        const std::int64_t back = ++coord[i] < size ? 1 : 1 - size;
        if (back != 1) coord[i] = 0;
        key += back * key_step[i];
        device += back * device_step[i];
        in_from += back * from_step[i];
        in_to += back * to_step[i];
        if (back == 1) break;
      }
      if (i == static_cast<std::size_t>(-1)) break;
    }
    dim.complete = true;
    return dim;
  }

 private:
  // A complete table's factors for `key`.
  const ExchangeFactors& at(std::size_t k, std::int64_t key) const {
    const ExchangeDimFactors& dim = *dims_[k];
    return dim.distinct[dim.which[static_cast<std::size_t>(key)] - 1];
  }

  // The pieces of [0, n) split along `axes`, by the coordinates on them (the first the most
  // significant): shard_range's, for every device.
  std::vector<Range> pieces(std::int64_t n, const AxisList& axes) const {
    std::vector<Range> out{Range{0, n}};
    for (int a : axes) {
      const std::int64_t parts = mesh_.size(a);
      std::vector<Range> next;
      next.reserve(out.size() * static_cast<std::size_t>(parts));
      for (const Range& r : out) {
        for (std::int64_t c = 0; c < parts; ++c) next.push_back(split_range(r, parts, c, mesh_.split_rule()));
      }
      out.swap(next);
    }
    return out;
  }

  const Mesh& mesh_;
  const Step& step_;
  const std::vector<std::int64_t>& shape_;
  const GroupOverlap& sends_;
  const GroupOverlap& receives_;
  std::vector<ExchangeDimFactors> own_;
  std::vector<ExchangeDimFactors*> dims_;  // by dimension
};

}  // namespace

std::uint32_t ExchangeDimFactors::number(const ExchangeFactors& f) {
  constexpr std::size_t kScanned = 16;
  if (index.empty()) {
    if (const auto at = std::find(distinct.begin(), distinct.end(), f); at != distinct.end()) {
      return static_cast<std::uint32_t>(at - distinct.begin());
    }
    if (distinct.size() < kScanned) {
      distinct.push_back(f);
      return static_cast<std::uint32_t>(distinct.size() - 1);
    }
    for (std::size_t i = 0; i < distinct.size(); ++i) index.emplace(distinct[i], static_cast<std::uint32_t>(i));
  }
  const auto [it, added] = index.emplace(f, static_cast<std::uint32_t>(distinct.size()));
  if (added) distinct.push_back(f);
  return it->second;
}

void ExchangeFactors::overflow(const ExchangeFactors& o) const {
  checked_mul(sends, o.sends, GroupOverlap::kWhat);
  checked_mul(receives, o.receives, GroupOverlap::kWhat);
  throw std::logic_error("ExchangeFactors::overflow: the products fit");
}

// Each device's traffic, member by member: a block that several members' new blocks cover
// goes to each of them, so what a device sends is not its block less what it keeps.
//
// A device's figures are products of per-dimension factors (GroupOverlap), each set by its
// coordinates on the axes that split that dimension under either layout. Each dimension's table
// is worked out for all its keys (at most one per device, kept in the memo), which gives its
// distinct factors. A dimension with one (even splits where its layouts nest, or it does not
// change) is a constant of every device's product, and links nothing. The others fall into
// parts linked by shared axes (an axis that moves between two dimensions links them), whose
// factors vary independently: every combination of the parts' distinct factors is some
// device's. A part of one dimension has its table's distinct factors; a part of several is
// walked on its own axes for them; the maxima are over their combinations. Where walking the
// parts apart would visit no fewer devices than walking them together, or the combinations are
// no fewer than the devices (uneven splits everywhere), every device of the varying dimensions
// is walked instead.
ExchangeTraffic exchange_traffic(const Mesh& mesh, const Step& step, const std::vector<std::int64_t>& shape,
                                 ExchangeDimMemo* memo) {
  // A device's block under `from` against the group's under `to` (what it sends), and the reverse.
  const GroupOverlap sends(mesh, step.to, step.from, shape, step.axes),
      receives(mesh, step.from, step.to, shape, step.axes);
  DimFactors factors(mesh, step, shape, sends, receives, memo);
  const std::size_t dims = shape.size();
  // The constant dimensions' product, and the dimensions that vary.
  ExchangeFactors constant;
  std::vector<std::size_t> varying;
  for (std::size_t k = 0; k < dims; ++k) {
    const ExchangeDimFactors& table = factors.complete(k);
    if (table.distinct.size() == 1) {
      constant.times(table.distinct.front());
    } else {
      varying.push_back(k);
    }
  }
  // part[k]: the first varying dimension of k's part; axes[p]: the part's axes (p a part's first dimension).
  std::vector<std::size_t> part(dims);
  std::iota(part.begin(), part.end(), std::size_t{0});
  std::vector<AxisList> axes(dims);
  std::vector<int> dim_of_axis(static_cast<std::size_t>(mesh.rank()), -1);
  for (std::size_t k : varying) {
    for (int a : factors.complete(k).axes) {
      int& owner = dim_of_axis[static_cast<std::size_t>(a)];
      if (owner < 0) {
        owner = static_cast<int>(k);
        axes[part[k]].push_back(a);
        continue;
      }
      const std::size_t joined = part[static_cast<std::size_t>(owner)];  // k's part joins the owner's
      if (joined == part[k]) continue;
      const std::size_t moved = part[k];
      for (std::size_t j : varying) {
        if (part[j] == moved) part[j] = joined;
      }
      axes[joined].insert(axes[joined].end(), axes[moved].begin(), axes[moved].end());
      axes[moved].clear();
    }
  }
  const auto dims_of = [&](std::size_t p) {
    std::vector<std::size_t> out;
    for (std::size_t k : varying) {
      if (part[k] == p) out.push_back(k);
    }
    return out;
  };
  ExchangeTraffic t;
  const auto add = [&](const ExchangeFactors& parts) {
    // What the device keeps is in both sums; it neither sends nor receives it.
    ExchangeFactors device{sends.multiplier(), receives.multiplier(), 1};
    device.times(parts);
    const std::int64_t sent = device.sends - device.kept, received = device.receives - device.kept;
    t.sent = std::max(t.sent, sent);
    t.received = std::max(t.received, received);
    // The executor packs what it sends, unpacks what it receives, and copies what it keeps
    // from block to block.
    t.copied = std::max<std::int64_t>(t.copied, checked_add(checked_add(sent, received, "elements an exchange copies"),
                                                            device.kept, "elements an exchange copies"));
  };
  std::vector<std::size_t> parts;
  for (std::size_t k : varying) {
    if (part[k] == k) parts.push_back(k);
  }
  // The parts' distinct factors, where walking the parts of several dimensions apart visits
  // fewer devices than walking them together, and while their combinations stay fewer than the
  // devices.
  AxisList every_axis;
  std::int64_t apart = 0;
  for (std::size_t p : parts) {
    every_axis.insert(every_axis.end(), axes[p].begin(), axes[p].end());
    if (dims_of(p).size() > 1) apart += mesh.group_size(axes[p]);
  }
  const std::int64_t devices = mesh.group_size(every_axis);
  std::vector<std::vector<ExchangeFactors>> distinct;
  std::int64_t combinations = 1;
  for (std::size_t i = 0; i < parts.size() && apart < devices && combinations < devices; ++i) {
    const std::vector<std::size_t> part_dims = dims_of(parts[i]);
    if (part_dims.size() == 1) {
      distinct.push_back(factors.complete(part_dims.front()).distinct);
    } else {
      std::vector<ExchangeFactors>& found = distinct.emplace_back();
      factors.walk(axes[parts[i]], part_dims, [&](const ExchangeFactors& f) { found.push_back(f); });
      std::sort(found.begin(), found.end());
      found.erase(std::unique(found.begin(), found.end()), found.end());
    }
    combinations *= static_cast<std::int64_t>(distinct.back().size());  // at most `devices`
  }
  if (distinct.size() < parts.size() || combinations >= devices) {  // every device of the varying dimensions, then
    factors.walk(every_axis, varying, [&](const ExchangeFactors& f) {
      ExchangeFactors device = constant;
      device.times(f);
      add(device);
    });
    return t;
  }
  std::vector<std::size_t> pick(distinct.size(), 0);
  while (true) {
    ExchangeFactors combination = constant;
    for (std::size_t p = 0; p < distinct.size(); ++p) combination.times(distinct[p][pick[p]]);
    add(combination);
    std::size_t p = 0;
    while (p < distinct.size() && ++pick[p] == distinct[p].size()) pick[p++] = 0;
    if (p == distinct.size()) return t;
  }
}

StepCoster::Cost StepCoster::cost_exchange(const Step& step, const ExchangeTraffic& traffic) const {
  const std::int64_t elem = dtype_bytes(options_.dtype);
  Cost c{checked_mul(traffic.sent, elem, "bytes sent per device"),
         checked_mul(traffic.received, elem, "bytes received per device"),
         0,
         0,
         Bound::none,
         {},
         {}};
  // Timed as the all_to_all that moves as much per device: one of n members sends (n - 1) / n
  // of its array.
  const std::int64_t n = mesh_.group_size(step.axes);
  const std::int64_t moved = std::max(c.sent, c.received);
  if (n > 1 && moved > 0) {
    const std::int64_t array = checked_add(checked_mul(moved, n, "an exchange's bytes"), n - 2, "an exchange's bytes");
    const CollectiveCost cc =
        collective_cost(options_.hw, mesh_, OpKind::all_to_all, step.axes, array / (n - 1));  // rounded up
    c.time = cc.time_s;
    c.bound = cc.bound();
    c.confidence = cc.confidence;
  }
  if (options_.hw.calibration) {
    c.time += local_copy_time(options_.hw, checked_mul(traffic.copied, elem, "bytes copied per device"));
    if (c.bound == Bound::none && c.time > 0) c.bound = Bound::memory;  // copies and no traffic
  }
  return c;
}

void StepCoster::cost_einsum(Step& step, const DimSizes& sizes) {
  cost_einsum(step, global_shape(step.from, sizes), global_shape(step.from_b, sizes), global_shape(step.to, sizes));
}

void StepCoster::cost_einsum(Step& step, const std::vector<std::int64_t>& a_shape,
                             const std::vector<std::int64_t>& b_shape, const std::vector<std::int64_t>& c_shape) {
  // Device 0 holds the first (largest) shard of every dimension: the most work and bytes. Each
  // letter's local extent comes from the operand that holds it (batch and contracted letters
  // are sharded alike in both, so either will do).
  double flops = 2;
  for (std::size_t i = 0; i < step.from.dims.size(); ++i) {
    flops *= static_cast<double>(shard_range(mesh_, a_shape[i], step.from.dims[i].axes, 0).extent);
  }
  for (std::size_t i = 0; i < step.from_b.dims.size(); ++i) {
    const DimSpec& d = step.from_b.dims[i];
    if (step.from.find_dim(d.name) < 0) flops *= static_cast<double>(shard_range(mesh_, b_shape[i], d.axes, 0).extent);
  }
  const std::int64_t bytes =
      checked_add(checked_add(max_bytes(step.from, a_shape), max_bytes(step.from_b, b_shape), "the einsum's bytes"),
                  max_bytes(step.to, c_shape), "the einsum's bytes");
  step.flops = flops;
  const std::int64_t rows = gemm_rows(step, a_shape, b_shape);
  step.time_s = einsum_time(options_.hw, options_.dtype, flops, bytes, rows);
  step.bound = einsum_bound(options_.hw, step.time_s, bytes);
  step.confidence = einsum_confidence(options_.hw, options_.dtype, flops, bytes, rows);
}

std::int64_t StepCoster::gemm_rows(const Step& einsum, const DimSizes& sizes, const std::string& chunk_letter,
                                   double share) const {
  return gemm_rows(einsum, global_shape(einsum.from, sizes), global_shape(einsum.from_b, sizes), chunk_letter, share);
}

std::int64_t StepCoster::gemm_rows(const Step& einsum, const std::vector<std::int64_t>& a_shape,
                                   const std::vector<std::int64_t>& b_shape, const std::string& chunk_letter,
                                   double share) const {
  // M: device 0's extent of the letters only A has; N: of those only B has.
  const auto free_extent = [&](const Spec& own, const std::vector<std::int64_t>& shape, const Spec& other) {
    double extent = 1;
    for (std::size_t i = 0; i < own.dims.size(); ++i) {
      const DimSpec& d = own.dims[i];
      if (other.find_dim(d.name) >= 0) continue;
      extent *=
          static_cast<double>(shard_range(mesh_, shape[i], d.axes, 0).extent) * (d.name == chunk_letter ? share : 1.0);
    }
    return extent;
  };
  const double rows =
      std::min(free_extent(einsum.from, a_shape, einsum.from_b), free_extent(einsum.from_b, b_shape, einsum.from));
  return static_cast<std::int64_t>(std::llround(std::min(rows, 9e18)));
}

namespace {

// The ring's members and the share of the einsum one chunk carries: the largest chunk
// (device 0's, as either split rule puts the longer pieces first) over the whole extent.
struct Ring {
  std::int64_t members;
  double chunk_share;
};

Ring ring_of(const Mesh& mesh, const AxisList& group, std::int64_t size, const AxisList& whole_axes,
             const AxisList& chunk_axes) {
  const std::int64_t whole = shard_range(mesh, size, whole_axes, 0).extent;
  const std::int64_t chunk = shard_range(mesh, size, chunk_axes, 0).extent;
  return {mesh.group_size(group), whole == 0 ? 0.0 : static_cast<double>(chunk) / static_cast<double>(whole)};
}

// One chunk's einsum: its share of the FLOPs and of the bytes of each tensor that holds the
// ring's letter (the chunked operand and C where the letter is free, both operands where it is
// contracted), the whole of the others; `einsum` in its own view (gathered operand,
// unscattered C). Costed at its own arithmetic intensity: on a calibrated profile a narrow
// chunk runs at a lower GEMM rate than the whole einsum, which can undo what the overlap saves.
double chunk_einsum_time(const Step& einsum, const std::string& letter, double share, const DimSizes& sizes,
                         const StepCoster& coster) {
  double chunk_bytes = 0;
  for (const Spec* spec : {&einsum.from, &einsum.from_b, &einsum.to}) {
    const auto bytes = static_cast<double>(coster.max_bytes(*spec, global_shape(*spec, sizes)));
    chunk_bytes += spec->find_dim(letter) >= 0 ? share * bytes : bytes;
  }
  return einsum_time(coster.options().hw, coster.options().dtype, einsum.flops * share,
                     static_cast<std::int64_t>(chunk_bytes), coster.gemm_rows(einsum, sizes, letter, share));
}

Step fused(OpKind op, const Step& collective, const Step& einsum, double chunk_compute_s,
           const std::vector<int>& chunks, std::int64_t hop_bytes, const StepCoster& coster) {
  Step s = einsum;
  s.op = op;
  s.axes = collective.axes;
  s.bytes_sent = collective.bytes_sent;
  s.bytes_received = collective.bytes_received;
  s.ring_steps = static_cast<int>(chunks.size());
  s.confidence.add_part(collective.confidence);
  const double hop = ring_hop_time(coster.options().hw, coster.mesh(), collective.axes, hop_bytes);
  s.comm_time_s = hop * static_cast<double>(chunks.size() - 1);  // the hops of one step move at once
  s.compute_time_s = einsum.time_s;
  const auto& calibration = coster.options().hw.calibration;
  const double overlap = calibration ? calibration->ring_overlap(op) : 1;
  // On a calibrated profile each hop's hand-off also costs what no GEMM hides (cost.h).
  const double handoffs = calibration ? static_cast<double>(chunks.size() - 1) * calibration->ring_handoff_s : 0;
  s.time_s = overlapped_ring_time(chunks, chunk_compute_s, hop, overlap) + handoffs;
  s.bound = s.compute_time_s >= s.comm_time_s ? Bound::compute : ring_hop_bound(coster.options().hw, coster.mesh(), collective.axes, hop_bytes);
  return s;
}

}  // namespace

Step fuse_all_gather_einsum(const Step& gather, const Step& einsum, int operand, bool bidirectional,
                            const DimSizes& sizes, const StepCoster& coster) {
  const DimSpec& d = gather.from.dims[static_cast<std::size_t>(gather.dim)];
  const Ring ring = ring_of(coster.mesh(), gather.axes, sizes.at(d.name),
                            gather.to.dims[static_cast<std::size_t>(gather.dim)].axes, d.axes);
  const double chunk_s = chunk_einsum_time(einsum, d.name, ring.chunk_share, sizes, coster);
  Step s = einsum;
  (operand == 0 ? s.from : s.from_b) = gather.from;
  s.dim = gather.dim;
  s.ring_operand = operand;
  s.bidirectional = bidirectional;
  const std::int64_t shard = coster.max_bytes(gather.from, global_shape(gather.from, sizes));
  return fused(OpKind::all_gather_einsum, gather, s, chunk_s, ring_chunks(ring.members, bidirectional), shard, coster);
}

Step fuse_einsum_reduce_scatter(const Step& einsum, const Step& scatter, bool bidirectional, const DimSizes& sizes,
                                const StepCoster& coster) {
  const DimSpec& d = scatter.to.dims[static_cast<std::size_t>(scatter.dim)];
  const Ring ring = ring_of(coster.mesh(), scatter.axes, sizes.at(d.name),
                            scatter.from.dims[static_cast<std::size_t>(scatter.dim)].axes, d.axes);
  const double chunk_s = chunk_einsum_time(einsum, d.name, ring.chunk_share, sizes, coster);
  Step s = einsum;
  s.to = scatter.to;
  s.dim = scatter.dim;
  s.bidirectional = bidirectional;
  const std::int64_t block = coster.max_bytes(scatter.to, global_shape(scatter.to, sizes));
  // The all_gather ring's transpose: its steps in reverse order, the single chunk (the own
  // block) last, as the partial sums converge on their owners.
  std::vector<int> chunks = ring_chunks(ring.members, bidirectional);
  std::reverse(chunks.begin(), chunks.end());
  Step ring_step = fused(OpKind::einsum_reduce_scatter, scatter, s, chunk_s, chunks, block, coster);
  // On a calibrated profile (this executor on this machine) the rank itself adds each of the
  // n - 1 running sums that arrive to its own partial block, between its GEMMs: y += x reads
  // two blocks and writes one. (The one-shot reduce_scatter's fit already holds its sums.)
  if (const auto& calibration = coster.options().hw.calibration) {
    ring_step.time_s +=
        static_cast<double>(ring.members - 1) * 3 * static_cast<double>(block) / calibration->add_bandwidth;
  }
  return ring_step;
}

void PlanTimes::add(const Step& s) {
  if (is_collective_matmul(s.op)) {
    comm_ += s.comm_time_s;
    compute_ += s.compute_time_s;
    overlaps_ = true;
  } else {
    (is_collective(s.op) ? comm_ : compute_) += s.time_s;
  }
  steps_ += s.time_s;
}

void total_up(Plan& plan, const PlanOptions& options) {
  PlanTimes times;
  for (const Step& s : plan.steps) times.add(s);
  plan.comm_time_s = times.comm_s();
  plan.compute_time_s = times.compute_s();
  plan.total_time_s = times.total_s();
  plan.overlapped_time_s = std::max(plan.comm_time_s, plan.compute_time_s);
  plan.fits_memory = !options.mem_limit_bytes || plan.peak_bytes_per_device <= *options.mem_limit_bytes;
}

}  // namespace shardmm::detail
