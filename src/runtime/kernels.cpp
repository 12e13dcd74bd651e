#include "shardmm/runtime/kernels.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <new>
#include <set>
#include <stdexcept>
#include <utility>

#include "shardmm/core/error.h"
#include "shardmm/runtime/blas.h"

namespace shardmm {
namespace {

std::string show(const Shape& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string show(const std::vector<std::string>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

Shape row_major_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Calls f(offsets) once per index of `extents` (row-major order), where offsets[j] is the
// index dotted with strides[j]: the one strided walk behind every kernel here. Nothing
// is called when an extent is 0; rank 0 is one call with all offsets 0.
template <std::size_t N, class F>
void walk(const Shape& extents, const std::array<Shape, N>& strides, F&& f) {
  for (std::int64_t e : extents) {
    if (e == 0) return;
  }
  const std::size_t rank = extents.size();
  Shape index(rank, 0);
  std::array<std::int64_t, N> off{};
  for (;;) {
    f(off);
    std::size_t d = rank;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < extents[d]) {
        for (std::size_t j = 0; j < N; ++j) off[j] += strides[j][d];
        break;
      }
      for (std::size_t j = 0; j < N; ++j) off[j] -= (extents[d] - 1) * strides[j][d];
      index[d] = 0;
    }
  }
}

// The box walk of copy_box and add_box: `run(src, dst, n)` handles n contiguous
// elements, the innermost dimension merged with every trailing one that the box covers
// whole in both arrays.
template <class T, class Run>
void walk_box(const char* what, const T* src, const Shape& src_shape, const Shape& src_offset,
              T* dst, const Shape& dst_shape, const Shape& dst_offset, const Shape& extent,
              Run run) {
  const std::size_t rank = extent.size();
  if (src_shape.size() != rank || src_offset.size() != rank || dst_shape.size() != rank ||
      dst_offset.size() != rank) {
    throw UsageError(std::string(what) + ": ranks differ (src shape " + show(src_shape) +
                     ", src offset " + show(src_offset) + ", dst shape " + show(dst_shape) +
                     ", dst offset " + show(dst_offset) + ", extent " + show(extent) +
                     "): all must have the same rank");
  }
  auto check = [&](const char* side, const Shape& shape, const Shape& offset) {
    for (std::size_t d = 0; d < rank; ++d) {
      if (shape[d] < 0 || extent[d] < 0 || offset[d] < 0 || offset[d] > shape[d] - extent[d]) {
        throw UsageError(std::string(what) + ": box of extent " + show(extent) + " at offset " +
                         show(offset) + " does not fit in " + side + " shape " + show(shape) +
                         ": need 0 <= offset and offset + extent <= shape in every dimension");
      }
    }
  };
  check("src", src_shape, src_offset);
  check("dst", dst_shape, dst_offset);
  for (std::int64_t e : extent) {
    if (e == 0) return;
  }

  const Shape src_strides = row_major_strides(src_shape), dst_strides = row_major_strides(dst_shape);
  std::int64_t src_base = 0, dst_base = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    src_base += src_offset[d] * src_strides[d];
    dst_base += dst_offset[d] * dst_strides[d];
  }
  // Dimensions [inner, rank) form one contiguous run.
  std::size_t inner = rank;
  std::int64_t run_length = 1;
  while (inner > 0) {
    --inner;
    run_length *= extent[inner];
    if (extent[inner] != src_shape[inner] || extent[inner] != dst_shape[inner]) break;
  }
  const Shape outer(extent.begin(), extent.begin() + static_cast<std::ptrdiff_t>(inner));
  walk<2>(outer, {Shape(src_strides.begin(), src_strides.begin() + static_cast<std::ptrdiff_t>(inner)),
                  Shape(dst_strides.begin(), dst_strides.begin() + static_cast<std::ptrdiff_t>(inner))},
          [&](const std::array<std::int64_t, 2>& off) {
            run(src + src_base + off[0], dst + dst_base + off[1], run_length);
          });
}

// d[0, n) = s[0, n), or d[0, n) += s[0, n) (Add): the run that every kernel here writes.
template <bool Add, class T>
void store(T* d, const T* s, std::int64_t n) {
  if constexpr (Add) {
    for (std::int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    std::memcpy(d, s, static_cast<std::size_t>(n) * sizeof(T));
  }
}

// dst = src with its dimensions reordered (see permute), where src's dimension d lies at
// stride src_strides[d] (a box of a larger buffer, or row-major); Add: dst += instead.
template <bool Add, class T>
void rearrange(const T* src, const Shape& shape, const Shape& src_strides, const std::vector<int>& perm, T* dst) {
  for (std::int64_t e : shape) {
    if (e == 0) return;
  }
  // dst's dimensions with extent > 1, merged where they are also adjacent and in order
  // in src; `ext`, `sst` their extents and src strides.
  Shape ext, sst;
  for (int d : perm) {
    if (shape[d] == 1) continue;
    if (!ext.empty() && sst.back() == shape[d] * src_strides[d]) {
      ext.back() *= shape[d];
      sst.back() = src_strides[d];
    } else {
      ext.push_back(shape[d]);
      sst.push_back(src_strides[d]);
    }
  }
  if (ext.empty()) {
    store<Add>(dst, src, 1);
    return;
  }
  const Shape dst_strides = row_major_strides(ext);
  const std::size_t last = ext.size() - 1;
  if (sst[last] == 1) {  // dst's rows are src runs
    walk<2>(Shape(ext.begin(), ext.end() - 1), {Shape(sst.begin(), sst.end() - 1),
                                                Shape(dst_strides.begin(), dst_strides.end() - 1)},
            [&](const std::array<std::int64_t, 2>& off) {
              store<Add>(dst + off[1], src + off[0], ext[last]);
            });
    return;
  }
  const std::size_t q = static_cast<std::size_t>(std::find(sst.begin(), sst.end(), 1) - sst.begin());
  if (q == sst.size()) {  // a box whose contiguous dimension has extent 1: element by element
    walk<2>(ext, {sst, dst_strides},
            [&](const std::array<std::int64_t, 2>& off) { store<Add>(dst + off[1], src + off[0], 1); });
    return;
  }
  // A transpose of src's contiguous dimension q with dst's contiguous last one, in
  // tiles, so that neither side is read or written at a cache line per element.
  Shape outer_ext, outer_src, outer_dst;
  for (std::size_t d = 0; d < last; ++d) {
    if (d == q) continue;
    outer_ext.push_back(ext[d]);
    outer_src.push_back(sst[d]);
    outer_dst.push_back(dst_strides[d]);
  }
  constexpr std::int64_t tile = 32;
  const std::int64_t rows = ext[q], cols = ext[last], src_col = sst[last], dst_row = dst_strides[q];
  walk<2>(outer_ext, {outer_src, outer_dst}, [&](const std::array<std::int64_t, 2>& off) {
    const T* s = src + off[0];
    T* d = dst + off[1];
    for (std::int64_t i0 = 0; i0 < rows; i0 += tile) {
      const std::int64_t i1 = std::min(rows, i0 + tile);
      for (std::int64_t j0 = 0; j0 < cols; j0 += tile) {
        const std::int64_t j1 = std::min(cols, j0 + tile);
        for (std::int64_t i = i0; i < i1; ++i) {
          for (std::int64_t j = j0; j < j1; ++j) {
            if constexpr (Add) {
              d[i * dst_row + j] += s[i + j * src_col];
            } else {
              d[i * dst_row + j] = s[i + j * src_col];
            }
          }
        }
      }
    }
  });
}

}  // namespace

template <class T>
void copy_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst,
              const Shape& dst_shape, const Shape& dst_offset, const Shape& extent) {
  walk_box("copy_box", src, src_shape, src_offset, dst, dst_shape, dst_offset, extent,
           [](const T* s, T* d, std::int64_t n) { store<false>(d, s, n); });
}

template <class T>
void add_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst,
             const Shape& dst_shape, const Shape& dst_offset, const Shape& extent) {
  walk_box("add_box", src, src_shape, src_offset, dst, dst_shape, dst_offset, extent,
           [](const T* s, T* d, std::int64_t n) { store<true>(d, s, n); });
}

template <class T>
void permute(const T* src, const Shape& shape, const std::vector<int>& perm, T* dst) {
  const std::size_t rank = shape.size();
  std::vector<bool> seen(rank, false);
  bool valid = perm.size() == rank;
  for (std::size_t i = 0; valid && i < rank; ++i) {
    valid = perm[i] >= 0 && static_cast<std::size_t>(perm[i]) < rank && !seen[perm[i]];
    if (valid) seen[perm[i]] = true;
  }
  if (!valid) {
    Shape p(perm.begin(), perm.end());
    throw UsageError("permute: " + show(p) + " is not a permutation of the " +
                     std::to_string(rank) + " dimensions of shape " + show(shape) +
                     ": each of 0.." + std::to_string(static_cast<long>(rank) - 1) +
                     " must appear exactly once");
  }
  for (std::int64_t e : shape) {
    if (e < 0) throw UsageError("permute: negative extent in shape " + show(shape));
  }
  rearrange<false>(src, shape, row_major_strides(shape), perm, dst);
}

#define SHARDMM_INSTANTIATE(T)                                                                 \
  template void copy_box<T>(const T*, const Shape&, const Shape&, T*, const Shape&, const Shape&, \
                            const Shape&);                                                     \
  template void add_box<T>(const T*, const Shape&, const Shape&, T*, const Shape&, const Shape&,  \
                           const Shape&);                                                      \
  template void permute<T>(const T*, const Shape&, const std::vector<int>&, T*);
SHARDMM_INSTANTIATE(float)
SHARDMM_INSTANTIATE(double)
#undef SHARDMM_INSTANTIATE

// ---------------------------------------------------------------------------------------
// LocalEinsum

namespace {

using Names = std::vector<std::string>;

bool contains(const Names& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A buffer (dimension d of extent shape[d] at stride strides[d]) as a matrix [g1 x g2]: each
// group's names (extent > 1 only, in the group's linear order) must be adjacent and in that
// order in the buffer, so that the group is one strided dimension; one of the two must then
// be contiguous.
struct MatrixView {
  bool ok = false;
  bool trans = false;  // stored [g2, g1]
  std::int64_t ld = 1;
};

MatrixView matrix_view(const Names& names, const Shape& shape, const Shape& strides, const Names& g1,
                       const Names& g2) {
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

struct LocalEinsum::Impl {
  // An operand as GEMM sees it: a buffer (the caller's, or a copy in the workspace).
  struct Operand {
    Names names;  // the buffer's order
    Shape shape;
    Shape strides;              // of `shape` in the buffer GEMM reads
    Shape caller_shape;
    Shape caller_strides;       // row-major in the caller's buffer, which may be larger (OperandBuffers)
    bool copied = false;
    std::int64_t offset = 0;    // in the workspace, in elements
    std::int64_t elements = 0;
    std::vector<int> perm;      // A, B: buffer dim i = caller dim perm[i]; C: the reverse
    bool reduce = false;        // A, B with summed dimensions: reduced, not permuted
    Shape reduce_strides;       // per caller dim: buffer stride, 0 for summed
    MatrixView view;
    Shape batch_strides;
  };

  EinsumLayout layout;
  DType dtype;
  double flops = 1;
  bool empty = false;  // some extent is 0: C is all zeros
  std::int64_t c_elements = 1;
  std::int64_t m = 1, n = 1, k = 1;
  bool swap = false;  // C is stored [N, M]: GEMM computes C^T = B^T A^T
  Shape batch_extents;
  Operand a, b, c;
  std::int64_t workspace_bytes = 0;
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, Free> workspace;

  static std::unique_ptr<Impl> plan(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents,
                                    DType dtype, const OperandBuffers& buffers);
  template <class T>
  void run(const T* a_in, const T* b_in, T* c_out, bool accumulate);
  void run_by_dtype(const void* a_in, const void* b_in, void* c_out, bool accumulate) {
    if (dtype == DType::f32) {
      run(static_cast<const float*>(a_in), static_cast<const float*>(b_in), static_cast<float*>(c_out), accumulate);
    } else {
      run(static_cast<const double*>(a_in), static_cast<const double*>(b_in), static_cast<double*>(c_out), accumulate);
    }
  }
  template <class T>
  const T* prepare(const Operand& op, const T* in, T* ws) const;
};

// The plan alone: everything but the workspace's allocation.
std::unique_ptr<LocalEinsum::Impl> LocalEinsum::Impl::plan(EinsumLayout layout,
                                                           const std::map<std::string, std::int64_t>& extents,
                                                           DType dtype, const OperandBuffers& buffers) {
  auto impl = std::make_unique<Impl>();
  Impl& p = *impl;
  const std::string where = "einsum " + show(layout.a) + ", " + show(layout.b) + " -> " +
                            show(layout.c);
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw InputError(where + ": dtype " + to_string(dtype) +
                     " has no local kernel: the einsum runs in f32 or f64");
  }
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
        throw UsageError(where + ": no extent given for dimension '" + name +
                         "': every dimension needs one");
      }
      if (it->second < 0) {
        throw UsageError(where + ": dimension '" + name + "' has extent " +
                         std::to_string(it->second) + ": extents must be >= 0");
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
  if (p.empty) return impl;
  const EinsumLayout& L = p.layout;

  // Groups, each over names of extent > 1 in the order of `names` (only those names
  // shape a strided view; extent-1 dimensions sit anywhere).
  auto group = [&](const Names& names, bool in_a, bool in_b, bool in_c) {
    Names g;
    for (const std::string& name : names) {
      if (ext(name) > 1 && contains(L.a, name) == in_a && contains(L.b, name) == in_b &&
          contains(L.c, name) == in_c) {
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
    if ((ka && kc && m_in_a != m_in_c) || (ka && kb && k_in_a != k_in_b) ||
        (kb && kc && n_in_b != n_in_c)) {
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
    const std::int64_t cost = (ka || reduce_a ? 0 : a_elements) + (kb || reduce_b ? 0 : b_elements) +
                              (kc ? 0 : c_elements);
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
      if (ext(name) == 1 && contains(L.a, name) == in_a && contains(L.b, name) == in_b &&
          contains(L.c, name) == in_c) {
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
  auto setup = [&](Impl::Operand& op, const Names& caller, bool keep, bool reduce, bool output,
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
      ws_elements += (op.elements + line - 1) / line * line;
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
  auto order = [&](const Names& g1, const Names& g2, const Names& caller, bool in_a, bool in_b,
                   bool reduce) {
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
  setup(p.a, L.a, best & 1, reduce_a, false, order(m_all, k_all, L.a, true, false, reduce_a),
        ord_m, ord_k);
  setup(p.b, L.b, best & 2, reduce_b, false, order(k_all, n_all, L.b, false, true, reduce_b),
        ord_k, ord_n);
  setup(p.c, L.c, best & 4, false, true, concat(batch_all, m_all, n_all), ord_m, ord_n);
  p.swap = p.c.view.trans;
  for (const std::string& name : ord_m) p.m *= ext(name);
  for (const std::string& name : ord_k) p.k *= ext(name);
  for (const std::string& name : ord_n) p.n *= ext(name);
  for (const std::string& name : batch) p.batch_extents.push_back(ext(name));

  p.workspace_bytes = checked_mul(ws_elements, dtype_bytes(dtype), "einsum workspace bytes");
  return impl;
}

LocalEinsum::LocalEinsum(EinsumLayout layout, std::map<std::string, std::int64_t> extents,
                         DType dtype, const OperandBuffers& buffers)
    : impl_(Impl::plan(std::move(layout), extents, dtype, buffers)) {
  if (impl_->workspace_bytes > 0) {
    impl_->workspace.reset(static_cast<std::byte*>(
        ::operator new(static_cast<std::size_t>(impl_->workspace_bytes), std::align_val_t{64})));
  }
}

std::int64_t LocalEinsum::workspace_bytes_for(EinsumLayout layout,
                                              const std::map<std::string, std::int64_t>& extents,
                                              DType dtype, const OperandBuffers& buffers) {
  return Impl::plan(std::move(layout), extents, dtype, buffers)->workspace_bytes;
}

LocalEinsum::~LocalEinsum() = default;
LocalEinsum::LocalEinsum(LocalEinsum&&) noexcept = default;
LocalEinsum& LocalEinsum::operator=(LocalEinsum&&) noexcept = default;

const EinsumLayout& LocalEinsum::layout() const { return impl_->layout; }
DType LocalEinsum::dtype() const { return impl_->dtype; }
double LocalEinsum::flops() const { return impl_->flops; }
std::int64_t LocalEinsum::workspace_bytes() const { return impl_->workspace_bytes; }
bool LocalEinsum::copies_a() const { return impl_->a.copied; }
bool LocalEinsum::copies_b() const { return impl_->b.copied; }
bool LocalEinsum::copies_c() const { return impl_->c.copied; }

void LocalEinsum::run(const void* a, const void* b, void* c) { impl_->run_by_dtype(a, b, c, false); }
void LocalEinsum::accumulate(const void* a, const void* b, void* c) { impl_->run_by_dtype(a, b, c, true); }

template <class T>
const T* LocalEinsum::Impl::prepare(const Operand& op, const T* in, T* ws) const {
  if (!op.copied) return in;
  T* out = ws + op.offset;
  if (!op.reduce) {
    rearrange<false>(in, op.caller_shape, op.caller_strides, op.perm, out);
    return out;
  }
  // Summed dimensions have buffer stride 0: their elements add onto one another. The
  // caller's last dimension is contiguous (its buffer is row-major).
  std::fill(out, out + op.elements, T(0));
  const std::size_t last = op.caller_shape.size() - 1;
  const std::int64_t run = op.caller_shape[last], step = op.reduce_strides[last];
  walk<2>(Shape(op.caller_shape.begin(), op.caller_shape.end() - 1),
          {Shape(op.caller_strides.begin(), op.caller_strides.end() - 1),
           Shape(op.reduce_strides.begin(), op.reduce_strides.end() - 1)},
          [&](const std::array<std::int64_t, 2>& off) {
            const T* s = in + off[0];
            T* d = out + off[1];
            for (std::int64_t i = 0; i < run; ++i) d[i * step] += s[i];
          });
  return out;
}

template <class T>
void LocalEinsum::Impl::run(const T* a_in, const T* b_in, T* c_out, bool accumulate) {
  if (empty) {
    if (!accumulate) std::fill(c_out, c_out + c_elements, T(0));
    return;
  }
  // GEMM adds into c where it writes c in place; a copied c is added when permuted back.
  const T beta = accumulate && !c.copied ? T(1) : T(0);
  T* ws = reinterpret_cast<T*>(workspace.get());
  const T* pa = prepare(a, a_in, ws);
  const T* pb = prepare(b, b_in, ws);
  T* pc = c.copied ? ws + c.offset : c_out;
  walk<3>(batch_extents, {a.batch_strides, b.batch_strides, c.batch_strides},
          [&](const std::array<std::int64_t, 3>& off) {
            if (swap) {
              blas::gemm(!b.view.trans, !a.view.trans, n, m, k, T(1), pb + off[1], b.view.ld,
                         pa + off[0], a.view.ld, beta, pc + off[2], c.view.ld);
            } else {
              blas::gemm(a.view.trans, b.view.trans, m, n, k, T(1), pa + off[0], a.view.ld,
                         pb + off[1], b.view.ld, beta, pc + off[2], c.view.ld);
            }
          });
  if (!c.copied) return;
  if (accumulate) {
    rearrange<true>(static_cast<const T*>(pc), c.shape, c.strides, c.perm, c_out);
  } else {
    rearrange<false>(static_cast<const T*>(pc), c.shape, c.strides, c.perm, c_out);
  }
}

}  // namespace shardmm
