// Calibrated profiles in the cost model: the alpha-beta fit against exact synthetic data,
// the fits and GEMM rates replacing the formulas exactly where they apply (and nowhere
// else), the profile's JSON both ways, every way its "calibration" object can be wrong,
// and where the calibrated profile lives (docs/calibration.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "input_error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

using testing::input_error;

// ---- the fit ----

std::vector<double> sweep() {
  std::vector<double> sizes;
  for (double s = 4096; s <= 32 << 20; s *= 2) sizes.push_back(s);
  return sizes;
}

TEST(FitAlphaBeta, RecoversAlphaAndBetaExactlyFromALine) {
  const double alpha = 7.5e-6, beta = 1.0 / 3.2e9;
  const std::vector<double> x = sweep();
  std::vector<double> t;
  for (double b : x) t.push_back(alpha + beta * b);
  const AlphaBetaFit fit = fit_alpha_beta(x, t);
  EXPECT_NEAR(fit.alpha_s, alpha, alpha * 1e-9);
  EXPECT_NEAR(fit.beta_s_per_byte, beta, beta * 1e-9);
  EXPECT_LT(fit.max_rel_residual, 1e-9);
  EXPECT_LT(fit.rms_rel_residual, 1e-9);
}

TEST(FitAlphaBeta, ResidualsAreRelativeToTheMeasuredTime) {
  // Two points on t = 1 + x and one 10% above it: the weighted fit keeps the line near
  // the two, and the worst residual is the third point's.
  const std::vector<double> x = {1, 2, 3};
  const std::vector<double> t = {2, 3, 4.4};
  const AlphaBetaFit fit = fit_alpha_beta(x, t);
  double worst = 0, sum_sq = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double rel = std::abs(fit.alpha_s + fit.beta_s_per_byte * x[i] - t[i]) / t[i];
    worst = std::max(worst, rel);
    sum_sq += rel * rel;
  }
  EXPECT_DOUBLE_EQ(fit.max_rel_residual, worst);
  EXPECT_DOUBLE_EQ(fit.rms_rel_residual, std::sqrt(sum_sq / 3));
  EXPECT_GT(fit.max_rel_residual, 0.01);
  // The weighted normal equations by hand (w = 1/t^2).
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1 / (t[i] * t[i]);
    sw += w, sx += w * x[i], sy += w * t[i], sxx += w * x[i] * x[i], sxy += w * x[i] * t[i];
  }
  const double beta = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  EXPECT_NEAR(fit.beta_s_per_byte, beta, 1e-12);
  EXPECT_NEAR(fit.alpha_s, (sy - beta * sx) / sw, 1e-12);
}

TEST(FitAlphaBeta, NegativeInterceptIsRefittedThroughTheOrigin) {
  // The line through (1, 0.1) and (2, 2) has alpha = -1.8; through the origin with weights
  // 1/t^2: beta = sum w x t / sum w x^2 = (100*0.1 + 0.25*4) / (100 + 0.25*4) = 11 / 101.
  const AlphaBetaFit fit = fit_alpha_beta({1, 2}, {0.1, 2});
  EXPECT_EQ(fit.alpha_s, 0);
  EXPECT_NEAR(fit.beta_s_per_byte, 11.0 / 101.0, 1e-15);
}

TEST(FitAlphaBeta, RejectsWhatCannotBeFitted) {
  EXPECT_THROW(fit_alpha_beta({1024, 1024}, {1e-6, 2e-6}), UsageError);
  EXPECT_THROW(fit_alpha_beta({1024}, {1e-6}), UsageError);
  EXPECT_THROW(fit_alpha_beta({1024, 2048}, {1e-6}), UsageError);
  EXPECT_THROW(fit_alpha_beta({1024, 2048}, {1e-6, 0}), UsageError);
  EXPECT_THROW(fit_alpha_beta({1024, 2048}, {1e-6, NAN}), UsageError);
}

// Equal times give no cost per byte at all, not the rounding of the normal equations (which
// printed as 5e10 PB/s in a calibration whose 128-512 KiB reduce_scatters took the same time).
TEST(FitAlphaBeta, EqualTimesFitNoCostPerByte) {
  for (int i = 0; i < 200; ++i) {
    const double t = 1e-6 * std::pow(1.037, i);  // 1 us to ~1.4 ms: many leave rounding
    const AlphaBetaFit fit = fit_alpha_beta({131072, 262144, 524288}, {t, t, t});
    EXPECT_EQ(fit.beta_s_per_byte, 0.0) << t;
    EXPECT_NEAR(fit.alpha_s, t, 1e-12 * t) << t;
    EXPECT_LT(fit.max_rel_residual, 1e-12) << t;
  }
}

TEST(FitAlphaBetaSegments, OneLineStaysOneSegment) {
  const std::vector<double> x = sweep();
  std::vector<double> t;
  for (double b : x) t.push_back(3e-6 + b / 5e9);
  const std::vector<AlphaBetaSegment> segments = fit_alpha_beta_segments(x, t);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].min_bytes, x.front());
  EXPECT_EQ(segments[0].max_bytes, x.back());
  EXPECT_NEAR(segments[0].fit.alpha_s, 3e-6, 3e-15);
  EXPECT_NEAR(segments[0].fit.beta_s_per_byte, 1 / 5e9, 1e-22);
}

TEST(FitAlphaBetaSegments, ACacheKneeGivesTwoExactLines) {
  // In cache up to 1 MiB (10 us + 20 GB/s), out of it from 2 MiB (50 us + 2 GB/s).
  const std::vector<double> x = sweep();
  std::vector<double> t;
  for (double b : x) t.push_back(b <= (1 << 20) ? 1e-5 + b / 2e10 : 5e-5 + b / 2e9);
  const std::vector<AlphaBetaSegment> segments = fit_alpha_beta_segments(x, t);
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].max_bytes, 1 << 20);
  EXPECT_EQ(segments[1].min_bytes, 2 << 20);
  EXPECT_NEAR(segments[0].fit.alpha_s, 1e-5, 1e-14);
  EXPECT_NEAR(segments[0].fit.beta_s_per_byte, 1 / 2e10, 1e-22);
  EXPECT_NEAR(segments[1].fit.alpha_s, 5e-5, 1e-13);
  EXPECT_NEAR(segments[1].fit.beta_s_per_byte, 1 / 2e9, 1e-21);
  for (const AlphaBetaSegment& s : segments) EXPECT_LT(s.fit.max_rel_residual, 1e-9);
}

TEST(FitAlphaBetaSegments, TwoKneesGiveThreeExactLines) {
  // A private cache up to 128 KiB, a shared one up to 4 MiB, memory beyond.
  const std::vector<double> x = sweep();
  std::vector<double> t;
  for (double b : x)
    t.push_back(b <= (128 << 10) ? 1e-6 + b / 4e10 : b <= (4 << 20) ? 5e-6 + b / 3e10 : 2e-5 + b / 1e10);
  const std::vector<AlphaBetaSegment> segments = fit_alpha_beta_segments(x, t);
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].max_bytes, 128 << 10);
  EXPECT_EQ(segments[1].min_bytes, 256 << 10);
  EXPECT_EQ(segments[1].max_bytes, 4 << 20);
  EXPECT_EQ(segments[2].min_bytes, 8 << 20);
  EXPECT_NEAR(segments[1].fit.beta_s_per_byte, 1 / 3e10, 1e-22);
  EXPECT_NEAR(segments[2].fit.beta_s_per_byte, 1 / 1e10, 1e-21);
  for (const AlphaBetaSegment& s : segments) EXPECT_LT(s.fit.max_rel_residual, 1e-9);
}

TEST(FitAlphaBetaSegments, NeedsAscendingDistinctSizes) {
  EXPECT_THROW(fit_alpha_beta_segments({2, 1, 3}, {1, 1, 1}), UsageError);
  EXPECT_THROW(fit_alpha_beta_segments({1, 1, 3}, {1, 1, 1}), UsageError);
}

// ---- the cost model on a calibrated profile ----

HardwareProfile calibrated() {
  HardwareProfile p;
  p.name = "calibrated-threads";
  p.peak_flops = {{DType::f32, 8e9}, {DType::f64, 4e9}};
  p.hbm_bandwidth = 1e10;
  p.link_bandwidth = 5e9;
  p.hop_latency_s = 4e-6;
  p.topology = "switch";
  Calibration c;
  c.backend = "threads";
  c.mesh = "X=2,Y=2";
  c.host = "test";
  c.measured_at = "2026-01-01T00:00:00Z";
  c.copy_bandwidth = 1e10;
  c.add_bandwidth = 1.5e10;
  c.collectives = {{OpKind::all_gather, 2, 5e-6, 1 / 4e9, 4096, 1 << 25, 0.05},
                   {OpKind::all_reduce, 4, 2e-5, 1 / 2e9, 4096, 1 << 25, 0.1}};
  // f32: 2e9 FLOP/s at intensity 4, 8e9 at 64 (a decade and a bit apart).
  c.gemm = {{DType::f32, "skinny", 256, 8, 256, 4, 2e9}, {DType::f32, "square", 1024, 1024, 1024, 64, 8e9}};
  p.calibration = c;
  return p;
}

TEST(CalibratedCost, CollectiveFitReplacesTheFormulaForItsOpAndGroupSize) {
  const HardwareProfile hw = calibrated();
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const std::int64_t bytes = 3 << 20;
  EXPECT_DOUBLE_EQ(collective_time(hw, mesh, OpKind::all_gather, {0}, bytes), 5e-6 + bytes / 4e9);
  EXPECT_DOUBLE_EQ(collective_time(hw, mesh, OpKind::all_gather, {1}, bytes), 5e-6 + bytes / 4e9);
  EXPECT_DOUBLE_EQ(collective_time(hw, mesh, OpKind::all_reduce, {0, 1}, bytes), 2e-5 + bytes / 2e9);
  // Nothing to move costs nothing, fit or not.
  EXPECT_EQ(collective_time(hw, mesh, OpKind::all_gather, {0}, 0), 0);
}

TEST(CalibratedCost, EachSizeTakesTheFitOfItsRange) {
  HardwareProfile hw = calibrated();
  // all_gather on 2 ranks: 5 us + 4 GB/s from 4 KiB, and a second range from 1 MiB.
  hw.calibration->collectives[0].max_bytes = 512 << 10;
  hw.calibration->collectives.push_back({OpKind::all_gather, 2, 4e-5, 1 / 1e9, 1 << 20, 1 << 25, 0.02});
  const Mesh mesh = Mesh::parse("X=2");
  const auto t = [&](std::int64_t bytes) { return collective_time(hw, mesh, OpKind::all_gather, {0}, bytes); };
  EXPECT_DOUBLE_EQ(t(1024), 5e-6 + 1024 / 4e9);                                      // below every range: the lowest
  EXPECT_DOUBLE_EQ(t(512 << 10), 5e-6 + (512 << 10) / 4e9);                          // in the first
  EXPECT_DOUBLE_EQ(t(768 << 10), 5e-6 + (768 << 10) / 4e9);                          // between: the range below
  EXPECT_DOUBLE_EQ(t(1 << 20), 4e-5 + (1 << 20) / 1e9);                              // in the second
  EXPECT_DOUBLE_EQ(t(std::int64_t{1} << 30), 4e-5 + (std::int64_t{1} << 30) / 1e9);  // beyond: the last
}

TEST(CalibratedCost, WithoutAFitTheFormulasOfTheProfileApply) {
  HardwareProfile hw = calibrated();
  HardwareProfile analytic = hw;
  analytic.calibration.reset();
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const std::int64_t bytes = 3 << 20;
  // reduce_scatter has no fit; all_gather has none on 4 ranks, all_reduce none on 2.
  for (const auto& [op, group] : std::vector<std::pair<OpKind, AxisList>>{
           {OpKind::reduce_scatter, {0}}, {OpKind::all_gather, {0, 1}}, {OpKind::all_reduce, {1}}}) {
    EXPECT_DOUBLE_EQ(collective_time(hw, mesh, op, group, bytes), collective_time(analytic, mesh, op, group, bytes));
  }
  // Switch formula by hand: AllGather on 4 ranks = max(3 steps x 4 us, V 3/4 / L).
  EXPECT_DOUBLE_EQ(collective_time(hw, mesh, OpKind::all_gather, {0, 1}, bytes),
                   std::max(3 * 4e-6, bytes * 0.75 / 5e9));
}

TEST(CalibratedCost, EinsumTakesTheMeasuredRateAtItsIntensity) {
  const HardwareProfile hw = calibrated();
  // Intensity 16 is halfway between 4 and 64 in log: the rate halfway, 5e9.
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 1.6e9, 100000000), 1.6e9 / 5e9);
  // At and beyond the ends the end rates (above the memory bound here).
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 6.4e10, 1000000000), 6.4e10 / 8e9);
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 6.4e11, 1000000000), 6.4e11 / 8e9);
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000), 4e8 / 2e9);
  // Below the memory bound the roofline's memory term still wins.
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 1e8, 1000000000), 1000000000 / 1e10);
  // f64 has no measured rate here: its peak.
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f64, 4e9, 1000), 1.0);
}

// A GEMM of a few rows takes the thin shapes' rate at its rows (the BLAS's small-row kernels
// do not follow the intensity), interpolated between the row counts measured; past the
// largest, and where its rows are unknown, the rate at its intensity as before.
TEST(CalibratedCost, AThinEinsumTakesTheMeasuredRateAtItsRows) {
  HardwareProfile hw = calibrated();
  const double plain = einsum_time(hw, DType::f32, 4e8, 100000000);
  hw.calibration->gemm.push_back({DType::f32, kThinGemm, 1, 1100, 1100, 0.5, 3e9});
  hw.calibration->gemm.push_back({DType::f32, kThinGemm, 2, 1100, 1100, 1.0, 1e9});
  hw.calibration->gemm.push_back({DType::f32, kThinGemm, 4, 1100, 1100, 2.0, 4e9});
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000, 1), 4e8 / 3e9);
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000, 2), 4e8 / 1e9);  // slower than one row
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000, 3), 4e8 / 2.5e9);
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000, 5), plain);
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 4e8, 100000000), plain);
  // The intensities the thin shapes have do not move the others' interpolation.
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 1.6e9, 100000000), 1.6e9 / 5e9);
  // A rate by rows is measured, not extrapolated.
  EXPECT_TRUE(einsum_confidence(hw, DType::f32, 1e8, 100000000, 2).why.empty());
  EXPECT_FALSE(einsum_confidence(hw, DType::f32, 1e8, 100000000, 5).why.empty());

  // The planner gives an einsum its rows: device 0's extent of A's letters B lacks, or of B's
  // that A lacks, the smaller; 3 rows over X=2 leave device 0 two.
  PlanOptions opt;
  opt.dtype = DType::f32;
  opt.hw = hw;
  const Mesh mesh = Mesh::parse("X=2");
  const MatmulPlanning planning = plan_matmul(mesh, parse_contraction("A[I_X, J] @ B[J, K] -> C[I_X, K]", mesh),
                                              parse_dims("I=3,J=1000,K=1000"), opt);
  const auto local = std::find_if(planning.candidates.begin(), planning.candidates.end(),
                                  [](const Plan& c) { return c.steps.size() == 1; });
  ASSERT_NE(local, planning.candidates.end());
  const Plan& p = *local;
  ASSERT_EQ(p.steps[0].op, OpKind::einsum);
  const double flops = 2.0 * 2 * 1000 * 1000;
  EXPECT_DOUBLE_EQ(p.steps[0].flops, flops);
  EXPECT_DOUBLE_EQ(p.steps[0].time_s,
                   std::max(flops / 1e9, (2.0 * 1000 + 1000 * 1000 + 2 * 1000) * 4 / hw.hbm_bandwidth));
}

// A copy takes the bandwidth measured for its size (the caches hold small ones), interpolated
// in log(bytes) between the sizes measured and the end ones beyond; without the table, the
// one copy_bandwidth (the HBM bandwidth of a calibrated profile) as before.
TEST(CalibratedCost, ACopyTakesTheBandwidthMeasuredForItsSize) {
  HardwareProfile hw = calibrated();
  const double plain = local_copy_time(hw, 1 << 20);
  EXPECT_DOUBLE_EQ(plain, 2.0 * (1 << 20) / hw.hbm_bandwidth);
  hw.calibration->copy_bandwidths = {{1 << 16, 8e10}, {1 << 20, 4e10}, {1 << 24, 1e10}};
  EXPECT_DOUBLE_EQ(local_copy_time(hw, 1 << 20), 2.0 * (1 << 20) / 4e10);
  EXPECT_DOUBLE_EQ(local_copy_time(hw, 1 << 18), 2.0 * (1 << 18) / 6e10);  // halfway in log
  EXPECT_DOUBLE_EQ(local_copy_time(hw, 1 << 10), 2.0 * (1 << 10) / 8e10);
  EXPECT_DOUBLE_EQ(local_copy_time(hw, 1 << 28), 2.0 * (1 << 28) / 1e10);
  EXPECT_EQ(local_copy_time(hw, 0), 0);
  HardwareProfile analytic = hw;
  analytic.calibration.reset();
  EXPECT_DOUBLE_EQ(local_copy_time(analytic, 1 << 20), plain);
}

// On a calibrated profile a collective step also costs the copies the executor makes around
// it, at the measured copy bandwidth (2 bytes of traffic per byte copied); mesh X=2, f32.
TEST(CalibratedCost, CollectivesAddTheExecutorsCopies) {
  PlanOptions opt;
  opt.dtype = DType::f32;
  opt.hw = calibrated();
  HardwareProfile analytic = opt.hw;
  analytic.calibration.reset();
  const Mesh mesh = Mesh::parse("X=2");
  const std::vector<std::int64_t> shape = {64, 32};  // I, J
  const auto one_step = [&](const char* from, const char* to, const HardwareProfile& hw) {
    PlanOptions o = opt;
    o.hw = hw;
    const Plan p = plan_reshard(mesh, parse_spec(from, mesh), parse_spec(to, mesh), shape, o);
    EXPECT_EQ(p.steps.size(), 1u) << from << " -> " << to;
    return p.steps.at(0);
  };
  const auto copies = [&](std::int64_t elements) { return 2.0 * elements * 4 / 1e10; };
  struct Case {
    const char* from;
    const char* to;
    std::int64_t copied;  // elements, worked out by hand from the executor
  };
  for (const Case& c : std::vector<Case>{
           {"A[I_X, J]", "A[I, J]", 32 * 32},            // own piece only: I leads, gathered in place
           {"A[I, J_X]", "A[I, J]", 64 * 16 + 64 * 32},  // own piece into staging, staging into A
           {"A[I, J]{U_X}", "A[I_X, J]", 0},             // I leads: scattered from A in place
           {"A[I, J]{U_X}", "A[I, J_X]", 64 * 32},       // packed into staging
           {"A[I, J]{U_X}", "A[I, J]", 64 * 32},         // input into output, reduced there
           {"A[I_X, J]", "A[I, J_X]", 32 * 32},          // J's pieces packed; I's received in place
           {"A[I, J_X]", "A[I_X, J]", 32 * 32},          // I's pieces sent in place; J's unpacked
       }) {
    const Step s = one_step(c.from, c.to, opt.hw);
    // The collective's array: all_gather's output, the others' input (as cost.h has it).
    const std::int64_t bytes = 4 * max_local_elements(mesh, s.op == OpKind::all_gather ? s.to : s.from, shape);
    EXPECT_DOUBLE_EQ(s.time_s, collective_time(opt.hw, mesh, s.op, s.axes, bytes) + copies(c.copied))
        << c.from << " -> " << c.to << " (" << to_string(s.op) << ")";
    // Analytic profiles model the collective alone.
    EXPECT_DOUBLE_EQ(one_step(c.from, c.to, analytic).time_s, collective_time(analytic, mesh, s.op, s.axes, bytes))
        << c.from << " -> " << c.to;
  }
}

// The reduce-scatter ring's rank adds the n - 1 running sums that arrive into its partial
// block itself: on a calibrated profile that costs (n - 1) x 3 block bytes at the measured
// y += x bandwidth, on top of the overlapped ring. Isolated by halving that bandwidth.
TEST(CalibratedCost, TheReduceScatterRingPaysForItsAdditions) {
  const Mesh mesh = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I_X, K]", mesh);
  const auto ring_time = [&](double add_bandwidth) {
    PlanOptions opt;
    opt.dtype = DType::f32;
    opt.hw = calibrated();
    opt.hw.calibration->add_bandwidth = add_bandwidth;
    for (const Plan& p : plan_matmul(mesh, c, parse_dims("I=64,J=32,K=16"), opt).candidates) {
      if (p.steps.size() == 1 && p.steps[0].op == OpKind::einsum_reduce_scatter) return p.steps[0].time_s;
    }
    ADD_FAILURE() << "no einsum_reduce_scatter candidate";
    return 0.0;
  };
  const double block = 16 * 16 * 4;  // C[I_X, K]: 16 rows of 16 f32
  EXPECT_NEAR(ring_time(1e9) - ring_time(2e9), 3 * 3 * block / 2e9, 1e-15);
}

// Each ring takes its own op's overlap: with none hidden its time grows by its n - 1 hops
// (the GEMMs here outlast a hop, so with all hidden the hops cost nothing), and the other
// ring's overlap leaves it alone.
TEST(CalibratedCost, EachRingHidesTheShareOfItsHopsItsOverlapSays) {
  const Mesh mesh = Mesh::parse("X=4");
  const auto ring_time = [&](const char* expression, OpKind op, double gather_overlap, double scatter_overlap) {
    PlanOptions opt;
    opt.dtype = DType::f32;
    opt.hw = calibrated();
    opt.hw.calibration->gather_ring_overlap = gather_overlap;
    opt.hw.calibration->scatter_ring_overlap = scatter_overlap;
    const Contraction c = parse_contraction(expression, mesh);
    for (const Plan& p : plan_matmul(mesh, c, parse_dims("I=1024,J=1024,K=16"), opt).candidates) {
      if (p.steps.size() == 1 && p.steps[0].op == op && !p.steps[0].bidirectional) return p.steps[0].time_s;
    }
    ADD_FAILURE() << "no one-way " << to_string(op) << " candidate";
    return 0.0;
  };
  const char* fsdp = "A[I_X, J] @ B[J, K_X] -> C[I_X, K]";          // B's shards travel: 1024 x 4 f32 each
  const char* row_parallel = "A[I, J_X] @ B[J_X, K] -> C[I_X, K]";  // C's partial blocks: 256 x 16 f32
  const HardwareProfile hw = calibrated();
  EXPECT_NEAR(ring_time(fsdp, OpKind::all_gather_einsum, 0, 1) - ring_time(fsdp, OpKind::all_gather_einsum, 1, 1),
              3 * ring_hop_time(hw, mesh, {0}, 1024 * 4 * 4), 1e-15);
  EXPECT_EQ(ring_time(fsdp, OpKind::all_gather_einsum, 1, 0), ring_time(fsdp, OpKind::all_gather_einsum, 1, 1));
  EXPECT_NEAR(ring_time(row_parallel, OpKind::einsum_reduce_scatter, 1, 0) -
                  ring_time(row_parallel, OpKind::einsum_reduce_scatter, 1, 1),
              3 * ring_hop_time(hw, mesh, {0}, 256 * 16 * 4), 1e-15);
  EXPECT_EQ(ring_time(row_parallel, OpKind::einsum_reduce_scatter, 0, 1),
            ring_time(row_parallel, OpKind::einsum_reduce_scatter, 1, 1));
}

// The fixed costs (cost.h): every einsum that computes pays einsum_call_s once, a ring once
// per chunk it multiplies, and a ring ring_handoff_s once per hop; an analytic profile neither.
TEST(CalibratedCost, FixedCostsAddPerCallAndPerHop) {
  HardwareProfile hw = calibrated();
  const double without = einsum_time(hw, DType::f32, 1.6e9, 100000000);
  hw.calibration->einsum_call_s = 3e-6;
  EXPECT_DOUBLE_EQ(einsum_time(hw, DType::f32, 1.6e9, 100000000), without + 3e-6);
  EXPECT_EQ(einsum_time(hw, DType::f32, 0, 0), 0);  // nothing to compute, no call

  const Mesh mesh = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I_X, J] @ B[J, K_X] -> C[I_X, K]", mesh);
  const auto ring = [&](double call, double handoff) {
    PlanOptions opt;
    opt.dtype = DType::f32;
    opt.hw = calibrated();
    opt.hw.calibration->einsum_call_s = call;
    opt.hw.calibration->ring_handoff_s = handoff;
    const MatmulPlanning planning = plan_matmul(mesh, c, parse_dims("I=1024,J=1024,K=16"), opt);
    const Plan* p = find_candidate(planning, {OpKind::all_gather_einsum}, false);
    EXPECT_NE(p, nullptr);
    return p ? p->steps[0] : Step{};
  };
  const Step base = ring(0, 0);
  ASSERT_EQ(base.ring_steps, 4);
  // The GEMMs outlast every hop here, so each chunk's call adds in full: 4 chunks, 3 hops.
  EXPECT_NEAR(ring(1e-6, 0).time_s - base.time_s, 4 * 1e-6, 1e-15);
  EXPECT_NEAR(ring(0, 5e-6).time_s - base.time_s, 3 * 5e-6, 1e-15);
  EXPECT_EQ(ring(0, 5e-6).comm_time_s, base.comm_time_s);  // the hops' own time is unchanged

  HardwareProfile analytic = hw;
  analytic.calibration.reset();
  EXPECT_DOUBLE_EQ(einsum_time(analytic, DType::f32, 8e9, 1), 1.0);  // the peak alone
}

// ---- confidence (docs/cost-model.md, "Confidence") ----

TEST(Confidence, ACollectiveIsWeakWithoutAFitOutsideItsSizesOrWhereItsFitMisses) {
  HardwareProfile hw = calibrated();  // all_gather fitted on 2 ranks, 4 KiB .. 32 MiB, residual 5%
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const auto conf = [&](const AxisList& group, std::int64_t bytes) {
    return collective_cost(hw, mesh, OpKind::all_gather, group, bytes);
  };
  EXPECT_FALSE(conf({0}, 1 << 20).confidence.low());  // inside, a close fit

  const CollectiveCost none = conf({0, 1}, 1 << 20);  // 4 ranks: no fit
  ASSERT_EQ(none.confidence.why.size(), 1u);
  EXPECT_THAT(none.confidence.why[0], HasSubstr("no all_gather on 4 ranks was calibrated"));
  EXPECT_DOUBLE_EQ(none.confidence.uncertainty_s, kModelBand * none.time_s);

  const CollectiveCost beyond = conf({0}, std::int64_t{1} << 30);
  ASSERT_EQ(beyond.confidence.why.size(), 1u);
  EXPECT_THAT(beyond.confidence.why[0], HasSubstr("extrapolated: 1.00 GiB lies outside the sizes calibrated"));
  EXPECT_TRUE(conf({0}, 1024).confidence.low());  // below the smallest size too

  hw.calibration->collectives[0].max_rel_residual = 0.4;
  const CollectiveCost loose = conf({0}, 1 << 20);
  ASSERT_EQ(loose.confidence.why.size(), 1u);
  EXPECT_THAT(loose.confidence.why[0], HasSubstr("misses its own samples by up to 40%"));
  EXPECT_DOUBLE_EQ(loose.confidence.uncertainty_s, 0.4 * loose.time_s);

  // The hardware the formulas describe: nothing known against them.
  hw.calibration.reset();
  EXPECT_FALSE(conf({0, 1}, std::int64_t{1} << 30).confidence.low());
}

TEST(Confidence, AnEinsumIsWeakBelowTheGemmShapesMeasured) {
  const HardwareProfile hw = calibrated();                                    // f32 measured at intensities 4 and 64
  EXPECT_FALSE(einsum_confidence(hw, DType::f32, 1.6e9, 100000000).low());    // 16 FLOP/byte
  EXPECT_FALSE(einsum_confidence(hw, DType::f32, 6.4e11, 1000000000).low());  // 640: at least the square's rate
  const Confidence thin = einsum_confidence(hw, DType::f32, 2e8, 100000000);  // 2 FLOP/byte
  ASSERT_TRUE(thin.low());
  EXPECT_THAT(thin.why[0], HasSubstr("2 FLOP/byte lies below the GEMM shapes calibrated, 4 .. 64"));
  EXPECT_DOUBLE_EQ(thin.uncertainty_s, kModelBand * einsum_time(hw, DType::f32, 2e8, 100000000));
  EXPECT_THAT(einsum_confidence(hw, DType::f64, 4e9, 1000).why.at(0), HasSubstr("no GEMM rate was calibrated for f64"));
}

// A ring is as weak as its transfer and its GEMMs together; the plan's uncertainty sums its steps'.
TEST(Confidence, ARingAddsItsTransfersUncertaintyToItsGemms) {
  PlanOptions opt;
  opt.dtype = DType::f32;
  opt.hw = calibrated();
  const Mesh mesh = Mesh::parse("X=4");  // no fit on 4 ranks
  const Contraction c = parse_contraction("A[I_X, J] @ B[J, K_X] -> C[I_X, K]", mesh);
  const MatmulPlanning planning = plan_matmul(mesh, c, parse_dims("I=1024,J=1024,K=16"), opt);
  const Plan* ring = find_candidate(planning, {OpKind::all_gather_einsum}, false);
  const Plan* serial = find_candidate(planning, {OpKind::all_gather, OpKind::einsum});
  ASSERT_TRUE(ring && serial);
  const Step& gather = serial->steps[0];
  ASSERT_TRUE(gather.confidence.low());
  EXPECT_FALSE(serial->steps[1].confidence.low());
  EXPECT_EQ(ring->steps[0].confidence.why, gather.confidence.why);
  EXPECT_DOUBLE_EQ(ring->steps[0].confidence.uncertainty_s, gather.confidence.uncertainty_s);
  EXPECT_DOUBLE_EQ(uncertainty_s(*serial), gather.confidence.uncertainty_s);
}

TEST(Confidence, ANearTieIsTwoPlansCloserThanTheirUncertainty) {
  const auto plan = [](double time, double uncertainty) {
    Plan p;
    p.total_time_s = time;
    Step s;
    if (uncertainty > 0) s.confidence.add("weak", uncertainty);
    p.steps.push_back(s);
    return p;
  };
  MatmulPlanning m;
  m.candidates = {plan(100e-6, 4e-6), plan(108e-6, 5e-6), plan(103e-6, 0)};
  m.chosen = 0;
  const std::optional<NearTie> tie = near_tie(m);
  ASSERT_TRUE(tie.has_value());
  EXPECT_EQ(tie->candidate, 2);  // the nearest, 3 us away, within 4 + 0
  EXPECT_NEAR(tie->difference_s, 3e-6, 1e-18);
  EXPECT_DOUBLE_EQ(tie->uncertainty_s, 4e-6);
  m.candidates[2].fits_memory = false;  // then #1, 8 us away, but 9 us of uncertainty
  ASSERT_TRUE(near_tie(m).has_value());
  EXPECT_EQ(near_tie(m)->candidate, 1);
  m.candidates[1].total_time_s = 110e-6;  // 10 us apart: the model can rank them
  EXPECT_FALSE(near_tie(m).has_value());
}

TEST(CalibratedCost, AnalyticProfilesAreUnchanged) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  EXPECT_FALSE(v5e.calibration.has_value());
  // The book's pop quiz figure (cost_test.cpp has the derivation).
  EXPECT_NEAR(collective_time(v5e, Mesh::parse("X=8,Y=4"), OpKind::all_gather, {1}, 33554432), 33554432 / 9e10, 1e-12);
  EXPECT_DOUBLE_EQ(einsum_time(v5e, DType::bf16, 1.97e14, 1), 1.0);
}

// ---- JSON ----

TEST(CalibratedProfileJson, RoundTripsEveryField) {
  HardwareProfile p = calibrated();
  p.calibration->gather_ring_overlap = 0.25;
  p.calibration->scatter_ring_overlap = 0.75;
  p.calibration->einsum_call_s = 1.5e-6;
  p.calibration->ring_handoff_s = 4.25e-6;
  p.calibration->local_seconds_per_element[DType::f32] = {{"gelu", 1.25e-8}, {"gelu backward", 2.5e-8}};
  p.calibration->local_seconds_per_element[DType::f64] = {{"accumulate backward", 7.5e-10}};
  p.calibration->copy_bandwidths = {{2048, 6.5e10}, {1 << 24, 1.25e10}};
  const HardwareProfile q = parse_profile_json(profile_to_json(p), "p.json");
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.peak_flops, p.peak_flops);
  EXPECT_EQ(q.hbm_bandwidth, p.hbm_bandwidth);
  EXPECT_EQ(q.link_bandwidth, p.link_bandwidth);
  EXPECT_EQ(q.hop_latency_s, p.hop_latency_s);
  EXPECT_EQ(q.topology, p.topology);
  ASSERT_TRUE(q.calibration.has_value());
  const Calibration& a = *p.calibration;
  const Calibration& b = *q.calibration;
  EXPECT_EQ(b.backend, a.backend);
  EXPECT_EQ(b.mesh, a.mesh);
  EXPECT_EQ(b.host, a.host);
  EXPECT_EQ(b.measured_at, a.measured_at);
  EXPECT_EQ(b.copy_bandwidth, a.copy_bandwidth);
  EXPECT_EQ(b.add_bandwidth, a.add_bandwidth);
  EXPECT_EQ(b.gather_ring_overlap, 0.25);
  EXPECT_EQ(b.scatter_ring_overlap, 0.75);
  EXPECT_EQ(b.einsum_call_s, 1.5e-6);
  EXPECT_EQ(b.ring_handoff_s, 4.25e-6);
  EXPECT_EQ(b.local_seconds_per_element, a.local_seconds_per_element);
  ASSERT_EQ(b.copy_bandwidths.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b.copy_bandwidths[i].bytes, a.copy_bandwidths[i].bytes);
    EXPECT_EQ(b.copy_bandwidths[i].bandwidth, a.copy_bandwidths[i].bandwidth);
  }
  ASSERT_EQ(b.collectives.size(), a.collectives.size());
  for (std::size_t i = 0; i < a.collectives.size(); ++i) {
    EXPECT_EQ(b.collectives[i].op, a.collectives[i].op);
    EXPECT_EQ(b.collectives[i].group_size, a.collectives[i].group_size);
    EXPECT_EQ(b.collectives[i].alpha_s, a.collectives[i].alpha_s);
    EXPECT_EQ(b.collectives[i].beta_s_per_byte, a.collectives[i].beta_s_per_byte);
    EXPECT_EQ(b.collectives[i].min_bytes, a.collectives[i].min_bytes);
    EXPECT_EQ(b.collectives[i].max_bytes, a.collectives[i].max_bytes);
    EXPECT_EQ(b.collectives[i].max_rel_residual, a.collectives[i].max_rel_residual);
  }
  ASSERT_EQ(b.gemm.size(), a.gemm.size());
  for (std::size_t i = 0; i < a.gemm.size(); ++i) {
    EXPECT_EQ(b.gemm[i].dtype, a.gemm[i].dtype);
    EXPECT_EQ(b.gemm[i].shape, a.gemm[i].shape);
    EXPECT_EQ(b.gemm[i].m, a.gemm[i].m);
    EXPECT_EQ(b.gemm[i].n, a.gemm[i].n);
    EXPECT_EQ(b.gemm[i].k, a.gemm[i].k);
    EXPECT_EQ(b.gemm[i].intensity, a.gemm[i].intensity);
    EXPECT_EQ(b.gemm[i].flops_per_s, a.gemm[i].flops_per_s);
  }
  // An analytic profile writes no calibration and reads back without one.
  EXPECT_FALSE(parse_profile_json(profile_to_json(builtin_profile("h100")), "h.json").calibration.has_value());
}

struct BadCalibration {
  const char* name;
  std::function<void(json&)> edit;
  const char* message;
};

TEST(CalibratedProfileJson, EveryMistakeNamesTheKeyAndTheRule) {
  const std::vector<BadCalibration> cases = {
      {"not an object", [](json& d) { d["calibration"] = 3; }, "key 'calibration' must be an object, got number"},
      {"unknown key", [](json& d) { d["calibration"]["speed"] = 1; },
       "unknown key 'calibration.speed'; expected backend"},
      {"missing key", [](json& d) { d["calibration"].erase("gemm"); }, "missing key 'calibration.gemm'"},
      {"unknown backend", [](json& d) { d["calibration"]["backend"] = "gpu"; },
       "key 'calibration.backend' names the backend measured, threads or mpi, got 'gpu'"},
      {"collectives not array", [](json& d) { d["calibration"]["collectives"] = json::object(); },
       "key 'calibration.collectives' must be an array, got object"},
      {"unknown op", [](json& d) { d["calibration"]["collectives"][0]["op"] = "broadcast"; },
       "key 'calibration.collectives[0].op' must be all_gather, reduce_scatter, all_reduce or all_to_all, got "
       "'broadcast'"},
      {"group of one", [](json& d) { d["calibration"]["collectives"][1]["group_size"] = 1; },
       "key 'calibration.collectives[1].group_size' must be a whole number >= 2, got 1"},
      {"fractional group", [](json& d) { d["calibration"]["collectives"][0]["group_size"] = 2.5; },
       "key 'calibration.collectives[0].group_size' must be a whole number >= 2, got 2.5"},
      {"negative alpha", [](json& d) { d["calibration"]["collectives"][0]["alpha_s"] = -1e-6; },
       "key 'calibration.collectives[0].alpha_s' must be a non-negative finite number, got -1e-06"},
      {"negative beta", [](json& d) { d["calibration"]["collectives"][0]["beta_s_per_byte"] = -1e-9; },
       "key 'calibration.collectives[0].beta_s_per_byte' must be a non-negative finite number, got -1e-09"},
      {"sizes reversed", [](json& d) { d["calibration"]["collectives"][0]["max_bytes"] = 1; },
       "key 'calibration.collectives[0].max_bytes' must be a whole number >= 4096, got 1"},
      {"overlapping fits",
       [](json& d) {
         d["calibration"]["collectives"][1] = d["calibration"]["collectives"][0];
         d["calibration"]["collectives"][1]["min_bytes"] = 1 << 20;
       },
       "calibration.collectives[1] overlaps another all_gather fit on group size 2 (4096..33554432 bytes); the fits "
       "of one collective and group size cover disjoint size ranges"},
      {"bad dtype", [](json& d) { d["calibration"]["gemm"][0]["dtype"] = "fp32"; },
       "key 'calibration.gemm[0].dtype' must be one of bf16, f16, f32, f64, got 'fp32'"},
      {"zero rate", [](json& d) { d["calibration"]["gemm"][1]["flops_per_s"] = 0; },
       "key 'calibration.gemm[1].flops_per_s' must be a finite rate of at least 1 FLOP/s, got 0"},
      {"bandwidth string", [](json& d) { d["calibration"]["copy_bandwidth"] = "fast"; },
       "key 'calibration.copy_bandwidth' must be a number, got string"},
      {"overlap above one", [](json& d) { d["calibration"]["gather_ring_overlap"] = 1.5; },
       "key 'calibration.gather_ring_overlap' is a share of the ring's transfers, 0 to 1, got 1.5"},
      {"negative overlap", [](json& d) { d["calibration"]["scatter_ring_overlap"] = -0.1; },
       "key 'calibration.scatter_ring_overlap' must be a non-negative finite number, got -0.1"},
      {"negative call cost", [](json& d) { d["calibration"]["einsum_call_s"] = -1e-6; },
       "key 'calibration.einsum_call_s' must be a non-negative finite number, got -1e-06"},
      {"hand-off of seconds", [](json& d) { d["calibration"]["ring_handoff_s"] = 2; },
       "key 'calibration.ring_handoff_s' is the fixed cost of one step in seconds, 0 to 1 (steps take "
       "microseconds), got 2"},
      {"unknown key lists the optional ones", [](json& d) { d["calibration"]["overlap"] = 1; },
       "gemm, gather_ring_overlap, scatter_ring_overlap, einsum_call_s, ring_handoff_s, local_seconds_per_element"},
      {"copy sizes not ascending",
       [](json& d) {
         d["calibration"]["copy_bandwidths"] =
             json::array({{{"bytes", 4096}, {"bandwidth", 2e10}}, {{"bytes", 4096}, {"bandwidth", 1e10}}});
       },
       "key 'calibration.copy_bandwidths[1].bytes' must be larger than the entry's before it (sizes ascend), got 4096"},
      {"copy of no bandwidth",
       [](json& d) {
         d["calibration"]["copy_bandwidths"] = json::array({{{"bytes", 4096}, {"bandwidth", 0}}});
       },
       "key 'calibration.copy_bandwidths[0].bandwidth' must be a finite rate of at least 1 bytes/s, got 0"},
      {"rates not an object", [](json& d) { d["calibration"]["local_seconds_per_element"] = 1; },
       "key 'calibration.local_seconds_per_element' must be an object, got number"},
      {"rates of no dtype", [](json& d) { d["calibration"]["local_seconds_per_element"]["fp32"]["gelu"] = 1e-8; },
       "key 'calibration.local_seconds_per_element.fp32' must be a dtype: bf16, f16, f32 or f64"},
      {"zero rate per element", [](json& d) { d["calibration"]["local_seconds_per_element"]["f32"]["gelu"] = 0; },
       "key 'calibration.local_seconds_per_element.f32.gelu' must be a positive finite number (seconds per element), "
       "got 0"},
      {"a second per element", [](json& d) { d["calibration"]["local_seconds_per_element"]["f64"]["gelu"] = 2; },
       "key 'calibration.local_seconds_per_element.f64.gelu' is seconds per element, above 0 and at most 1"},
  };
  const json good = json::parse(profile_to_json(calibrated()));
  for (const BadCalibration& c : cases) {
    SCOPED_TRACE(c.name);
    json doc = good;
    c.edit(doc);
    const std::string message = input_error([&] { parse_profile_json(doc.dump(), "p.json"); });
    EXPECT_EQ(message.rfind("p.json: ", 0), 0u) << message;
    EXPECT_THAT(message, HasSubstr(c.message));
  }
}

// A profile written before the rings' overlap was measured reads as hiding every hop, as
// the model then assumed.
TEST(CalibratedProfileJson, AProfileWithoutRingOverlapsHidesEveryHop) {
  json doc = json::parse(profile_to_json(calibrated()));
  doc["calibration"].erase("gather_ring_overlap");
  doc["calibration"].erase("scatter_ring_overlap");
  const HardwareProfile p = parse_profile_json(doc.dump(), "old.json");
  EXPECT_EQ(p.calibration->gather_ring_overlap, 1.0);
  EXPECT_EQ(p.calibration->scatter_ring_overlap, 1.0);
}

// A profile written before the fixed costs were measured predicts without them.
TEST(CalibratedProfileJson, AProfileWithoutFixedCostsReadsThemAsZero) {
  json doc = json::parse(profile_to_json(calibrated()));
  doc["calibration"].erase("einsum_call_s");
  doc["calibration"].erase("ring_handoff_s");
  const HardwareProfile p = parse_profile_json(doc.dump(), "old.json");
  EXPECT_EQ(p.calibration->einsum_call_s, 0.0);
  EXPECT_EQ(p.calibration->ring_handoff_s, 0.0);
}

// A profile written before local functions were measured has no rates (and writes none back):
// its local steps stay costed by their traffic.
TEST(CalibratedProfileJson, AProfileWithoutLocalRatesCostsLocalOpsByTheirTraffic) {
  const json doc = json::parse(profile_to_json(calibrated()));
  EXPECT_FALSE(doc["calibration"].contains("local_seconds_per_element"));
  const HardwareProfile p = parse_profile_json(doc.dump(), "old.json");
  EXPECT_TRUE(p.calibration->local_seconds_per_element.empty());
  const LocalOpCost c = local_op_cost(p, DType::f32, "gelu", 1 << 20);
  EXPECT_EQ(c.compute_s, 0.0);
  EXPECT_EQ(c.time_s, local_op_time(p, 1 << 20));
  EXPECT_EQ(c.bound, Bound::memory);
}

// ---- where the calibrated profile lives ----

class CalibratedPath : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : {"SHARDMM_PROFILE", "XDG_CONFIG_HOME", "HOME"}) {
      const char* v = std::getenv(var);
      saved_.emplace_back(var, v ? std::optional<std::string>(v) : std::nullopt);
    }
  }
  void TearDown() override {
    for (const auto& [var, value] : saved_) {
      if (value) setenv(var.c_str(), value->c_str(), 1);
      else unsetenv(var.c_str());
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(CalibratedPath, EnvironmentDecidesInOrder) {
  setenv("HOME", "/home/u", 1);
  unsetenv("XDG_CONFIG_HOME");
  unsetenv("SHARDMM_PROFILE");
  EXPECT_EQ(calibrated_profile_path(), "/home/u/.config/shardmm/calibrated.json");
  setenv("XDG_CONFIG_HOME", "/cfg", 1);
  EXPECT_EQ(calibrated_profile_path(), "/cfg/shardmm/calibrated.json");
  setenv("SHARDMM_PROFILE", "/x/p.json", 1);
  EXPECT_EQ(calibrated_profile_path(), "/x/p.json");
  setenv("SHARDMM_PROFILE", "", 1);  // empty counts as unset
  EXPECT_EQ(calibrated_profile_path(), "/cfg/shardmm/calibrated.json");
  unsetenv("XDG_CONFIG_HOME");
  unsetenv("HOME");
  unsetenv("SHARDMM_PROFILE");
  EXPECT_EQ(calibrated_profile_path(), "");
}

TEST_F(CalibratedPath, LoadProfileReadsItByName) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("shardmm-calibration-test-" + std::to_string(getpid()) + ".json");
  setenv("SHARDMM_PROFILE", file.c_str(), 1);
  EXPECT_THAT(input_error([] { load_profile("calibrated"); }),
              HasSubstr("no calibrated hardware profile at " + file.string() + "; run 'shardmm calibrate' first"));
  std::ofstream(file) << profile_to_json(calibrated());
  const HardwareProfile p = load_profile("calibrated");
  EXPECT_EQ(p.name, "calibrated-threads");
  ASSERT_TRUE(p.calibration.has_value());
  EXPECT_EQ(p.calibration->collectives.size(), 2u);
  std::ofstream(file) << "{";
  EXPECT_THAT(input_error([] { load_profile("calibrated"); }), HasSubstr(file.string() + ": malformed JSON"));
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace shardmm
