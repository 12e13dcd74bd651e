// Local kernels against naive index loops: copy_box/add_box, permute, blas::gemm (sizes,
// transposes, splitting, threads) and LocalEinsum over thousands of random layouts.
#include "shardmm/runtime/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "shardmm/core/error.h"
#include "shardmm/runtime/blas.h"

namespace shardmm {
namespace {

using Index = std::vector<std::int64_t>;

// Calls f(index) for every index of `extents` in row-major order (none if an extent is 0).
template <class F>
void for_each_index(const Shape& extents, F f) {
  for (std::int64_t e : extents) {
    if (e == 0) return;
  }
  Index idx(extents.size(), 0);
  for (;;) {
    f(idx);
    std::size_t d = extents.size();
    while (d > 0 && ++idx[d - 1] == extents[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

std::int64_t flat(const Index& idx, const Shape& shape) {
  std::int64_t f = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

std::int64_t count(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

template <class T>
std::vector<T> random_values(std::mt19937_64& rng, std::int64_t n) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

std::int64_t pick(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

// ------------------------------------------------------------------------- boxes

template <class T>
void check_boxes(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t rank = static_cast<std::size_t>(trial % 5);  // 0..4
    Shape src_shape(rank), dst_shape(rank), src_off(rank), dst_off(rank), extent(rank);
    for (std::size_t d = 0; d < rank; ++d) {
      src_shape[d] = pick(rng, 0, 6);
      dst_shape[d] = pick(rng, 0, 6);
      // Mostly a whole or nearly whole box, so that trailing dimensions merge.
      const std::int64_t most = std::min(src_shape[d], dst_shape[d]);
      extent[d] = pick(rng, 0, 3) == 0 ? pick(rng, 0, most) : most;
      src_off[d] = pick(rng, 0, src_shape[d] - extent[d]);
      dst_off[d] = pick(rng, 0, dst_shape[d] - extent[d]);
    }
    const std::vector<T> src = random_values<T>(rng, count(src_shape));
    const std::vector<T> dst0 = random_values<T>(rng, count(dst_shape));
    std::vector<T> want_copy = dst0, want_add = dst0;
    for_each_index(extent, [&](const Index& i) {
      Index s(rank), d(rank);
      for (std::size_t k = 0; k < rank; ++k) {
        s[k] = src_off[k] + i[k];
        d[k] = dst_off[k] + i[k];
      }
      want_copy[flat(d, dst_shape)] = src[flat(s, src_shape)];
      want_add[flat(d, dst_shape)] += src[flat(s, src_shape)];
    });
    std::vector<T> got = dst0;
    copy_box(src.data(), src_shape, src_off, got.data(), dst_shape, dst_off, extent);
    ASSERT_EQ(got, want_copy) << "trial " << trial;
    got = dst0;
    add_box(src.data(), src_shape, src_off, got.data(), dst_shape, dst_off, extent);
    ASSERT_EQ(got, want_add) << "trial " << trial;
  }
}

TEST(Boxes, CopyAndAddMatchNaiveLoopsF32) { check_boxes<float>(1); }
TEST(Boxes, CopyAndAddMatchNaiveLoopsF64) { check_boxes<double>(2); }

TEST(Boxes, ExampleFromHeader) {
  // src 4x2 = rows {0,1},{2,3},{4,5},{6,7}; its rows 1..2 land in dst[0:2, 3:5].
  std::vector<float> src = {0, 1, 2, 3, 4, 5, 6, 7}, dst(10, -1);
  copy_box(src.data(), {4, 2}, {1, 0}, dst.data(), {2, 5}, {0, 3}, {2, 2});
  EXPECT_EQ(dst, (std::vector<float>{-1, -1, -1, 2, 3, -1, -1, -1, 4, 5}));
}

TEST(Boxes, BadBoxesAreUsageErrors) {
  std::vector<double> src(12), dst(12);
  EXPECT_THROW(copy_box(src.data(), {3, 4}, {2, 0}, dst.data(), {3, 4}, {0, 0}, {2, 4}), UsageError);
  EXPECT_THROW(add_box(src.data(), {3, 4}, {0, 0}, dst.data(), {3, 4}, {0, 1}, {3, 4}), UsageError);
  EXPECT_THROW(copy_box(src.data(), {3, 4}, {0}, dst.data(), {3, 4}, {0, 0}, {1, 1}), UsageError);
  EXPECT_THROW(copy_box(src.data(), {3, 4}, {-1, 0}, dst.data(), {3, 4}, {0, 0}, {1, 1}), UsageError);
  try {
    copy_box(src.data(), {3, 4}, {2, 0}, dst.data(), {3, 4}, {0, 0}, {2, 4});
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4] at offset [2, 0] does not fit in src shape [3, 4]"), std::string::npos)
        << e.what();
  }
}

// ------------------------------------------------------------------------- permute

template <class T>
void check_permute(const Shape& shape, const std::vector<int>& perm, std::mt19937_64& rng) {
  const std::vector<T> src = random_values<T>(rng, count(shape));
  Shape dst_shape;
  for (int p : perm) dst_shape.push_back(shape[p]);
  std::vector<T> want(src.size()), got(src.size(), T(-7));
  for_each_index(dst_shape, [&](const Index& i) {
    Index s(shape.size());
    for (std::size_t d = 0; d < perm.size(); ++d) s[perm[d]] = i[d];
    want[flat(i, dst_shape)] = src[flat(s, shape)];
  });
  permute(src.data(), shape, perm, got.data());
  ASSERT_EQ(got, want) << "rank " << shape.size();
}

TEST(Permute, MatchesNaiveLoops) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 1500; ++trial) {
    const std::size_t rank = static_cast<std::size_t>(pick(rng, 0, 5));
    Shape shape(rank);
    for (auto& e : shape) e = pick(rng, 0, 9) == 0 ? pick(rng, 0, 1) : pick(rng, 2, 7);
    std::vector<int> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (trial % 2) {
      check_permute<float>(shape, perm, rng);
    } else {
      check_permute<double>(shape, perm, rng);
    }
  }
}

TEST(Permute, TiledTransposesWithPartialTiles) {
  std::mt19937_64 rng(4);
  check_permute<float>({257, 131}, {1, 0}, rng);
  check_permute<double>({33, 65}, {1, 0}, rng);
  check_permute<float>({5, 70, 40}, {0, 2, 1}, rng);
  check_permute<float>({70, 3, 40}, {2, 1, 0}, rng);
  check_permute<double>({40, 6, 35}, {1, 2, 0}, rng);
}

TEST(Permute, BadPermutationsAreUsageErrors) {
  std::vector<float> src(6), dst(6);
  EXPECT_THROW(permute(src.data(), {2, 3}, {0, 0}, dst.data()), UsageError);
  EXPECT_THROW(permute(src.data(), {2, 3}, {0}, dst.data()), UsageError);
  EXPECT_THROW(permute(src.data(), {2, 3}, {1, 2}, dst.data()), UsageError);
}

// ------------------------------------------------------------------------- gemm

template <class T>
constexpr long double unit_roundoff() {
  return std::numeric_limits<T>::epsilon() / 2;
}

// Checks c (computed) against alpha * op(A) op(B) + beta * c0 in long double. Bound:
// any summation order of k products plus the beta term stays within
// gamma_{k+2} * (|alpha| sum |a||b| + |beta||c0|), gamma_n ~ n u; doubled for the
// second-order terms.
template <class T>
void expect_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const std::vector<T>& a,
                 std::int64_t lda, const std::vector<T>& b, std::int64_t ldb, T beta, const std::vector<T>& c0,
                 const std::vector<T>& c, std::int64_t ldc, const std::string& what) {
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      long double sum = 0, mag = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const long double x = ta ? a[p * lda + i] : a[i * lda + p];
        const long double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      // beta == 0: c0 (NaN here) is not read.
      const long double beta_c = beta == T(0) ? 0.0L : beta * static_cast<long double>(c0[i * ldc + j]);
      const long double want = alpha * sum + beta_c;
      const long double tol = 2 * (k + 2) * unit_roundoff<T>() * (std::fabs(alpha) * mag + std::fabs(beta_c));
      ASSERT_LE(std::fabs(c[i * ldc + j] - want), tol)
          << what << " ta=" << ta << " tb=" << tb << " m=" << m << " n=" << n << " k=" << k << " at " << i << "," << j;
    }
  }
  // Padding between rows is never written.
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = n; j < ldc && i * ldc + j < static_cast<std::int64_t>(c.size()); ++j) {
      ASSERT_EQ(std::memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof(T)), 0)
          << what << " padding at " << i << "," << j;
    }
  }
}

// Random problem with padded leading dimensions; `limit` < 0 calls blas::gemm.
template <class T>
void check_gemm(std::mt19937_64& rng, std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb, T alpha, T beta,
                std::int64_t limit) {
  const std::int64_t lda = (ta ? m : k) + pick(rng, 0, 3);
  const std::int64_t ldb = (tb ? k : n) + pick(rng, 0, 3);
  const std::int64_t ldc = n + pick(rng, 0, 3);
  const auto a = random_values<T>(rng, std::max<std::int64_t>(1, (ta ? k : m) * lda));
  const auto b = random_values<T>(rng, std::max<std::int64_t>(1, (tb ? n : k) * ldb));
  auto c0 = random_values<T>(rng, std::max<std::int64_t>(1, m * ldc));
  if (beta == T(0)) std::fill(c0.begin(), c0.end(), std::numeric_limits<T>::quiet_NaN());
  auto c = c0;
  const std::int64_t la = std::max<std::int64_t>(1, lda), lb = std::max<std::int64_t>(1, ldb),
                     lc = std::max<std::int64_t>(1, ldc);
  if (limit < 0) {
    blas::gemm(ta, tb, m, n, k, alpha, a.data(), la, b.data(), lb, beta, c.data(), lc);
  } else {
    blas::detail::gemm_split(ta, tb, m, n, k, alpha, a.data(), la, b.data(), lb, beta, c.data(), lc, limit);
  }
  expect_gemm(ta, tb, m, n, k, alpha, a, la, b, lb, beta, c0, c, lc,
              limit < 0 ? "gemm" : "gemm_split limit " + std::to_string(limit));
}

TEST(Gemm, MatchesNaiveForAllTransposesAndPaddings) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    const bool ta = trial & 1, tb = trial & 2;
    const std::int64_t m = pick(rng, 0, 40), n = pick(rng, 0, 40), k = pick(rng, 0, 40);
    const double beta = trial % 3 == 0 ? 0.0 : -1.5;
    if (trial & 4) {
      check_gemm<float>(rng, m, n, k, ta, tb, 0.5f, static_cast<float>(beta), -1);
    } else {
      check_gemm<double>(rng, m, n, k, ta, tb, 0.5, beta, -1);
    }
  }
}

TEST(Gemm, SplitsIntoPiecesThatFitTheLimit) {
  std::mt19937_64 rng(6);
  for (std::int64_t limit : {1, 2, 3, 5, 100}) {
    for (int t = 0; t < 16; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const double beta = t & 4 ? 0.0 : 0.75;
      if (t & 8) {
        check_gemm<float>(rng, 7, 8, 9, ta, tb, 1.0f, static_cast<float>(beta), limit);
      } else {
        check_gemm<double>(rng, 9, 4, 11, ta, tb, -2.0, beta, limit);
      }
    }
  }
}

TEST(Gemm, ZeroSizes) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> a(6, 1.0), b(6, 1.0);
  // k == 0: C = beta * C; beta == 0 overwrites NaN.
  std::vector<double> c = {nan, nan, nan, 1, 2, 3};
  blas::gemm(false, false, 1, 3, 0, 1.0, a.data(), 1, b.data(), 3, 0.0, c.data(), 3);
  EXPECT_EQ(c, (std::vector<double>{0, 0, 0, 1, 2, 3}));
  c = {1, 2, 3, 4, 5, 6};
  blas::gemm(true, true, 2, 3, 0, 1.0, a.data(), 2, b.data(), 1, 2.0, c.data(), 3);
  EXPECT_EQ(c, (std::vector<double>{2, 4, 6, 8, 10, 12}));
  // m == 0 or n == 0: nothing is touched.
  c = {nan, 1, 2, 3, 4, 5};
  blas::gemm(false, false, 0, 3, 2, 1.0, a.data(), 2, b.data(), 3, 0.0, c.data(), 3);
  blas::gemm(false, false, 2, 0, 2, 1.0, a.data(), 2, b.data(), 1, 0.0, c.data(), 1);
  EXPECT_TRUE(std::isnan(c[0]));
  EXPECT_EQ(c[5], 5.0);
}

TEST(Gemm, BadArgumentsAreUsageErrors) {
  std::vector<float> a(12), b(12), c(12);
  EXPECT_THROW(blas::gemm(false, false, -1, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2), UsageError);
  EXPECT_THROW(blas::gemm(false, false, 2, 2, 3, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2),
               UsageError);  // lda < k
  EXPECT_THROW(blas::gemm(false, true, 2, 3, 2, 1.f, a.data(), 2, b.data(), 1, 0.f, c.data(), 3),
               UsageError);  // ldb < k for B^T
  EXPECT_THROW(blas::gemm(false, false, 2, 3, 2, 1.f, a.data(), 2, b.data(), 3, 0.f, c.data(), 2),
               UsageError);  // ldc < n
}

TEST(Blas, ThreadSettings) {
  EXPECT_THROW(blas::set_threads(0), UsageError);
  EXPECT_EQ(blas::threads_per_rank(16, 4), 4);
  EXPECT_EQ(blas::threads_per_rank(16, 3), 5);
  EXPECT_EQ(blas::threads_per_rank(2, 8), 1);
  EXPECT_THROW(blas::threads_per_rank(0, 1), UsageError);
  blas::set_threads(1);
  EXPECT_EQ(blas::threads(), 1);
}

// The threads backend's situation: OpenBLAS at one thread, called from several rank
// threads at once. Each thread's results must be bit-identical to a sequential run.
TEST(Blas, ConcurrentSingleThreadedGemmGivesSequentialBits) {
  blas::set_threads(1);
  ASSERT_EQ(blas::threads(), 1);
  constexpr int kThreads = 4, kRepeats = 6;
  struct Problem {
    std::int64_t m, n, k;
    std::vector<float> af, bf, cf;
    std::vector<double> ad, bd, cd;
  };
  std::mt19937_64 rng(7);
  std::vector<Problem> problems;
  for (int t = 0; t < kThreads; ++t) {
    Problem p{300 + 17 * t, 280 + 5 * t, 350 + 11 * t, {}, {}, {}, {}, {}, {}};
    p.af = random_values<float>(rng, p.m * p.k);
    p.bf = random_values<float>(rng, p.k * p.n);
    p.ad = random_values<double>(rng, p.m * p.k);
    p.bd = random_values<double>(rng, p.k * p.n);
    p.cf.resize(static_cast<std::size_t>(p.m * p.n));
    p.cd.resize(static_cast<std::size_t>(p.m * p.n));
    blas::gemm(false, t % 2 == 1, p.m, p.n, p.k, 1.f, p.af.data(), p.k, p.bf.data(), t % 2 == 1 ? p.k : p.n, 0.f,
               p.cf.data(), p.n);
    blas::gemm(t % 2 == 1, false, p.m, p.n, p.k, 1.0, p.ad.data(), t % 2 == 1 ? p.m : p.k, p.bd.data(), p.n, 0.0,
               p.cd.data(), p.n);
    problems.push_back(std::move(p));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const Problem& p = problems[static_cast<std::size_t>(t)];
      std::vector<float> cf(p.cf.size());
      std::vector<double> cd(p.cd.size());
      for (int r = 0; r < kRepeats; ++r) {
        blas::gemm(false, t % 2 == 1, p.m, p.n, p.k, 1.f, p.af.data(), p.k, p.bf.data(), t % 2 == 1 ? p.k : p.n, 0.f,
                   cf.data(), p.n);
        blas::gemm(t % 2 == 1, false, p.m, p.n, p.k, 1.0, p.ad.data(), t % 2 == 1 ? p.m : p.k, p.bd.data(), p.n, 0.0,
                   cd.data(), p.n);
        if (std::memcmp(cf.data(), p.cf.data(), cf.size() * sizeof(float)) != 0) ++mismatches;
        if (std::memcmp(cd.data(), p.cd.data(), cd.size() * sizeof(double)) != 0) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ------------------------------------------------------------------------- einsum

using Names = std::vector<std::string>;
using Extents = std::map<std::string, std::int64_t>;

Shape shape_of(const Names& names, const Extents& ext) {
  Shape s;
  for (const auto& name : names) s.push_back(ext.at(name));
  return s;
}

bool has(const Names& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// `box` (row-major, extents `shape`) placed at a random offset in a buffer of random larger
// extents filled with NaN, which any read outside the box carries into the result.
template <class T>
struct Boxed {
  std::vector<T> buffer;
  std::map<std::string, std::int64_t> extents;  // the buffer's, per name
  const T* first = nullptr;                     // the box's first element
};
template <class T>
Boxed<T> boxed(const std::vector<T>& box, const Names& names, const Shape& shape, std::mt19937_64& rng) {
  Boxed<T> out;
  Shape held, offset;
  for (std::size_t d = 0; d < names.size(); ++d) {
    held.push_back(shape[d] + pick(rng, 0, 2));
    offset.push_back(pick(rng, 0, held.back() - shape[d]));
    out.extents[names[d]] = held.back();
  }
  out.buffer.assign(static_cast<std::size_t>(count(held)), std::numeric_limits<T>::quiet_NaN());
  copy_box(box.data(), shape, Shape(shape.size(), 0), out.buffer.data(), held, offset, shape);
  out.first = out.buffer.data() + (count(held) == 0 ? 0 : flat(offset, held));
  return out;
}

// Runs the einsum on random inputs (twice, over a NaN-filled output) and checks it
// against a sum over every index combination in long double. Per output element,
// |error| <= (K + Sa + Sb) u sum|a b| to first order: the GEMM's sum of K products
// (gamma_K, any order), plus the pre-reductions of A and B over their summed lengths
// Sa and Sb (gamma_Sa, gamma_Sb), each weighted by the same sum of |a b| over all terms;
// the factor 2 covers the second-order terms. Exact zeros (no terms) must be exact.
// With `rng`'s say, A and B are boxes of larger buffers (OperandBuffers), and C is added to
// (accumulate) instead of overwritten: one more rounding, over |c| too.
template <class T>
void check_einsum(const EinsumLayout& layout, const Extents& ext, std::mt19937_64& rng, const std::string& context) {
  const DType dtype = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  const Shape sa = shape_of(layout.a, ext), sb = shape_of(layout.b, ext), sc = shape_of(layout.c, ext);
  const auto a = random_values<T>(rng, count(sa));
  const auto b = random_values<T>(rng, count(sb));
  const bool in_boxes = pick(rng, 0, 1) == 1, accumulate = pick(rng, 0, 1) == 1;
  const Boxed<T> a_boxed = boxed(a, layout.a, sa, rng), b_boxed = boxed(b, layout.b, sb, rng);
  LocalEinsum op(layout, ext, dtype, in_boxes ? OperandBuffers{a_boxed.extents, b_boxed.extents} : OperandBuffers{});
  const T* a_in = in_boxes ? a_boxed.first : a.data();
  const T* b_in = in_boxes ? b_boxed.first : b.data();
  const std::string what = context + (in_boxes ? " in boxes" : "") + (accumulate ? " accumulating" : "");
  const auto c0 = random_values<T>(rng, count(sc));
  std::vector<T> c = accumulate ? c0 : std::vector<T>(c0.size(), std::numeric_limits<T>::quiet_NaN());

  Names all = layout.a;
  for (const auto& name : layout.b) {
    if (!has(all, name)) all.push_back(name);
  }
  const Shape extents = shape_of(all, ext);
  std::int64_t contracted = 1, summed_a = 1, summed_b = 1;
  double flops = 2;
  for (const auto& name : all) {
    flops *= static_cast<double>(ext.at(name));
    const bool in_a = has(layout.a, name), in_b = has(layout.b, name), in_c = has(layout.c, name);
    if (in_a && in_b && !in_c) contracted *= ext.at(name);
    if (in_a && !in_b && !in_c) summed_a *= ext.at(name);
    if (!in_a && in_b && !in_c) summed_b *= ext.at(name);
  }
  EXPECT_EQ(op.flops(), flops) << what;

  std::vector<long double> want(c.size(), 0), mag(c.size(), 0);
  for (std::size_t i = 0; accumulate && i < c.size(); ++i) {
    want[i] = c0[i];
    mag[i] = std::fabs(c0[i]);
  }
  auto position = [&](const Names& names, const Shape& shape, const Index& idx) {
    std::int64_t f = 0;
    for (std::size_t d = 0; d < names.size(); ++d) {
      f = f * shape[d] + idx[std::find(all.begin(), all.end(), names[d]) - all.begin()];
    }
    return f;
  };
  for_each_index(extents, [&](const Index& idx) {
    const long double term = static_cast<long double>(a[position(layout.a, sa, idx)]) * b[position(layout.b, sb, idx)];
    want[position(layout.c, sc, idx)] += term;
    mag[position(layout.c, sc, idx)] += std::fabs(term);
  });

  accumulate ? op.accumulate(a_in, b_in, c.data()) : op.run(a_in, b_in, c.data());
  const long double bound = 2.0L * static_cast<long double>(contracted + summed_a + summed_b + 1) * unit_roundoff<T>();
  for (std::size_t i = 0; i < c.size(); ++i) {
    ASSERT_LE(std::fabs(c[i] - want[i]), bound * mag[i])
        << what << " element " << i << ": got " << c[i] << " want " << static_cast<double>(want[i]);
  }
  // The workspace is reused: a second run gives the same bits.
  std::vector<T> again = accumulate ? c0 : std::vector<T>(c.size(), std::numeric_limits<T>::quiet_NaN());
  accumulate ? op.accumulate(a_in, b_in, again.data()) : op.run(a_in, b_in, again.data());
  ASSERT_TRUE(c.empty() || std::memcmp(again.data(), c.data(), c.size() * sizeof(T)) == 0) << what;
}

std::string describe(const EinsumLayout& l, const Extents& ext) {
  auto list = [&](const Names& names) {
    std::string s;
    for (const auto& n : names) s += n + "=" + std::to_string(ext.at(n)) + " ";
    return s;
  };
  return "a: " + list(l.a) + "| b: " + list(l.b) + "| c: " + list(l.c);
}

// Random einsums: 0..2 batch, contracted, free_a and free_b names, 0..1 summed names per
// input; extents 1..5, sometimes 0; orders either fully shuffled or shuffled by class
// (then often a strided GEMM view, which exercises the no-copy paths).
TEST(LocalEinsum, MatchesNaiveEinsumOnRandomLayouts) {
  std::mt19937_64 rng(8);
  int copies = 0, direct = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> pool = {"B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M"};
    std::shuffle(pool.begin(), pool.end(), rng);
    auto take = [&](std::int64_t n) {
      Names g(pool.end() - n, pool.end());
      pool.resize(pool.size() - static_cast<std::size_t>(n));
      return g;
    };
    const Names batch = take(pick(rng, 0, 2)), contracted = take(pick(rng, 0, 2)), free_a = take(pick(rng, 0, 2)),
                free_b = take(pick(rng, 0, 2)), summed_a = take(pick(rng, 0, 1)), summed_b = take(pick(rng, 0, 1));
    EinsumLayout l;
    if (trial % 2 == 0) {
      auto cat = [](std::vector<Names> groups) {
        Names out;
        for (const auto& g : groups) out.insert(out.end(), g.begin(), g.end());
        return out;
      };
      l.a = cat({batch, free_a, contracted, summed_a});
      l.b = cat({batch, contracted, free_b, summed_b});
      l.c = cat({batch, free_a, free_b});
      std::shuffle(l.a.begin(), l.a.end(), rng);
      std::shuffle(l.b.begin(), l.b.end(), rng);
      std::shuffle(l.c.begin(), l.c.end(), rng);
    } else {
      std::vector<Names> ga = {batch, free_a, contracted, summed_a};
      std::vector<Names> gb = {batch, contracted, free_b, summed_b};
      std::vector<Names> gc = {batch, free_a, free_b};
      std::shuffle(ga.begin(), ga.end(), rng);
      std::shuffle(gb.begin(), gb.end(), rng);
      std::shuffle(gc.begin(), gc.end(), rng);
      for (const auto& g : ga) l.a.insert(l.a.end(), g.begin(), g.end());
      for (const auto& g : gb) l.b.insert(l.b.end(), g.begin(), g.end());
      for (const auto& g : gc) l.c.insert(l.c.end(), g.begin(), g.end());
    }
    Extents ext;
    for (const auto* g : {&batch, &contracted, &free_a, &free_b, &summed_a, &summed_b}) {
      for (const auto& name : *g) ext[name] = pick(rng, 0, 19) == 0 ? 0 : pick(rng, 1, 5);
    }
    // At most 4096 index combinations, so that the naive reference stays cheap.
    for (;;) {
      std::int64_t total = 1;
      Names big;
      for (const auto& [name, e] : ext) {
        total *= e;
        if (e > 1) big.push_back(name);
      }
      if (total <= 4096) break;
      --ext[big[static_cast<std::size_t>(pick(rng, 0, static_cast<std::int64_t>(big.size()) - 1))]];
    }
    const std::string what = "trial " + std::to_string(trial) + " " + describe(l, ext);
    if (trial % 3 == 2) {
      check_einsum<float>(l, ext, rng, what);
    } else {
      check_einsum<double>(l, ext, rng, what);
    }
    if (HasFatalFailure()) return;
    const LocalEinsum probe(l, ext, DType::f32);
    (probe.workspace_bytes() > 0 ? copies : direct)++;
  }
  // Both kinds of plan were exercised.
  EXPECT_GT(copies, 300);
  EXPECT_GT(direct, 300);
}

struct Case {
  EinsumLayout layout;
  bool copies_a, copies_b, copies_c;
};

void check_plan(const Case& t, const Extents& ext) {
  const std::string what = describe(t.layout, ext);
  const LocalEinsum op(t.layout, ext, DType::f32);
  EXPECT_EQ(op.copies_a(), t.copies_a) << what;
  EXPECT_EQ(op.copies_b(), t.copies_b) << what;
  EXPECT_EQ(op.copies_c(), t.copies_c) << what;
  if (!t.copies_a && !t.copies_b && !t.copies_c) {
    EXPECT_EQ(op.workspace_bytes(), 0) << what;
  }
  std::mt19937_64 rng(9);
  check_einsum<float>(t.layout, ext, rng, what);
  check_einsum<double>(t.layout, ext, rng, what);
}

TEST(LocalEinsum, MatmulLayoutsCallGemmWithoutCopies) {
  const Extents ext = {{"I", 3}, {"J", 4}, {"K", 5}, {"B", 2}, {"L", 6}, {"S", 1}};
  const std::vector<Case> cases = {
      {{{"I", "J"}, {"J", "K"}, {"I", "K"}}, false, false, false},
      {{{"J", "I"}, {"J", "K"}, {"I", "K"}}, false, false, false},
      {{{"I", "J"}, {"K", "J"}, {"I", "K"}}, false, false, false},
      {{{"J", "I"}, {"K", "J"}, {"I", "K"}}, false, false, false},
      {{{"I", "J"}, {"J", "K"}, {"K", "I"}}, false, false, false},  // C^T = B^T A^T
      {{{"J", "I"}, {"K", "J"}, {"K", "I"}}, false, false, false},
      {{{"B", "I", "J"}, {"B", "J", "K"}, {"B", "I", "K"}}, false, false, false},
      {{{"I", "B", "J"}, {"B", "J", "K"}, {"B", "I", "K"}}, false, false, false},
      {{{"I", "L", "J"}, {"J", "K"}, {"I", "L", "K"}}, false, false, false},  // M = I*L
      {{{"J", "I", "L"}, {"K", "J"}, {"K", "I", "L"}}, false, false, false},
      {{{"I", "J", "L"}, {"J", "L", "K"}, {"I", "K"}}, false, false, false},  // K = J*L
      {{{"I", "J"}, {"J"}, {"I"}}, false, false, false},                      // matrix-vector
      {{{"J"}, {"J"}, {}}, false, false, false},                              // dot
      {{{"I"}, {"K"}, {"K", "I"}}, false, false, false},                      // outer product
      {{{"I", "J", "S"}, {"J", "K"}, {"I", "K"}}, false, false, false},       // summed, extent 1
  };
  for (const Case& t : cases) check_plan(t, ext);
}

TEST(LocalEinsum, CopiesOnlyWhatNoStridedViewCanServe) {
  // A's M dims (I, L) are not adjacent in A: only A is copied.
  check_plan({{{"I", "J", "L"}, {"J", "K"}, {"I", "L", "K"}}, true, false, false},
             {{"I", 3}, {"J", 4}, {"K", 5}, {"L", 2}});
  // A orders M as (I, L), C as (L, I): copy the smaller of the two.
  check_plan({{{"I", "L", "J"}, {"J", "K"}, {"L", "I", "K"}}, true, false, false},
             {{"I", 2}, {"L", 3}, {"J", 4}, {"K", 5}});  // A 24 < C 30 elements
  check_plan({{{"I", "L", "J"}, {"J", "K"}, {"L", "I", "K"}}, false, false, true},
             {{"I", 2}, {"L", 3}, {"J", 8}, {"K", 5}});  // A 48 > C 30 elements
  // C[I, K, B]: neither I nor K is contiguous, so GEMM writes a copy.
  check_plan({{{"I", "B", "J"}, {"J", "B", "K"}, {"I", "K", "B"}}, false, false, true},
             {{"I", 3}, {"J", 4}, {"K", 5}, {"B", 2}});
  // A summed dimension is reduced into the workspace.
  check_plan({{{"I", "J", "S"}, {"J", "K"}, {"I", "K"}}, true, false, false}, {{"I", 3}, {"J", 4}, {"K", 5}, {"S", 3}});
  check_plan({{{"I", "J"}, {"S", "K", "J"}, {"K", "I"}}, false, true, false}, {{"I", 3}, {"J", 4}, {"K", 5}, {"S", 2}});
}

// The executor's ring over a contracted dimension: C[I, K] = sum over chunks m of
// A[I, J_m] @ B[J_m, K], each chunk of A's columns read in place from the whole A (its
// leading dimension is A's), the first chunk written, the others added. Integer-valued data:
// every sum is exact, so the chunks add up to the whole einsum's bits.
TEST(LocalEinsum, ContractedChunksReadInPlaceAndAddUp) {
  const std::int64_t I = 5, J = 7, K = 3;
  std::vector<double> a(I * J), b(J * K), whole(I * K), chunked(I * K, std::nan(""));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>(i % 5) - 2;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(i % 7) - 3;
  const EinsumLayout layout{{"I", "J"}, {"J", "K"}, {"I", "K"}};
  LocalEinsum(layout, {{"I", I}, {"J", J}, {"K", K}}, DType::f64).run(a.data(), b.data(), whole.data());
  std::int64_t offset = 0;
  for (std::int64_t extent : {3, 0, 4}) {
    LocalEinsum chunk(layout, {{"I", I}, {"J", extent}, {"K", K}}, DType::f64, OperandBuffers{{{"J", J}}, {}});
    EXPECT_FALSE(chunk.copies_a());
    EXPECT_EQ(chunk.workspace_bytes(), 0);
    const double* a_columns = a.data() + offset;
    const double* b_rows = b.data() + offset * K;
    offset == 0 ? chunk.run(a_columns, b_rows, chunked.data()) : chunk.accumulate(a_columns, b_rows, chunked.data());
    offset += extent;
  }
  EXPECT_EQ(chunked, whole);
}

TEST(LocalEinsum, WorkspaceHoldsTheCopies) {
  const LocalEinsum op({{"I", "J", "L"}, {"J", "K"}, {"I", "L", "K"}}, {{"I", 3}, {"J", 4}, {"K", 5}, {"L", 7}},
                       DType::f64);
  ASSERT_TRUE(op.copies_a());
  EXPECT_GE(op.workspace_bytes(), 3 * 4 * 7 * 8);
  EXPECT_LT(op.workspace_bytes(), 3 * 4 * 7 * 8 + 64);
}

TEST(LocalEinsum, ZeroExtentsGiveZerosOrNothing) {
  std::mt19937_64 rng(10);
  // Contracted length 0: C is all zeros (not the NaN it held).
  check_einsum<float>({{"I", "J"}, {"J", "K"}, {"I", "K"}}, {{"I", 3}, {"J", 0}, {"K", 2}}, rng, "J=0");
  check_einsum<double>({{"I", "J", "S"}, {"J", "K"}, {"K", "I"}}, {{"I", 3}, {"J", 2}, {"K", 2}, {"S", 0}}, rng, "S=0");
  // Empty output: nothing to write, nothing read.
  LocalEinsum op({{"I", "J"}, {"J", "K"}, {"I", "K"}}, {{"I", 0}, {"J", 4}, {"K", 2}}, DType::f32);
  EXPECT_EQ(op.flops(), 0.0);
  op.run(nullptr, nullptr, nullptr);
  // Contracted length 0, accumulating: C keeps what it held.
  std::vector<float> c = {1, 2, 3, 4};
  LocalEinsum({{"I", "J"}, {"J", "K"}, {"I", "K"}}, {{"I", 2}, {"J", 0}, {"K", 2}}, DType::f32)
      .accumulate(nullptr, nullptr, c.data());
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
}

TEST(LocalEinsum, FlopsCountEveryTerm) {
  const LocalEinsum op({{"I", "J", "S"}, {"J", "K"}, {"I", "K"}}, {{"I", 3}, {"J", 4}, {"K", 5}, {"S", 6}}, DType::f32);
  EXPECT_EQ(op.flops(), 2.0 * 3 * 4 * 5 * 6);
}

template <class Error>
void expect_error(const EinsumLayout& layout, const Extents& ext, DType dtype, const std::string& needle) {
  try {
    LocalEinsum op(layout, ext, dtype);
    ADD_FAILURE() << "no error; wanted one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A layout the caller built wrong is its bug; the dtype is the user's choice.
TEST(LocalEinsum, BadLayoutsAreUsageErrors) {
  const Extents ext = {{"I", 2}, {"J", 3}, {"K", 4}};
  expect_error<UsageError>({{"I", "J", "I"}, {"J", "K"}, {"I", "K"}}, ext, DType::f32,
                           "dimension 'I' appears twice in a");
  expect_error<UsageError>({{"I", "J"}, {"J", "K"}, {"K", "K"}}, ext, DType::f32, "dimension 'K' appears twice in c");
  expect_error<UsageError>({{"I", "J"}, {"J", "K"}, {"I", "Z"}}, {{"I", 2}, {"J", 3}, {"K", 4}, {"Z", 1}}, DType::f32,
                           "output dimension 'Z' is in neither input");
  expect_error<UsageError>({{"I", "J"}, {"J", "Q"}, {"I", "Q"}}, ext, DType::f64, "no extent given for dimension 'Q'");
  expect_error<UsageError>({{"I", "J"}, {"J", "K"}, {"I", "K"}}, {{"I", 2}, {"J", -3}, {"K", 4}}, DType::f64,
                           "dimension 'J' has extent -3");
  expect_error<InputError>({{"I", "J"}, {"J", "K"}, {"I", "K"}}, ext, DType::bf16, "dtype bf16");
  try {
    LocalEinsum op({{"I", "J"}, {"J", "K"}, {"I", "K"}}, ext, DType::f32, OperandBuffers{{}, {{"J", 2}}});
    ADD_FAILURE() << "a buffer smaller than its box was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the buffer of b has extent 2 for dimension 'J', less than the einsum's 3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardmm
