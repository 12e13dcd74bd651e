// How much of the weight gather a collective matmul hides (docs/collective-matmul.md).
//
//   build/bench/collective_matmul_bench [--backend threads] [--ranks 2] [--rows 32,128,512,2048]
//                                       [--inner 1024] [--repeat 7] [--rounds 3] [--dtype f32]
//   mpirun -n 2 build/bench/collective_matmul_bench --backend mpi
//
// FSDP on mesh X=ranks: A[I_X, J] @ B[J, K_X] -> C[I_X, K], J = K = --inner, I = each --rows.
// Four runs, all in this process, medians over --rounds rounds of --repeat timed runs each
// (the rounds interleave the four, so load that drifts hits them alike):
//   overlapped  the all_gather_einsum plan (B's shards travel round the ring between GEMMs)
//   serialized  all_gather B, then the einsum (the plan the ring replaces)
//   compute     the einsum alone, B already gathered: A[I_X, J] @ B[J, K] -> C[I_X, K]
//   comm        the all_gather of B alone (a reshard B[J, K_X] -> B[J, K])
// and the OSU overlap fraction max(0, 1 - (overlapped - compute) / comm): 1 when the
// gather is fully hidden behind the compute, 0 when it is not hidden at all. Noise can put
// the overlapped run below the compute alone; the fraction is then shown as 100%.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/runner.h"

namespace {

using namespace shardmm;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::int64_t> parse_list(const std::string& text) {
  std::vector<std::int64_t> out;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(std::stoll(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

// The candidate whose steps are exactly `ops`.
const Plan& candidate(const MatmulPlanning& p, const std::vector<OpKind>& ops) {
  for (const Plan& plan : p.candidates) {
    std::vector<OpKind> have;
    for (const Step& s : plan.steps) have.push_back(s.op);
    if (have == ops) return plan;
  }
  throw std::runtime_error("no candidate with the expected steps");
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, repeat = 7, rounds = 3;
  std::int64_t inner = 1024;
  std::string rows_text = "32,128,512,2048", dtype_text = "f32", backend = "threads";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") ranks = std::atoi(argv[i + 1]);
    else if (flag == "--rows") rows_text = argv[i + 1];
    else if (flag == "--inner") inner = std::atoll(argv[i + 1]);
    else if (flag == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (flag == "--dtype") dtype_text = argv[i + 1];
    else if (flag == "--backend") backend = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "unknown flag %s; flags: --backend threads|mpi --ranks N --rows a,b,c --inner N --repeat N "
                   "--rounds N --dtype f32|f64\n",
                   argv[i]);
      return 2;
    }
  }
  try {
    const DType dtype = parse_dtype(dtype_text);
    if (ranks < 2 || repeat < 1 || rounds < 1 || inner < 1) {
      throw InputError("--ranks must be at least 2, --repeat, --rounds and --inner at least 1");
    }
    const bool root = process_rank(backend) == 0;
    const Mesh mesh = Mesh::parse("X=" + std::to_string(ranks));
    const Contraction fsdp = parse_contraction("A[I_X, J] @ B[J, K_X] -> C[I_X, K]", mesh);
    const Contraction gathered = parse_contraction("A[I_X, J] @ B[J, K] -> C[I_X, K]", mesh);
    PlanOptions opt;
    opt.dtype = dtype;
    opt.hw = builtin_profile("h100");
    if (root) {
      std::printf("FSDP A[I_X, J] @ B[J, K_X] -> C[I_X, K], J = K = %lld, %d ranks on %s, %s; medians of %d x %d runs\n",
                  static_cast<long long>(inner), ranks, backend.c_str(), to_string(dtype), rounds, repeat);
      std::printf("%7s %12s %12s %12s %12s %9s %9s %8s %9s\n", "I", "overlap (s)", "serial (s)", "compute (s)",
                  "comm (s)", "hidden", "ser/ovl", "comp/comm", "verified");
    }
    for (std::int64_t rows : parse_list(rows_text)) {
      const DimSizes sizes = {{"I", rows}, {"J", inner}, {"K", inner}};
      const MatmulPlanning p = plan_matmul(mesh, fsdp, sizes, opt);
      const MatmulPlanning q = plan_matmul(mesh, gathered, sizes, opt);
      const Spec b_from = fsdp.b, b_to = gathered.b;
      RunRequest base;
      base.backend = backend;
      base.mesh = mesh;
      base.sizes = sizes;
      base.dtype = dtype;
      base.repeat = repeat;
      base.check = false;  // the check mode's extra messages are not what is measured
      RunRequest overlapped = base, serialized = base, compute = base, comm = base;
      overlapped.plan = candidate(p, {OpKind::all_gather_einsum});
      overlapped.contraction = &fsdp;
      serialized.plan = candidate(p, {OpKind::all_gather, OpKind::einsum});
      serialized.contraction = &fsdp;
      compute.plan = candidate(q, {OpKind::einsum});
      compute.contraction = &gathered;
      comm.plan = plan_reshard(mesh, b_from, b_to, {inner, inner}, opt);
      comm.reshard_from = &b_from;
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
      if (!root) continue;
      const double ovl = median(t[0]), ser = median(t[1]), cmp = median(t[2]), com = median(t[3]);
      const double hidden = std::clamp(1 - (ovl - cmp) / com, 0.0, 1.0);
      std::printf("%7lld %12.6f %12.6f %12.6f %12.6f %8.0f%% %9.3f %8.2f %9s\n", static_cast<long long>(rows), ovl, ser,
                  cmp, com, 100 * hidden, ser / ovl, cmp / com, verified ? "yes" : "NO");
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_matmul_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
