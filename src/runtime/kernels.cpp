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
#include "buffer_pool.h"

namespace shardmm {
namespace {

std::string show(const Shape& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
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
void walk_box(const char* what, const T* src, const Shape& src_shape, const Shape& src_offset, T* dst,
              const Shape& dst_shape, const Shape& dst_offset, const Shape& extent, Run run) {
  const std::size_t rank = extent.size();
  if (src_shape.size() != rank || src_offset.size() != rank || dst_shape.size() != rank || dst_offset.size() != rank) {
    throw UsageError(std::string(what) + ": ranks differ (src shape " + show(src_shape) + ", src offset " +
                     show(src_offset) + ", dst shape " + show(dst_shape) + ", dst offset " + show(dst_offset) +
                     ", extent " + show(extent) + "): all must have the same rank");
  }
  auto check = [&](const char* side, const Shape& shape, const Shape& offset) {
    for (std::size_t d = 0; d < rank; ++d) {
      if (shape[d] < 0 || extent[d] < 0 || offset[d] < 0 || offset[d] > shape[d] - extent[d]) {
        throw UsageError(std::string(what) + ": box of extent " + show(extent) + " at offset " + show(offset) +
                         " does not fit in " + side + " shape " + show(shape) +
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
  walk<2>(outer,
          {Shape(src_strides.begin(), src_strides.begin() + static_cast<std::ptrdiff_t>(inner)),
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
    walk<2>(Shape(ext.begin(), ext.end() - 1),
            {Shape(sst.begin(), sst.end() - 1), Shape(dst_strides.begin(), dst_strides.end() - 1)},
            [&](const std::array<std::int64_t, 2>& off) { store<Add>(dst + off[1], src + off[0], ext[last]); });
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
void copy_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst, const Shape& dst_shape,
              const Shape& dst_offset, const Shape& extent) {
  walk_box("copy_box", src, src_shape, src_offset, dst, dst_shape, dst_offset, extent,
           [](const T* s, T* d, std::int64_t n) { store<false>(d, s, n); });
}

template <class T>
void add_box(const T* src, const Shape& src_shape, const Shape& src_offset, T* dst, const Shape& dst_shape,
             const Shape& dst_offset, const Shape& extent) {
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
    throw UsageError("permute: " + show(p) + " is not a permutation of the " + std::to_string(rank) +
                     " dimensions of shape " + show(shape) + ": each of 0.." +
                     std::to_string(static_cast<long>(rank) - 1) + " must appear exactly once");
  }
  for (std::int64_t e : shape) {
    if (e < 0) throw UsageError("permute: negative extent in shape " + show(shape));
  }
  rearrange<false>(src, shape, row_major_strides(shape), perm, dst);
}

#define SHARDMM_INSTANTIATE(T)                                                                                   \
  template void copy_box<T>(const T*, const Shape&, const Shape&, T*, const Shape&, const Shape&, const Shape&); \
  template void add_box<T>(const T*, const Shape&, const Shape&, T*, const Shape&, const Shape&, const Shape&);  \
  template void permute<T>(const T*, const Shape&, const std::vector<int>&, T*);
SHARDMM_INSTANTIATE(float)
SHARDMM_INSTANTIATE(double)
#undef SHARDMM_INSTANTIATE

// ---------------------------------------------------------------------------------------
// LocalEinsum

struct LocalEinsum::Impl : EinsumPlan {
  struct Free {
    std::size_t bytes;
    void operator()(std::byte* p) const { detail::pool_free(p, bytes); }
  };
  std::unique_ptr<std::byte, Free> workspace;

  // The local kernel computes in f32 or f64; the plan alone takes any dtype.
  static EinsumPlan plan(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents, DType dtype,
                         const OperandBuffers& buffers) {
    if (dtype != DType::f32 && dtype != DType::f64) {
      throw InputError(describe(layout) + ": dtype " + to_string(dtype) +
                       " has no local kernel: the einsum runs in f32 or f64");
    }
    return plan_local_einsum(std::move(layout), extents, dtype, buffers);
  }
  explicit Impl(EinsumPlan p) : EinsumPlan(std::move(p)) {}

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

LocalEinsum::LocalEinsum(EinsumLayout layout, std::map<std::string, std::int64_t> extents, DType dtype,
                         const OperandBuffers& buffers)
    : impl_(std::make_unique<Impl>(Impl::plan(std::move(layout), extents, dtype, buffers))) {
  if (impl_->workspace_bytes > 0) {
    // Whole 64-byte lines, as a Buffer's (aligned_alloc's rule), so that a block serves either once freed.
    const auto bytes = static_cast<std::size_t>((impl_->workspace_bytes + 63) / 64 * 64);
    impl_->workspace = {static_cast<std::byte*>(detail::pool_allocate(bytes)), Impl::Free{bytes}};
    if (!impl_->workspace) throw std::bad_alloc();
  }
}

std::int64_t LocalEinsum::workspace_bytes_for(EinsumLayout layout, const std::map<std::string, std::int64_t>& extents,
                                              DType dtype, const OperandBuffers& buffers) {
  return Impl::plan(std::move(layout), extents, dtype, buffers).workspace_bytes;
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
              blas::gemm(!b.view.trans, !a.view.trans, n, m, k, T(1), pb + off[1], b.view.ld, pa + off[0], a.view.ld,
                         beta, pc + off[2], c.view.ld);
            } else {
              blas::gemm(a.view.trans, b.view.trans, m, n, k, T(1), pa + off[0], a.view.ld, pb + off[1], b.view.ld,
                         beta, pc + off[2], c.view.ld);
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
