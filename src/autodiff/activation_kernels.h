// The activations' element kernels (relu, gelu, silu, tanh, exp): value and slope in double,
// by branch-free formulas whose time does not depend on the values and which the compiler
// vectorizes: 3.8-20 times the speed of libm's std::tanh and std::exp element by element
// (docs/benchmarks.md, "Activations: kernels vs libm"), which branch on the argument's range,
// so that their time on a step's values could differ from the calibration's. Accuracy (tests/autodiff/activation_kernels_test.cpp): tanh
// and exp within 1 ulp of the exact value rounded (3 of glibc's tanh, 1 of its exp) over the
// whole range, inf and nan as they give them; gelu, silu and the slopes within 4 ulps of their
// terms' magnitudes; an f32 result, rounded from these, the exact value rounded (but next to a
// tie). The dense references (nn/reference.cpp, nn/program_reference.cpp) keep std::. Private
// to the autodiff layer.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace shardmm::autodiff::kernels {

namespace detail {

// (x + kRound) - kRound is x rounded to an integer, for |x| < 2^51.
constexpr double kRound = 0x1.8p52;

inline double round_to_integer(double x) { return (x + kRound) - kRound; }

// 2^k for an integer k in [-1022, 1023]: k + 1023 placed in the exponent's bits. The sum's low
// 12 bits are k + 1023 (kRound's are zero).
inline double pow2(double k) { return std::bit_cast<double>(std::bit_cast<std::uint64_t>(k + (kRound + 1023)) << 52); }

// exp(x) = 2^k exp(r) with k = round(x / ln 2) and r = x - k ln 2 = hi - lo, ln 2 in two parts
// so that k * kLn2Hi is exact (Cody and Waite). exp(r), |r| <= ln 2 / 2, by fdlibm's e_exp.c:
// a rational function of r whose error is below 1 ulp.
struct ReducedExp {
  double k, exp_r;
};

inline ReducedExp reduce_exp(double x) {
  constexpr double kInvLn2 = 0x1.71547652b82fep0, kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  constexpr double kP1 = 1.66666666666666019037e-01, kP2 = -2.77777777770155933842e-03,
                   kP3 = 6.61375632143793436117e-05, kP4 = -1.65339022054652515390e-06,
                   kP5 = 4.13813679705723846039e-08;
  const double k = round_to_integer(x * kInvLn2);
  const double hi = x - k * kLn2Hi, lo = k * kLn2Lo;
  const double r = hi - lo, r2 = r * r;
  const double c = r - r2 * (kP1 + r2 * (kP2 + r2 * (kP3 + r2 * (kP4 + r2 * kP5))));
  return {k, 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)};
}

// exp(x) for x <= 0, and 0 where that is below the normal doubles (x < -708): no subnormal
// result, which costs some CPUs a microcode assist per element. nan stays nan.
inline double exp_nonpositive(double x) {
  constexpr double kLowest = -708.0;  // exp(-708) = 3.3e-308, normal
  const ReducedExp e = reduce_exp(x < kLowest ? kLowest : x);
  const double y = e.exp_r * pow2(e.k);
  return x < kLowest ? 0.0 : y;
}

// The logistic function s = 1 / (1 + exp(-x)) and 1 - s, each without cancellation: with
// e = exp(-|x|) <= 1 they are 1 / (1 + e) and e / (1 + e), in either order.
struct Logistic {
  double s, one_minus_s;
};

inline Logistic logistic(double x) {
  const double e = exp_nonpositive(-std::abs(x));
  const double whole = 1.0 / (1.0 + e), part = e * whole;
  return x < 0 ? Logistic{part, whole} : Logistic{whole, part};
}

// tanh(x) and 1 - tanh(x)^2. On |x| <= 0.625 Cephes' rational approximation (peak error
// 2.5e-16); beyond, (1 - e) / (1 + e) with e = exp(-2|x|), and 1 - t^2 = 4e / (1 + e)^2 rather
// than the difference, which cancels. Computed on |x|, the sign put back last (tanh(-0) = -0).
struct TanhParts {
  double t, one_minus_t2;
};

inline TanhParts tanh_parts(double x) {
  constexpr double kP0 = -9.64399179425052238628e-1, kP1 = -9.92877231001918586564e1, kP2 = -1.61468768441708447952e3;
  constexpr double kQ0 = 1.12811678491632931402e2, kQ1 = 2.23548839060100448583e3, kQ2 = 4.84406305325125486048e3;
  const double a = std::abs(x), s = a * a;
  const double near_zero = a + a * s * (((kP0 * s + kP1) * s + kP2) / (((s + kQ0) * s + kQ1) * s + kQ2));
  const double e = exp_nonpositive(-2.0 * a);
  const double inverse = 1.0 / (1.0 + e);
  const bool near = a <= 0.625;
  const double t = near ? near_zero : (1.0 - e) / (1.0 + e);
  return {std::copysign(t, x), near ? 1.0 - t * t : 4.0 * e * inverse * inverse};
}

}  // namespace detail

// exp(x) over the whole range: subnormal results (x < -708) and overflow to inf as std::exp.
// 2^k as two factors, each a normal double where 2^k is not; the first product is exact, so
// a subnormal result is rounded once.
inline double exp(double x) {
  x = x < -746.0 ? -746.0 : x;  // exp(-746) rounds to 0
  x = x > 710.0 ? 710.0 : x;    // and exp(710) to inf
  const detail::ReducedExp e = detail::reduce_exp(x);
  const double half = detail::round_to_integer(e.k * 0.5);
  return e.exp_r * detail::pow2(half) * detail::pow2(e.k - half);
}

inline double tanh(double x) { return detail::tanh_parts(x).t; }

// One struct per activation: its name, value and slope (the derivative), so that each kernel's
// loop is compiled for one function.
struct Relu {
  static constexpr const char* name = "relu";
  static double value(double x) { return x > 0 ? x : 0.0; }
  static double slope(double x) { return x > 0 ? 1.0 : 0.0; }
};

// The tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3). As
// 0.5 (1 + tanh(u)) is logistic(2u), gelu(x) = x s and its slope s + x s (1 - s) 2 du/dx,
// both free of the cancellation 1 + tanh(u) has for u << 0.
struct Gelu {
  static constexpr const char* name = "gelu";
  static constexpr double kC = 0.044715, kTwoSqrt2OverPi = 2 * 0.79788456080286535588;
  static double value(double x) { return x * detail::logistic(kTwoSqrt2OverPi * (x + kC * x * x * x)).s; }
  static double slope(double x) {
    const detail::Logistic l = detail::logistic(kTwoSqrt2OverPi * (x + kC * x * x * x));
    return l.s + x * (l.s * l.one_minus_s) * (kTwoSqrt2OverPi * (1.0 + 3.0 * kC * x * x));
  }
};

// x logistic(x); slope s (1 + x (1 - s)).
struct Silu {
  static constexpr const char* name = "silu";
  static double value(double x) { return x * detail::logistic(x).s; }
  static double slope(double x) {
    const detail::Logistic l = detail::logistic(x);
    return l.s * (1.0 + x * l.one_minus_s);
  }
};

struct Tanh {
  static constexpr const char* name = "tanh";
  static double value(double x) { return detail::tanh_parts(x).t; }
  static double slope(double x) { return detail::tanh_parts(x).one_minus_t2; }
};

struct Exp {
  static constexpr const char* name = "exp";
  static double value(double x) { return kernels::exp(x); }
  static double slope(double x) { return kernels::exp(x); }
};

// The loops, one per activation and element type (activation_kernels.cpp, where the compiler
// vectorizes them), each element computed in double: y = f(x), dx = g f'(x), and swiglu's
// y = f(x) z.
template <class F, class T>
void forward(const T* x, T* y, std::int64_t n);
template <class F, class T>
void backward(const T* g, const T* x, T* dx, std::int64_t n);
template <class F, class T>
void gated(const T* x, const T* z, T* y, std::int64_t n);

}  // namespace shardmm::autodiff::kernels
