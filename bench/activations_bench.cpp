// The activation kernels (src/autodiff/activation_kernels.h) against the same functions through
// libm, element by element (std::tanh and std::exp in double, as the dense references compute
// them and as the runtime did before 2026-12-05), measured in the same run: nanoseconds per
// element of gelu, silu, tanh and exp, forward (y = f(x)) and backward (dx = g f'(x)), in f32
// and f64, on blocks of 2M elements drawn from normal distributions of scale 1, 8 and 30. The
// summary gives, per point, the median over the repetitions with its range, and libm / kernel.
//
//   build/bench/activations_bench [--benchmark_filter=gelu]   # 5 repetitions of each
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "autodiff/activation_kernels.h"
#include "shardmm/nn/reference.h"

namespace {

namespace kernels = shardmm::autodiff::kernels;
namespace nn = shardmm::nn;

constexpr std::int64_t kElements = std::int64_t{1} << 21;
constexpr double kScales[] = {1, 8, 30};

// The libm side: each function's value and slope as the dense reference computes them.
template <class F>
double libm_value(double x);
template <class F>
double libm_slope(double x);
template <>
double libm_value<kernels::Gelu>(double x) {
  return nn::activate(nn::Activation::gelu, x);
}
template <>
double libm_slope<kernels::Gelu>(double x) {
  return nn::activate_grad(nn::Activation::gelu, x);
}
template <>
double libm_value<kernels::Silu>(double x) {
  return nn::activate(nn::Activation::silu, x);
}
template <>
double libm_slope<kernels::Silu>(double x) {
  return nn::activate_grad(nn::Activation::silu, x);
}
template <>
double libm_value<kernels::Tanh>(double x) {
  return std::tanh(x);
}
template <>
double libm_slope<kernels::Tanh>(double x) {
  const double t = std::tanh(x);
  return 1 - t * t;
}
template <>
double libm_value<kernels::Exp>(double x) {
  return std::exp(x);
}
template <>
double libm_slope<kernels::Exp>(double x) {
  return std::exp(x);
}

template <class T>
struct Blocks {
  explicit Blocks(double scale) : x(kElements), g(kElements), y(kElements) {
    std::mt19937_64 rng(1);
    std::normal_distribution<double> normal(0, scale), unit(0, 1);
    for (T& v : x) v = static_cast<T>(normal(rng));
    for (T& v : g) v = static_cast<T>(unit(rng));
  }
  std::vector<T> x, g, y;
};

template <class F, class T>
void run(Blocks<T>& b, bool libm, bool backward) {
  if (libm) {
    for (std::int64_t i = 0; i < kElements; ++i) {
      b.y[i] = static_cast<T>(backward ? b.g[i] * libm_slope<F>(b.x[i]) : libm_value<F>(b.x[i]));
    }
  } else if (backward) {
    kernels::backward<F>(b.g.data(), b.x.data(), b.y.data(), kElements);
  } else {
    kernels::forward<F>(b.x.data(), b.y.data(), kElements);
  }
}

template <class F, class T>
void bm_activation(benchmark::State& state, bool libm, bool backward, double scale) {
  Blocks<T> blocks(scale);
  for (auto _ : state) {
    run<F>(blocks, libm, backward);
    benchmark::DoNotOptimize(blocks.y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

// (function, direction, dtype, scale) -> the repetitions' ns per element, kernel and libm.
using Point = std::tuple<std::string, std::string, std::string, double>;
struct Samples {
  std::vector<double> kernel, libm;
};

template <class F, class T>
void register_function(std::map<std::string, Point>& points) {
  const std::string dtype = sizeof(T) == 4 ? "f32" : "f64";
  for (const bool backward : {false, true}) {
    for (const double scale : kScales) {
      for (const bool libm : {false, true}) {
        const std::string direction = backward ? "backward" : "forward";
        const std::string name = std::string(F::name) + "/" + direction + "/" + dtype +
                                 "/scale:" + std::to_string(static_cast<int>(scale)) + (libm ? "/libm" : "/kernel");
        benchmark::RegisterBenchmark(name.c_str(), bm_activation<F, T>, libm, backward, scale)
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.05)
            ->Repetitions(5);
        points[name] = {F::name, direction, dtype, scale};
      }
    }
  }
}

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(std::map<std::string, Point> points) : points_(std::move(points)) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const std::string name = run.run_name.function_name;
      const auto point = points_.find(name);
      if (point == points_.end()) continue;
      const double ns = 1e9 / static_cast<double>(run.counters.at("items_per_second"));
      Samples& s = samples_[point->second];
      (name.ends_with("/libm") ? s.libm : s.kernel).push_back(ns);
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-5s %-9s %-5s %5s  %-22s %-22s %s\n", "f", "direction", "dtype", "scale", "kernel ns/element",
                "libm ns/element", "libm/kernel");
    for (auto& [point, s] : samples_) {
      if (s.kernel.empty() || s.libm.empty()) continue;
      const auto [f, direction, dtype, scale] = point;
      std::printf("%-5s %-9s %-5s %5.0f  %-22s %-22s %.1f\n", f.c_str(), direction.c_str(), dtype.c_str(), scale,
                  summary(s.kernel).c_str(), summary(s.libm).c_str(), median(s.libm) / median(s.kernel));
    }
  }

 private:
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  // "median (min-max)"
  static std::string summary(const std::vector<double>& v) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2f (%.2f-%.2f)", median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return text;
  }
  std::map<std::string, Point> points_;
  std::map<Point, Samples> samples_;
};

template <class T>
void register_dtype(std::map<std::string, Point>& points) {
  register_function<kernels::Gelu, T>(points);
  register_function<kernels::Silu, T>(points);
  register_function<kernels::Tanh, T>(points);
  register_function<kernels::Exp, T>(points);
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, Point> points;
  register_dtype<float>(points);
  register_dtype<double>(points);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  SummaryReporter reporter(std::move(points));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
