// What the program layer adds to a matmul: the same plan run as one op of a program (an
// executed autodiff tape: one Executor per step, its result copied out) and as `shardmm run`
// runs it (run_plan: one Executor, its buffers kept between repeats). The tape records steps one
// at a time, so its plan has no collective matmul ring (autodiff::tape_plan): both run that.
//
//   build/bench/program_overhead_bench [--ranks 2] [--sizes 512,1024,2048] [--dtype f32] [--repeat 7]
//
// The four cases of the Scaling Book on mesh X=ranks (threads). Program: the op's span on each
// rank, from its first step's start to its last step's end, the slowest rank's; run: run_plan's
// measured time (first rank's start to last rank's finish). Both medians of --repeat after one
// warm-up. ratio = program / run (issue 26's goal: at most 1.10).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"
#include "shardmm/runtime/runner.h"

namespace {

using namespace shardmm;

struct Case {
  const char* name;
  const char* a;  // the operands' and the result's specs
  const char* b;
  const char* c;
};

// The Scaling Book's four cases, the result's layout each one's.
const Case kCases[] = {
    {"case 1", "a[I_X, J]", "b[J, K]", "c[I_X, K]"},
    {"case 2", "a[I, J_X]", "b[J, K]", "c[I, K]"},
    {"case 3", "a[I, J_X]", "b[J_X, K]", "c[I, K]"},
    {"case 4", "a[I_X, J]", "b[J, K_X]", "c[I_X, K]"},
};

// The op's span (its first step's start to its last's end) on each rank of each repeat, the
// slowest rank's, after one warm-up recording.
std::vector<double> program_times(const program::Graph& g, const nn::ProgramOptions& options, int repeat,
                                  std::vector<OpKind>& steps) {
  std::vector<double> times;
  run_backend("threads", g.mesh, [&](Communicator& comm) {
    AxisList all;
    for (int a = 0; a < g.mesh.rank(); ++a) all.push_back(a);
    for (int r = 0; r <= repeat; ++r) {
      autodiff::Tape tape(comm, {options.dtype, options.hw});
      double line_up = 0;  // every rank starts the op together, as run_plan's repeats do
      comm.all_reduce(&line_up, 1, DType::f64, all);
      nn::record_program(tape, g, options);
      double first = 0, last = 0;
      bool any = false;
      for (const autodiff::TapeEvent& e : tape.events()) {
        if (e.scope != 0) continue;
        first = any ? std::min(first, e.measured.start_s) : e.measured.start_s;
        last = any ? std::max(last, e.measured.end_s) : e.measured.end_s;
        any = true;
        if (r == 0 && comm.rank() == 0) steps.push_back(e.step.op);
      }
      double span = last - first;
      comm.all_reduce(&span, 1, DType::f64, all, ReduceOp::max);
      if (r > 0 && comm.rank() == 0) times.push_back(span);
    }
  });
  return times;
}

constexpr const char* kUsage =
    "usage: program_overhead_bench [--ranks N] [--sizes a,b,c] [--dtype f32|f64] [--repeat N]\n"
    "The Scaling Book's four cases on mesh X=ranks (default 2, threads) at I = J = K = each of --sizes\n"
    "(512,1024,2048): the op's time run as one op of a program (an executed tape) against the same steps\n"
    "run as `shardmm run` runs a plan; medians of --repeat (7) after a warm-up, ratio = program / run.\n"
    "Exit 2 on a bad flag, 1 when the two ran different steps, 3 when the run's result is wrong.\n";

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, repeat = 7;
  std::vector<std::int64_t> sizes = {512, 1024, 2048};
  std::string dtype_text = "f32";
  const std::optional<int> stop = bench::parse_flags("program_overhead_bench", kUsage, [&] {
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
    std::printf("%d in-process ranks, %s, median of %d; times in ms\n", ranks, to_string(dtype), repeat);
    std::printf("%-7s %6s %-48s %10s %10s %7s\n", "case", "n", "plan", "program", "run", "ratio");
    for (const Case& k : kCases) {
      for (std::int64_t n : sizes) {
        const std::string dims =
            "dims I=" + std::to_string(n) + ", J=" + std::to_string(n) + ", K=" + std::to_string(n);
        const std::string text = "mesh " + mesh.to_string() + "\n" + dims + "\ninput a[I, J] : " + k.a +
                                 "\ninput b[J, K] : " + k.b + "\nc[I, K] = a @ b : " + k.c + "\n";
        const program::Graph g = program::bind(program::parse_program(text, k.name), {});
        nn::ProgramOptions options;
        options.dtype = dtype;
        options.train = false;
        std::vector<OpKind> program_steps;
        const std::vector<double> program = program_times(g, options, repeat, program_steps);

        const Contraction c = parse_contraction(std::string(k.a) + " @ " + k.b + " -> " + k.c, mesh);
        PlanOptions plan_options;
        plan_options.dtype = dtype;
        plan_options.hw = options.hw;
        RunRequest req;
        req.mesh = mesh;
        req.sizes = {{"I", n}, {"J", n}, {"K", n}};
        req.plan = autodiff::tape_plan(mesh, c, req.sizes, plan_options);
        req.dtype = dtype;
        req.contraction = &c;
        req.repeat = repeat;
        std::vector<OpKind> run_steps;
        for (const Step& s : req.plan.steps) run_steps.push_back(s.op);
        if (run_steps != program_steps) {
          std::fprintf(stderr, "program_overhead_bench: %s at n = %lld: the program ran other steps than %s\n", k.name,
                       static_cast<long long>(n), req.plan.description.c_str());
          return 1;
        }
        const RunReport r = run_plan(req);
        if (!r.verification.verified) {
          std::fprintf(stderr, "program_overhead_bench: %s at n = %lld: the run gave a wrong C\n", k.name,
                       static_cast<long long>(n));
          return 3;
        }
        const double program_median = median(program);
        std::printf("%-7s %6lld %-48s %10.3f %10.3f %7.3f\n", k.name, static_cast<long long>(n),
                    req.plan.description.c_str(), program_median * 1e3, r.measured_time_s * 1e3,
                    program_median / r.measured_time_s);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "program_overhead_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
