#include "shardmm/runtime/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "runtime/bench_timing.h"
#include "runtime/gemm_timing.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/collective_bench.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {

namespace {

struct GemmShape {
  const char* shape;
  std::int64_t m, n, k;
};

// Large enough to leave the caches ("square"), cache-sized ("small"), and a matrix times
// a few columns ("skinny"): arithmetic intensities a decade apart. Then a few rows times a
// large matrix (kThinGemm), one shape per row count: a BLAS runs these with kernels of their
// own, whose rates do not follow the intensity. Its extents are not powers of two, which
// alias in the caches (rows of 4 KiB).
std::vector<GemmShape> gemm_shapes(bool quick) {
  std::vector<GemmShape> shapes =
      quick
          ? std::vector<GemmShape>{{"skinny", 256, 8, 256}, {"small", 96, 96, 96}, {"square", 256, 256, 256}}
          : std::vector<GemmShape>{{"skinny", 1024, 16, 1024}, {"small", 192, 192, 192}, {"square", 1024, 1024, 1024}};
  const std::int64_t thin = quick ? 300 : 1100;
  for (std::int64_t rows : quick ? std::vector<std::int64_t>{1, 2, 4} : std::vector<std::int64_t>{1, 2, 3, 4, 6, 8})
    shapes.push_back({kThinGemm, rows, thin, thin});
  return shapes;
}

std::vector<GemmRate> measure_gemm(const CalibrateOptions& o, int trials) {
  std::vector<GemmRate> rates;
  std::mutex root;
  run_backend(o.backend, o.mesh, [&](Communicator& comm) {
    const detail::BenchTimer timer{comm, 0, trials};
    std::vector<GemmRate> mine;
    for (DType dtype : {DType::f32, DType::f64}) {
      for (const GemmShape& s : gemm_shapes(o.quick)) {
        if (comm.rank() == 0 && o.progress) {
          o.progress(std::string("gemm ") + to_string(dtype) + " " + s.shape + " " + std::to_string(s.m) + "x" +
                     std::to_string(s.n) + "x" + std::to_string(s.k));
        }
        const double t = detail::gemm_seconds(timer, dtype, s.m, s.n, s.k);
        const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
        const double bytes = static_cast<double>((s.m * s.k + s.k * s.n + s.m * s.n) * dtype_bytes(dtype));
        mine.push_back({dtype, s.shape, s.m, s.n, s.k, flops / bytes, flops / t});
      }
    }
    if (comm.rank() == 0) {
      std::lock_guard lock(root);
      rates = std::move(mine);
    }
  });
  return rates;
}

// Each axis alone and all axes together, one group per distinct size.
std::map<int, AxisList> groups_by_size(const Mesh& mesh) {
  std::vector<AxisList> groups;
  for (int a = 0; a < mesh.rank(); ++a) groups.push_back({a});
  groups.push_back(mesh.all_axes());
  std::map<int, AxisList> out;
  for (const AxisList& g : groups) {
    const auto n = static_cast<int>(mesh.group_size(g));
    if (n > 1) out.emplace(n, g);
  }
  return out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf.data();
}

std::string host_name() {
  std::array<char, 256> buf{};
  return gethostname(buf.data(), buf.size() - 1) == 0 ? std::string(buf.data()) : std::string("unknown");
}

// The analytic fields, so that a group size or dtype the calibration lacks still gets a
// figure: switch topology (ranks share memory), link and latency from the AllGather fit
// of the largest group.
void build_profile(const CalibrateOptions& o, Calibration cal, HardwareProfile& p) {
  p.name = "calibrated-" + o.backend;
  p.description = "Measured by 'shardmm calibrate" + std::string(o.quick ? " --quick" : "") + "' on " + cal.host +
                  ", " + o.backend + " backend, mesh " + cal.mesh + ", at " + cal.measured_at +
                  ": collectives by alpha-beta fit per group size, GEMM rates by shape, the fixed costs of a GEMM "
                  "call and a ring's hand-off, collective matmul rings' overlap (docs/calibration.md)";
  for (const GemmRate& g : cal.gemm) p.peak_flops[g.dtype] = std::max(p.peak_flops[g.dtype], g.flops_per_s);
  p.hbm_bandwidth = cal.copy_bandwidth;
  const CollectiveFit* widest = nullptr;
  for (const CollectiveFit& f : cal.collectives) {
    // The widest group's fit of the largest sizes: the bandwidth bulk transfers get.
    if (f.op == OpKind::all_gather && (!widest || f.group_size > widest->group_size ||
                                       (f.group_size == widest->group_size && f.min_bytes > widest->min_bytes))) {
      widest = &f;
    }
  }
  const double n = widest->group_size;
  p.link_bandwidth = (n - 1) / n / widest->beta_s_per_byte;
  p.hop_latency_s = widest->alpha_s / (n - 1);
  p.bidirectional = true;
  p.topology = "switch";
  p.calibration = std::move(cal);
}

// --- the collective matmul rings' overlap (docs/calibration.md, "Ring overlap") ---

// A ring and its serialized twin on one mesh axis: FSDP's gathered weight, and the
// row-parallel layer's reduce-scattered output. `grown` scales the GEMMs, not the transfer.
struct RingProbe {
  OpKind ring;
  std::vector<OpKind> serialized;
  std::string expression;
  std::string grown;
};

std::vector<RingProbe> ring_probes(const std::string& x) {
  return {{OpKind::all_gather_einsum,
           {OpKind::all_gather, OpKind::einsum},
           "A[I_" + x + ", J] @ B[J, K_" + x + "] -> C[I_" + x + ", K]",
           "I"},
          {OpKind::einsum_reduce_scatter,
           {OpKind::einsum, OpKind::reduce_scatter},
           "A[I, J_" + x + "] @ B[J_" + x + ", K] -> C[I_" + x + ", K]",
           "J"}};
}

// find_candidate, which the probes' fixed contractions always have.
const Plan& candidate_with(const MatmulPlanning& p, const std::vector<OpKind>& ops,
                           std::optional<bool> bidirectional = std::nullopt) {
  if (const Plan* plan = find_candidate(p, ops, bidirectional)) return *plan;
  throw std::logic_error("calibrate: the planner offered no candidate with the probe's steps");
}

// Sets the grown dimension of `sizes` to the power of two at which the serialized plan's
// GEMMs take at least twice its transfer on `opt`'s profile: a ring could then hide all of
// the transfer, so what the measured ratio shows is how much of it the backend does hide.
void grow_until_compute_bound(const Mesh& mesh, const Contraction& c, const RingProbe& probe, const PlanOptions& opt,
                              DimSizes& sizes) {
  // From base / 8: narrower chunks are rank-few updates, not the GEMMs rings are built for.
  const std::int64_t base = sizes.at(probe.grown);
  for (std::int64_t grown = std::max(base / 8, 2 * mesh.device_count()); grown <= (std::int64_t{1} << 16); grown *= 2) {
    sizes[probe.grown] = grown;
    const MatmulPlanning planning = plan_matmul(mesh, c, sizes, opt);  // outlives the reference into it
    const Plan& serial = candidate_with(planning, probe.serialized);
    if (serial.compute_time_s >= 2 * serial.comm_time_s) break;
  }
}

// sample.overlap: the share in [0, 1] at which the model's ring / serialized ratio equals the
// measured one (the ring's predicted time falls as the share grows); 0 or 1 beyond the
// model's range, which goes to sample.predicted_*.
void fit_overlap(const Mesh& mesh, const Contraction& c, const RingProbe& probe, bool bidirectional, PlanOptions opt,
                 RingOverlapSample& sample) {
  double& overlap = opt.hw.calibration->ring_overlap(probe.ring);
  const auto ratio = [&](double share) {
    overlap = share;
    const MatmulPlanning p = plan_matmul(mesh, c, sample.sizes, opt);
    return candidate_with(p, {probe.ring}, bidirectional).total_time_s /
           candidate_with(p, probe.serialized).total_time_s;
  };
  const double measured = sample.ring_s / sample.serialized_s;
  sample.predicted_hidden = ratio(1);
  sample.predicted_exposed = ratio(0);
  if (measured <= sample.predicted_hidden || measured >= sample.predicted_exposed) {
    sample.overlap = measured <= sample.predicted_hidden ? 1 : 0;
    return;
  }
  double lo = 0, hi = 1;
  for (int i = 0; i < 30; ++i) (ratio((lo + hi) / 2) > measured ? lo : hi) = (lo + hi) / 2;
  sample.overlap = (lo + hi) / 2;
}

// The probes' axis: the longest ring the mesh has.
int widest_axis(const Mesh& mesh) {
  int widest = 0;
  for (int a = 1; a < mesh.rank(); ++a) widest = mesh.size(a) > mesh.size(widest) ? a : widest;
  return widest;
}

// --- the fixed costs (docs/calibration.md, "Fixed costs") ---

// The plan's times over `rounds` rounds of 20 runs each, verified in the first.
std::vector<double> run_times(RunRequest& request, int rounds) {
  std::vector<double> times;
  request.repeat = 20;
  for (int round = 0; round < rounds; ++round) {
    request.verify = round == 0;
    const RunReport r = run_plan(request);
    if (!r.verification.verified) {
      throw std::runtime_error("calibrate: the " + request.plan.description +
                               " plan's result did not match the dense reference");
    }
    times.insert(times.end(), r.repeat_times_s.begin(), r.repeat_times_s.end());
  }
  return times;
}

// A local einsum, then each ring probe, on the mesh's widest axis at 2 rows a member: their
// FLOPs and bytes cost next to nothing, so what they take beyond the model's time for them is
// fixed. The einsum's call is set on the profile before the rings are predicted (each chunk
// pays it), and the rings' hand-off before their overlap is fitted, so that no cost counts twice.
void measure_fixed_costs(const CalibrateOptions& o, int rounds, CalibrationResult& result) {
  const int widest = widest_axis(o.mesh);
  const std::string x = o.mesh.axis_names({widest});
  const std::int64_t tiny = 2 * o.mesh.size(widest);
  const DimSizes sizes = {{"I", tiny}, {"J", tiny}, {"K", tiny}};
  PlanOptions analytic;  // every process plans alike; only the steps matter to the run
  analytic.dtype = DType::f32;
  analytic.hw = builtin_profile("h100");
  struct Probe {
    std::vector<OpKind> ops;
    std::string expression;
  };
  std::vector<Probe> probes = {{{OpKind::einsum}, "A[I_" + x + ", J] @ B[J, K] -> C[I_" + x + ", K]"}};
  for (const RingProbe& ring : ring_probes(x)) probes.push_back({{ring.ring}, ring.expression});
  std::vector<double> handoffs;
  for (const Probe& probe : probes) {
    const Contraction c = parse_contraction(probe.expression, o.mesh);
    if (result.is_root && o.progress) o.progress("fixed cost of " + std::string(to_string(probe.ops[0])));
    RunRequest request;
    request.backend = o.backend;
    request.mesh = o.mesh;
    request.sizes = sizes;
    request.contraction = &c;
    request.check = false;
    request.plan = candidate_with(plan_matmul(o.mesh, c, sizes, analytic), probe.ops);
    const std::vector<double> times = run_times(request, rounds);
    if (!result.is_root) continue;
    PlanOptions calibrated;
    calibrated.dtype = DType::f32;
    calibrated.hw = result.profile;
    FixedCostSample sample;
    sample.op = probe.ops[0];
    sample.expression = format_contraction(c, o.mesh);
    sample.sizes = sizes;
    sample.measured_s = median(times);
    const MatmulPlanning planning = plan_matmul(o.mesh, c, sizes, calibrated);  // outlives `predicted`
    const Plan& predicted = candidate_with(planning, probe.ops, request.plan.steps.front().bidirectional);
    sample.predicted_s = predicted.total_time_s;
    sample.calls = sample.op == OpKind::einsum ? 1 : predicted.steps.front().ring_steps - 1;
    sample.per_call_s = std::max(0.0, sample.measured_s - sample.predicted_s) / sample.calls;
    if (sample.op == OpKind::einsum) {
      result.profile.calibration->einsum_call_s = sample.per_call_s;
    } else {
      handoffs.push_back(sample.per_call_s);
    }
    result.fixed_costs.push_back(std::move(sample));
  }
  // One figure for both rings: their hand-offs are the same point-to-point exchange.
  if (result.is_root) result.profile.calibration->ring_handoff_s = (handoffs[0] + handoffs[1]) / 2;
}

// Runs both rings and their serialized twins (interleaved rounds, so drifting load hits them
// alike) and sets the profile's overlaps on the root process.
void measure_ring_overlap(const CalibrateOptions& o, int rounds, CalibrationResult& result) {
  const int widest = widest_axis(o.mesh);
  const std::int64_t base = o.quick ? 512 : 1024;
  PlanOptions calibrated;
  calibrated.dtype = DType::f32;
  if (result.is_root) calibrated.hw = result.profile;
  // Every process runs the same plans: planned alike on an analytic profile, and only their
  // steps matter to the run.
  PlanOptions analytic;
  analytic.dtype = DType::f32;
  analytic.hw = builtin_profile("h100");
  for (const RingProbe& probe : ring_probes(o.mesh.axis_names({widest}))) {
    const Contraction c = parse_contraction(probe.expression, o.mesh);
    DimSizes sizes = {{"I", base}, {"J", base}, {"K", base}};
    if (result.is_root) grow_until_compute_bound(o.mesh, c, probe, calibrated, sizes);
    sizes[probe.grown] =
        static_cast<std::int64_t>(detail::from_root(o.backend, o.mesh, static_cast<double>(sizes[probe.grown])));
    if (result.is_root && o.progress) {
      o.progress(std::string("collective matmul ") + to_string(probe.ring) + " " + probe.expression);
    }
    const MatmulPlanning p = plan_matmul(o.mesh, c, sizes, analytic);
    RunRequest ring, serialized;
    ring.backend = o.backend;
    ring.mesh = o.mesh;
    ring.sizes = sizes;
    ring.contraction = &c;
    ring.check = false;  // the check mode's extra messages are not what is measured
    serialized = ring;
    ring.plan = candidate_with(p, {probe.ring});
    serialized.plan = candidate_with(p, probe.serialized);
    std::vector<double> ring_times, serialized_times;
    for (int round = 0; round < rounds; ++round) {
      for (auto [request, times] : {std::pair{&ring, &ring_times}, std::pair{&serialized, &serialized_times}}) {
        request->verify = round == 0;
        const RunReport r = run_plan(*request);
        if (!r.verification.verified) {
          throw std::runtime_error("calibrate: the " + request->plan.description +
                                   " plan's result did not match the dense reference");
        }
        times->insert(times->end(), r.repeat_times_s.begin(), r.repeat_times_s.end());
      }
    }
    if (!result.is_root) continue;
    RingOverlapSample sample;
    sample.ring = probe.ring;
    sample.expression = format_contraction(c, o.mesh);
    sample.sizes = sizes;
    sample.ring_s = median(ring_times);
    sample.serialized_s = median(serialized_times);
    fit_overlap(o.mesh, c, probe, ring.plan.steps.front().bidirectional, calibrated, sample);
    result.profile.calibration->ring_overlap(probe.ring) = sample.overlap;
    result.rings.push_back(std::move(sample));
  }
}

}  // namespace

double gemm_spread(const std::vector<GemmRate>& a, const std::vector<GemmRate>& b) {
  double spread = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = a[i].flops_per_s, y = b[i].flops_per_s;
    spread = std::max(spread, std::abs(x - y) / ((x + y) / 2));
  }
  return spread;
}

std::vector<GemmRate> combine_gemm_passes(const std::vector<std::vector<GemmRate>>& passes) {
  if (passes.size() != 2 && passes.size() != 3) {
    throw UsageError("combine_gemm_passes: two or three passes, got " + std::to_string(passes.size()));
  }
  std::vector<GemmRate> out = passes[0];
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::vector<double> rates;
    for (const auto& pass : passes) rates.push_back(pass.at(i).flops_per_s);
    std::sort(rates.begin(), rates.end());
    out[i].flops_per_s = rates.size() == 2 ? (rates[0] + rates[1]) / 2 : rates[1];
  }
  return out;
}

std::vector<std::int64_t> calibration_sizes(bool quick) {
  // Both ends matter: the small sizes pin alpha, the large ones beta.
  const std::int64_t lo = quick ? 16 << 10 : 4 << 10;
  const std::int64_t hi = quick ? 4 << 20 : 32 << 20;
  const int step = quick ? 4 : 2;
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = lo; s <= hi; s *= step) sizes.push_back(s);
  return sizes;
}

CalibrationResult calibrate(const CalibrateOptions& o) {
  if (o.mesh.device_count() < 2) {
    throw InputError("cannot calibrate on mesh " + o.mesh.to_string() +
                     ": it has one device, so no collective can be measured; give a mesh of two or more, e.g. " +
                     field("mesh") + " X=2");
  }
  const int trials = o.quick ? 3 : 5;
  CalibrationResult result;
  result.is_root = process_rank(o.backend) == 0;
  Calibration cal;
  cal.backend = o.backend;
  cal.mesh = o.mesh.to_string();
  cal.host = host_name();
  cal.measured_at = utc_now();
  cal.gemm = measure_gemm(o, trials);

  for (const auto& [size, group] : groups_by_size(o.mesh)) {
    CollectiveBenchOptions b;
    b.backend = o.backend;
    b.mesh = o.mesh;
    b.group = group;
    b.sizes = calibration_sizes(o.quick);
    b.trials = trials;
    const int n = size;
    if (o.progress) {
      b.progress = [&o, n](const CollectiveBenchProgress& p) {
        o.progress(p.op + " " + format_bytes(p.bytes) + " on " + std::to_string(n) + " ranks (" +
                   std::to_string(p.index) + " of " + std::to_string(p.total) + ")");
      };
    }
    const CollectiveBenchReport report = bench_collectives(b);
    if (!report.is_root) continue;
    std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> points;
    double copy = 0, add = 0;  // rows come by size, ascending: these end as the largest size's, least in cache
    std::vector<Calibration::SizedRate> copies;
    for (const CollectiveBenchRow& row : report.rows) {
      if (row.op == "memcpy") {
        copy = 2 * row.busbw;                                            // each byte read once, written once
        copies.push_back({std::llround(row.busbw * row.time_s), copy});  // busbw: the bytes copied per second
      } else if (row.op == "y += x") {
        add = 3 * row.busbw;  // y and x read, y written
      } else {
        points[row.op].first.push_back(static_cast<double>(row.bytes));
        points[row.op].second.push_back(row.time_s);
      }
    }
    if (cal.copy_bandwidth == 0) {  // from the smallest group: the most ranks idle in between
      cal.copy_bandwidth = copy;
      cal.add_bandwidth = add;
      cal.copy_bandwidths = std::move(copies);
    }
    for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
      const auto& [bytes, seconds] = points.at(to_string(op));
      // A larger message never takes less time than a smaller one: a size measured slower
      // than a larger one was disturbed (the machine is shared), so it counts at the larger
      // one's time. Times rising with size also keep the fitted beta >= 0.
      std::vector<double> envelope = seconds;
      for (std::size_t i = envelope.size() - 1; i-- > 0;) envelope[i] = std::min(envelope[i], envelope[i + 1]);
      const std::vector<AlphaBetaSegment> segments = fit_alpha_beta_segments(bytes, envelope);
      // A range of small sizes may be flat (latency alone); the largest sizes must cost per byte.
      if (!(segments.back().fit.beta_s_per_byte > 0)) {
        throw InputError(std::string("calibration failed: ") + to_string(op) + " on " + std::to_string(n) +
                         " ranks took no longer for larger messages, so it has no per-byte cost to fit (the "
                         "timings were too noisy); run it again on a quieter machine, or without " +
                         field("quick"));
      }
      for (const AlphaBetaSegment& seg : segments) {
        cal.collectives.push_back({op, n, seg.fit.alpha_s, seg.fit.beta_s_per_byte,
                                   static_cast<std::int64_t>(seg.min_bytes), static_cast<std::int64_t>(seg.max_bytes),
                                   seg.fit.max_rel_residual});
      }
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        // A named copy: clang before 16 cannot capture a structured binding (`bytes`).
        const auto size = bytes[i];
        const auto& seg = *std::find_if(segments.rbegin(), segments.rend(),
                                        [size](const AlphaBetaSegment& s) { return s.min_bytes <= size; });
        result.samples.push_back({op, n, static_cast<std::int64_t>(bytes[i]), seconds[i], envelope[i],
                                  seg.fit.alpha_s + seg.fit.beta_s_per_byte * bytes[i]});
      }
    }
  }
  // Again after the collectives, so the rates stand for the calibration's whole span rather
  // than its first second; where the two passes disagree, a third decides. Only the root
  // holds the rates: every process takes its spread, since each must join the third pass.
  std::vector<std::vector<GemmRate>> passes{std::move(cal.gemm), measure_gemm(o, trials)};
  result.gemm_drift = detail::from_root(o.backend, o.mesh, gemm_spread(passes[0], passes[1]));
  if (result.gemm_drift >= o.gemm_steady_spread) passes.push_back(measure_gemm(o, trials));
  result.gemm_passes = static_cast<int>(passes.size());
  cal.gemm = combine_gemm_passes(passes);
  if (result.is_root) build_profile(o, std::move(cal), result.profile);
  measure_fixed_costs(o, trials, result);
  measure_ring_overlap(o, trials, result);
  return result;
}

}  // namespace shardmm
