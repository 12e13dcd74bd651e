// The activation kernels (autodiff/activation_kernels.h) against libm and against exact values
// (long double, 11 more bits than a double), through the compiled loops the tape runs: random
// points of fixed seeds at the scales activations see and over the whole range, and the edges.
#include "autodiff/activation_kernels.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "random_cases.h"

namespace shardmm::autodiff::kernels {
namespace {

using Exact = long double;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Doubles in order as integers: the distance between two is the number of doubles apart (ulps).
std::int64_t ordered(double x) {
  std::int64_t i;
  std::memcpy(&i, &x, sizeof i);
  return i < 0 ? std::numeric_limits<std::int64_t>::min() - i : i;
}

std::int64_t ulps_apart(double a, double b) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b) ? 0 : std::numeric_limits<std::int64_t>::max();
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Normal points of scale 1, 8 and 30 (what activations see), uniform ones over +-800 (past both
// ends of exp's range), and magnitudes from the least subnormal to 1e300 of either sign, in turn.
std::vector<double> random_points(unsigned seed, unsigned n) {
  testing::Rng rng(seed);
  std::vector<double> points(n);
  for (unsigned i = 0; i < n; ++i) {
    switch (i % 5) {
      case 0:
      case 1:
      case 2:
        points[i] = std::normal_distribution<double>(0, i % 5 == 0 ? 1 : i % 5 == 1 ? 8 : 30)(rng);
        break;
      case 3:
        points[i] = std::uniform_real_distribution<double>(-800, 800)(rng);
        break;
      default:
        points[i] = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng),
                               std::uniform_int_distribution<int>(-1074, 996)(rng)) *
                    (rng() % 2 ? 1 : -1);
    }
  }
  return points;
}

const std::vector<double> kEdges = {0.0,     -0.0,    DBL_TRUE_MIN, -DBL_TRUE_MIN, DBL_MIN, -DBL_MIN,  1e-300,
                                    -1e-300, 1e-8,    -1e-8,        0.625,         -0.625,  0.6250001, 19.06,
                                    -19.06,  20,      -20,          354,           -354,    708,       -708,
                                    -708.5,  709.78,  709.79,       -745.13,       -745.14, -746,      1e300,
                                    -1e300,  DBL_MAX, -DBL_MAX,     kInf,          -kInf,   kNan};

template <class F>
std::vector<double> values(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  forward<F>(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  return y;
}

template <class F>
std::vector<double> slopes(const std::vector<double>& x) {
  const std::vector<double> ones(x.size(), 1.0);
  std::vector<double> y(x.size());
  backward<F>(ones.data(), x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  return y;
}

TEST(ActivationKernels, TanhAndExpAreWithinUlpsOfLibmAndOfTheExactValue) {
  std::vector<double> x = random_points(27, testing::scaled_cases(1'000'000));
  x.insert(x.end(), kEdges.begin(), kEdges.end());
  const std::vector<double> t = values<Tanh>(x), e = values<Exp>(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    // glibc's tanh is 1-2 ulp from the exact value itself.
    ASSERT_LE(ulps_apart(t[i], std::tanh(x[i])), 3) << "tanh(" << x[i] << ") = " << t[i];
    ASSERT_LE(ulps_apart(t[i], static_cast<double>(std::tanh(static_cast<Exact>(x[i])))), 1) << x[i];
    if (!std::isnan(x[i])) {
      ASSERT_EQ(std::signbit(t[i]), std::signbit(x[i])) << x[i];
    }
    // Subnormal results included: exp rounds them once.
    ASSERT_LE(ulps_apart(e[i], std::exp(x[i])), 1) << "exp(" << x[i] << ") = " << e[i];
    ASSERT_LE(ulps_apart(e[i], static_cast<double>(std::exp(static_cast<Exact>(x[i])))), 1) << x[i];
  }
  EXPECT_EQ(kernels::tanh(-0.0), 0.0);
  EXPECT_TRUE(std::signbit(kernels::tanh(-0.0)));
  EXPECT_EQ(kernels::exp(-kInf), 0.0);
  EXPECT_EQ(kernels::exp(kInf), kInf);
  EXPECT_EQ(kernels::exp(709.79), kInf);
  EXPECT_TRUE(std::isnan(kernels::exp(kNan)) && std::isnan(kernels::tanh(kNan)));
}

// An activation's exact value and slope at x, and the error each may have: `ulps` ulps of the
// sum of its terms' magnitudes (a result near a zero crossing cancels), times the condition of
// the formula's inner argument where the kernel rounds one (gelu's u). Results the kernels flush
// to zero rather than make subnormal stay below 1e-300.
struct Expected {
  Exact value, value_scale, slope, slope_scale;
};

constexpr Exact kFlushed = 1e-300L;
constexpr Exact kUlp = DBL_EPSILON;

Exact logistic(Exact z) { return 1 / (1 + std::exp(-z)); }

Expected exact_silu(double x) {
  const Exact s = logistic(x), ax = std::fabs(static_cast<Exact>(x));
  return {x * s, ax * s, s * (1 + x * (1 - s)), s * (1 + ax * (1 - s))};
}

Expected exact_gelu(double x) {
  const Exact c = Gelu::kC, k = Gelu::kTwoSqrt2OverPi, v = x, z = k * (v + c * v * v * v), s = logistic(z);
  // u's rounding, relative a few ulps, moves logistic(z) by |z| (1 - s) of it, and its slope by |z|.
  const Exact value_condition = 1 + std::fabs(z) * (1 - s), slope_condition = 1 + std::fabs(z);
  const Exact dz = k * (1 + 3 * c * v * v);
  return {v * s, std::fabs(v * s) * value_condition, s + v * s * (1 - s) * dz,
          (s + std::fabs(v) * s * (1 - s) * dz) * slope_condition};
}

Expected exact_tanh(double x) {
  const Exact t = std::tanh(static_cast<Exact>(x)), c = std::cosh(static_cast<Exact>(x));
  return {t, std::fabs(t), 1 / (c * c), 1 / (c * c)};
}

// Up to |x| = `largest`: beyond 1e100 gelu's x^3 and x^2 overflow, and its formulas (libm's
// form's too) give inf or nan.
template <class F>
void expect_within(Expected (*exact)(double), Exact ulps, double largest = kInf) {
  std::vector<double> x = random_points(5, testing::scaled_cases(1'000'000));
  x.insert(x.end(), kEdges.begin(), kEdges.end());
  const std::vector<double> v = values<F>(x), d = slopes<F>(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const Expected want = exact(x[i]);
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(v[i]) && std::isnan(d[i]));
      continue;
    }
    if (std::isinf(x[i]) || std::fabs(x[i]) > largest) continue;  // InfinitiesAsLibmsFormsGiveThem
    const auto close = [&](double got, Exact value, Exact scale) {
      const Exact error = std::fabs(got - value);
      return error <= kFlushed || error <= ulps * kUlp * scale;
    };
    ASSERT_TRUE(close(v[i], want.value, want.value_scale))
        << F::name << "(" << x[i] << ") = " << v[i] << ", exact " << static_cast<double>(want.value);
    ASSERT_TRUE(close(d[i], want.slope, want.slope_scale))
        << F::name << "'(" << x[i] << ") = " << d[i] << ", exact " << static_cast<double>(want.slope);
  }
}

TEST(ActivationKernels, GeluSiluAndTanhAreWithinUlpsOfTheExactValueAndSlope) {
  expect_within<Gelu>(exact_gelu, 4, 1e100);
  expect_within<Silu>(exact_silu, 4);
  expect_within<Tanh>(exact_tanh, 4);
}

// libm's forms: tanh(+-inf) = +-1; x / (1 + exp(-x)) and 0.5 x (1 + tanh(u)) are inf at inf
// and nan at -inf (-inf times 0).
TEST(ActivationKernels, InfinitiesAsLibmsFormsGiveThem) {
  const std::vector<double> x = {kInf, -kInf};
  EXPECT_EQ(values<Tanh>(x), (std::vector<double>{1, -1}));
  EXPECT_EQ(slopes<Tanh>(x), (std::vector<double>{0, 0}));
  for (const std::vector<double>& y : {values<Gelu>(x), values<Silu>(x)}) {
    EXPECT_EQ(y[0], kInf);
    EXPECT_TRUE(std::isnan(y[1]));
  }
}

// In f32 (each element computed in double, then rounded) the result is the exact value rounded
// to a float, but where the exact value is within the double computation's error of a tie.
template <class F>
void expect_rounded(Expected (*exact)(double)) {
  testing::Rng rng(11);
  const unsigned n = testing::scaled_cases(300'000);
  std::vector<float> x(n), g(n), y(n), dx(n);
  for (unsigned i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::normal_distribution<double>(0, i % 3 == 0 ? 1 : i % 3 == 1 ? 8 : 30)(rng));
    g[i] = static_cast<float>(std::normal_distribution<double>(0, 1)(rng));
  }
  forward<F>(x.data(), y.data(), n);
  backward<F>(g.data(), x.data(), dx.data(), n);
  const auto rounded = [](float got, Exact value, Exact scale) {
    const float nearest = static_cast<float>(value);
    if (got == nearest) return true;
    const Exact tie = (static_cast<Exact>(got) + nearest) / 2;
    return std::nextafter(got, nearest) == nearest && std::fabs(value - tie) <= 8 * kUlp * scale;
  };
  for (unsigned i = 0; i < n; ++i) {
    const Expected want = exact(x[i]);
    ASSERT_TRUE(rounded(y[i], want.value, want.value_scale)) << F::name << "(" << x[i] << ") = " << y[i];
    ASSERT_TRUE(rounded(dx[i], g[i] * want.slope, std::fabs(g[i]) * want.slope_scale))
        << g[i] << " " << F::name << "'(" << x[i] << ") = " << dx[i];
  }
}

Expected exact_exp(double x) {
  const Exact e = std::exp(static_cast<Exact>(x));
  return {e, e, e, e};
}

TEST(ActivationKernels, F32ResultsAreTheExactValuesRounded) {
  expect_rounded<Gelu>(exact_gelu);
  expect_rounded<Silu>(exact_silu);
  expect_rounded<Tanh>(exact_tanh);
  expect_rounded<Exp>(exact_exp);
}

// swiglu's forward, silu(x) z, is the backward's loop with the value for the slope.
TEST(ActivationKernels, GatedIsTheValueTimesTheGate) {
  const std::vector<double> x = random_points(3, 1000), z = random_points(4, 1000);
  std::vector<double> y(x.size());
  gated<Silu>(x.data(), z.data(), y.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(ulps_apart(y[i], Silu::value(x[i]) * z[i]), 0) << x[i];
}

}  // namespace
}  // namespace shardmm::autodiff::kernels
