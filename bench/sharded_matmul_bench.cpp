// Case 1 of the Scaling Book (no communication) on in-process ranks against the physical limit:
// one OpenBLAS GEMM of the same total size on the same cores, measured in the same run.
//
//   build/bench/sharded_matmul_bench [--ranks 2] [--sizes 512,1024,2048,4096] [--dtype f32] [--repeat 7]
//
// Sharded: A[I_X, J] @ B[J, K] -> C[I_X, K] on mesh X=ranks, every rank a thread running a
// single-threaded GEMM on its block. Reference: C = A @ B as one GEMM with `ranks` OpenBLAS
// threads. Both are medians of --repeat runs after one warm-up; ratio = reference time /
// sharded time (1.0 = as fast as the single GEMM).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/runner.h"
#include "shardmm/runtime/tensor.h"

namespace {

using namespace shardmm;

template <class T>
double single_gemm_time(std::int64_t n, int threads, int repeat) {
  std::vector<T> a(static_cast<std::size_t>(n * n), T(0.5)), b(a), c(a);
  blas::set_threads(threads);
  std::vector<double> times;
  for (int r = 0; r <= repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    blas::gemm(false, false, n, n, n, T(1), a.data(), n, b.data(), n, T(0), c.data(), n);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) times.push_back(t);  // the first run is the warm-up
  }
  return median(times);
}

constexpr const char* kUsage =
    "usage: sharded_matmul_bench [--ranks N] [--sizes a,b,c] [--dtype f32|f64] [--repeat N]\n"
    "Case 1 of the Scaling Book, A[I_X, J] @ B[J, K] -> C[I_X, K] on mesh X=ranks (default 2; no communication),\n"
    "each rank a thread with a single-threaded GEMM, against one OpenBLAS GEMM of the same size with\n"
    "`ranks` threads, at N = each of --sizes (512,1024,2048,4096); medians of --repeat (7) runs after a\n"
    "warm-up, ratio = GEMM time / sharded time. Exit 2 on a bad flag.\n";

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, repeat = 7;
  std::vector<std::int64_t> sizes = {512, 1024, 2048, 4096};
  std::string dtype_text = "f32";
  const std::optional<int> stop = bench::parse_flags("sharded_matmul_bench", kUsage, [&] {
    bench::FlagReader flags(argc, argv);
    for (std::string flag; flags.next(flag);) {
      if (flag == "--ranks") ranks = flags.count(1);
      else if (flag == "--sizes") sizes = flags.wholes(1);
      else if (flag == "--dtype") dtype_text = flags.value();
      else if (flag == "--repeat") repeat = flags.count(1);
      else flags.unknown("--ranks --sizes --dtype --repeat");
    }
  });
  if (stop) return *stop;
  try {
    const DType dtype = parse_dtype(dtype_text);
    const Mesh mesh = Mesh::parse("X=" + std::to_string(ranks));
    const Contraction c = parse_contraction("A[I_X, J] @ B[J, K] -> C[I_X, K]", mesh);
    std::printf("case 1 on %d in-process ranks vs one %d-thread OpenBLAS GEMM, %s, median of %d\n", ranks, ranks,
                to_string(dtype), repeat);
    std::printf("%8s %14s %14s %12s %12s %8s %9s\n", "n", "gemm (s)", "sharded (s)", "gemm GF/s", "shard GF/s", "ratio",
                "verified");
    for (std::int64_t n : sizes) {
      const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      const double reference =
          dtype == DType::f32 ? single_gemm_time<float>(n, ranks, repeat) : single_gemm_time<double>(n, ranks, repeat);
      PlanOptions opt;
      opt.dtype = dtype;
      opt.hw = builtin_profile("h100");
      const DimSizes sizes_map = {{"I", n}, {"J", n}, {"K", n}};
      const MatmulPlanning p = plan_matmul(mesh, c, sizes_map, opt);
      RunRequest req;
      req.mesh = mesh;
      req.plan = p.candidates.at(static_cast<std::size_t>(p.chosen));
      req.sizes = sizes_map;
      req.dtype = dtype;
      req.contraction = &c;
      req.repeat = repeat;
      req.verify = n <= 2048;  // the f64 reference costs a GEMM of its own; skip it for the largest
      const RunReport r = run_plan(req);
      std::printf("%8lld %14.6f %14.6f %12.1f %12.1f %8.3f %9s\n", static_cast<long long>(n), reference,
                  r.measured_time_s, flops / reference / 1e9, flops / r.measured_time_s / 1e9,
                  reference / r.measured_time_s,
                  !req.verify               ? "skipped"
                  : r.verification.verified ? "yes"
                                            : "NO");
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_matmul_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
