// Planning is pure computation: a contraction on a 4-axis mesh of 8192 devices plans in
// milliseconds. Google Benchmark; run build/bench/planner_bench.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "shardmm/plan/planner.h"

namespace {

using namespace shardmm;

void plan_expression(benchmark::State& state, const char* mesh_text, const char* expr, const char* dims) {
  const Mesh mesh = Mesh::parse(mesh_text);
  const Contraction c = parse_contraction(expr, mesh);
  const DimSizes sizes = parse_dims(dims);
  PlanOptions opt;
  opt.hw = builtin_profile("tpu-v5p");
  std::size_t candidates = 0;
  for (auto _ : state) {
    const MatmulPlanning p = plan_matmul(mesh, c, sizes, opt);
    candidates = p.candidates.size();
    benchmark::DoNotOptimize(p.chosen);
  }
  state.counters["devices"] = static_cast<double>(mesh.device_count());
  state.counters["candidates"] = static_cast<double>(candidates);
}

// 8192 devices, every axis in play: data parallel over X, tensor parallel over Y and Z,
// the contracting dimension split over W.
void BM_Plan8192Devices(benchmark::State& state) {
  plan_expression(state, "X=16,Y=8,Z=8,W=8", "X[B_X, T, D_W] @ W[D_W, F_YZ] -> Y[B_X, T_W, F_YZ]",
                  "B=4096,T=2048,D=8192,F=32768");
}
BENCHMARK(BM_Plan8192Devices)->Unit(benchmark::kMillisecond);

// The Scaling Book's case 4 on the same mesh, no output requested: every choice is open.
void BM_Plan8192DevicesCase4(benchmark::State& state) {
  plan_expression(state, "X=16,Y=8,Z=8,W=8", "A[I_X, J_Y] @ B[J_Z, K_X]", "I=65536,J=8192,K=65536");
}
BENCHMARK(BM_Plan8192DevicesCase4)->Unit(benchmark::kMillisecond);

// What solve asks of the planner: the same op planned for many layouts of its operands, one
// PlannerMemo across them (fresh each iteration, so the sweep pays for its own misses), only
// the chosen plan built. 256 different operand pairs on the 8192 devices: x takes every way
// of giving each mesh axis to B, T, D or none, w a different one of D, F or none for each.
std::string spec_text(const char* tensor, const std::vector<std::string>& letters, int code, int base) {
  static const char* const axes[] = {"X", "Y", "Z", "W"};
  std::vector<std::string> subscripts(letters.size());
  for (int a = 0; a < 4; ++a, code /= base) {
    if (const int dim = code % base; dim < static_cast<int>(letters.size())) subscripts[dim] += axes[a];
  }
  std::string out = std::string(tensor) + "[";
  for (std::size_t d = 0; d < letters.size(); ++d) {
    out += (d ? ", " : "") + letters[d] + (subscripts[d].empty() ? "" : "_" + subscripts[d]);
  }
  return out + "]";
}
void BM_Plan8192DevicesEveryInputSpec(benchmark::State& state) {
  const Mesh mesh = Mesh::parse("X=16,Y=8,Z=8,W=8");
  const DimSizes sizes = parse_dims("B=4096,T=2048,D=8192,F=32768");
  std::vector<Contraction> ops;
  for (int x = 0; x < 256; ++x) {
    const std::string text = spec_text("X", {"B", "T", "D"}, x, 4) + " @ " + spec_text("W", {"D", "F"}, x * 7 % 81, 3) +
                             " -> Y[B_X, T_W, F_YZ]";
    ops.push_back(parse_contraction(text, mesh));
  }
  PlanOptions opt;
  opt.hw = builtin_profile("tpu-v5p");
  for (auto _ : state) {
    PlannerMemo memo;
    for (const Contraction& c : ops) {
      benchmark::DoNotOptimize(plan_matmul(mesh, c, sizes, opt, &memo, Candidates::serial).chosen);
    }
  }
  state.counters["ops"] = static_cast<double>(ops.size());
  // Seconds per op, printed with an SI prefix (u: microseconds).
  state.counters["s_per_op"] = benchmark::Counter(
      static_cast<double>(ops.size()), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Plan8192DevicesEveryInputSpec)->Unit(benchmark::kMillisecond);

void BM_Reshard8192Devices(benchmark::State& state) {
  const Mesh mesh = Mesh::parse("X=16,Y=8,Z=8,W=8");
  const Spec from = parse_spec("A[I_XY, J_Z]{U_W}", mesh), to = parse_spec("A[I_W, J_XYZ]", mesh);
  PlanOptions opt;
  opt.hw = builtin_profile("tpu-v5p");
  for (auto _ : state) benchmark::DoNotOptimize(plan_reshard(mesh, from, to, {1 << 20, 1 << 16}, opt).steps.size());
}
BENCHMARK(BM_Reshard8192Devices)->Unit(benchmark::kMillisecond);

// One exchange between two orders of the same axes: every device's block moves. Its bytes are
// sums over each device's group; costing them visits only the shards that meet the device's
// (about a step per device): the 256 x 256 mesh took 99.5 s pair by pair. `I` = 8
// leaves all but 8 devices empty, 2^20 gives every device a block.
void reshard_exchange(benchmark::State& state, const char* mesh_text, std::int64_t i) {
  const Mesh mesh = Mesh::parse(mesh_text);
  const Spec from = parse_spec("A[I_XY, J]", mesh), to = parse_spec("A[I_YX, J]", mesh);
  PlanOptions opt;
  opt.hw = builtin_profile("tpu-v5p");
  std::size_t steps = 0;
  for (auto _ : state) {
    const Plan p = plan_reshard(mesh, from, to, {i, 64}, opt);
    steps = p.steps.size();
    benchmark::DoNotOptimize(p.total_time_s);
  }
  state.counters["devices"] = static_cast<double>(mesh.device_count());
  state.counters["steps"] = static_cast<double>(steps);
}
void BM_Exchange8192Devices(benchmark::State& state) { reshard_exchange(state, "X=64,Y=128", 1 << 20); }
BENCHMARK(BM_Exchange8192Devices)->Unit(benchmark::kMillisecond);
void BM_Exchange65536Devices(benchmark::State& state) { reshard_exchange(state, "X=256,Y=256", 1 << 20); }
BENCHMARK(BM_Exchange65536Devices)->Unit(benchmark::kMillisecond);
void BM_Exchange65536DevicesMostlyEmpty(benchmark::State& state) { reshard_exchange(state, "X=256,Y=256", 8); }
BENCHMARK(BM_Exchange65536DevicesMostlyEmpty)->Unit(benchmark::kMillisecond);

// A contraction whose result's reshard may be one exchange, on 128 x 128 devices (13.5 s
// pair by pair).
void BM_PlanWithExchange16384Devices(benchmark::State& state) {
  plan_expression(state, "X=128,Y=128", "A[I_XY, J] @ B[J, K] -> C[I_YX, K]", "I=1048576,J=1024,K=1024");
}
BENCHMARK(BM_PlanWithExchange16384Devices)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
