#include "shardmm/runtime/runner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <new>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/kernels.h"
#include "runtime/bench_timing.h"
#include "runtime/machine_cores.h"

namespace shardmm {

namespace {

constexpr int kTimingTag = 0x71e;
// Bounds of the timed warm-up (RunRequest::warmup_min_s): a minute at most, and at most
// this many runs of a plan however short it is.
constexpr double kMaxWarmupSeconds = 60;
constexpr int kMaxWarmupRuns = 100000;

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

}  // namespace

void check_warmup_time(double seconds) {
  if (!(seconds >= 0 && seconds <= kMaxWarmupSeconds)) {
    throw InputError(field("warmup_time") + " " + format_seconds(seconds) + ": must be 0 to " + format_seconds(kMaxWarmupSeconds) +
                     " seconds");
  }
}

namespace {


double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Per rank, what device 0 needs: every step's duration in every repeat, every step's start
// in every repeat (from the repeat's start), then each step's bytes sent and received.
std::vector<double> timing_message(const std::vector<std::vector<double>>& durations,
                                   const std::vector<std::vector<double>>& starts, const std::vector<TraceEvent>& trace) {
  std::vector<double> msg;
  for (const auto& rep : durations) msg.insert(msg.end(), rep.begin(), rep.end());
  for (const auto& rep : starts) msg.insert(msg.end(), rep.begin(), rep.end());
  for (const TraceEvent& e : trace) {
    msg.push_back(static_cast<double>(e.bytes_sent));
    msg.push_back(static_cast<double>(e.bytes_received));
  }
  return msg;
}

}  // namespace

double step_time_s(OpKind op, const std::vector<double>& starts, const std::vector<double>& durations) {
  if (starts.size() != durations.size() || starts.empty()) {
    throw InputError("step_time_s: one start and one duration per rank, and at least one rank");
  }
  double slowest = 0, last_arrival = starts.front(), last_end = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    slowest = std::max(slowest, durations[i]);
    last_arrival = std::max(last_arrival, starts[i]);
    last_end = std::max(last_end, starts[i] + durations[i]);
  }
  return is_collective(op) ? last_end - last_arrival : slowest;
}

namespace {

// Byte counts saturate (core/error.h): a run that would need more than 2^63 bytes is refused
// all the same.

std::int64_t elements_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n = saturating_mul(n, e);
  return n;
}

// As Buffer allocates: whole 64-byte lines, at least one.
std::int64_t buffer_bytes(std::int64_t elements, DType dtype) {
  return saturating_add(std::max<std::int64_t>(saturating_mul(elements, dtype_bytes(dtype)), 1), 63) / 64 * 64;
}

std::int64_t block_bytes(const Mesh& mesh, const Spec& spec, const DimSizes& sizes, DType dtype, std::int64_t device) {
  return buffer_bytes(local_elements(mesh, spec, global_shape(spec, sizes), device), dtype);
}


void check_operands(const RunRequest& req) {
  if ((req.contraction != nullptr) == (req.reshard_from != nullptr)) {
    throw InputError("run_plan needs exactly one of a contraction or a reshard source");
  }
}

// Ranks of this mpirun job on this node; they share its memory.
std::int64_t ranks_on_node() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  }
  return 1;
}

// The first number in a file ("max" in a cgroup v2 limit is no number: no limit).
std::optional<std::int64_t> file_number(const char* path) {
  std::ifstream in(path);
  std::int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// The run needs more than the request's limit or the machine's memory: refuse, with the
// figures, before anything is allocated.
void check_memory(const RunRequest& req, const MemoryNeed& need) {
  const std::string verifying =
      need.verify_bytes ? " + " + format_bytes(need.verify_bytes) + " to verify on device 0" : std::string();
  // What each device holds at most, its copy of the result for verification included.
  const std::int64_t per_device = saturating_add(need.device_bytes, need.verify_copy_bytes);
  // The limit is the devices' memory; verification is the host's check, outside it.
  if (req.mem_limit_bytes && need.device_bytes > *req.mem_limit_bytes) {
    throw InputError("the run needs " + format_bytes(need.device_bytes) + " on device 0 (its inputs, and every step's " +
                     "buffers, which the executor keeps between repeats), over the memory limit of " +
                     format_bytes(*req.mem_limit_bytes) + " per device" +
                     (need.verify_bytes ? " (verifying takes " +
                                              format_bytes(saturating_add(need.verify_copy_bytes, need.verify_bytes)) +
                                              " more on device 0, not counted against the limit)"
                                        : std::string()) +
                     "; use smaller " + field("dims") + " or more devices");
  }
  const bool threads = backend_capabilities(req.backend).ranks_in_one_process;
  // Under an address-space limit, a mapping that fails inside BLAS hangs it (OpenBLAS retries
  // forever): refuse up front what this process's ranks would map.
  if (const auto left = address_space_left(); left && !req.available_bytes) {
    const std::int64_t ranks = threads ? req.mesh.device_count() : 1;
    const bool holds_device0 = threads || process_rank(req.backend) == 0;  // verification's gathering
    const std::int64_t process = saturating_add(saturating_mul(saturating_add(per_device, kRankAddressSpaceBytes), ranks),
                                                holds_device0 ? need.verify_bytes : 0);
    if (process > *left) {
      throw InputError("the run maps " + format_bytes(process) + " in this process (" + std::to_string(ranks) +
                       (ranks == 1 ? " rank" : " ranks") + " x (" + format_bytes(per_device) + " + " +
                       format_bytes(kRankAddressSpaceBytes) + " for BLAS's work buffer and the rank's stack)" +
                       (holds_device0 ? verifying : std::string()) + "), but its address-space limit (ulimit -v) leaves " + format_bytes(*left) +
                       "; raise the limit, or use smaller " + field("dims") + " or more devices");
    }
  }
  const std::int64_t available = req.available_bytes ? *req.available_bytes : available_memory();
  if (need.total_bytes > available) {
    const std::string sharing =
        threads ? std::to_string(need.devices_sharing) + (need.devices_sharing == 1 ? " device" : " devices") +
                      " in this process"
                : std::to_string(need.devices_sharing) +
                      (need.devices_sharing == 1 ? " process (device)" : " processes (devices)") + " on this node";
    throw InputError("the run needs " + format_bytes(per_device) + " per device x " + sharing + verifying +
                     " = " + format_bytes(need.total_bytes) + ", but only " + format_bytes(available) +
                     " is available; use smaller " + field("dims") + " or " +
                     (threads ? "more processes (" + field("backend") + " mpi, across machines)" : "more machines"));
  }
}

// Allocation failure despite the check (another program took the memory, or a
// container's limit is lower than it says) is an InputError with the estimate.
std::function<void(Communicator&)> allocation_failure_as_input_error(const MemoryNeed& need,
                                                                     std::function<void(Communicator&)> body) {
  return [&need, body = std::move(body)](Communicator& comm) {
    try {
      body(comm);
    } catch (const std::bad_alloc&) {
      throw InputError("out of memory on device " + std::to_string(comm.rank()) + " (the run was estimated at " +
                       format_bytes(need.device_bytes) + " per device); use smaller " + field("dims") + " or more devices");
    }
  };
}

}  // namespace

std::string format_bytes(std::int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (u + 1 < std::size(units) && v >= 1024) {
    v /= 1024;
    ++u;
  }
  char text[32];
  if (u == 0) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s", v, units[u]);
  }
  return text;
}

MemoryNeed memory_need(const RunRequest& req) {
  check_operands(req);
  const bool matmul = req.contraction != nullptr;
  const Mesh& mesh = req.mesh;
  const Spec& a_spec = matmul ? req.contraction->a : *req.reshard_from;
  MemoryNeed need;
  need.device_bytes = saturating_add(block_bytes(mesh, a_spec, req.sizes, req.dtype, 0),
                              Executor::bytes_needed(mesh, req.plan, req.sizes, req.dtype, 0));
  if (matmul) need.device_bytes = saturating_add(need.device_bytes, block_bytes(mesh, req.contraction->b, req.sizes, req.dtype, 0));
  const BackendCapabilities backend = backend_capabilities(req.backend);
  if (backend.reduces_into_workspace) {
    // The mpi backend's reductions receive the other members' chunks into a workspace
    // (mpi_backend.cpp, reduce_scatter; all_reduce is one): about the input block.
    std::int64_t workspace = 0;
    for (const Step& s : req.plan.steps) {
      if (s.op == OpKind::reduce_scatter || s.op == OpKind::all_reduce) {
        workspace = std::max(workspace, block_bytes(mesh, s.from, req.sizes, req.dtype, 0));
      }
    }
    need.device_bytes = saturating_add(need.device_bytes, workspace);
  }
  if (req.verify) {
    // Every device sends device 0 a copy of its result block (verify.h), which device 0
    // keeps, with the dense reference in f64.
    const Spec& out = req.plan.output;
    need.verify_copy_bytes = block_bytes(mesh, out, req.sizes, req.dtype, 0);
    for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
      need.verify_bytes = saturating_add(need.verify_bytes, block_bytes(mesh, out, req.sizes, req.dtype, d));
    }
    const auto dense = [&](const Spec& s) { return saturating_mul(elements_of(global_shape(s, req.sizes)), 8); };
    if (matmul) {
      // The inputs, the expected and the assembled result, and the reference einsum's workspace.
      const Contraction& c = *req.contraction;
      EinsumLayout layout;
      for (const DimSpec& d : c.a.dims) layout.a.push_back(d.name);
      for (const DimSpec& d : c.b.dims) layout.b.push_back(d.name);
      layout.c = c.out_dims;
      const std::map<std::string, std::int64_t> extents(req.sizes.begin(), req.sizes.end());
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_add(dense(c.a), dense(c.b)));
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_mul(dense(out), 2));
      need.verify_bytes =
          saturating_add(need.verify_bytes, LocalEinsum::workspace_bytes_for(std::move(layout), extents, DType::f64));
    } else {
      need.verify_bytes = saturating_add(need.verify_bytes, saturating_mul(dense(out), 2));  // assembled and expected
    }
  }
  need.devices_sharing = backend.ranks_in_one_process ? mesh.device_count() : ranks_on_node();
  need.total_bytes = saturating_add(
      saturating_mul(saturating_add(need.device_bytes, need.verify_copy_bytes), need.devices_sharing), need.verify_bytes);
  return need;
}

std::int64_t available_memory() {
  std::int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key, rest;
  std::int64_t kib = 0;
  while (meminfo >> key >> kib && std::getline(meminfo, rest)) {
    if (key == "MemAvailable:") {
      available = saturating_mul(kib, 1024);
      break;
    }
  }
  if (available < 0) available = saturating_mul(sysconf(_SC_AVPHYS_PAGES), sysconf(_SC_PAGESIZE));
  // A container's memory limit (cgroup v2, else v1), which MemAvailable does not see.
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (const auto bytes = file_number(limit)) available = std::min(available, *bytes);
  }
  return available;
}

std::optional<std::int64_t> address_space_left() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  // /proc/self/statm's first field: the pages mapped now.
  const std::optional<std::int64_t> pages = file_number("/proc/self/statm");
  const std::int64_t mapped = pages ? saturating_mul(*pages, sysconf(_SC_PAGESIZE)) : 0;
  const auto cap = static_cast<std::int64_t>(std::min<rlim_t>(limit.rlim_cur, std::numeric_limits<std::int64_t>::max()));
  return std::max<std::int64_t>(0, cap - mapped);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

RunReport run_plan(const RunRequest& req) {
  check_operands(req);
  const bool matmul = req.contraction != nullptr;
  if (req.repeat < 1 || req.warmup < 0) {
    throw InputError(field("repeat") + " must be at least 1 and " + field("warmup") + " at least 0 (got " + std::to_string(req.repeat) + " and " +
                     std::to_string(req.warmup) + ")");
  }
  check_warmup_time(req.warmup_min_s);
  const MemoryNeed need = memory_need(req);
  check_memory(req, need);
  const Mesh& mesh = req.mesh;
  const std::size_t nsteps = req.plan.steps.size();
  const auto a_values = uniform_values(1), b_values = uniform_values(2);
  RunReport report;
  report.ranks = static_cast<int>(mesh.device_count());
  report.ranks_on_machine = need.devices_sharing;
  report.cores = detail::machine_cores();
  std::mutex root_mutex;

  BackendOptions backend_options;
  backend_options.check = req.check;
  backend_options.watchdog_s = req.watchdog_s;
  run_backend(req.backend, mesh, allocation_failure_as_input_error(need, [&](Communicator& comm) {
    const std::int64_t me = comm.rank();
    const Spec& a_spec = matmul ? req.contraction->a : *req.reshard_from;
    DistTensor a = DistTensor::filled(mesh, me, a_spec, global_shape(a_spec, req.sizes), req.dtype, a_values);
    DistTensor b;
    if (matmul) b = DistTensor::filled(mesh, me, req.contraction->b, global_shape(req.contraction->b, req.sizes), req.dtype, b_values);
    const auto note = [&](const std::string& what) {
      if (me == 0 && req.progress) req.progress(what);
    };
    Executor exec(comm, req.plan, req.sizes, req.dtype);
    comm.barrier();
    const auto warmup_start = std::chrono::steady_clock::now();
    int warmups = 0;
    for (; warmups < req.warmup; ++warmups) {
      note("warm-up " + std::to_string(warmups + 1) + " of " + std::to_string(req.warmup) +
           (req.warmup_min_s > 0 ? ", then more until " + format_seconds(req.warmup_min_s) + " s" : ""));
      exec.run(a, matmul ? &b : nullptr);
    }
    // Then until the warm-up has taken warmup_min_s. Every rank must make the same runs, so
    // after each they agree on going on from their mean time spent (one 8-byte all_reduce).
    const AxisList everyone = mesh.all_axes();
    while (req.warmup_min_s > 0 && warmups < kMaxWarmupRuns) {
      double spent = seconds_since(warmup_start);
      comm.all_reduce(&spent, 1, DType::f64, everyone);
      if (spent / static_cast<double>(mesh.device_count()) >= req.warmup_min_s) break;
      note("warm-up " + std::to_string(++warmups) + " (until " + format_seconds(req.warmup_min_s) + " s)");
      exec.run(a, matmul ? &b : nullptr);
    }

    std::vector<double> repeat_times;
    std::vector<std::vector<double>> durations, starts;
    const DistTensor* result = nullptr;
    for (int i = 0; i < req.repeat; ++i) {
      note("repeat " + std::to_string(i + 1) + " of " + std::to_string(req.repeat));
      double repeat_start = 0;  // on the trace's clock
      double lag = 0;           // after the first rank's start: steps are timed from that
      repeat_times.push_back(detail::group_span_s(
          comm,
          [&] {
            repeat_start = exec.clock();
            result = &exec.run(a, matmul ? &b : nullptr);
          },
          &lag));
      std::vector<double> d, from;
      for (const TraceEvent& e : exec.trace()) {
        d.push_back(e.end_s - e.start_s);
        from.push_back(e.start_s - repeat_start + lag);
      }
      durations.push_back(std::move(d));
      starts.push_back(std::move(from));
    }

    // Device 0 collects every rank's step timings and bytes.
    std::vector<double> mine = timing_message(durations, starts, exec.trace());
    std::vector<std::vector<double>> all;
    if (me == 0) {
      all.push_back(mine);
      for (std::int64_t dev = 1; dev < mesh.device_count(); ++dev) {
        std::vector<double> msg(mine.size());
        comm.recv(msg.data(), static_cast<std::int64_t>(msg.size() * sizeof(double)), dev, kTimingTag);
        all.push_back(std::move(msg));
      }
    } else {
      comm.send(mine.data(), static_cast<std::int64_t>(mine.size() * sizeof(double)), 0, kTimingTag);
    }

    Verification v;
    v.verified = true;
    if (req.verify) {
      note("verifying against the dense reference");
      v = matmul ? verify_contraction(comm, *req.contraction, req.sizes, req.dtype, *result, a_values, b_values)
                 : verify_reshard(comm, *req.reshard_from, global_shape(*req.reshard_from, req.sizes), req.dtype, *result,
                                  a_values);
    }
    if (me != 0) {
      if (!comm.capabilities().ranks_in_one_process) {
        report.is_root = false;
        report.verification = v;
        report.verified_run = req.verify;
      }
      return;
    }
    std::lock_guard lock(root_mutex);
    report.verification = v;
    report.verified_run = req.verify;
    report.repeat_times_s = repeat_times;
    report.warmup_runs = warmups;
    report.measured_time_s = median(repeat_times);
    const std::vector<TraceEvent>& trace = exec.trace();
    for (std::size_t s = 0; s < nsteps; ++s) {
      StepMeasurement m;
      m.op = trace[s].op;
      m.axes = trace[s].axes;
      m.tensor = trace[s].tensor;
      std::vector<double> per_repeat;
      const std::size_t starts_at = static_cast<std::size_t>(req.repeat) * nsteps;
      for (int r = 0; r < req.repeat; ++r) {
        const std::size_t at = static_cast<std::size_t>(r) * nsteps + s;
        std::vector<double> begun, took;
        for (const auto& msg : all) {
          begun.push_back(msg[starts_at + at]);
          took.push_back(msg[at]);
        }
        per_repeat.push_back(step_time_s(m.op, begun, took));
      }
      m.measured_time_s = median(per_repeat);
      const std::size_t bytes_at = 2 * static_cast<std::size_t>(req.repeat) * nsteps + 2 * s;
      for (const auto& msg : all) {
        m.bytes_sent = std::max(m.bytes_sent, static_cast<std::int64_t>(msg[bytes_at]));
        m.bytes_received = std::max(m.bytes_received, static_cast<std::int64_t>(msg[bytes_at + 1]));
      }
      report.steps.push_back(std::move(m));
    }
    // The repeat whose time is the median (the upper one of an even count), on every rank.
    std::vector<int> order(static_cast<std::size_t>(req.repeat));
    for (int r = 0; r < req.repeat; ++r) order[static_cast<std::size_t>(r)] = r;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return repeat_times[static_cast<std::size_t>(x)] < repeat_times[static_cast<std::size_t>(y)]; });
    report.timeline_repeat = order[order.size() / 2];
    const std::size_t rep = static_cast<std::size_t>(report.timeline_repeat) * nsteps;
    const std::size_t starts_at = static_cast<std::size_t>(req.repeat) * nsteps;
    for (const auto& msg : all) {
      std::vector<StepSpan> spans;
      for (std::size_t s = 0; s < nsteps; ++s) {
        const double start = msg[starts_at + rep + s];
        spans.push_back({start, start + msg[rep + s]});
      }
      report.timeline.push_back(std::move(spans));
    }
  }), backend_options);
  return report;
}

}  // namespace shardmm
