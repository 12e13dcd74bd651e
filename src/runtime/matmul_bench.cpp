#include "shardmm/runtime/matmul_bench.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/bench_timing.h"
#include "runtime/gemm_timing.h"
#include "runtime/machine_cores.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {

namespace {

// Trials of the speed check's GEMM per round (each ~20 ms or one call, whichever is longer).
constexpr int kSpeedCheckTrials = 3;

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The times of `repeat` `threads`-thread GEMMs C[m,n] = A[m,k] @ B[k,n] after `warmup` runs.
template <class T>
std::vector<double> gemm_times(std::int64_t m, std::int64_t n, std::int64_t k, int threads, int warmup, int repeat) {
  // Values in [-1, 1): no denormals or infinities that would time differently.
  const auto fill = [](std::vector<T>& v, int salt) {
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<T>(static_cast<double>((i * 7919 + salt) % 2001) / 1000.0 - 1.0);
  };
  std::vector<T> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
      c(static_cast<std::size_t>(m * n));
  fill(a, 1);
  fill(b, 2);
  const int saved = blas::threads();
  blas::set_threads(threads);
  std::vector<double> times;
  for (int r = 0; r < warmup + repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    blas::gemm(false, false, m, n, k, T(1), a.data(), k, b.data(), n, T(0), c.data(), n);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r >= warmup) times.push_back(t);
  }
  blas::set_threads(saved);
  return times;
}

// The reference's times (under mpirun: on rank 0; the other processes get none).
std::vector<double> reference_times(const MatmulBenchOptions& o, const MatmulBenchPoint& p, int threads) {
  const auto time = [&](int warmup, int repeat) {
    return o.dtype == DType::f32 ? gemm_times<float>(p.gemm_m, p.gemm_n, p.gemm_k, threads, warmup, repeat)
                                 : gemm_times<double>(p.gemm_m, p.gemm_n, p.gemm_k, threads, warmup, repeat);
  };
  if (backend_capabilities(o.backend).ranks_in_one_process) return time(o.warmup, o.repeat);
  // Under mpirun rank 0 alone computes. A rank waiting in an MPI call polls and would take
  // cycles from the GEMM's threads, so the others sleep instead, for as long as rank 0 says
  // the GEMMs will take (from one timed GEMM, with a margin), and only then wait for it.
  std::vector<double> t;
  run_backend(o.backend, o.mesh, [&](Communicator& comm) {
    const double expected_s =
        detail::rank0_value(comm, comm.rank() == 0 ? time(0, 1).front() * (o.warmup + o.repeat) : 0);
    if (comm.rank() == 0) {
      t = time(o.warmup, o.repeat);
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(1.25 * expected_s + 0.01));
    }
    comm.barrier();
  });
  return t;
}

// The calibration's largest GEMM in `dtype`, where `hw` was calibrated on this backend and mesh
// (a rank's rate depends on how many ranks share the cores, so another mesh's is no yardstick).
std::optional<GemmRate> calibrated_yardstick(const HardwareProfile& hw, const std::string& backend, const Mesh& mesh,
                                             DType dtype) {
  if (!hw.calibration || hw.calibration->backend != backend || hw.calibration->mesh != mesh.to_string()) {
    return std::nullopt;
  }
  std::optional<GemmRate> largest;
  for (const GemmRate& g : hw.calibration->gemm) {
    if (g.dtype == dtype && (!largest || g.m * g.n * g.k > largest->m * largest->n * largest->k)) largest = g;
  }
  return largest;
}

// The yardstick's per-rank rate now (on the root process; 0 elsewhere under mpirun). Rank 0
// alone writes it, read after run_backend has joined the ranks.
double yardstick_rate(const MatmulBenchOptions& o, const GemmRate& g) {
  double rate = 0;
  run_backend(o.backend, o.mesh, [&](Communicator& comm) {
    const detail::BenchTimer timer{comm, 0, kSpeedCheckTrials};
    const double t = detail::gemm_seconds(timer, g.dtype, g.m, g.n, g.k);
    if (comm.rank() == 0)
      rate = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) / t;
  });
  return rate;
}

}  // namespace

const MatmulBenchRun& fastest_run(const MatmulBenchPoint& p) {
  return *std::min_element(p.runs.begin(), p.runs.end(), [](const MatmulBenchRun& x, const MatmulBenchRun& y) {
    return x.measured_time_s < y.measured_time_s;
  });
}

MatmulBenchReport bench_matmul(const MatmulBenchOptions& o) {
  if (o.dtype != DType::f32 && o.dtype != DType::f64) {
    throw InputError(std::string("cannot bench in ") + to_string(o.dtype) + ": execution computes in f32 or f64");
  }
  if (o.repeat < 1) throw InputError("repeat " + std::to_string(o.repeat) + ": at least one timed run is needed");
  if (o.warmup < 0) throw InputError("warmup " + std::to_string(o.warmup) + ": must be 0 or more");
  if (o.rounds < 1) throw InputError("rounds " + std::to_string(o.rounds) + ": at least one round is needed");
  if (o.sizes.empty()) throw InputError("no sizes to bench: give at least one");
  const std::vector<std::string> dims = o.contraction.all_dims();
  if (std::all_of(dims.begin(), dims.end(), [&](const std::string& d) { return o.fixed.count(d) > 0; })) {
    throw InputError("every dimension (" + join_names(dims) +
                     ") already has a fixed size, so the swept sizes would set none; leave at least one out of the "
                     "fixed sizes (" +
                     field("dims") + ")");
  }

  MatmulBenchReport report;
  report.is_root = process_rank(o.backend) == 0;
  report.ranks = static_cast<int>(o.mesh.device_count());
  report.gemm_threads = std::min(report.ranks, detail::machine_cores());
  // Under mpirun the reference GEMM runs on rank 0 with gemm_threads threads; Open MPI binds
  // each of up to 2 ranks to one core by default, which would give those threads one core
  // between them and make the reference look slow. Every rank sees its own mask, so all
  // throw together (before any collective).
  cpu_set_t allowed;
  if (!backend_capabilities(o.backend).ranks_in_one_process && sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
      CPU_COUNT(&allowed) < report.gemm_threads) {
    throw InputError("the one-GEMM reference runs " + std::to_string(report.gemm_threads) +
                     " BLAS threads on rank 0, but this process may run on " + std::to_string(CPU_COUNT(&allowed)) +
                     " core(s) only (mpirun binds ranks to cores by default): launch with mpirun --bind-to none");
  }
  const PlanOptions plan_options{o.dtype, o.hw, std::nullopt};
  const std::optional<GemmRate> yardstick = calibrated_yardstick(o.hw, o.backend, o.mesh, o.dtype);

  for (const std::int64_t n : o.sizes) {
    if (n < 1) throw InputError("size " + std::to_string(n) + ": every size must be at least 1");
    MatmulBenchPoint p;
    p.sizes = o.fixed;
    for (const std::string& d : dims) p.sizes.emplace(d, n);
    p.gemm_m = p.gemm_n = p.gemm_k = 1;
    p.flops = 2;
    for (const std::string& d : dims) {
      const std::int64_t size = p.sizes.at(d);
      p.flops *= static_cast<double>(size);
      const DimRole role = o.contraction.role(d);
      (role == DimRole::contracted ? p.gemm_k : role == DimRole::free_b ? p.gemm_n : p.gemm_m) *= size;
    }
    const MatmulPlanning planning = plan_matmul(o.mesh, o.contraction, p.sizes, plan_options);
    p.chosen = planning.chosen;
    const std::string label = "N=" + std::to_string(n);
    const auto note = [&](const std::string& what) {
      if (report.is_root && o.progress) o.progress(label + ": " + what);
    };
    const auto run_request = [&](const Plan& plan, bool verify) {
      RunRequest req;
      req.backend = o.backend;
      req.mesh = o.mesh;
      req.plan = plan;
      req.sizes = p.sizes;
      req.dtype = o.dtype;
      req.contraction = &o.contraction;
      req.warmup = o.warmup;
      req.warmup_min_s = o.warmup_min_s;
      req.repeat = o.repeat;
      req.check = o.check;
      req.verify = verify;
      return req;
    };
    // The chosen candidate against the fastest measured one, if that is another: both again,
    // in turn (which goes first alternates), for as many rounds, neither verified again. Every
    // process takes the same decision: under mpirun the times are rank 0's, so it is broadcast.
    const auto runoff = [&](const MatmulBenchPoint& point,
                            const MatmulPlanning& planning) -> std::optional<MatmulBenchRunoff> {
      const int rival =
          static_cast<int>(detail::from_root(o.backend, o.mesh, report.is_root ? fastest_run(point).candidate : -1));
      if (rival == point.chosen) return std::nullopt;
      std::vector<double> mine, theirs;
      for (int round = 0; round < o.rounds; ++round) {
        for (int side = 0; side < 2; ++side) {
          const bool chosen_side = (side == 0) == (round % 2 == 0);
          const int c = chosen_side ? point.chosen : rival;
          note("runoff, candidate " + std::to_string(c + 1) + ", round " + std::to_string(round + 1) + " of " +
               std::to_string(o.rounds));
          const RunReport r = run_plan(run_request(planning.candidates[static_cast<std::size_t>(c)], false));
          std::vector<double>& side_times = chosen_side ? mine : theirs;
          side_times.insert(side_times.end(), r.repeat_times_s.begin(), r.repeat_times_s.end());
        }
      }
      MatmulBenchRunoff out;
      out.candidate = rival;
      if (!mine.empty()) out.chosen_time_s = median(mine);
      if (!theirs.empty()) out.candidate_time_s = median(theirs);
      return out;
    };
    std::vector<int> order;
    if (o.all) {
      for (std::size_t i = 0; i < planning.candidates.size(); ++i) order.push_back(static_cast<int>(i));
    } else if (planning.chosen >= 0) {
      order.push_back(planning.chosen);
    }
    // Each round runs the reference, then every candidate; round 0 verifies each candidate,
    // later rounds only time it again. Times are medians of all of a side's runs.
    std::vector<double> reference, speed_rates;
    std::vector<std::vector<double>> times(order.size());
    for (int round = 0; round < o.rounds; ++round) {
      const std::string of_rounds =
          o.rounds > 1 ? ", round " + std::to_string(round + 1) + " of " + std::to_string(o.rounds) : "";
      if (yardstick) {
        note("speed check: the calibration's " + std::to_string(yardstick->m) + "x" + std::to_string(yardstick->n) +
             "x" + std::to_string(yardstick->k) + " GEMM on every rank" + of_rounds);
        speed_rates.push_back(yardstick_rate(o, *yardstick));
      }
      note("one GEMM of the same size (" + std::to_string(report.gemm_threads) + " threads)" + of_rounds);
      const std::vector<double> r = reference_times(o, p, report.gemm_threads);
      reference.insert(reference.end(), r.begin(), r.end());
      // OpenBLAS's worker threads busy-wait for a while after a parallel GEMM before they
      // sleep (THREAD_TIMEOUT, 2^28 cycles by default: ~0.1 s): the plan run next would
      // share the cores with them (it measured up to 1.7x slower at N = 512).
      if (report.gemm_threads > 1) std::this_thread::sleep_for(std::chrono::milliseconds(250));
      for (std::size_t i = 0; i < order.size(); ++i) {
        const Plan& plan = planning.candidates[static_cast<std::size_t>(order[i])];
        note("candidate " + std::to_string(order[i] + 1) + " of " + std::to_string(planning.candidates.size()) +
             of_rounds + ", " + plan.description);
        const RunReport r = run_plan(run_request(plan, round == 0));
        times[i].insert(times[i].end(), r.repeat_times_s.begin(), r.repeat_times_s.end());
        if (round == 0) {
          Confidence confidence;
          for (const Step& s : plan.steps) confidence.add_part(s.confidence);
          p.runs.push_back({order[i], plan.description, plan.total_time_s, plan.comm_time_s, plan.compute_time_s, 0,
                            r.verification.verified, r.verification.max_rel_error, confidence});
        }
      }
    }
    // Empty off the root under mpirun.
    if (!reference.empty()) p.gemm_time_s = median(reference);
    if (yardstick) p.speed_check = MatmulBenchSpeedCheck{*yardstick, median(speed_rates)};
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (!times[i].empty()) p.runs[i].measured_time_s = median(times[i]);
    }
    if (o.all && planning.chosen >= 0) p.runoff = runoff(p, planning);
    report.points.push_back(std::move(p));
  }
  return report;
}

}  // namespace shardmm
