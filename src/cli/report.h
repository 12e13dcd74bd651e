// The explanations `plan` and `reshard` print (and `demo` reuses), in the Scaling Book's terms:
// dimension roles, the four cases per mesh axis, the chosen plan's steps with what each
// one does and costs, the totals and the roofline verdict, then the alternatives; and the
// matching JSON documents (docs/json-schema.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <vector>

#include "cli/common.h"
#include "shardmm/core/contraction.h"

namespace shardmm::cli {

struct ReportOptions {
  bool all = false;              // every candidate in full
  bool show = false;             // draw the tensors' blocks on the mesh
  std::size_t alternatives = 5;  // rows in the alternatives summary
  bool compact = false;          // a two-line header and no legends (demo prints them once)
};

// The Scaling Book's four cases in three lines.
extern const char* const kCasesLegend;

// Plans `c` (its dimension sizes must all be in p.sizes, and nothing more).
MatmulPlanning plan_contraction(const Planning& p, const Contraction& c);
void print_matmul_report(std::ostream& out, const Planning& p, const Contraction& c, const MatmulPlanning& m,
                         const ReportOptions& options);
Json matmul_json(const Planning& p, const Contraction& c, const MatmulPlanning& m);

struct Reshard {
  Spec from, to;
  std::vector<std::int64_t> shape;
  Plan plan;
};
Reshard plan_reshard_specs(const Planning& p, const Spec& from, const Spec& to);
void print_reshard_report(std::ostream& out, const Planning& p, const Reshard& r, const ReportOptions& options);
Json reshard_json(const Planning& p, const Reshard& r);

// Throws InputError naming the smallest peak found and the limit when no candidate fits
// the memory limit.
void require_fit(const std::vector<Plan>& candidates, const PlanOptions& options);

}  // namespace shardmm::cli
