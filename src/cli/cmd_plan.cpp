// shardmm plan EXPR --mesh M [--split array|chunk] --dims ... [--dtype] [--hw] [--mem-limit] [--all] [--show] [--json]
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/report.h"

namespace shardmm::cli {

Command add_plan_command(CLI::App& root) {
  struct Flags {
    std::string expr;
    PlanningFlags common;
    bool all = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "plan", "plan a sharded contraction: its case (1-4) per mesh axis, the collectives, their cost");
  app->add_option("EXPR", flags->expr,
                  "the contraction, e.g. 'A[I, J_X] @ B[J_X, K] -> C[I, K]' (without '-> C[...]' the planner picks "
                  "the output's sharding)")
      ->required();
  add_planning_flags(*app, flags->common, true);
  app->add_flag("--all", flags->all, "print every candidate plan with its steps, e.g. --all");
  app->footer(std::string(kNotationHint) +
              "\n\nExamples:\n"
              "  shardmm plan 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=8192,J=4096,K=16384\n"
              "  shardmm plan 'A[I_X, J] @ B[J, K_X]' --mesh X=4,Y=2 --dims I=8192,J=4096,K=16384 --hw h100 "
              "--mem-limit 16GiB --all --show\n\n" +
              kDocsHint);
  return {app, [flags](std::ostream& out) {
            const Planning p = make_planning(flags->common);
            const Contraction c = parse_contraction(flags->expr, p.mesh);
            const MatmulPlanning m = plan_contraction(p, c);
            if (flags->common.json) {
              out << matmul_json(p, c, m).dump(2) << "\n";
            } else {
              print_matmul_report(out, p, c, m, {flags->all, flags->common.show});
            }
            return 0;
          }};
}

}  // namespace shardmm::cli
