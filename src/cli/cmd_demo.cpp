// shardmm demo: the Scaling Book's four cases, Megatron's column -> row pair and the all_to_all
// reshard, each planned and explained the way `plan` / `reshard` print them.
#include <memory>
#include <ostream>

#include "cli/commands.h"
#include "cli/report.h"

namespace shardmm::cli {
namespace {

struct Example {
  const char* title;
  const char* in_short;   // the rule in one line, as a mnemonic
  const char* statement;  // the same, spelled out
  const char* mesh;
  const char* dims;
  const char* expr;  // a contraction, or "SRC -> DST" for a reshard
  bool reshard = false;
  const char* compare = nullptr;  // another expression on the same mesh, costed for comparison
};

// Realistic sizes: I=8192 tokens, J=4096 model width, K=16384 hidden width.
const Example kExamples[] = {
    {"Case 1: the contracting dimension is not split -> no communication",
     "情形一：求和维没有被切分 | Case 1: 都没切 contract 维 → 零通信",
     "Neither input splits the contracting dimension J, so every device holds whole J-rows and J-columns: it "
     "multiplies its blocks locally and the result lands in C[I_X, K_Y] with no communication at all.",
     "X=4,Y=2", "I=8192,J=4096,K=16384", "A[I_X, J] @ B[J, K_Y] -> C[I_X, K_Y]"},
    {"Case 2: one input splits the contracting dimension -> all_gather it",
     "情形二：只有一个输入沿求和维切分 | Case 2: 一边切 contract 维 → AllGather 补齐",
     "Only A splits J (over X): a device lacks the other J-blocks of A, so the usual fix is to all_gather A over X "
     "and multiply whole J; the alternative is to slice B's J to match and reduce the partial sums afterwards.",
     "X=4", "I=8192,J=4096,K=16384", "A[I, J_X] @ B[J, K] -> C[I, K]"},
    {"Case 3: both inputs split the contracting dimension on the same axis -> partial sums, then reduce",
     "情形三：两个输入都沿同一求和维切分 | Case 3: 两边同 axis 切 contract → AllReduce 求和",
     "A and B both split J over X: each device multiplies its matching J-blocks into a partial sum C[I, K]{U_X}, "
     "and an all_reduce over X adds them up. Asking for a sharded C[I, K_X] instead lets the planner avoid the "
     "all_reduce (compared below).",
     "X=4", "I=8192,J=4096,K=16384", "A[I, J_X] @ B[J_X, K] -> C[I, K]", false, "A[I, J_X] @ B[J_X, K] -> C[I, K_X]"},
    {"Case 4: two non-contracting dimensions on the same axis -> all_gather one side first",
     "情形四：两个输入在同一 mesh 轴上切了不同的非求和维 | Case 4: 两边同 axis 切 non-contract → AllGather 一个",
     "A splits I and B splits K over the same axis X: the local blocks only meet on the diagonal of C, and "
     "C[I_X, K_X] is illegal (a mesh axis shards one dimension), so one side is all-gathered over X first; "
     "which one depends on what comes next, so no output is given and the planner weighs both.",
     "X=4", "I=8192,J=4096,K=16384", "A[I_X, J] @ B[J, K_X]"},
    {"Megatron column parallel: W1's output dimension F split over X (case 1)",
     "Column Parallel 的\"零通信\"不是直觉，是 Case 1 的直接结果",
     "H[B, D] is replicated and W1[D, F_X] splits its columns: D is not split, so each device computes its own "
     "F-block of U with no communication, and U comes out as U[B, F_X].",
     "X=4", "B=8192,D=4096,F=16384", "H[B, D] @ W1[D, F_X] -> U[B, F_X]"},
    {"Megatron row parallel: U[B, F_X] meets W2[F_X, D] (case 3, one all_reduce)",
     "Column + Row 配对：中间状态天然衔接 + 只需一次 AllReduce",
     "The column layer's output U[B, F_X] is exactly the input the row layer wants: F is contracted and split "
     "over X in both, so the local products are partial sums Z{U_X} and one all_reduce finishes the MLP.",
     "X=4", "B=8192,D=4096,F=16384", "U[B, F_X] @ W2[F_X, D] -> Z[B, D]"},
    {"AllToAll: move the X split from J to I", "AllToAll: [A, B_X] → [A_X, B]，布局重排，代价约为 AllGather 的四分之一",
     "An all_to_all neither copies nor sums: each device keeps 1/4 of its block and sends each other device the "
     "piece it needs, so the X subscript moves from J to I. No device ever holds the whole tensor; compare an "
     "all_gather of the same tensor.",
     "X=4", "I=8192,J=4096", "A[I, J_X] -> A[I_X, J]", true, "A[I, J_X] -> A[I, J]"},
};

void print_command(std::ostream& out, const Example& e, const PlanningFlags& flags) {
  out << "$ shardmm ";
  if (e.reshard) {
    const std::string expr = e.expr;
    const std::size_t arrow = expr.find(" -> ");
    out << "reshard '" << expr.substr(0, arrow) << "' '" << expr.substr(arrow + 4) << "'";
  } else {
    out << "plan '" << e.expr << "'";
  }
  out << " --mesh " << e.mesh << " --dims " << e.dims;
  if (flags.dtype) out << " --dtype " << *flags.dtype;
  if (flags.hw) out << " --hw " << *flags.hw;
  if (flags.show) out << " --show";
  out << "\n\n";
}

// The chosen plan of `expr` ("SRC -> DST" when `reshard`).
Plan plan_of(const Planning& p, const std::string& expr, bool reshard) {
  if (reshard) {
    const std::size_t arrow = expr.find(" -> ");
    return plan_reshard_specs(p, parse_spec(expr.substr(0, arrow), p.mesh), parse_spec(expr.substr(arrow + 4), p.mesh))
        .plan;
  }
  const MatmulPlanning m = plan_contraction(p, parse_contraction(expr, p.mesh));
  return m.candidates.at(static_cast<std::size_t>(m.chosen));
}

void run_example(std::ostream& out, const Example& e, const PlanningFlags& demo_flags, std::size_t number) {
  PlanningFlags flags = demo_flags;
  flags.mesh = e.mesh;
  flags.dims = e.dims;
  const Planning p = make_planning(flags);
  out << std::string(100, '=') << "\n";
  out << number << ". " << e.title << "\n";
  out << "   in short: " << e.in_short << "\n";
  out << "   " << wrap(e.statement, 97, "   ") << "\n\n";
  print_command(out, e, flags);
  const ReportOptions report{false, flags.show, 3, true};
  const std::string expr = e.expr;
  if (e.reshard) {
    const std::size_t arrow = expr.find(" -> ");
    const Spec from = parse_spec(expr.substr(0, arrow), p.mesh);
    print_reshard_report(out, p, plan_reshard_specs(p, from, parse_spec(expr.substr(arrow + 4), p.mesh)), report);
  } else {
    const Contraction c = parse_contraction(expr, p.mesh);
    print_matmul_report(out, p, c, plan_contraction(p, c), report);
  }
  if (e.compare) {
    const Plan mine = plan_of(p, expr, e.reshard);
    const Plan other = plan_of(p, e.compare, e.reshard);
    const std::string text = std::string(e.compare) + " (" + other.description + ") takes " +
                             format_time(other.total_time_s) + " with a peak of " +
                             format_bytes(static_cast<double>(other.peak_bytes_per_device)) +
                             " per device; the plan above takes " +
                             format_sig3(mine.total_time_s / other.total_time_s) + "x that time and " +
                             format_sig3(static_cast<double>(mine.peak_bytes_per_device) /
                                         static_cast<double>(other.peak_bytes_per_device)) +
                             "x that memory";
    out << "\nCompare: " << wrap(text, 91, "         ") << "\n";
  }
  out << "\n";
}

}  // namespace

Command add_demo_command(CLI::App& root) {
  auto flags = std::make_shared<PlanningFlags>();
  CLI::App* app = root.add_subcommand(
      "demo",
      "the Scaling Book's four sharded-matmul cases, Megatron column -> row and an all_to_all, planned and explained");
  add_dtype_flag(*app, flags->dtype);
  add_hw_flag(*app, flags->hw);
  app->add_flag("--show", flags->show, "also draw each tensor's blocks on the mesh devices, e.g. --show");
  app->footer(std::string(kNotationHint) +
              "\n\nExamples:\n"
              "  shardmm demo\n"
              "  shardmm demo --hw h100 --dtype f32 --show\n\n" +
              kDocsHint);
  return {app, [flags](std::ostream& out) {
            out << "shardmm demo: the Scaling Book's four cases of a sharded matmul, then Megatron's column -> row\n"
                   "pair and an all_to_all reshard. Each section shows the equivalent command; the rule everywhere:\n"
                   "look at whether the contracting dimension is split (看 contract 维有没有被切).\n\n";
            PlanningFlags hw_flags = *flags;
            hw_flags.mesh = "X=1";
            const Planning p = make_planning(hw_flags);
            out << "Every example uses " << to_string(p.options.dtype) << " and this hardware:\n";
            print_hardware(out, p);
            out << "\nThe four cases, judged per mesh axis from the inputs' shardings:\n" << kCasesLegend << "\n";
            std::size_t n = 0;
            for (const Example& e : kExamples) run_example(out, e, *flags, ++n);
            return 0;
          }};
}

}  // namespace shardmm::cli
