// LocalEinsum for C[I,K] = A[I,J] @ B[J,K] against a direct blas::gemm of the same
// matrices, measured in the same run; prints GFLOP/s per benchmark and, at the end, the
// einsum/gemm ratio per size (the einsum's planning must cost nothing at run time: ~1).
//
//   build-*/bench/kernels_bench [--benchmark_repetitions=5]
//   OPENBLAS_NUM_THREADS=1 build-*/bench/kernels_bench   # one core, timed by CPU time
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <unistd.h>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/kernels.h"

namespace {

template <class T>
struct Operands {
  explicit Operands(std::int64_t n) : a(n * n), b(n * n), c(n * n) {
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<double> dist(-1, 1);
    for (T& x : a) x = static_cast<T>(dist(rng));
    for (T& x : b) x = static_cast<T>(dist(rng));
  }
  std::vector<T> a, b, c;
};

void set_rate(benchmark::State& state, std::int64_t n) {
  state.counters["GFLOP"] =
      benchmark::Counter(2e-9 * static_cast<double>(n * n * n), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void bm_gemm(benchmark::State& state, std::int64_t n) {
  Operands<T> x(n);
  for (auto _ : state) {
    shardmm::blas::gemm(false, false, n, n, n, T(1), x.a.data(), n, x.b.data(), n, T(0), x.c.data(), n);
    benchmark::DoNotOptimize(x.c.data());
    benchmark::ClobberMemory();
  }
  set_rate(state, n);
}

template <class T>
void bm_einsum(benchmark::State& state, std::int64_t n) {
  Operands<T> x(n);
  shardmm::LocalEinsum op({{"I", "J"}, {"J", "K"}, {"I", "K"}}, {{"I", n}, {"J", n}, {"K", n}},
                          sizeof(T) == 4 ? shardmm::DType::f32 : shardmm::DType::f64);
  if (op.workspace_bytes() != 0) state.SkipWithError("the plain matmul layout copied an operand");
  for (auto _ : state) {
    op.run(x.a.data(), x.b.data(), x.c.data());
    benchmark::DoNotOptimize(x.c.data());
    benchmark::ClobberMemory();
  }
  set_rate(state, n);
}

// The console table, plus each benchmark's best GFLOP/s over its repetitions for the
// ratios: on a shared machine the best run is the one least disturbed by other load.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(isatty(fileno(stdout)) ? OO_ColorTabular : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration && !run.error_occurred) {
        double& best = gflops[run.run_name.function_name];
        best = std::max(best, static_cast<double>(run.counters.at("GFLOP")));
      }
    }
  }
  std::map<std::string, double> gflops;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("blas_threads", std::to_string(shardmm::blas::threads()));
  using Bench = void (*)(benchmark::State&, std::int64_t);
  struct Kind {
    const char* dtype;
    Bench gemm, einsum;
  };
  const Kind kinds[] = {{"f32", bm_gemm<float>, bm_einsum<float>}, {"f64", bm_gemm<double>, bm_einsum<double>}};
  std::vector<std::string> keys;
  for (std::int64_t n : {1024, 2048}) {
    for (const Kind& kind : kinds) {
      const std::string key = std::string(kind.dtype) + "/" + std::to_string(n);
      keys.push_back(key);
      // Each einsum right after its gemm, so that both see the same machine state.
      for (auto [prefix, fn] : {std::pair{"gemm/", kind.gemm}, std::pair{"einsum/", kind.einsum}}) {
        auto* bench = benchmark::RegisterBenchmark((prefix + key).c_str(), fn, n);
        bench->Unit(benchmark::kMillisecond);
        // With one BLAS thread the benchmark thread's CPU time is all the work, and it
        // stays honest on a loaded machine; more threads need wall-clock time.
        if (shardmm::blas::threads() > 1) bench->UseRealTime();
      }
    }
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  for (const std::string& key : keys) {
    auto g = reporter.gflops.find("gemm/" + key);
    auto e = reporter.gflops.find("einsum/" + key);
    if (g == reporter.gflops.end() || e == reporter.gflops.end()) continue;
    std::printf("einsum/gemm %-8s %7.2f / %7.2f GFLOP/s = %.3f\n", key.c_str(), e->second, g->second,
                e->second / g->second);
  }
  return 0;
}
