#include "shardmm/plan/local_einsum.h"

#include <algorithm>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <utility>

#include "shardmm/core/error.h"

namespace shardmm {

namespace {

using Names = std::vector<std::string>;

std::string show(const Names& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

bool contains(const Names& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A buffer (dimension d of extent shape[d] at stride strides[d]) as a matrix [g1 x g2]: each
// group's names (extent > 1 only, in the group's linear order) must be adjacent and in that
// order in the buffer, so that the group is one strided dimension; one of the two must then
// be contiguous.
MatrixView matrix_view(const Names& names, const Shape& shape, const Shape& strides, const Names& g1, const Names& g2) {
  auto dim = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  // The group's extent and the stride of its linear index (0 for an empty group).
  auto merge = [&](const Names& g, std::int64_t& extent, std::int64_t& stride) {
    extent = 1;
    stride = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const std::size_t d = dim(g[i]);
      if (i + 1 < g.size()) {
        const std::size_t next = dim(g[i + 1]);
        if (strides[d] != shape[next] * strides[next]) return false;
      }
      extent *= shape[d];
      stride = strides[d];
    }
    return true;
  };
  std::int64_t e1, s1, e2, s2;
  MatrixView v;
  if (!merge(g1, e1, s1) || !merge(g2, e2, s2)) return v;
  if (g2.empty() || s2 == 1) {
    v = {true, false, g1.empty() ? std::max<std::int64_t>(1, e2) : s1};
  } else if (g1.empty() || s1 == 1) {
    v = {true, true, g2.empty() ? std::max<std::int64_t>(1, e1) : s2};
  }
  return v;
}

}  // namespace
Shape row_major_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

std::string describe(const EinsumLayout& layout) {
  return "einsum " + show(layout.a) + ", " + show(layout.b) + " -> " + show(layout.c);
}

EinsumPlan plan_local_einsum(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents, DType dtype,
                             const OperandBuffers& buffers) {
  EinsumPlan p;
  const std::string where = describe(layout);
  const std::initializer_list<std::pair<const char*, const Names*>> operands = {
      {"a", &layout.a}, {"b", &layout.b}, {"c", &layout.c}};
  for (const auto& [label, names] : operands) {
    std::set<std::string> seen;
    for (const std::string& name : *names) {
      if (!seen.insert(name).second) {
        throw UsageError(where + ": dimension '" + name + "' appears twice in " + label +
                         ": a dimension appears at most once per operand");
      }
      auto it = extents.find(name);
      if (it == extents.end()) {
        throw UsageError(where + ": no extent given for dimension '" + name + "': every dimension needs one");
      }
      if (it->second < 0) {
        throw UsageError(where + ": dimension '" + name + "' has extent " + std::to_string(it->second) +
                         ": extents must be >= 0");
      }
    }
  }
  for (const std::string& name : layout.c) {
    if (!contains(layout.a, name) && !contains(layout.b, name)) {
      throw UsageError(where + ": output dimension '" + name +
                       "' is in neither input: every output dimension comes from an input");
    }
  }

  auto ext = [&](const std::string& name) { return extents.at(name); };
  auto shape_of = [&](const Names& names, const char* what) {
    Shape s;
    std::int64_t count = 1;
    for (const std::string& name : names) {
      s.push_back(ext(name));
      count = checked_mul(count, ext(name), what);
    }
    return std::pair{s, count};
  };
  const auto [a_shape, a_elements] = shape_of(layout.a, "einsum operand a's element count");
  const auto [b_shape, b_elements] = shape_of(layout.b, "einsum operand b's element count");
  const auto [c_shape, c_elements] = shape_of(layout.c, "einsum output c's element count");
  // Each input's strides in the buffer that holds it.
  const auto buffer_strides = [&](const Names& names, const std::map<std::string, std::int64_t>& held,
                                  const char* label) {
    Shape shape;
    for (const std::string& name : names) {
      const auto it = held.find(name);
      shape.push_back(it == held.end() ? ext(name) : it->second);
      if (shape.back() < ext(name)) {
        throw UsageError(where + ": the buffer of " + label + " has extent " + std::to_string(shape.back()) +
                         " for dimension '" + name + "', less than the einsum's " + std::to_string(ext(name)) +
                         ": an operand's buffer holds at least the einsum's extent of each dimension");
      }
    }
    return row_major_strides(shape);
  };
  p.a.caller_shape = a_shape;
  p.b.caller_shape = b_shape;
  p.c.caller_shape = c_shape;
  p.a.caller_strides = buffer_strides(layout.a, buffers.a, "a");
  p.b.caller_strides = buffer_strides(layout.b, buffers.b, "b");
  p.c.caller_strides = row_major_strides(c_shape);
  p.c_elements = c_elements;
  std::set<std::string> all(layout.a.begin(), layout.a.end());
  all.insert(layout.b.begin(), layout.b.end());
  for (const std::string& name : all) {
    p.flops *= static_cast<double>(ext(name));
    if (ext(name) == 0) p.empty = true;
  }
  p.flops *= 2;
  p.layout = std::move(layout);
  p.dtype = dtype;
  if (p.empty) return p;
  const EinsumLayout& L = p.layout;

  // Groups, each over names of extent > 1 in the order of `names` (only those names
  // shape a strided view; extent-1 dimensions sit anywhere).
  auto group = [&](const Names& names, bool in_a, bool in_b, bool in_c) {
    Names g;
    for (const std::string& name : names) {
      if (ext(name) > 1 && contains(L.a, name) == in_a && contains(L.b, name) == in_b && contains(L.c, name) == in_c) {
        g.push_back(name);
      }
    }
    return g;
  };
  const Names batch = group(L.c, true, true, true);
  const Names m_in_a = group(L.a, true, false, true), m_in_c = group(L.c, true, false, true);
  const Names k_in_a = group(L.a, true, true, false), k_in_b = group(L.b, true, true, false);
  const Names n_in_b = group(L.b, false, true, true), n_in_c = group(L.c, false, true, true);
  // An operand with a summed dimension is reduced into the workspace in whatever order
  // the plan wants, so its own order constrains nothing.
  const bool reduce_a = !group(L.a, true, false, false).empty();
  const bool reduce_b = !group(L.b, false, true, false).empty();

  // Keep (use in place) the subset of operands whose orders agree and whose buffers
  // are GEMM views, copying the fewest elements; the empty subset always works.
  Names ord_m, ord_k, ord_n;
  int best = -1;
  std::int64_t best_cost = 0;
  for (int keep = 7; keep >= 0; --keep) {
    const bool ka = keep & 1, kb = keep & 2, kc = keep & 4;
    if ((ka && reduce_a) || (kb && reduce_b)) continue;
    if ((ka && kc && m_in_a != m_in_c) || (ka && kb && k_in_a != k_in_b) || (kb && kc && n_in_b != n_in_c)) {
      continue;
    }
    const Names& m = kc ? m_in_c : m_in_a;
    const Names& k = kb ? k_in_b : k_in_a;
    const Names& n = kc ? n_in_c : n_in_b;
    if ((ka && !matrix_view(L.a, a_shape, p.a.caller_strides, m, k).ok) ||
        (kb && !matrix_view(L.b, b_shape, p.b.caller_strides, k, n).ok) ||
        (kc && !matrix_view(L.c, c_shape, p.c.caller_strides, m, n).ok)) {
      continue;
    }
    const std::int64_t cost =
        (ka || reduce_a ? 0 : a_elements) + (kb || reduce_b ? 0 : b_elements) + (kc ? 0 : c_elements);
    if (best < 0 || cost < best_cost) {
      best = keep;
      best_cost = cost;
      ord_m = m;
      ord_k = k;
      ord_n = n;
    }
  }

  // Workspace layouts are [batch, g1, g2]; the extent-1 names of each class follow.
  auto with_trivial = [&](Names g, const Names& names, bool in_a, bool in_b, bool in_c) {
    for (const std::string& name : names) {
      if (ext(name) == 1 && contains(L.a, name) == in_a && contains(L.b, name) == in_b && contains(L.c, name) == in_c) {
        g.push_back(name);
      }
    }
    return g;
  };
  const Names batch_all = with_trivial(batch, L.c, true, true, true);
  const Names m_all = with_trivial(ord_m, L.c, true, false, true);
  const Names k_all = with_trivial(ord_k, L.a, true, true, false);
  const Names n_all = with_trivial(ord_n, L.c, false, true, true);
  auto concat = [](Names x, const Names& y, const Names& z) {
    x.insert(x.end(), y.begin(), y.end());
    x.insert(x.end(), z.begin(), z.end());
    return x;
  };

  std::int64_t ws_elements = 0;
  const std::int64_t line = 64 / dtype_bytes(dtype);  // each copy starts on a cache line
  // The output's perm runs the other way: it permutes the workspace into the caller's c.
  auto setup = [&](EinsumPlan::Operand& op, const Names& caller, bool keep, bool reduce, bool output,
                   const Names& workspace_order, const Names& g1, const Names& g2) {
    if (keep) {
      op.names = caller;
      op.shape = op.caller_shape;
      op.strides = op.caller_strides;
    } else {
      op.copied = true;
      op.reduce = reduce;
      op.names = workspace_order;
      op.elements = 1;
      for (const std::string& name : op.names) {
        op.shape.push_back(ext(name));
        op.elements *= ext(name);
      }
      op.offset = ws_elements;
      ws_elements = saturating_add(ws_elements, saturating_add(op.elements, line - 1) / line * line);
      op.strides = row_major_strides(op.shape);
      const Shape& strides = op.strides;
      auto pos = [](const Names& names, const std::string& name) {
        return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
      };
      if (reduce) {
        for (const std::string& name : caller) {
          const int d = pos(op.names, name);
          op.reduce_strides.push_back(d < static_cast<int>(op.names.size()) ? strides[d] : 0);
        }
      } else if (output) {
        for (const std::string& name : caller) op.perm.push_back(pos(op.names, name));
      } else {
        for (const std::string& name : op.names) op.perm.push_back(pos(caller, name));
      }
    }
    op.view = matrix_view(op.names, op.shape, op.strides, g1, g2);
    if (!op.view.ok) throw std::logic_error("LocalEinsum: planned operand is not a GEMM view");
    for (const std::string& name : batch) {
      op.batch_strides.push_back(op.strides[std::find(op.names.begin(), op.names.end(), name) - op.names.begin()]);
    }
  };
  // A copy that only permutes keeps the (extent-1) summed names; a reduction drops them.
  auto order = [&](const Names& g1, const Names& g2, const Names& caller, bool in_a, bool in_b, bool reduce) {
    Names o = concat(batch_all, g1, g2);
    if (!reduce) {
      for (const std::string& name : caller) {
        if (contains(L.a, name) == in_a && contains(L.b, name) == in_b && !contains(L.c, name)) {
          o.push_back(name);
        }
      }
    }
    return o;
  };
  setup(p.a, L.a, best & 1, reduce_a, false, order(m_all, k_all, L.a, true, false, reduce_a), ord_m, ord_k);
  setup(p.b, L.b, best & 2, reduce_b, false, order(k_all, n_all, L.b, false, true, reduce_b), ord_k, ord_n);
  setup(p.c, L.c, best & 4, false, true, concat(batch_all, m_all, n_all), ord_m, ord_n);
  p.swap = p.c.view.trans;
  for (const std::string& name : ord_m) p.m *= ext(name);
  for (const std::string& name : ord_k) p.k *= ext(name);
  for (const std::string& name : ord_n) p.n *= ext(name);
  for (const std::string& name : batch) p.batch_extents.push_back(ext(name));

  // Saturating: the planner weighs sizes no memory holds, which the memory limit then refuses.
  p.workspace_bytes = saturating_mul(ws_elements, dtype_bytes(dtype));
  return p;
}

}  // namespace shardmm
