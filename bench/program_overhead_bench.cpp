// What the program layer adds to a matmul: the same plan run as one op of a program (an
// executed autodiff tape: one Executor per step) and as `shardmm run` runs it (one Executor, its
// buffers kept between repeats). The tape records steps one at a time, so its plan has no
// collective matmul ring (autodiff::tape_plan): both run that plan.
//
//   build/bench/program_overhead_bench [--ranks 2] [--sizes 512,1024,2048] [--dtype f32] [--repeat 15]
//
// The four cases of the Scaling Book on mesh X=ranks (threads). Each repeat times both, one
// after the other, every rank lined up before each: the program's op and the kept Executor's run,
// each from the moment the last rank began it (the op's first step) to the moment the last one
// ended it, on the ranks' shared clock. From the last rank's start, not each rank's own: the
// program makes its leaves' values right before the op, which the ranks finish at different
// times on a busy machine (0.1-1.5 ms apart at n = 512, of 2-3 ms), and a rank waiting in the
// op's first collective for one still making its leaves is not the op's time; `run` lines its
// ranks up right before its op. A machine's drift then moves both alike: ratio = the median of
// the repeats' program / run, with the lowest and highest (issue 26's goal: at most 1.10). One
// warm-up repeat first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "bench_ranks.h"
#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"
#include "shardmm/runtime/executor.h"
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

struct Times {
  std::vector<double> program, run;  // seconds, per repeat
  std::vector<OpKind> program_steps;
};

Times time_both(const program::Graph& g, const nn::ProgramOptions& options, const Contraction& c, const Plan& plan,
                const DimSizes& sizes, int repeat) {
  Times times;
  run_backend("threads", g.mesh, [&](Communicator& comm) {
    bench::RankClock clock(comm);
    const std::int64_t me = comm.rank();
    // The program's own values of its leaves a and b (tensors 0 and 1).
    const DistTensor a =
        DistTensor::filled(g.mesh, me, c.a, global_shape(c.a, sizes), options.dtype, nn::leaf_values(g, 0, options));
    const DistTensor b =
        DistTensor::filled(g.mesh, me, c.b, global_shape(c.b, sizes), options.dtype, nn::leaf_values(g, 1, options));
    Executor kept(comm, plan, sizes, options.dtype);
    const auto seconds = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    for (int r = 0; r <= repeat; ++r) {
      const double built = seconds(std::chrono::steady_clock::now());  // the tape's clock starts as it is built
      autodiff::Tape tape(comm, {options.dtype, options.hw});
      clock.line_up();
      nn::record_program(tape, g, options);
      double first = 0, last = 0;
      bool any = false;
      for (const autodiff::TapeEvent& e : tape.events()) {
        if (e.scope != 0) continue;
        first = any ? std::min(first, e.measured.start_s) : e.measured.start_s;
        last = any ? std::max(last, e.measured.end_s) : e.measured.end_s;
        any = true;
        if (r == 0 && me == 0) times.program_steps.push_back(e.step.op);
      }
      const double program = clock.latest(built + last) - clock.latest(built + first);
      clock.line_up();
      const double start = seconds(std::chrono::steady_clock::now());
      kept.run(a, &b);
      const double end = seconds(std::chrono::steady_clock::now());
      const double run = clock.latest(end) - clock.latest(start);
      if (r > 0 && me == 0) {
        times.program.push_back(program);
        times.run.push_back(run);
      }
    }
  });
  return times;
}

constexpr const char* kUsage =
    "usage: program_overhead_bench [--ranks N] [--sizes a,b,c] [--dtype f32|f64] [--repeat N]\n"
    "The Scaling Book's four cases on mesh X=ranks (default 2, threads) at I = J = K = each of --sizes\n"
    "(512,1024,2048): the op's time as one op of a program (an executed tape) against the same plan run\n"
    "by one kept Executor as `shardmm run` does, alternating over --repeat (15) repeats after a warm-up;\n"
    "ratio = the median of the repeats' program / run, with its lowest and highest.\n"
    "Exit 2 on a bad flag, 1 when the two ran different steps.\n";

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, repeat = 15;
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
    std::printf("%-7s %6s %-62s %9s %9s %7s %s\n", "case", "n", "plan", "program", "run", "ratio", "range");
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
        const Contraction c = parse_contraction(std::string(k.a) + " @ " + k.b + " -> " + k.c, mesh);
        PlanOptions plan_options;
        plan_options.dtype = dtype;
        plan_options.hw = options.hw;
        const DimSizes sizes = {{"I", n}, {"J", n}, {"K", n}};
        const Plan plan = autodiff::tape_plan(mesh, c, sizes, plan_options);
        const Times t = time_both(g, options, c, plan, sizes, repeat);
        std::vector<OpKind> plan_steps;
        for (const Step& s : plan.steps) plan_steps.push_back(s.op);
        if (plan_steps != t.program_steps) {
          std::fprintf(stderr, "program_overhead_bench: %s at n = %lld: the program ran other steps than %s\n", k.name,
                       static_cast<long long>(n), plan.description.c_str());
          return 1;
        }
        std::vector<double> ratios;
        for (std::size_t r = 0; r < t.program.size(); ++r) ratios.push_back(t.program[r] / t.run[r]);
        std::printf("%-7s %6lld %-62s %9.3f %9.3f %7.3f %5.2f-%.2f\n", k.name, static_cast<long long>(n),
                    plan.description.c_str(), median(t.program) * 1e3, median(t.run) * 1e3, median(ratios),
                    *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "program_overhead_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
