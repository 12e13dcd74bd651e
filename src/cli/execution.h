// Running a planned contraction or reshard for real, for `run` and `reshard --run`: the
// flags, the run itself, and its report (text, or keys added to the plan's JSON).
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

#include "cli/common.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {

struct ExecutionFlags {
  std::string backend = "threads";
  int repeat = 5;
  int warmup = 1;
  double warmup_time_s = 0.2;        // RunRequest::warmup_min_s
  std::optional<int> candidate;      // 1-based index into the candidates as printed; none: the chosen one
  bool check = true;                 // BackendOptions::check; --no-check turns it off
  std::optional<double> watchdog_s;  // BackendOptions::watchdog_s (--watchdog; unset: SHARDMM_WATCHDOG_S or 300 s)
  std::optional<std::string> trace;  // --trace FILE: a Chrome trace of the run
};

// --backend, --repeat, --warmup, --warmup-time, --candidate, --no-check, --watchdog, --trace.
void add_execution_flags(CLI::App& app, ExecutionFlags& flags);
// --warmup-time alone (bench matmul times plans as run does).
void add_warmup_time_flag(CLI::App& app, double& seconds);

// Where a command executes only with --run (`run` false): InputError when an execution flag
// was given without it, instead of ignoring it.
void require_run(const CLI::App& app, bool run);

// Checks the backend name, the dtype (runs compute in f32 or f64) and the --trace path
// before anything runs, so that every MPI rank rejects bad input alike; then plans for that
// backend (p.options.reduction_workspace: the peak counts its reduction workspace).
void check_execution(const ExecutionFlags& flags, Planning& p);

// The candidate to run: flags.candidate, or `chosen`.
std::size_t pick_candidate(const ExecutionFlags& flags, std::size_t count, int chosen);

// Runs the plan (progress on stderr on the printing process).
RunReport execute(const ExecutionFlags& flags, const Planning& p, const Plan& plan, const Contraction* contraction,
                  const Spec* reshard_from);

void print_execution(std::ostream& out, const Planning& p, const Plan& plan, const ExecutionFlags& flags,
                     const RunReport& r);
// Adds the run's figures to a plan document: top-level keys (`executed` = `candidate`) and
// each executed step's measured_time_s and measured/predicted ratio (docs/json-schema.md).
void add_execution_json(Json& doc, std::size_t candidate, const Planning& p, const Plan& plan,
                        const ExecutionFlags& flags, const RunReport& r);

// The exit status of a run: 0 when verified, 3 when the result is wrong (a line on stderr).
int execution_status(const RunReport& r);
// After the report is printed (a trace that cannot be written loses nothing else): with
// --trace, the printing process writes the Chrome trace (chrome_trace.h) of every rank; then
// execution_status.
int finish_execution(const ExecutionFlags& flags, const Planning& p, const Plan& plan, const RunReport& r);

}  // namespace shardmm::cli
