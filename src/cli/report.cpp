#include "cli/report.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <ostream>

#include "cli/layout.h"
#include "shardmm/core/error.h"

namespace shardmm::cli {

const char* const kCasesLegend =
    "  (1: no input splits the contracting dimension: no communication; 2: one input splits it:\n"
    "  all_gather it; 3: both split it on the same axis: partial sums, then all_reduce/reduce_scatter;\n"
    "  4: both split different non-contracting dimensions on the same axis: all_gather one side first)\n";

namespace {

constexpr std::size_t kWidth = 100;

std::string dim_at(const Spec& s, int d) {
  return d >= 0 && d < s.rank() ? s.dims[static_cast<std::size_t>(d)].name : "?";
}

// The part of `out` that dimension `d` indexes, as a matrix's reader names it: the last
// dimension's blocks are columns, the one before it rows (batch dimensions lead, as in
// numpy's matmul); any other is a block of d.
std::string part_indexed_by(const Spec& out, const std::string& d) {
  const int at = out.find_dim(d);
  if (at == out.rank() - 1) return d + "-columns";
  if (at == out.rank() - 2) return d + "-rows";
  return d + "-blocks";
}

std::string axes_or_dash(const Mesh& mesh, const AxisList& axes) { return axes.empty() ? "-" : mesh.axis_names(axes); }

// What a step does, in the Scaling Book's words: all_gather fills in missing slices, all_reduce
// missing sums, reduce_scatter sums and keeps a sharding, all_to_all fixes a layout.
std::string explain_step(const Step& s, const Mesh& mesh) {
  const std::string g = mesh.axis_names(s.axes);
  const std::string d = dim_at(s.from, s.dim);
  if (!multiplies(s.op) && !s.axes.empty() && mesh.group_size(s.axes) == 1) {
    return g + (s.axes.size() > 1 ? " span" : " spans") +
           " one device, so nothing moves or changes: " + format_spec(s.from, mesh) + " and " +
           format_spec(s.to, mesh) + " are the same data, renamed";
  }
  switch (s.op) {
    case OpKind::einsum: {
      std::string text = "each device multiplies its blocks of " + s.from.tensor + " and " + s.from_b.tensor;
      if (s.to.unreduced.empty()) return text + ": every output block is complete (no contracted dimension is split)";
      return text + ": the contracted dimension is split over " + mesh.axis_names(s.to.unreduced) +
             ", so each device holds only a partial sum, written {U_" + mesh.axis_names(s.to.unreduced) + "}";
    }
    case OpKind::all_gather:
      return "collects the " + g + "-blocks of " + d + " onto every device (the subscript " + g +
             " disappears): fills in the missing slices";
    case OpKind::slice:
      return "keeps only this device's " + g + "-block of the replicated " + d + ": local, no communication";
    case OpKind::all_to_all:
      return "moves the " + g + " split from " + d + " to " + dim_at(s.from, s.dst_dim) +
             ": each device sends the pieces the others need, no full copies (a layout change)";
    case OpKind::reduce_scatter:
      return "sums the partial sums over " + g + " and leaves each device one " + g + "-block of " + d +
             ": reduces and keeps the result sharded";
    case OpKind::all_reduce:
      return "sums the partial sums over " + g + "; every device gets the whole sum (= reduce_scatter + all_gather)";
    case OpKind::exchange:
      return "each device sends every member of " + g +
             " the part of its block that the member's new block "
             "covers, in one collective: each receives only what its new block lacks, with no gathered copy in "
             "between";
    case OpKind::to_partial:
      if (s.dim >= 0) {
        return "pads each device's " + g + "-block of " + d + " with zeros to the whole of it: a partial sum over " +
               g + " whose total is the gathered " + d + ", local (no all_gather)";
      }
      return "turns the replicated value into a partial sum over " + g +
             " (coordinate 0 keeps it, the others hold zeros): local";
    case OpKind::all_gather_einsum: {
      const Spec& gathered = s.ring_operand == 0 ? s.from : s.from_b;
      const Spec& other = s.ring_operand == 0 ? s.from_b : s.from;
      const std::string d = dim_at(gathered, s.dim);
      return "collective matmul: all_gather " + gathered.tensor + "'s " + g + "-blocks of " + d + " round a " +
             (s.bidirectional ? "bidirectional " : "") + "ring of " + std::to_string(s.ring_steps) + " steps, " +
             (gathers_contracted(s) ? "multiplying each block by " + other.tensor + "'s matching block of " + d +
                                          " and adding the product into all of " + s.to.tensor
                                    : "multiplying each block into the " + part_indexed_by(s.to, d) + " of " +
                                          s.to.tensor + " it covers") +
             " while the next one is in flight (" + format_time(s.comm_time_s) + " of transfers, " +
             format_time(s.compute_time_s) + " of compute)";
    }
    case OpKind::local:
      return "each device computes " + s.function + " on its own blocks, reading and writing " +
             format_bytes(static_cast<double>(s.memory_bytes)) + ": local, no communication";
    case OpKind::einsum_reduce_scatter:
      return "collective matmul: computes the partial " + g + "-block of " + dim_at(s.to, s.dim) +
             " bound for each member in turn, adds the running sum that arrived from the previous member and "
             "passes it on round a ring of " +
             std::to_string(s.ring_steps) + " steps (" + format_time(s.comm_time_s) + " of transfers, " +
             format_time(s.compute_time_s) + " of compute)";
  }
  return "";
}

std::string step_transition(const Step& s, const Mesh& mesh) {
  if (multiplies(s.op)) {
    return format_spec(s.from, mesh) + " @ " + format_spec(s.from_b, mesh) + " -> " + format_spec(s.to, mesh);
  }
  return format_spec(s.from, mesh) + " -> " + format_spec(s.to, mesh);
}

void print_steps(std::ostream& out, const Plan& plan, const Mesh& mesh) {
  if (plan.steps.empty()) {
    out << "  (no steps: the input is already in the requested layout)\n";
    return;
  }
  Table table({"#", "op", "axes", "tensor", "from -> to", "sent", "received", "FLOPs", "time", "bound"});
  for (std::size_t c : {0u, 5u, 6u, 7u, 8u}) table.right_align(c);
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    table.add({std::to_string(i + 1), op_name(s), axes_or_dash(mesh, s.axes), s.tensor, step_transition(s, mesh),
               format_bytes(static_cast<double>(s.bytes_sent)), format_bytes(static_cast<double>(s.bytes_received)),
               multiplies(s.op) ? format_flops(s.flops) : "-", format_time(s.time_s),
               s.bound == Bound::none ? "-" : to_string(s.bound)});
  }
  table.print(out);
  out << "  (sent, received, FLOPs: per device, the most any device handles; bound: what sets the time,\n"
         "   latency (a fixed cost per hop) or bandwidth (bytes over the links) for communication, compute or\n"
         "   memory for local work)\n";
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const std::string head = "  " + std::to_string(i + 1) + ". " + op_name(plan.steps[i]) + ": ";
    out << head << wrap(explain_step(plan.steps[i], mesh), kWidth - head.size(), std::string(head.size(), ' ')) << "\n";
  }
  std::vector<Confidence> confidence;
  for (const Step& s : plan.steps) confidence.push_back(s.confidence);
  print_confidence(out, confidence);
}

std::string roofline(const Plan& plan, const PlanOptions& options) {
  const double comm = plan.comm_time_s, compute = plan.compute_time_s;
  std::string text;
  if (plan.steps.empty()) return "nothing to do";
  if (comm == 0) {
    text = "no collectives: the plan is local work only (" + format_time(compute) + ")";
  } else if (comm > compute) {
    text = "communication-bound: the collectives take " + format_time(comm) +
           (compute > 0 ? ", " + format_sig3(comm / compute) + "x the local compute (" + format_time(compute) + ")"
                        : " and there is no local compute to hide them behind") +
           (compute > 0 ? "; overlap can hide at most " + format_time(compute) + " of them" : "");
  } else {
    text = "compute-bound: local compute takes " + format_time(compute) + ", " + format_sig3(compute / comm) +
           "x the collectives (" + format_time(comm) + "); with overlap the collectives can hide behind it";
  }
  for (const Step& s : plan.steps) {
    if (!multiplies(s.op) || s.flops == 0) continue;
    const double at_peak = s.flops / options.hw.flops_for(options.dtype);
    text += s.time_s > at_peak * (1 + 1e-9)
                ? "; the local einsum is HBM-bound on chip (moving its operands takes longer than its FLOPs at " +
                      format_flop_rate(options.hw.flops_for(options.dtype)) + ")"
                : "; the local einsum runs at the chip's peak " +
                      format_flop_rate(options.hw.flops_for(options.dtype)) + " (compute-bound on chip)";
  }
  return text;
}

void print_totals(std::ostream& out, const Plan& plan, const Mesh& mesh, const PlanOptions& options) {
  out << "  output    " << format_spec(plan.output, mesh) << "\n";
  out << "  time      communication " << format_time(plan.comm_time_s) << " + compute "
      << format_time(plan.compute_time_s) << " = " << format_time(plan.comm_time_s + plan.compute_time_s)
      << " serialized; ";
  if (std::any_of(plan.steps.begin(), plan.steps.end(), [](const Step& s) { return is_collective_matmul(s.op); })) {
    out << format_time(plan.total_time_s) << " with the collective matmul's ring overlap; ";
  }
  out << format_time(plan.overlapped_time_s) << " with perfect overlap\n";
  // The planner saturates a peak that overflows 64 bits (core/error.h's saturating_add).
  const bool beyond = plan.peak_bytes_per_device == std::numeric_limits<std::int64_t>::max();
  out << "  memory    peak " << (beyond ? "over " : "") << format_bytes(static_cast<double>(plan.peak_bytes_per_device))
      << " per device" << (beyond ? " (more bytes than a 64-bit count holds)" : "");
  if (options.mem_limit_bytes) {
    out << (plan.fits_memory ? ", within" : ", OVER") << " the limit of "
        << format_bytes(static_cast<double>(*options.mem_limit_bytes));
  }
  out << "\n";
  out << "  roofline  " << wrap(roofline(plan, options), kWidth - 12, "            ") << "\n";
}

void print_plan(std::ostream& out, const Plan& plan, const Mesh& mesh, const PlanOptions& options) {
  print_steps(out, plan, mesh);
  print_totals(out, plan, mesh, options);
}

void print_header(std::ostream& out, const Planning& p, const std::string& expr, bool compact) {
  out << "  expr      " << expr << "\n";
  if (compact) {
    out << "  on        mesh " << describe_mesh(p.mesh) << ", " << format_sizes(p.sizes) << ", "
        << to_string(p.options.dtype) << ", " << p.options.hw.name << "\n";
    return;
  }
  out << "  mesh      " << describe_mesh(p.mesh) << "\n";
  out << "  dims      " << format_sizes(p.sizes) << "\n";
  out << "  dtype     " << to_string(p.options.dtype) << " (" << dtype_bytes(p.options.dtype) << " B per element"
      << (p.default_dtype ? "; the default, choose another with --dtype" : "") << ")\n";
  print_hardware(out, p);
  out << "  memory    "
      << (p.options.mem_limit_bytes ? "limit " + format_bytes_exact(*p.options.mem_limit_bytes) + " per device"
                                    : std::string("no limit (set one with --mem-limit)"))
      << "\n";
}

// The alternatives to the chosen candidate: a summary table, or each in full.
void print_alternatives(std::ostream& out, const std::vector<Plan>& candidates, int chosen, const Mesh& mesh,
                        const PlanOptions& options, const ReportOptions& report) {
  const std::size_t others = candidates.size() - 1;
  if (others == 0) {
    out << "\nNo alternatives: this is the only strategy.\n";
    return;
  }
  if (report.all) {
    out << "\nAll " << others << " alternatives, cheapest first:\n";
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (static_cast<int>(i) == chosen) continue;
      out << "\nCandidate " << i + 1 << " of " << candidates.size() << ": " << candidates[i].description
          << (candidates[i].fits_memory ? "" : "  [over the memory limit]") << "\n";
      print_plan(out, candidates[i], mesh, options);
    }
    return;
  }
  const std::size_t shown = std::min(others, report.alternatives);
  out << "\nAlternatives (" << others << ", cheapest first"
      << (shown < others ? "; the first " + std::to_string(shown) : "") << "; --all prints each one's steps):\n";
  Table table({"#", "total", "comm", "compute", "overlap", "peak/device", "output", "strategy"});
  for (std::size_t c : {0u, 1u, 2u, 3u, 4u, 5u}) table.right_align(c);
  std::size_t n = 0;
  for (std::size_t i = 0; i < candidates.size() && n < shown; ++i) {
    if (static_cast<int>(i) == chosen) continue;
    const Plan& c = candidates[i];
    table.add({std::to_string(i + 1), format_time(c.total_time_s), format_time(c.comm_time_s),
               format_time(c.compute_time_s), format_time(c.overlapped_time_s),
               format_bytes(static_cast<double>(c.peak_bytes_per_device)), format_spec(c.output, mesh),
               c.description + (c.fits_memory ? "" : "  [over the memory limit]")});
    ++n;
  }
  table.print(out);
}

const char* case_label(int n) {
  switch (n) {
    case 1:
      return "no communication";
    case 2:
      return "all_gather the contracting dimension";
    case 3:
      return "partial sums, then reduce";
    case 4:
      return "all_gather one side first";
  }
  return "";
}

std::string role_text(const Contraction& c, const std::string& dim) {
  switch (c.role(dim)) {
    case DimRole::contracted:
      return "in " + c.a.tensor + " and " + c.b.tensor +
             ", summed away; where it is split, local products are "
             "partial sums";
    case DimRole::batch:
      return "in " + c.a.tensor + ", " + c.b.tensor + " and " + c.out_tensor +
             "; matching blocks multiply independently";
    case DimRole::free_a:
      return "only in " + c.a.tensor + ", kept in " + c.out_tensor;
    case DimRole::free_b:
      return "only in " + c.b.tensor + ", kept in " + c.out_tensor;
  }
  return "";
}

}  // namespace

void require_fit(const std::vector<Plan>& candidates, const PlanOptions& options) {
  if (!options.mem_limit_bytes || candidates.empty()) return;
  const Plan* best = &candidates.front();
  for (const Plan& c : candidates) {
    if (c.fits_memory) return;
    if (c.peak_bytes_per_device < best->peak_bytes_per_device) best = &c;
  }
  const std::int64_t limit = *options.mem_limit_bytes;
  throw InputError("no plan fits --mem-limit " + format_bytes_exact(limit) + " per device: the smallest peak among " +
                   std::to_string(candidates.size()) + (candidates.size() == 1 ? " candidate" : " candidates") +
                   " is " + format_bytes_exact(best->peak_bytes_per_device) + " (" + best->description + ")");
}

MatmulPlanning plan_contraction(const Planning& p, const Contraction& c) {
  std::vector<const Spec*> specs{&c.a, &c.b};
  if (c.out) specs.push_back(&*c.out);
  check_dims_used(p.sizes, specs);
  // The output's shape: its letters, from the inputs.
  Spec out;
  out.tensor = c.out_tensor;
  for (const std::string& d : c.out_dims) out.dims.push_back({d, {}});
  for (const Spec* s : {&c.a, &c.b, static_cast<const Spec*>(&out)}) check_tensor_bytes(*s, p.sizes, p.options.dtype);
  MatmulPlanning m = plan_matmul(p.mesh, c, p.sizes, p.options);
  require_fit(m.candidates, p.options);
  return m;
}

void print_matmul_report(std::ostream& out, const Planning& p, const Contraction& c, const MatmulPlanning& m,
                         const ReportOptions& options) {
  const Mesh& mesh = p.mesh;
  const std::string free_output = !m.every_output_layout
                                      ? "   (no output spec: the planner picks C's sharding among the layouts its "
                                        "inputs' axes give; every layout is more combinations than it weighs)"
                                      : "   (no output spec: the planner picks C's sharding, weighing every layout)";
  print_header(out, p, format_contraction(c, mesh) + (c.out ? "" : free_output), options.compact);

  out << "\nDimensions\n";
  Table dims({"dim", "role", "size", ""});
  dims.right_align(2);
  for (const std::string& d : c.all_dims()) {
    dims.add({d, to_string(c.role(d)), std::to_string(p.sizes.at(d)), role_text(c, d)});
  }
  dims.print(out);

  out << "\nThe four cases, per mesh axis\n";
  if (!options.compact) out << kCasesLegend;
  for (const AxisCase& ac : m.cases) {
    out << "  " << mesh.axis(ac.axis).name << "  case " << ac.case_number << " (" << case_label(ac.case_number)
        << ")\n      " << wrap(ac.reason, kWidth - 6, "      ") << "\n";
  }

  const Plan& chosen = m.candidates.at(static_cast<std::size_t>(m.chosen));
  const auto cheapest =
      std::find_if(m.candidates.begin(), m.candidates.end(), [](const Plan& x) { return x.fits_memory; });
  out << "\nChosen plan (candidate " << m.chosen + 1 << " of " << m.candidates.size();
  if (&*cheapest == &chosen) {
    out << ", the cheapest" << (p.options.mem_limit_bytes ? " within the memory limit" : "");
  } else {
    out << ": " << format_sig3(100 * (chosen.total_time_s / cheapest->total_time_s - 1))
        << "% slower than the cheapest, #" << cheapest - m.candidates.begin() + 1 << " ("
        << format_time(chosen.total_time_s) << " against " << format_time(cheapest->total_time_s)
        << "), within --tie-margin " << format_given(p.options.tie_margin) << ", with fewer synchronizations ("
        << synchronizations(chosen) << " against " << synchronizations(*cheapest) << ")";
  }
  out << "): " << chosen.description << "\n";
  if (const std::optional<NearTie> tie = near_tie(m)) {
    const Plan& other = m.candidates[static_cast<std::size_t>(tie->candidate)];
    out << "  near tie  "
        << wrap("#" + std::to_string(tie->candidate + 1) + " (" + other.description + ") is predicted " +
                    format_time(other.total_time_s) + " against " + format_time(chosen.total_time_s) + ", " +
                    format_time(tie->difference_s) + " apart, less than the ±" + format_time(tie->uncertainty_s) +
                    " their low-confidence steps may be off by: the model cannot rank the two "
                    "(docs/cost-model.md, 'Confidence')",
                kWidth - 12, "            ")
        << "\n";
  }
  print_plan(out, chosen, mesh, p.options);
  print_alternatives(out, m.candidates, m.chosen, mesh, p.options, options);

  if (options.show) {
    out << "\nLayouts (--show): each device's block of the inputs and of the chosen output\n";
    draw_layout(out, mesh, c.a, global_shape(c.a, p.sizes));
    draw_layout(out, mesh, c.b, global_shape(c.b, p.sizes));
    draw_layout(out, mesh, chosen.output, global_shape(chosen.output, p.sizes));
  }
}

namespace {

// The keys plan and reshard documents open with: what was planned, and under which options.
Json planning_json(const Planning& p, const std::string& expr) {
  Json j;
  j["expr"] = expr;
  add_mesh_json(j, p.mesh);
  j["dims"] = dims_json(p.sizes);
  j["dtype"] = to_string(p.options.dtype);
  j["hardware"] = p.options.hw.name;
  j["mem_limit_bytes"] = p.options.mem_limit_bytes ? Json(*p.options.mem_limit_bytes) : Json(nullptr);
  j["tie_margin"] = p.options.tie_margin;
  return j;
}

}  // namespace

Json matmul_json(const Planning& p, const Contraction& c, const MatmulPlanning& m) {
  Json j = planning_json(p, format_contraction(c, p.mesh));
  j["roles"] = Json::object();
  for (const std::string& d : c.all_dims()) j["roles"][d] = to_string(c.role(d));
  j["cases"] = Json::array();
  for (const AxisCase& ac : m.cases) {
    j["cases"].push_back({{"axis", p.mesh.axis(ac.axis).name}, {"case", ac.case_number}, {"reason", ac.reason}});
  }
  j["candidates"] = Json::array();
  for (const Plan& plan : m.candidates) j["candidates"].push_back(plan_json(plan, p.mesh));
  j["chosen"] = m.chosen;  // plan_contraction's require_fit leaves a plan that fits
  if (const std::optional<NearTie> tie = near_tie(m)) {
    j["near_tie"] = {
        {"candidate", tie->candidate}, {"difference_s", tie->difference_s}, {"uncertainty_s", tie->uncertainty_s}};
  } else {
    j["near_tie"] = nullptr;
  }
  j["every_output_layout"] = m.every_output_layout;
  return j;
}

Reshard plan_reshard_specs(const Planning& p, const Spec& from, const Spec& to) {
  check_same_tensor(from, to, p.mesh);
  const std::string what = "cannot reshard " + format_spec(from, p.mesh) + " to " + format_spec(to, p.mesh);
  if (from.tensor.empty() != to.tensor.empty()) {
    throw InputError(what + ": " + (from.tensor.empty() ? to.tensor : from.tensor) +
                     " is named on one side only; a reshard moves one tensor, so name it on both sides or on neither");
  }
  if (from.tensor != to.tensor) {
    throw InputError(what + ": a reshard moves one tensor; name the same tensor on both sides (" + from.tensor + ")");
  }
  check_dims_used(p.sizes, {&from});
  check_tensor_bytes(from, p.sizes, p.options.dtype);
  Reshard r{from, to, global_shape(from, p.sizes), {}};
  r.plan = plan_reshard(p.mesh, from, to, r.shape, p.options);
  require_fit({r.plan}, p.options);
  return r;
}

void print_reshard_report(std::ostream& out, const Planning& p, const Reshard& r, const ReportOptions& options) {
  const Mesh& mesh = p.mesh;
  print_header(out, p, format_spec(r.from, mesh) + " -> " + format_spec(r.to, mesh), options.compact);
  out << "\nWhat changes\n";
  Table changes({"dim", "from", "to"});
  const auto where = [&](const AxisList& axes) {
    return axes.empty() ? std::string("replicated") : "split over " + mesh.axis_names(axes);
  };
  for (std::size_t d = 0; d < r.from.dims.size(); ++d) {
    changes.add({r.from.dims[d].name, where(r.from.dims[d].axes), where(r.to.dims[d].axes)});
  }
  const auto partial = [&](const AxisList& axes) {
    return axes.empty() ? std::string("none") : "over " + mesh.axis_names(axes);
  };
  changes.add({"partial sums", partial(r.from.unreduced), partial(r.to.unreduced)});
  changes.print(out);

  out << "\nPlan: " << r.plan.description << "\n";
  print_plan(out, r.plan, mesh, p.options);
  if (options.show) {
    out << "\nLayouts (--show): each device's block before and after\n";
    draw_layout(out, mesh, r.from, r.shape);
    draw_layout(out, mesh, r.plan.output, r.shape);
  }
}

Json reshard_json(const Planning& p, const Reshard& r) {
  Json j = planning_json(p, format_spec(r.from, p.mesh) + " -> " + format_spec(r.to, p.mesh));
  j["candidates"] = Json::array({plan_json(r.plan, p.mesh)});
  j["chosen"] = 0;  // plan_reshard_specs's require_fit: the one plan fits
  return j;
}

}  // namespace shardmm::cli
