#include "cli/execution.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <ostream>

#include "shardmm/core/error.h"
#include "shardmm/core/files.h"
#include "shardmm/runtime/chrome_trace.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::cli {

void add_warmup_time_flag(CLI::App& app, double& seconds) {
  app.add_option("--warmup-time", seconds,
                 "then more untimed runs until the warm-up has taken this many seconds, as some machines' clocks and "
                 "memory speed ramp up over the first tenths of a second; 0 for exactly --warmup runs, e.g. "
                 "--warmup-time 0.5 (default 0.2)");
}

void add_execution_flags(CLI::App& app, ExecutionFlags& flags) {
  app.add_option("--backend", flags.backend,
                 "where the ranks run: threads (one thread per device, the default) or mpi (one process per device, "
                 "under mpirun -n <devices>), e.g. --backend mpi");
  app.add_option("--repeat", flags.repeat, "timed runs; the report gives medians, e.g. --repeat 10 (default 5)");
  app.add_option("--warmup", flags.warmup, "untimed runs before them, e.g. --warmup 2 (default 1)");
  add_warmup_time_flag(app, flags.warmup_time_s);
  app.add_option("--candidate", flags.candidate,
                 "run this candidate instead of the chosen one: 1-based, as 'plan --all' (or 'reshard') numbers "
                 "them on the same --hw and --dtype, e.g. --candidate 2");
  app.add_flag_callback(
      "--no-check", [&flags] { flags.check = false; },
      "on the mpi backend, skip comparing the ranks' calls before each collective (one small message per "
      "member; a rank that disagrees or never arrives then hangs the job instead of ending it with a message); "
      "the threads backend always checks, e.g. --no-check");
  app.add_option("--watchdog", flags.watchdog_s,
                 "seconds a rank waits for its peers in a collective or a message before the run ends naming the "
                 "ranks that never came (default: SHARDMM_WATCHDOG_S, else 300), e.g. --watchdog 30");
  app.add_option("--trace", flags.trace,
                 "write a Chrome trace of the run (every rank's steps in the median repeat, a compute and a "
                 "communication lane per rank; open it in ui.perfetto.dev or chrome://tracing), e.g. --trace "
                 "run.json; under mpirun rank 0 writes the whole job's");
}

namespace {

constexpr const char* kExecutionFlags[] = {"--backend",   "--repeat",   "--warmup", "--warmup-time",
                                           "--candidate", "--no-check", "--trace"};

}  // namespace

void require_run(const CLI::App& app, bool run) {
  if (run) return;
  for (const char* name : kExecutionFlags) {
    if (app.get_option(name)->count() > 0) {
      throw InputError(std::string(name) + " applies to a run, and " + app.get_name() +
                       " only plans unless --run is given: add --run (with --dtype f32 or f64) or drop " + name);
    }
  }
}

void check_execution(const ExecutionFlags& flags, Planning& p) {
  check_backend(flags.backend, p.mesh);
  p.options.reduction_workspace = backend_capabilities(flags.backend).reduces_into_workspace;
  if (p.options.dtype != DType::f32 && p.options.dtype != DType::f64) {
    throw InputError(std::string("cannot run in ") + to_string(p.options.dtype) +
                     ": execution computes in f32 or f64; pass --dtype f32 or --dtype f64");
  }
  if (flags.repeat < 1)
    throw InputError("--repeat " + std::to_string(flags.repeat) + ": at least one timed run is needed");
  if (flags.warmup < 0) throw InputError("--warmup " + std::to_string(flags.warmup) + ": must be 0 or more");
  check_warmup_time(flags.warmup_time_s);
  if (flags.watchdog_s && !(*flags.watchdog_s > 0 && std::isfinite(*flags.watchdog_s))) {
    throw InputError("--watchdog " + format_given(*flags.watchdog_s) +
                     ": must be a positive number of seconds, e.g. --watchdog 30");
  }
  if (flags.trace) {
    if (flags.trace->empty()) throw InputError("--trace '': give the trace file's name, e.g. --trace run.json");
    check_writable_file(*flags.trace, "--trace '" + *flags.trace + "'");
  }
}

std::size_t pick_candidate(const ExecutionFlags& flags, std::size_t count, int chosen) {
  if (!flags.candidate) return static_cast<std::size_t>(chosen);
  const int k = *flags.candidate;
  if (k < 1 || static_cast<std::size_t>(k) > count) {
    const std::string numbered =
        count == 1 ? std::string("is 1 candidate (number 1)")
                   : "are " + std::to_string(count) + " candidates (numbered 1 to " + std::to_string(count) + ")";
    throw InputError("--candidate " + std::to_string(k) + ": there " + numbered +
                     " on this --hw and --dtype; 'plan --all' lists them when given the same two");
  }
  return static_cast<std::size_t>(k - 1);
}

RunReport execute(const ExecutionFlags& flags, const Planning& p, const Plan& plan, const Contraction* contraction,
                  const Spec* reshard_from) {
  RunRequest req;
  req.backend = flags.backend;
  req.mesh = p.mesh;
  req.plan = plan;
  req.sizes = p.sizes;
  req.dtype = p.options.dtype;
  req.contraction = contraction;
  req.reshard_from = reshard_from;
  req.repeat = flags.repeat;
  req.warmup = flags.warmup;
  req.warmup_min_s = flags.warmup_time_s;
  req.mem_limit_bytes = p.options.mem_limit_bytes;  // run_plan checks the run's memory against it
  req.check = flags.check;
  req.watchdog_s = flags.watchdog_s.value_or(0);
  ProgressLine progress;
  req.progress = progress.reporter();
  RunReport r = run_plan(req);
  if (r.is_root) progress.clear();
  return r;
}

int finish_execution(const ExecutionFlags& flags, const Planning& p, const Plan& plan, const RunReport& r) {
  const int status = execution_status(r);
  if (!r.is_root || !flags.trace) return status;
  try {
    write_chrome_trace_file(*flags.trace, run_trace_events(plan, p.mesh, r));
  } catch (const InputError& e) {
    // One write, one line (a line written in pieces can be split by another process's output).
    std::cerr << "shardmm: error: " + e.headline() + "; the run's report is printed all the same\n" << std::flush;
    return status != 0 ? status : 2;
  }
  return status;
}

namespace {

// Collective counts and bytes per op and mesh axes (the bytes each device sends, summed
// over the steps, as PyTorch's CommDebugMode counts them).
struct CommCount {
  int count = 0;
  std::int64_t bytes = 0;
};

std::map<std::string, std::map<std::string, CommCount>> comm_summary(const RunReport& r, const Mesh& mesh) {
  std::map<std::string, std::map<std::string, CommCount>> out;
  for (const StepMeasurement& s : r.steps) {
    if (!is_collective(s.op) && !is_collective_matmul(s.op)) continue;
    CommCount& c = out[to_string(s.op)][mesh.axis_names(s.axes)];
    c.count++;
    c.bytes += s.bytes_sent;
  }
  return out;
}

// The rule each element met (or one did not): absolute, plus a part relative to the
// expected value where the verification allows one.
std::string passing_rule(const Verification& v) {
  return "an element passes when its abs error <= " + format_error(v.tolerance) +
         (v.rel_tolerance > 0 ? " + " + format_error(v.rel_tolerance) + " x |expected|" : "");
}

// A calibrated profile was measured on this machine; a built-in or hand-written one models
// other hardware.
bool predicts_this_machine(const Planning& p) { return p.options.hw.calibration.has_value(); }

// Each step's confidence as planned, with what only the run knows (add_run_confidence); the
// text names a profile of other hardware once, on its profile line, rather than on every step.
std::vector<Confidence> run_confidence(const Planning& p, const Plan& plan, const RunReport& r, bool other_hardware) {
  std::vector<Confidence> out;
  for (const Step& s : plan.steps) {
    Confidence c = s.confidence;
    add_run_confidence(c, r.ranks_on_machine, r.cores, p.options.hw, other_hardware, s.time_s);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

void print_execution(std::ostream& out, const Planning& p, const Plan& plan, const ExecutionFlags& flags,
                     const RunReport& r) {
  const Mesh& mesh = p.mesh;
  out << "\nRun: " << r.ranks << " ranks on the " << flags.backend << " backend, " << to_string(p.options.dtype)
      << ", median of " << flags.repeat << " (after " << r.warmup_runs << " warm-up run"
      << (r.warmup_runs == 1 ? "" : "s")
      << (flags.warmup_time_s > 0 ? ", at least " + format_time(flags.warmup_time_s) : std::string()) << ")\n";
  out << "  plan      " << plan.description << "\n";
  // Only a profile calibrated here predicts this machine: another's prediction is shown as
  // that hardware's, with no ratio to what ran here.
  const bool here = predicts_this_machine(p);
  std::vector<std::string> columns{"#", "op", "axes", "tensor", "sent", "received"};
  columns.push_back(here ? "predicted" : "predicted on " + p.options.hw.name);
  columns.push_back("measured");
  if (here) columns.push_back("measured/predicted");
  Table steps(columns);
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const StepMeasurement& m = r.steps[i];
    const Step& s = plan.steps[i];
    std::vector<std::string> row{std::to_string(i + 1),
                                 to_string(m.op),
                                 m.axes.empty() ? "-" : mesh.axis_names(m.axes),
                                 m.tensor,
                                 format_bytes(static_cast<double>(m.bytes_sent)),
                                 format_bytes(static_cast<double>(m.bytes_received)),
                                 format_time(s.time_s),
                                 format_time(m.measured_time_s)};
    if (here) row.push_back(s.time_s > 0 ? format_sig3(m.measured_time_s / s.time_s) + "x" : "-");
    steps.add(row);
  }
  for (std::size_t c = 4; c < columns.size(); ++c) steps.right_align(c);
  steps.print(out);
  print_confidence(out, run_confidence(p, plan, r, false));
  out << "  (per step: the slowest rank's time, a collective's from its last rank's arrival, median over repeats"
      << (here ? "; predicted on " + p.options.hw.name + ", calibrated on this machine" : std::string()) << ")\n";
  out << "  total     measured " << format_time(r.measured_time_s)
      << " (first rank's start to last rank's finish); predicted " << format_time(plan.total_time_s) << " serialized";
  if (!here) {
    out << " on " << p.options.hw.name << "\n  profile   " << p.options.hw.name
        << " is another machine's, so no measured/predicted here: `shardmm calibrate --quick` measures this one in "
           "seconds, and run then predicts for it by default\n";
  } else {
    out << (plan.total_time_s > 0 ? "; measured/predicted " + format_sig3(r.measured_time_s / plan.total_time_s) + "x"
                                  : std::string())
        << "\n";
  }
  if (r.ranks_on_machine > r.cores) {
    out << "  shared    " << r.ranks_on_machine << " ranks take turns on this machine's " << r.cores
        << " cores: a rank that a collective wakes may wait for a core while others compute, and that wait counts "
           "in the collective's step above; the total is the figure to compare\n";
  }
  if (flags.trace) {
    out << "  trace     " << *flags.trace << ": " << r.timeline.size() << " ranks x " << r.steps.size()
        << " steps of repeat " << r.timeline_repeat + 1
        << " (the median); open it in ui.perfetto.dev or chrome://tracing\n";
  }

  out << "\nCommunication (bytes each device sends, summed over steps)\n";
  const auto summary = comm_summary(r, mesh);
  if (summary.empty()) {
    out << "  none: every step is local\n";
  } else {
    Table comm({"collective", "axes", "count", "bytes"});
    for (const auto& [op, by_axes] : summary) {
      for (const auto& [axes, c] : by_axes) {
        comm.add({op, axes, std::to_string(c.count), format_bytes(static_cast<double>(c.bytes))});
      }
    }
    comm.right_align(2);
    comm.right_align(3);
    comm.print(out);
  }

  const Verification& v = r.verification;
  out << "\nVerification against a dense single-device reference (f64)\n";
  out << "  " << (v.verified ? "verified" : "NOT VERIFIED") << ": max abs error " << format_error(v.max_abs_error)
      << " (" << passing_rule(v) << "); max rel error " << format_error(v.max_rel_error) << "\n";
  if (!v.verified && !v.detail.empty()) out << "  " << v.detail << "\n";
}

void add_execution_json(Json& doc, std::size_t candidate, const Planning& p, const Plan& plan,
                        const ExecutionFlags& flags, const RunReport& r) {
  // The executed candidate's steps first: adding top-level keys to an ordered document
  // moves its values, so no reference into it may be held across that.
  Json& plan_doc = doc["candidates"][candidate];
  const bool here = predicts_this_machine(p);
  const auto ratio = [here](double measured, double predicted) {
    return here && predicted > 0 ? Json(measured / predicted) : Json(nullptr);
  };
  const std::vector<Confidence> confidence = run_confidence(p, plan, r, true);
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    add_confidence_json(plan_doc["steps"][i], confidence[i]);
    plan_doc["steps"][i]["measured_time_s"] = r.steps[i].measured_time_s;
    plan_doc["steps"][i]["measured_over_predicted"] =
        ratio(r.steps[i].measured_time_s, plan_doc["steps"][i]["time_s"].get<double>());
    plan_doc["steps"][i]["measured_bytes_sent"] = r.steps[i].bytes_sent;
    plan_doc["steps"][i]["measured_bytes_received"] = r.steps[i].bytes_received;
  }
  plan_doc["measured_time_s"] = r.measured_time_s;
  const double predicted = plan_doc["total_time_s"].get<double>();
  doc["executed"] = candidate;
  doc["backend"] = flags.backend;
  doc["ranks"] = r.ranks;
  doc["ranks_on_machine"] = r.ranks_on_machine;
  doc["cores"] = r.cores;
  doc["repeat"] = flags.repeat;
  doc["warmup"] = flags.warmup;
  doc["warmup_time_s"] = flags.warmup_time_s;
  doc["warmup_runs"] = r.warmup_runs;
  doc["verified"] = r.verification.verified;
  doc["max_abs_error"] = r.verification.max_abs_error;
  doc["max_rel_error"] = r.verification.max_rel_error;
  doc["tolerance"] = r.verification.tolerance;
  doc["rel_tolerance"] = r.verification.rel_tolerance;
  doc["measured_time_s"] = r.measured_time_s;
  doc["predicted_time_s"] = predicted;
  doc["measured_over_predicted"] = ratio(r.measured_time_s, predicted);
  doc["predicted_for_this_machine"] = here;
  doc["repeat_times_s"] = r.repeat_times_s;
  Json trace = Json::object();
  for (const auto& [op, by_axes] : comm_summary(r, p.mesh)) {
    Json entry{{"count", 0}, {"bytes", 0}, {"by_axes", Json::object()}};
    for (const auto& [axes, c] : by_axes) {
      entry["count"] = entry["count"].get<int>() + c.count;
      entry["bytes"] = entry["bytes"].get<std::int64_t>() + c.bytes;
      entry["by_axes"][axes] = {{"count", c.count}, {"bytes", c.bytes}};
    }
    trace[op] = entry;
  }
  doc["trace"] = trace;
  doc["trace_file"] = flags.trace ? Json(*flags.trace) : Json(nullptr);
}

int execution_status(const RunReport& r) {
  if (r.verification.verified) return 0;
  if (r.is_root) {
    std::cerr << "shardmm: error: the result does not match the dense reference (max abs error " +
                     format_error(r.verification.max_abs_error) + "; " + passing_rule(r.verification) + ")\n";
  }
  return 3;
}

}  // namespace shardmm::cli
