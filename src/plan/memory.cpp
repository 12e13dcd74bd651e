#include "shardmm/plan/memory.h"

#include <algorithm>
#include <set>

#include "plan/steps.h"
#include "shardmm/core/error.h"

namespace shardmm {

namespace {

// The row-major stride of dimension `dim`: the product of the extents after it.
std::int64_t elements_after(const Shape& shape, int dim) {
  return elements_of(Shape(shape.begin() + dim + 1, shape.end()));
}

// `spec` without the trailing `group` axes of dimension `dim` (an all_gather's result).
Spec gathered(Spec spec, int dim, const AxisList& group) {
  AxisList& axes = spec.dims[static_cast<std::size_t>(dim)].axes;
  axes.resize(axes.size() - group.size());
  return spec;
}

}  // namespace

std::int64_t buffer_bytes(std::int64_t elements, DType dtype) {
  return saturating_add(std::max<std::int64_t>(saturating_mul(elements, dtype_bytes(dtype)), 1), 63) / 64 * 64;
}

std::int64_t elements_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n = saturating_mul(n, e);
  return n;
}

std::int64_t elements_across(const Shape& shape, int dim) {
  Shape others = shape;
  others[static_cast<std::size_t>(dim)] = 1;
  return elements_of(others);
}

std::pair<EinsumLayout, std::map<std::string, std::int64_t>> local_einsum_shape(const Mesh& mesh, const Step& step,
                                                                                const DimSizes& sizes,
                                                                                std::int64_t device) {
  EinsumLayout layout;
  std::map<std::string, std::int64_t> extents;
  for (const auto& [spec, names] :
       {std::pair{&step.from, &layout.a}, std::pair{&step.from_b, &layout.b}, std::pair{&step.to, &layout.c}}) {
    const std::vector<Range> box = shard_box(mesh, *spec, global_shape(*spec, sizes), device);
    for (std::size_t i = 0; i < spec->dims.size(); ++i) {
      names->push_back(spec->dims[i].name);
      extents[spec->dims[i].name] = box[i].extent;
    }
  }
  return {std::move(layout), std::move(extents)};
}

std::map<std::string, std::int64_t> RingGeometry::chunk_extents(std::size_t m) const {
  std::map<std::string, std::int64_t> e = extents;
  e[letter] = pieces[m].extent;
  return e;
}

OperandBuffers RingGeometry::chunk_buffers() const {
  OperandBuffers held;
  if (!contracted()) return held;
  std::map<std::string, std::int64_t>& other = operand == 0 ? held.b : held.a;
  for (const std::string& name : operand == 0 ? layout.b : layout.a) other[name] = extents.at(name);
  return held;
}

RingGeometry ring_geometry(const Mesh& mesh, const Step& step, const DimSizes& sizes, std::int64_t device) {
  RingGeometry g;
  g.members = mesh.group_members(device, step.axes);
  g.me = static_cast<std::size_t>(mesh.group_rank(device, step.axes));
  Step einsum = step;  // the einsum's own view: whole operands, C before any scatter
  if (step.op == OpKind::all_gather_einsum) {
    g.operand = step.ring_operand;
    g.operand_dim = step.dim;
    Spec& x = g.operand == 0 ? einsum.from : einsum.from_b;
    x = gathered(x, step.dim, step.axes);
  } else {
    Spec& c = einsum.to;
    const std::string letter = c.dims[static_cast<std::size_t>(step.dim)].name;
    c = gathered(c, step.dim, step.axes);
    c.unreduced.insert(c.unreduced.end(), step.axes.begin(), step.axes.end());
    g.operand = step.from.find_dim(letter) >= 0 ? 0 : 1;
    g.operand_dim = (g.operand == 0 ? step.from : step.from_b).find_dim(letter);
  }
  const Spec& x = g.operand == 0 ? einsum.from : einsum.from_b;
  const DimSpec& d = x.dims[static_cast<std::size_t>(g.operand_dim)];
  g.letter = d.name;
  g.out_dim = einsum.to.find_dim(d.name);
  if (g.contracted()) {
    const Spec& other = g.operand == 0 ? einsum.from_b : einsum.from;
    const Shape other_local = local_shape(mesh, other, global_shape(other, sizes), device);
    g.other_stride = elements_after(other_local, other.find_dim(d.name));
  }
  g.operand_local = local_shape(mesh, x, global_shape(x, sizes), device);
  g.out_local = local_shape(mesh, einsum.to, global_shape(einsum.to, sizes), device);
  // Member m's chunk: D sharded over the ring's axes too, at m's coordinates on them.
  const Spec& split = step.op == OpKind::all_gather_einsum ? (g.operand == 0 ? step.from : step.from_b) : step.to;
  const std::int64_t whole_offset = shard_range(mesh, sizes.at(d.name), d.axes, device).offset;
  const std::int64_t across = elements_across(g.operand_local, g.operand_dim);
  std::int64_t at = 0;
  for (std::int64_t m : g.members) {
    Range r = shard_range(mesh, sizes.at(d.name), split.dims[static_cast<std::size_t>(step.dim)].axes, m);
    r.offset -= whole_offset;
    g.pieces.push_back(r);
    g.chunk_at.push_back(at);
    at += r.extent * across;
  }
  const std::int64_t largest = std::max_element(g.pieces.begin(), g.pieces.end(), [](const Range& p, const Range& q) {
                                 return p.extent < q.extent;
                               })->extent;
  if (step.op == OpKind::all_gather_einsum) {
    g.chunk_elements = at;
    if (!g.contracted() && !contiguous_along(g.out_local, g.out_dim)) {
      g.product_elements = largest * elements_across(g.out_local, g.out_dim);
    }
  } else {
    const std::int64_t out_across = elements_across(g.out_local, g.out_dim);
    if (!contiguous_along(g.operand_local, g.operand_dim)) g.chunk_elements = at;
    g.product_elements = largest * out_across;
  }
  std::tie(g.layout, g.extents) = local_einsum_shape(mesh, einsum, sizes, device);
  return g;
}

namespace detail {

StepMemory step_memory(const Mesh& mesh, const Step& step, const DimSizes& sizes, DType dtype,
                       const ExchangeTraffic* traffic, EinsumWorkspaces* workspaces) {
  StepMemory m;
  const auto workspace = [&](const EinsumLayout& layout, const std::map<std::string, std::int64_t>& extents,
                             const OperandBuffers& buffers) {
    return workspaces ? workspaces->bytes(layout, extents, dtype, buffers)
                      : plan_local_einsum(layout, extents, dtype, buffers).workspace_bytes;
  };
  const auto hold = [&](std::int64_t bytes) { m.held = saturating_add(m.held, bytes); };
  const auto buffer = [&](std::int64_t elements) { hold(buffer_bytes(elements, dtype)); };
  const Shape out_local = local_shape(mesh, step.to, global_shape(step.to, sizes), 0);
  buffer(elements_of(out_local));
  const auto in_local = [&] { return local_shape(mesh, step.from, global_shape(step.from, sizes), 0); };
  switch (step.op) {
    case OpKind::exchange: {
      const ExchangeTraffic t = traffic ? *traffic : exchange_traffic(mesh, step, global_shape(step.from, sizes));
      buffer(t.sent);
      buffer(t.received);
      break;
    }
    case OpKind::einsum: {
      const auto [layout, extents] = local_einsum_shape(mesh, step, sizes, 0);
      hold(workspace(layout, extents, {}));
      break;
    }
    case OpKind::all_gather_einsum:
    case OpKind::einsum_reduce_scatter: {
      const RingGeometry g = ring_geometry(mesh, step, sizes, 0);
      if (g.chunk_elements > 0) buffer(g.chunk_elements);
      if (step.op == OpKind::einsum_reduce_scatter) {
        for (int i = 0; i < 4 * (step.bidirectional ? 2 : 1); ++i) buffer(g.product_elements);
      } else if (g.product_elements > 0) {
        buffer(g.product_elements);
      }
      std::set<std::int64_t> chunk_extents;  // one einsum per distinct extent of D
      for (std::size_t i = 0; i < g.members.size(); ++i) {
        if (chunk_extents.insert(g.pieces[i].extent).second) {
          hold(workspace(g.layout, g.chunk_extents(i), g.chunk_buffers()));
        }
      }
      break;
    }
    default: {
      const Staging stage = staging_of(step, in_local(), out_local);
      if (stage.send) buffer(*stage.send);
      if (stage.recv) buffer(*stage.recv);
      break;
    }
  }
  // The other members' chunks of this device's part, side by side (mpi_backend.cpp,
  // scatter_reduce): reduce_scatter's is its output block; all_reduce's the first of an
  // even split of its block, the largest.
  const std::int64_t others = mesh.group_size(step.axes) - 1;
  std::int64_t mine = 0;
  if (step.op == OpKind::reduce_scatter) mine = elements_of(out_local);
  if (step.op == OpKind::all_reduce && others > 0) {
    const std::int64_t block = elements_of(in_local());
    mine = block / (others + 1) + (block % (others + 1) > 0 ? 1 : 0);
  }
  m.reduction_workspace = saturating_mul(saturating_mul(others, mine), dtype_bytes(dtype));
  return m;
}

}  // namespace detail

StepMemory step_memory(const Mesh& mesh, const Step& step, const DimSizes& sizes, DType dtype) {
  return detail::step_memory(mesh, step, sizes, dtype, nullptr, nullptr);
}

std::int64_t EinsumWorkspaces::bytes(const EinsumLayout& layout, const std::map<std::string, std::int64_t>& extents,
                                     DType dtype, const OperandBuffers& buffers) {
  // Every name with its extent (and its buffer's, where given), operand by operand.
  std::string key = to_string(dtype);
  const auto add = [&](const std::vector<std::string>& names, const std::map<std::string, std::int64_t>* held) {
    key += '|';
    for (const std::string& name : names) {
      key += name + '=' + std::to_string(extents.at(name));
      if (const auto it = held ? held->find(name) : extents.end(); held && it != held->end()) {
        key += '/' + std::to_string(it->second);
      }
      key += ',';
    }
  };
  add(layout.a, &buffers.a);
  add(layout.b, &buffers.b);
  add(layout.c, nullptr);
  if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
  // Remembered only once worked out: a layout whose figures overflow throws, and is no entry.
  const std::int64_t bytes = plan_local_einsum(layout, extents, dtype, buffers).workspace_bytes;
  return memo_.emplace(std::move(key), bytes).first->second;
}

void PeakBytes::add(const StepMemory& step) {
  held_ = saturating_add(held_, step.held);
  workspace_ = std::max(workspace_, step.reduction_workspace);
}

std::int64_t PeakBytes::peak(bool reduction_workspace) const {
  return reduction_workspace ? saturating_add(held_, workspace_) : held_;
}

std::int64_t peak_bytes(std::int64_t inputs, const std::vector<StepMemory>& steps, bool reduction_workspace) {
  PeakBytes peak(inputs);
  for (const StepMemory& s : steps) peak.add(s);
  return peak.peak(reduction_workspace);
}

std::int64_t plan_peak_bytes(const Mesh& mesh, const Plan& plan, const std::vector<Spec>& inputs, const DimSizes& sizes,
                             DType dtype, bool reduction_workspace) {
  std::int64_t held = 0;
  for (const Spec& input : inputs)
    held = saturating_add(held, input_bytes(mesh, input, global_shape(input, sizes), dtype));
  std::vector<StepMemory> steps;
  for (const Step& step : plan.steps) steps.push_back(step_memory(mesh, step, sizes, dtype));
  return peak_bytes(held, steps, reduction_workspace);
}

std::int64_t input_bytes(const Mesh& mesh, const Spec& input, const std::vector<std::int64_t>& shape, DType dtype) {
  return buffer_bytes(local_elements(mesh, input, shape, 0), dtype);
}

}  // namespace shardmm
