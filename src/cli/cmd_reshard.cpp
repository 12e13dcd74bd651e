// shardmm reshard SRC DST --mesh M [--split array|chunk] --dims ... [--dtype] [--hw] [--mem-limit] [--show] [--json]
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/execution.h"
#include "cli/report.h"

namespace shardmm::cli {

Command add_reshard_command(CLI::App& root) {
  struct Flags {
    std::string from, to;
    PlanningFlags common;
    bool run = false;
    ExecutionFlags exec;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("reshard", "plan moving one tensor from one sharding to another, and its cost");
  app->add_option("SRC", flags->from, "the sharding the tensor has, e.g. 'A[I, J_X]'")->required();
  app->add_option("DST", flags->to, "the sharding wanted, same dimensions in the same order, e.g. 'A[I_X, J]'")
      ->required();
  add_planning_flags(*app, flags->common, true);
  app->add_flag("--run", flags->run,
                "also execute the reshard on real ranks, time it and check that every element arrives (needs --dtype "
                "f32 or f64), e.g. --run --dtype f32");
  add_execution_flags(*app, flags->exec);
  app->footer(std::string(kNotationHint) +
              "\n\nExamples:\n"
              "  shardmm reshard 'A[I, J_X]' 'A[I_X, J]' --mesh X=4 --dims I=8192,J=4096\n"
              "  shardmm reshard 'C[I, K]{U_X}' 'C[I, K_X]' --mesh X=4 --dims I=8192,K=16384 --dtype f32 --show\n\n" +
              kDocsHint);
  return {app, [flags, app](std::ostream& out) {
            require_run(*app, flags->run);
            Planning p = make_planning(flags->common);
            const Spec from = parse_spec(flags->from, p.mesh);
            const Spec to = parse_spec(flags->to, p.mesh);
            if (flags->run) check_execution(flags->exec, p);
            const Reshard r = plan_reshard_specs(p, from, to);
            if (flags->run) pick_candidate(flags->exec, 1, 0);  // a reshard has one plan: --candidate 1 at most
            RunReport run;
            if (flags->run) {
              run = execute(flags->exec, p, r.plan, nullptr, &r.from);
              if (!run.is_root) return execution_status(run);
            }
            if (flags->common.json) {
              Json doc = reshard_json(p, r);
              if (flags->run) add_execution_json(doc, 0, p, r.plan, flags->exec, run);
              out << doc.dump(2) << "\n";
            } else {
              print_reshard_report(out, p, r, {false, flags->common.show});
              if (flags->run) print_execution(out, p, r.plan, flags->exec, run);
            }
            return flags->run ? finish_execution(flags->exec, p, r.plan, run) : 0;
          }};
}

}  // namespace shardmm::cli
