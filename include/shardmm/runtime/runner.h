// Runs a plan on a backend with generated inputs, times it, traces it and verifies it:
// what `shardmm run` and `shardmm reshard --run` do, for any program that wants the same.
//
//   RunRequest req{"threads", mesh, plan, sizes, DType::f32};
//   req.contraction = &contraction;          // or req.reshard_from = &spec
//   req.repeat = 5;
//   RunReport r = run_plan(req);
//   if (r.is_root) std::cout << r.measured_time_s << " " << r.verification.verified;
//
// Before anything is allocated, run_plan checks the run's memory (memory_need) against
// the request's per-device limit and against what the machine has available, and
// refuses with the figures (InputError). An allocation that fails anyway is an
// InputError too, not a crash.
//
// On the threads backend every rank is a thread of this process and the report is
// complete here. Under mpirun each process is one rank: the figures are gathered on
// device 0 and `is_root` is true in that process only; the verdict is known everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/plan/step.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {

// The median every report and benchmark quotes: the middle value, or the mean of the two
// middle values of an even count; 0 for no values.
double median(std::vector<double> values);

struct RunRequest {
  std::string backend = "threads";
  Mesh mesh;
  Plan plan;
  DimSizes sizes;
  DType dtype = DType::f32;
  const Contraction* contraction = nullptr;  // a matmul plan's expression
  const Spec* reshard_from = nullptr;        // or a reshard plan's source layout
  int warmup = 1;                            // untimed runs first (page faults, caches)
  // Then more untimed runs until the warm-up has taken this long: some machines' clocks and
  // memory speed ramp up over the first tenths of a second of work (docs/calibration.md).
  // 0 to a minute (check_warmup_time).
  double warmup_min_s = 0;
  int repeat = 5;  // timed runs
  bool verify = true;
  bool check = true;      // BackendOptions::check (communicator.h)
  double watchdog_s = 0;  // BackendOptions::watchdog_s (0: SHARDMM_WATCHDOG_S or 300)
  // Per device (--mem-limit): refuse a run whose largest device needs more.
  std::optional<std::int64_t> mem_limit_bytes;
  // The memory this process may use; unset: available_memory() now. Lets a caller budget
  // for something else, and tests reach allocation failure.
  std::optional<std::int64_t> available_bytes;
  // Called on device 0 as the run moves on ("repeat 3 of 5", "verifying"), for long runs.
  std::function<void(const std::string&)> progress;
};

struct StepMeasurement {
  OpKind op = OpKind::einsum;
  AxisList axes;
  std::string tensor;
  std::int64_t bytes_sent = 0;      // the most any rank sent
  std::int64_t bytes_received = 0;  // the most any rank received
  double measured_time_s = 0;       // median over repeats of step_time_s
};

// Throws InputError naming --warmup-time unless `seconds` is 0 to 60 (RunRequest::warmup_min_s).
void check_warmup_time(double seconds);

// One step's time in one repeat, from every rank's start (from its start of the repeat) and
// duration: the slowest rank's span; for a collective, from its last member's arrival to
// its last member's completion, since it cannot complete before everyone has arrived: what
// an early rank spends waiting is the imbalance of the steps before, not the collective's.
double step_time_s(OpKind op, const std::vector<double>& starts, const std::vector<double>& durations);

// One step on one rank: seconds from that rank's start of the repeat (every rank starts a
// repeat on leaving the same barrier, so the ranks' spans line up).
struct StepSpan {
  double start_s = 0;
  double end_s = 0;
};

struct RunReport {
  bool is_root = true;  // this process holds the gathered figures
  int ranks = 0;
  double measured_time_s = 0;  // median over repeats, first rank's start to last rank's finish
  std::vector<double> repeat_times_s;
  int warmup_runs = 0;  // untimed runs made: `warmup`, or more for warmup_min_s
  std::vector<StepMeasurement> steps;
  // Every rank's steps in one repeat, the one whose time is the median: timeline[rank][step]
  // (chrome_trace.h's run_trace_events draws it).
  std::vector<std::vector<StepSpan>> timeline;
  int timeline_repeat = 0;    // 0-based
  Verification verification;  // verified = true and zero errors when verify is off
  bool verified_run = false;  // whether verification ran
  // The ranks on this machine (threads: every device; mpi: this node's processes) and its
  // cores. Where ranks outnumber cores they take turns: a rank that a collective wakes may wait
  // for a core another rank's GEMM holds, and that wait shows in the collective's step time.
  std::int64_t ranks_on_machine = 1;
  int cores = 1;
};

// What a run holds in memory at once, worked out from the plan alone. Device 0 holds the
// most: under either split rule the first shards of an uneven split are the longest.
struct MemoryNeed {
  // The most a device holds: its inputs and its executor's buffers, all kept between repeats,
  // and the backend's reduction workspace (plan/memory.h's plan_peak_bytes): the plan's
  // peak_bytes_per_device when it was planned in this dtype for this backend. The memory
  // limit weighs this figure alone.
  std::int64_t device_bytes = 0;
  // When verifying, on every device: the copy of its result block it sends device 0.
  std::int64_t verify_copy_bytes = 0;
  // More on device 0 when verifying: every device's result block, and the dense f64
  // reference (inputs, expected and assembled outputs, einsum workspace).
  std::int64_t verify_bytes = 0;
  // The devices whose memory comes out of one pool: threads, every device of the mesh
  // (one process); mpi, the ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE, else 1).
  std::int64_t devices_sharing = 1;
  // (device_bytes + verify_copy_bytes) * devices_sharing + verify_bytes (saturating).
  std::int64_t total_bytes = 0;
};
MemoryNeed memory_need(const RunRequest& request);

// Bytes the machine can give this process now: MemAvailable from /proc/meminfo (else
// free pages), capped by the cgroup's memory limit less its usage.
std::int64_t available_memory();

// The address space this process may still map under its RLIMIT_AS (`ulimit -v`): the limit
// less what is mapped now; unset where there is no limit. Every allocation counts against it
// whether or not it is touched, OpenBLAS's work buffers and each thread's stack and malloc
// arena included.
std::optional<std::int64_t> address_space_left();

// The address space a rank maps beside its buffers, measured with OpenBLAS 0.3.21 on glibc:
// a single-threaded GEMM's work buffer (128 MiB, at its first call) and, for a thread rank,
// its stack and malloc arena (72 MiB).
constexpr std::int64_t kRankAddressSpaceBytes = std::int64_t{200} << 20;

// "512 B", "16.0 MiB", "1.50 GiB": three significant digits, binary units.
std::string format_bytes(std::int64_t bytes);

// Throws InputError for a request that does not fit (no operand given, bad repeat, more
// memory than the limit or the machine allows).
RunReport run_plan(const RunRequest& request);

// The rank of this process in its backend's job: 0 for threads, the MPI world rank
// under mpirun (known before MPI starts). Lets a program print on one process only.
int process_rank(std::string_view backend);

// For a front end whose processes are the ranks of an mpirun job (the CLI); outside one, both
// return "" at once. Ranks started with different flags or environments, or one that fails
// alone, would otherwise hang in their first collective or print nothing.
//
// After parsing, every rank: its parse error ("" when none) and how it was started (its
// arguments and SHARDMM_* environment, an item a line). Returns the message all ranks stop with
// ("" to go on), or nullopt when not every rank came within `timeout_s`.
std::optional<std::string> agree_at_launch(const std::string& failure, const std::string& fingerprint,
                                           double timeout_s);
// A rank that fails before its first run of the mpi backend: the ranks waiting at that run's
// start hear of it and stop too. Returns the message all stop with, "" when the first run is
// past (nobody is waiting), or nullopt when the others did not come within `timeout_s` (a
// command that runs no backend).
std::optional<std::string> report_failure_before_run(const std::string& failure, double timeout_s);

}  // namespace shardmm
