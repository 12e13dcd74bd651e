#include "shardmm/runtime/runner.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"
#ifdef SHARDMM_HAVE_MPI
#include "runtime/mpi/mpi_backend.h"
#endif

namespace shardmm {

namespace {

constexpr int kTimingTag = 0x71e;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Per rank, what device 0 needs: every step's duration in every repeat, then each
// step's bytes sent and received.
std::vector<double> timing_message(const std::vector<std::vector<double>>& durations, const std::vector<TraceEvent>& trace) {
  std::vector<double> msg;
  for (const auto& rep : durations) msg.insert(msg.end(), rep.begin(), rep.end());
  for (const TraceEvent& e : trace) {
    msg.push_back(static_cast<double>(e.bytes_sent));
    msg.push_back(static_cast<double>(e.bytes_received));
  }
  return msg;
}

}  // namespace

int process_rank(std::string_view backend) {
#ifdef SHARDMM_HAVE_MPI
  if (backend == "mpi") return detail::mpi_world_rank();
#endif
  (void)backend;
  return 0;
}

RunReport run_plan(const RunRequest& req) {
  const bool matmul = req.contraction != nullptr;
  if (matmul == (req.reshard_from != nullptr)) {
    throw InputError("run_plan needs exactly one of a contraction or a reshard source");
  }
  if (req.repeat < 1 || req.warmup < 0) {
    throw InputError("--repeat must be at least 1 and --warmup at least 0 (got " + std::to_string(req.repeat) + " and " +
                     std::to_string(req.warmup) + ")");
  }
  const Mesh& mesh = req.mesh;
  const std::size_t nsteps = req.plan.steps.size();
  const auto a_values = uniform_values(1), b_values = uniform_values(2);
  RunReport report;
  report.ranks = static_cast<int>(mesh.device_count());
  std::mutex root_mutex;

  run_backend(req.backend, mesh, [&](Communicator& comm) {
    const std::int64_t me = comm.rank();
    const Spec& a_spec = matmul ? req.contraction->a : *req.reshard_from;
    DistTensor a = DistTensor::filled(mesh, me, a_spec, global_shape(a_spec, req.sizes), req.dtype, a_values);
    DistTensor b;
    if (matmul) b = DistTensor::filled(mesh, me, req.contraction->b, global_shape(req.contraction->b, req.sizes), req.dtype, b_values);
    const auto note = [&](const std::string& what) {
      if (me == 0 && req.progress) req.progress(what);
    };
    Executor exec(comm, req.plan, req.sizes, req.dtype);
    for (int i = 0; i < req.warmup; ++i) {
      note("warm-up " + std::to_string(i + 1) + " of " + std::to_string(req.warmup));
      exec.run(a, matmul ? &b : nullptr);
    }

    std::vector<double> repeat_times;
    std::vector<std::vector<double>> durations;
    const DistTensor* result = nullptr;
    for (int i = 0; i < req.repeat; ++i) {
      note("repeat " + std::to_string(i + 1) + " of " + std::to_string(req.repeat));
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      result = &exec.run(a, matmul ? &b : nullptr);
      comm.barrier();
      repeat_times.push_back(seconds_since(t0));
      std::vector<double> d;
      for (const TraceEvent& e : exec.trace()) d.push_back(e.end_s - e.start_s);
      durations.push_back(std::move(d));
    }

    // Device 0 collects every rank's step timings and bytes.
    std::vector<double> mine = timing_message(durations, exec.trace());
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
      if (req.backend != "threads") {
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
    report.measured_time_s = median(repeat_times);
    const std::vector<TraceEvent>& trace = exec.trace();
    for (std::size_t s = 0; s < nsteps; ++s) {
      StepMeasurement m;
      m.op = trace[s].op;
      m.axes = trace[s].axes;
      m.tensor = trace[s].tensor;
      std::vector<double> per_repeat;
      for (int r = 0; r < req.repeat; ++r) {
        double slowest = 0;
        for (const auto& msg : all) slowest = std::max(slowest, msg[static_cast<std::size_t>(r) * nsteps + s]);
        per_repeat.push_back(slowest);
      }
      m.measured_time_s = median(per_repeat);
      const std::size_t bytes_at = static_cast<std::size_t>(req.repeat) * nsteps + 2 * s;
      for (const auto& msg : all) {
        m.bytes_sent = std::max(m.bytes_sent, static_cast<std::int64_t>(msg[bytes_at]));
        m.bytes_received = std::max(m.bytes_received, static_cast<std::int64_t>(msg[bytes_at + 1]));
      }
      report.steps.push_back(std::move(m));
    }
  });
  return report;
}

}  // namespace shardmm
