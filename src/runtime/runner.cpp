#include "shardmm/runtime/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/kernels.h"
#include "runtime/bench_timing.h"
#include "runtime/run_memory.h"
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
    throw InputError(field("warmup_time") + " " + format_seconds(seconds) + ": must be 0 to " +
                     format_seconds(kMaxWarmupSeconds) + " seconds");
  }
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Per rank, what device 0 needs: every step's duration in every repeat, every step's start
// in every repeat (from the repeat's start), then each step's bytes sent and received.
std::vector<double> timing_message(const std::vector<std::vector<double>>& durations,
                                   const std::vector<std::vector<double>>& starts,
                                   const std::vector<TraceEvent>& trace) {
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

RunReport run_plan(const RunRequest& req) {
  detail::check_operands(req);
  const bool matmul = req.contraction != nullptr;
  if (req.repeat < 1 || req.warmup < 0) {
    throw InputError(field("repeat") + " must be at least 1 and " + field("warmup") + " at least 0 (got " +
                     std::to_string(req.repeat) + " and " + std::to_string(req.warmup) + ")");
  }
  check_warmup_time(req.warmup_min_s);
  const MemoryNeed need = memory_need(req);
  detail::check_memory(req, need);
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
  run_backend(
      req.backend, mesh,
      detail::allocation_failure_as_input_error(
          need,
          [&](Communicator& comm) {
            const std::int64_t me = comm.rank();
            const Spec& a_spec = matmul ? req.contraction->a : *req.reshard_from;
            DistTensor a = DistTensor::filled(mesh, me, a_spec, global_shape(a_spec, req.sizes), req.dtype, a_values);
            DistTensor b;
            if (matmul)
              b = DistTensor::filled(mesh, me, req.contraction->b, global_shape(req.contraction->b, req.sizes),
                                     req.dtype, b_values);
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
                         : verify_reshard(comm, *req.reshard_from, global_shape(*req.reshard_from, req.sizes),
                                          req.dtype, *result, a_values);
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
            std::sort(order.begin(), order.end(), [&](int x, int y) {
              return repeat_times[static_cast<std::size_t>(x)] < repeat_times[static_cast<std::size_t>(y)];
            });
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
          }),
      backend_options);
  return report;
}

}  // namespace shardmm
