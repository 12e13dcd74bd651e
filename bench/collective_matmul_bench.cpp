// How much of the communication a collective matmul hides (docs/collective-matmul.md).
//
//   build/bench/collective_matmul_bench [--kind gather|panel|scatter] [--backend threads] [--ranks 2]
//                                       [--rows 32,128,512,2048] [--inner 1024] [--contracted N]
//                                       [--repeat 7] [--rounds 3] [--dtype f32]
//   mpirun -n 2 build/bench/collective_matmul_bench --backend mpi
//
// On mesh X=ranks, K = --inner, J = --contracted (default --inner), I = each --rows:
//   gather   FSDP, A[I_X, J] @ B[J, K_X] -> C[I_X, K]: the weight B is gathered
//   panel    1-D pdgemm, A[I_X, J] @ B[J_X, K] -> C[I_X, K]: B's contracted J is gathered, each
//            arriving panel B[J_m, K] times A's columns J_m added into C (SUMMA's panel loop)
//   scatter  Megatron's row-parallel layer with a sequence-sharded output,
//            A[I, J_X] @ B[J_X, K] -> C[I_X, K]: the partial sums of C are reduce-scattered
// Four runs, all in this process, medians over --rounds rounds of --repeat timed runs each
// (the rounds interleave the four, so load that drifts hits them alike):
//   overlapped  the collective matmul plan (all_gather_einsum / einsum_reduce_scatter)
//   serialized  the collective, then the einsum, or the einsum, then the collective
//   compute     the einsum alone (B already gathered / C left as partial sums)
//   comm        the collective alone (a reshard of B or of the partial sums of C)
// and the OSU overlap fraction max(0, 1 - (overlapped - compute) / comm): 1 when the
// collective is fully hidden behind the compute, 0 when it is not hidden at all. Noise can
// put the overlapped run below the compute alone; the fraction is then shown as 100%.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "bench_flags.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/runner.h"

namespace {

using namespace shardmm;

constexpr const char* kUsage =
    "usage: collective_matmul_bench [--kind gather|panel|scatter] [--backend threads|mpi] [--ranks N]\n"
    "                               [--rows a,b,c] [--inner N] [--contracted N] [--repeat N] [--rounds N]\n"
    "                               [--dtype f32|f64]\n"
    "       mpirun -n 2 collective_matmul_bench --backend mpi ...\n"
    "How much of the communication a collective matmul hides: on mesh X=ranks (default 2), K = --inner\n"
    "(1024), J = --contracted (default --inner), I = each of --rows (32,128,512,2048):\n"
    "  gather   FSDP, A[I_X, J] @ B[J, K_X] -> C[I_X, K] (B is gathered)\n"
    "  panel    A[I_X, J] @ B[J_X, K] -> C[I_X, K] (B's contracted J is gathered, panel by panel)\n"
    "  scatter  A[I, J_X] @ B[J_X, K] -> C[I_X, K] (the partial sums of C are reduce-scattered)\n"
    "The overlapped plan, the serialized one, the einsum alone and the collective alone, medians over\n"
    "--rounds (3) rounds of --repeat (7) timed runs, and the overlap fraction\n"
    "max(0, 1 - (overlapped - compute) / comm). Exit 2 on a bad flag, 3 when a result is wrong.\n";

// Each --kind: its name in the printout and the sharded contraction it times.
struct Kind {
  const char* name;
  const char* title;
  const char* contraction;
};
constexpr Kind kKinds[] = {{"gather", "FSDP", "A[I_X, J] @ B[J, K_X] -> C[I_X, K]"},
                           {"panel", "panel", "A[I_X, J] @ B[J_X, K] -> C[I_X, K]"},
                           {"scatter", "row-parallel", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]"}};

const Plan& candidate(const MatmulPlanning& p, const std::vector<OpKind>& ops) {
  if (const Plan* plan = find_candidate(p, ops)) return *plan;
  throw std::runtime_error("no candidate with the expected steps");
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, repeat = 7, rounds = 3;
  std::int64_t inner = 1024, contracted = 0;
  std::vector<std::int64_t> row_counts = {32, 128, 512, 2048};
  std::string dtype_text = "f32", backend = "threads", kind = "gather";
  const std::optional<int> stop = bench::parse_flags("collective_matmul_bench", kUsage, [&] {
    bench::FlagReader flags(argc, argv);
    for (std::string flag; flags.next(flag);) {
      if (flag == "--ranks") ranks = flags.count(2);
      else if (flag == "--rows") row_counts = flags.wholes(1);
      else if (flag == "--inner") inner = flags.whole(1);
      else if (flag == "--contracted") contracted = flags.whole(1);
      else if (flag == "--repeat") repeat = flags.count(1);
      else if (flag == "--rounds") rounds = flags.count(1);
      else if (flag == "--dtype") dtype_text = flags.value();
      else if (flag == "--backend") backend = flags.value();
      else if (flag == "--kind") kind = flags.value();
      else flags.unknown("--kind --backend --ranks --rows --inner --contracted --repeat --rounds --dtype");
    }
  });
  if (stop) return *stop;
  try {
    const DType dtype = parse_dtype(dtype_text);
    if (contracted == 0) contracted = inner;
    const auto chosen =
        std::find_if(std::begin(kKinds), std::end(kKinds), [&](const Kind& k) { return k.name == kind; });
    if (chosen == std::end(kKinds)) throw InputError("--kind " + kind + ": gather, panel or scatter");
    const bool gather = kind != "scatter";
    const bool root = process_rank(backend) == 0;
    const Mesh mesh = Mesh::parse("X=" + std::to_string(ranks));
    // The sharded contraction, the same one with the collective done beforehand (gather) or
    // left undone (scatter), and the collective alone as a reshard.
    const Contraction fused = parse_contraction(chosen->contraction, mesh);
    const Contraction local =
        parse_contraction(gather ? "A[I_X, J] @ B[J, K] -> C[I_X, K]" : "A[I, J_X] @ B[J_X, K] -> C[I, K]{U_X}", mesh);
    const Spec comm_from = gather ? fused.b : *local.out, comm_to = gather ? local.b : *fused.out;
    const OpKind ring = gather ? OpKind::all_gather_einsum : OpKind::einsum_reduce_scatter;
    const std::vector<OpKind> serial = gather ? std::vector<OpKind>{OpKind::all_gather, OpKind::einsum}
                                              : std::vector<OpKind>{OpKind::einsum, OpKind::reduce_scatter};
    PlanOptions opt;
    opt.dtype = dtype;
    opt.hw = builtin_profile("h100");
    if (root) {
      std::printf("%s %s, J = %lld, K = %lld, %d ranks on %s, %s; medians of %d x %d runs\n", chosen->title,
                  format_contraction(fused, mesh).c_str(), static_cast<long long>(contracted),
                  static_cast<long long>(inner), ranks, backend.c_str(), to_string(dtype), rounds, repeat);
      std::printf("%7s %12s %12s %12s %12s %9s %9s %8s %9s\n", "I", "overlap (s)", "serial (s)", "compute (s)",
                  "comm (s)", "hidden", "ser/ovl", "comp/comm", "verified");
    }
    bool all_verified = true;
    for (std::int64_t rows : row_counts) {
      const DimSizes sizes = {{"I", rows}, {"J", contracted}, {"K", inner}};
      const MatmulPlanning p = plan_matmul(mesh, fused, sizes, opt);
      const MatmulPlanning q = plan_matmul(mesh, local, sizes, opt);
      RunRequest base;
      base.backend = backend;
      base.mesh = mesh;
      base.sizes = sizes;
      base.dtype = dtype;
      base.repeat = repeat;
      base.check = false;  // the check mode's extra messages are not what is measured
      RunRequest overlapped = base, serialized = base, compute = base, comm = base;
      overlapped.plan = candidate(p, {ring});
      overlapped.contraction = &fused;
      serialized.plan = candidate(p, serial);
      serialized.contraction = &fused;
      compute.plan = candidate(q, {OpKind::einsum});
      compute.contraction = &local;
      comm.plan = plan_reshard(mesh, comm_from, comm_to, {gather ? contracted : rows, inner}, opt);
      comm.reshard_from = &comm_from;
      std::vector<double> t[4];
      bool verified = true;
      for (int round = 0; round < rounds; ++round) {
        int k = 0;
        for (RunRequest* req : {&overlapped, &serialized, &compute, &comm}) {
          req->verify = round == 0;  // once each; the timed runs are the same every round
          const RunReport r = run_plan(*req);
          verified = verified && r.verification.verified;
          t[k].insert(t[k].end(), r.repeat_times_s.begin(), r.repeat_times_s.end());
          ++k;
        }
      }
      all_verified = all_verified && verified;
      if (!root) continue;
      const double ovl = median(t[0]), ser = median(t[1]), cmp = median(t[2]), com = median(t[3]);
      const double hidden = std::clamp(1 - (ovl - cmp) / com, 0.0, 1.0);
      std::printf("%7lld %12.6f %12.6f %12.6f %12.6f %8.0f%% %9.3f %8.2f %9s\n", static_cast<long long>(rows), ovl, ser,
                  cmp, com, 100 * hidden, ser / ovl, cmp / com, verified ? "yes" : "NO");
      std::fflush(stdout);
    }
    if (!all_verified) {
      std::fprintf(stderr, "collective_matmul_bench: a plan's result did not match the dense reference\n");
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_matmul_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
