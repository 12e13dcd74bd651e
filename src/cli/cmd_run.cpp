// shardmm run EXPR --mesh M [--split array|chunk] --dims ... [--backend threads|mpi] [--dtype f32|f64]
//             [--repeat N] [--json]
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/execution.h"
#include "cli/report.h"

namespace shardmm::cli {

Command add_run_command(CLI::App& root) {
  struct Flags {
    std::string expr;
    PlanningFlags common;
    ExecutionFlags exec;
  };
  auto flags = std::make_shared<Flags>();
  // Execution computes in f32 or f64; predictions need a profile with those peaks.
  flags->common.dtype = "f32";
  flags->common.fallback_hw = "h100";
  CLI::App* app = root.add_subcommand(
      "run", "plan a sharded contraction, execute it on real ranks, time it, and verify it against a dense reference");
  app->add_option("EXPR", flags->expr, "the contraction, e.g. 'A[I, J_X] @ B[J_X, K] -> C[I, K]'")->required();
  add_planning_flags(*app, flags->common, true);
  add_execution_flags(*app, flags->exec);
  app->footer(
      std::string(kNotationHint) +
      "\n\nInputs are deterministic values in [-1, 1) set by each element's global index, so the same\n"
      "logical tensors result on any mesh. Exit status: 0 verified, 2 bad input, 3 wrong result.\n"
      "The defaults here are --dtype f32 and, for the predictions, --hw calibrated when 'shardmm calibrate'\n"
      "has written a profile (docs/calibration.md), else --hw h100.\n\n"
      "Examples:\n"
      "  shardmm run 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=512,J=1024,K=256\n"
      "  shardmm run 'A[I_X, J] @ B[J, K_Y]' --mesh X=2,Y=2 --dims I=1000,J=300,K=77 --dtype f64 --json\n"
      "  mpirun -n 4 shardmm run 'A[I, J_X] @ B[J_X, K]' --mesh X=4 --dims I=512,J=512,K=512 --backend mpi\n\n" +
      kDocsHint);
  return {app, [flags](std::ostream& out) {
            Planning p = make_planning(flags->common);
            const Contraction c = parse_contraction(flags->expr, p.mesh);
            check_execution(flags->exec, p);
            const MatmulPlanning m = plan_contraction(p, c);
            const std::size_t index = pick_candidate(flags->exec, m.candidates.size(), m.chosen);
            const Plan& plan = m.candidates[index];
            const RunReport r = execute(flags->exec, p, plan, &c, nullptr);
            if (!r.is_root) return execution_status(r);
            if (flags->common.json) {
              Json doc = matmul_json(p, c, m);
              add_execution_json(doc, index, p, plan, flags->exec, r);
              out << doc.dump(2) << "\n";
            } else {
              print_matmul_report(out, p, c, m, {false, flags->common.show, 3, true});
              print_execution(out, p, plan, flags->exec, r);
            }
            return finish_execution(flags->exec, p, plan, r);
          }};
}

}  // namespace shardmm::cli
