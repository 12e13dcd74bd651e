// `shardmm calibrate` end to end, in-process (cli::run_cli): a --quick calibration writes a
// profile whose figures agree with the samples it printed; plan, reshard and run then load
// it by default (and with --hw calibrated or --hw FILE) and predict with its fits; run
// reports measured/predicted and writes a Chrome trace; bad profiles and flags exit 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <iostream>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_in_process.h"
#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/calibrate.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using Result = testing::CliResult;

Result shardmm_cli(std::vector<std::string> args) { return testing::run_cli_in_process(std::move(args)); }

json json_of(const Result& r) {
  EXPECT_EQ(r.status, 0) << r.err;
  return json::parse(r.out);
}

void expect_input_error(const std::vector<std::string>& args, const std::string& needle) {
  SCOPED_TRACE(::testing::PrintToString(args));
  const Result r = shardmm_cli(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith("shardmm: error: "));
  EXPECT_THAT(r.err.substr(0, r.err.find('\n')), HasSubstr(needle));
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One --quick calibration on X=2 for the whole suite, in its own directory, found through
// SHARDMM_PROFILE.
class Calibrated : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("shardmm-calibrate-test-" + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_);
    profile_ = new std::filesystem::path(*dir_ / "nested" / "calibrated.json");
    setenv("SHARDMM_PROFILE", profile_->c_str(), 1);
    calibration_ = new Result(shardmm_cli({"calibrate", "--quick", "--mesh", "X=2", "--json"}));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete calibration_;
    delete profile_;
    delete dir_;
  }
  void SetUp() override {
    setenv("SHARDMM_PROFILE", profile_->c_str(), 1);
    ASSERT_EQ(calibration_->status, 0) << calibration_->err;
  }
  static HardwareProfile profile() { return parse_profile_json(slurp(*profile_), profile_->string()); }
  // The one fit of `op` on 2 ranks (a --quick sweep has too few sizes for two ranges).
  static const CollectiveFit& fit(const HardwareProfile& p, OpKind op) {
    const CollectiveFit* found = nullptr;
    for (const CollectiveFit& f : p.calibration->collectives) {
      if (f.op != op || f.group_size != 2) continue;
      if (found) throw std::logic_error("two fits");
      found = &f;
    }
    if (!found) throw std::logic_error("no fit");
    return *found;
  }

  static std::filesystem::path* dir_;
  static std::filesystem::path* profile_;
  static Result* calibration_;
};
std::filesystem::path* Calibrated::dir_ = nullptr;
std::filesystem::path* Calibrated::profile_ = nullptr;
Result* Calibrated::calibration_ = nullptr;

TEST(GemmPasses, TwoAreAveragedAndThreeVoteByTheirMedian) {
  const auto pass = [](double square, double skinny) {
    return std::vector<GemmRate>{{DType::f32, "square", 64, 64, 64, 10.7, square},
                                 {DType::f64, "skinny", 64, 4, 64, 1.9, skinny}};
  };
  EXPECT_DOUBLE_EQ(gemm_spread(pass(100, 50), pass(100, 50)), 0.0);
  // The largest spread of the two shapes, each relative to its own mean.
  EXPECT_DOUBLE_EQ(gemm_spread(pass(100, 50), pass(80, 70)), 20.0 / 60.0);
  const std::vector<GemmRate> two = combine_gemm_passes({pass(100, 50), pass(80, 70)});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_DOUBLE_EQ(two[0].flops_per_s, 90);
  EXPECT_DOUBLE_EQ(two[1].flops_per_s, 60);
  EXPECT_EQ(two[1].shape, "skinny");  // everything but the rate is the first pass's
  EXPECT_EQ(two[1].dtype, DType::f64);
  EXPECT_EQ(two[1].n, 4);
  // A slow first pass is outvoted by the two that agree, per shape.
  const std::vector<GemmRate> three = combine_gemm_passes({pass(60, 50), pass(100, 70), pass(95, 68)});
  EXPECT_DOUBLE_EQ(three[0].flops_per_s, 95);
  EXPECT_DOUBLE_EQ(three[1].flops_per_s, 68);
  EXPECT_THROW(combine_gemm_passes({pass(1, 1)}), UsageError);
}

TEST_F(Calibrated, WritesAProfileThatAgreesWithItsSamples) {
  const json doc = json::parse(calibration_->out);
  EXPECT_EQ(doc["profile_path"], profile_->string());
  EXPECT_EQ(doc["profile"], json::parse(slurp(*profile_)));
  const HardwareProfile p = profile();
  EXPECT_EQ(p.name, "calibrated-threads");
  ASSERT_TRUE(p.calibration.has_value());
  EXPECT_EQ(p.calibration->backend, "threads");
  EXPECT_EQ(p.calibration->mesh, "X=2");
  EXPECT_EQ(p.topology, "switch");
  // Two GEMM passes, whose rates differ by a fraction of their mean (< 2, as both are > 0).
  ASSERT_TRUE(doc["gemm_drift"].is_number());
  EXPECT_GE(doc["gemm_drift"].get<double>(), 0.0);
  EXPECT_LT(doc["gemm_drift"].get<double>(), 2.0);
  // A third pass exactly when the first two are as far apart as --gemm-spread's default or more.
  EXPECT_EQ(doc["gemm_passes"].get<int>(),
            doc["gemm_drift"].get<double>() >= CalibrateOptions{}.gemm_steady_spread ? 3 : 2);
  for (const GemmRate& g : p.calibration->gemm) EXPECT_GT(g.flops_per_s, 0) << g.shape;

  // Four collectives on the one group size, one size range each (a --quick sweep has too
  // few sizes for two); every sample lies on its fit as the file says.
  const std::vector<std::int64_t> sizes = calibration_sizes(true);
  ASSERT_LT(sizes.size(), 2 * kMinSegmentPoints);
  ASSERT_EQ(p.calibration->collectives.size(), 4u);
  ASSERT_EQ(doc["samples"].size(), 4 * sizes.size());
  std::map<std::string, double> worst;
  for (std::size_t i = 0; i < doc["samples"].size(); ++i) {
    const json& s = doc["samples"][i];
    // The fit's input is the least time measured at this size or a larger one (same op:
    // the samples run by op, sizes ascending).
    double least = s["measured_s"].get<double>();
    for (std::size_t j = i + 1; j < doc["samples"].size() && doc["samples"][j]["op"] == s["op"]; ++j) {
      least = std::min(least, doc["samples"][j]["measured_s"].get<double>());
    }
    EXPECT_EQ(s["fit_input_s"].get<double>(), least);
    const std::int64_t size = s["bytes"].get<std::int64_t>();
    const CollectiveFit& f = fit(p, [&] {
      for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
        if (s["op"] == to_string(op)) return op;
      }
      throw std::logic_error("unknown op");
    }());
    const auto bytes = static_cast<double>(size);
    EXPECT_EQ(s["group_size"], 2);
    EXPECT_NEAR(s["fitted_s"].get<double>(), f.alpha_s + f.beta_s_per_byte * bytes, 1e-15);
    const double measured = s["fit_input_s"].get<double>();
    EXPECT_GT(measured, 0);
    worst[s["op"]] = std::max(worst[s["op"]], std::abs(s["fitted_s"].get<double>() - measured) / measured);
  }
  for (const CollectiveFit& f : p.calibration->collectives) {
    EXPECT_NEAR(f.max_rel_residual, worst[to_string(f.op)], 1e-12) << to_string(f.op);
    EXPECT_GE(f.alpha_s, 0);
    EXPECT_GE(f.beta_s_per_byte, 0);
    EXPECT_EQ(f.min_bytes, sizes.front());
    EXPECT_EQ(f.max_bytes, sizes.back());
  }
  // The analytic fields come from the AllGather fit and the fastest GEMM per dtype.
  const CollectiveFit& ag = fit(p, OpKind::all_gather);
  EXPECT_DOUBLE_EQ(p.link_bandwidth, 0.5 / ag.beta_s_per_byte);
  EXPECT_DOUBLE_EQ(p.hop_latency_s, ag.alpha_s);
  EXPECT_DOUBLE_EQ(p.hbm_bandwidth, p.calibration->copy_bandwidth);
  // memcpy by the bytes each size's copy moved (half the array on 2 ranks), the largest's the
  // one copy_bandwidth.
  ASSERT_EQ(p.calibration->copy_bandwidths.size(), sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    EXPECT_NEAR(static_cast<double>(p.calibration->copy_bandwidths[i].bytes), sizes[i] / 2.0, 1.0);
  EXPECT_DOUBLE_EQ(p.calibration->copy_bandwidths.back().bandwidth, p.calibration->copy_bandwidth);
  ASSERT_EQ(p.calibration->gemm.size(), 12u);  // per dtype 3 shapes by intensity, 3 thin (1, 2, 4 rows)
  EXPECT_EQ(std::count_if(p.calibration->gemm.begin(), p.calibration->gemm.end(),
                          [](const GemmRate& g) { return g.shape == kThinGemm && std::min(g.m, g.n) <= 4; }),
            6);
  std::map<DType, double> fastest;
  for (const GemmRate& g : p.calibration->gemm) {
    const double flops = 2.0 * static_cast<double>(g.m * g.n * g.k);
    const double bytes = static_cast<double>((g.m * g.k + g.k * g.n + g.m * g.n) * dtype_bytes(g.dtype));
    EXPECT_DOUBLE_EQ(g.intensity, flops / bytes);
    fastest[g.dtype] = std::max(fastest[g.dtype], g.flops_per_s);
  }
  EXPECT_EQ(p.peak_flops, fastest);
}

// Both collective matmul rings ran against their serialized twins, at sizes where the twin's
// GEMMs take at least twice its transfer, and the overlap written to the profile is the one
// at which the model predicts the ratio measured (or an end of 0..1 where the ratio lies
// beyond the model's range).
TEST_F(Calibrated, FitsEachRingsOverlapToTheMeasuredRatio) {
  const json doc = json::parse(calibration_->out);
  const HardwareProfile p = profile();
  const Mesh mesh = Mesh::parse("X=2");
  ASSERT_EQ(doc["rings"].size(), 2u);
  for (const json& ring : doc["rings"]) {
    SCOPED_TRACE(ring.dump());
    const OpKind op = ring["op"] == "all_gather_einsum" ? OpKind::all_gather_einsum : OpKind::einsum_reduce_scatter;
    EXPECT_EQ(ring["op"], to_string(op));
    const double overlap = ring["overlap"].get<double>();
    EXPECT_EQ(overlap, op == OpKind::all_gather_einsum ? p.calibration->gather_ring_overlap
                                                       : p.calibration->scatter_ring_overlap);
    ASSERT_GE(overlap, 0.0);
    ASSERT_LE(overlap, 1.0);
    const double measured = ring["ring_s"].get<double>() / ring["serialized_s"].get<double>();
    ASSERT_GT(ring["serialized_s"].get<double>(), 0);
    EXPECT_LT(ring["predicted_hidden"].get<double>(), ring["predicted_exposed"].get<double>());

    const Contraction c = parse_contraction(ring["expression"].get<std::string>(), mesh);
    DimSizes sizes;
    for (const auto& [dim, size] : ring["dims"].items()) sizes[dim] = size.get<std::int64_t>();
    PlanOptions opt;
    opt.dtype = DType::f32;
    opt.hw = p;
    const MatmulPlanning planning = plan_matmul(mesh, c, sizes, opt);
    const Plan* ring_plan = nullptr;
    const Plan* serialized = nullptr;
    for (const Plan& plan : planning.candidates) {
      if (plan.steps.size() == 1 && plan.steps[0].op == op) ring_plan = &plan;
      if (plan.steps.size() == 2 &&
          (plan.steps[0].op == OpKind::all_gather || plan.steps[1].op == OpKind::reduce_scatter)) {
        serialized = &plan;
      }
    }
    ASSERT_TRUE(ring_plan && serialized);
    EXPECT_GE(serialized->compute_time_s, 2 * serialized->comm_time_s);
    const double predicted = ring_plan->total_time_s / serialized->total_time_s;
    if (overlap == 0) {
      EXPECT_GE(measured, ring["predicted_exposed"].get<double>());
      EXPECT_NEAR(predicted, ring["predicted_exposed"].get<double>(), 1e-12);
    } else if (overlap == 1) {
      EXPECT_LE(measured, ring["predicted_hidden"].get<double>());
      EXPECT_NEAR(predicted, ring["predicted_hidden"].get<double>(), 1e-12);
    } else {
      EXPECT_NEAR(predicted, measured, 1e-6 * measured);
    }
  }
}

// The fixed costs: a tiny local einsum and both tiny rings ran through the executor; each
// sample's per-call figure is what it took beyond the model's time for it, and the profile holds
// the einsum's as einsum_call_s and the rings' mean as ring_handoff_s. The model's time for a
// ring includes the einsum's call per chunk (set first) but no hand-off, and hides every hop (the
// overlaps are fitted after, on a model that has the hand-offs).
TEST_F(Calibrated, MeasuresTheFixedCostsOnTinySteps) {
  const json doc = json::parse(calibration_->out);
  const HardwareProfile p = profile();
  const Mesh mesh = Mesh::parse("X=2");
  ASSERT_EQ(doc["fixed_costs"].size(), 3u);
  std::vector<double> handoffs;
  for (const json& f : doc["fixed_costs"]) {
    SCOPED_TRACE(f.dump());
    const std::string op = f["op"];
    const double measured = f["measured_s"], predicted = f["predicted_s"], per_call = f["per_call_s"];
    const int calls = f["calls"];
    EXPECT_GT(measured, 0);
    EXPECT_NEAR(per_call, std::max(0.0, measured - predicted) / calls, 1e-15);
    const Contraction c = parse_contraction(f["expression"].get<std::string>(), mesh);
    DimSizes sizes;
    for (const auto& [dim, size] : f["dims"].items()) sizes[dim] = size.get<std::int64_t>();
    PlanOptions opt;
    opt.dtype = DType::f32;
    opt.hw = p;
    opt.hw.calibration->ring_handoff_s = 0;
    // Measured before the rings' overlaps are fitted: as a profile without them, every hop hidden.
    opt.hw.calibration->gather_ring_overlap = opt.hw.calibration->scatter_ring_overlap = 1;
    if (op == "einsum") {
      EXPECT_EQ(calls, 1);
      EXPECT_EQ(per_call, p.calibration->einsum_call_s);
      opt.hw.calibration->einsum_call_s = 0;
    } else {
      EXPECT_EQ(calls, 1);  // two members: one hop
      handoffs.push_back(per_call);
    }
    const OpKind kind = op == "einsum"              ? OpKind::einsum
                        : op == "all_gather_einsum" ? OpKind::all_gather_einsum
                                                    : OpKind::einsum_reduce_scatter;
    const MatmulPlanning planning = plan_matmul(mesh, c, sizes, opt);
    const Plan* plan = find_candidate(planning, {kind});
    ASSERT_NE(plan, nullptr);
    EXPECT_NEAR(plan->total_time_s, predicted, 1e-12);
  }
  ASSERT_EQ(handoffs.size(), 2u);
  EXPECT_DOUBLE_EQ(p.calibration->ring_handoff_s, (handoffs[0] + handoffs[1]) / 2);
}

// Every local function's rate, forward and backward, in both dtypes the kernels run in, as the
// profile's calibration (the JSON --json prints is the file's).
TEST_F(Calibrated, MeasuresEveryLocalFunctionsRate) {
  const HardwareProfile p = profile();
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(to_string(dtype));
    ASSERT_TRUE(p.calibration->local_seconds_per_element.contains(dtype));
    const std::map<std::string, double>& rates = p.calibration->local_seconds_per_element.at(dtype);
    for (const autodiff::LocalFunction& f : autodiff::local_functions()) {
      for (bool backward : {false, true}) {
        if (!(backward ? f.backward : f.forward)) continue;
        const std::string key = local_rate_key(f.name, backward);
        ASSERT_TRUE(rates.contains(key)) << key;
        EXPECT_GT(rates.at(key), 0) << key;
      }
    }
  }
}

TEST_F(Calibrated, TextSaysWhereTheProfileWent) {
  const std::filesystem::path other = *dir_ / "other.json";
  const Result r = shardmm_cli({"calibrate", "--quick", "--mesh", "X=2", "--out", other.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("calibrated-threads written to " + other.string()));
  EXPECT_THAT(r.out, HasSubstr("all_reduce"));
  EXPECT_THAT(r.out, HasSubstr("einsum_reduce_scatter"));
  EXPECT_THAT(r.out, HasSubstr("einsum_call_s"));
  EXPECT_THAT(r.out, HasSubstr("ring_handoff_s"));
  EXPECT_THAT(r.out, HasSubstr("Local functions: seconds per element"));
  EXPECT_THAT(r.out, HasSubstr("gelu backward"));
  EXPECT_TRUE(parse_profile_json(slurp(other), other.string()).calibration.has_value());
}

TEST_F(Calibrated, GemmSpreadZeroAlwaysTakesAThirdPass) {
  const std::filesystem::path other = *dir_ / "three-passes.json";
  const Result r =
      shardmm_cli({"calibrate", "--quick", "--mesh", "X=2", "--gemm-spread", "0", "--out", other.string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["gemm_passes"], 3);
  EXPECT_TRUE(parse_profile_json(slurp(other), other.string()).calibration.has_value());
}

TEST_F(Calibrated, PlanAndReshardPredictWithTheFitByDefault) {
  const HardwareProfile p = profile();
  const std::vector<std::string> reshard = {"reshard", "A[I_X, J]", "A[I, J]",     "--mesh",
                                            "X=2",     "--dims",    "I=256,J=128", "--json"};
  // The default dtype on a profile without bf16 is f32: the all_gather's array is 256 x 128 x 4 B.
  const json by_default = json_of(shardmm_cli(reshard));
  EXPECT_EQ(by_default["hardware"], "calibrated-threads");
  EXPECT_EQ(by_default["dtype"], "f32");
  const json& step = by_default["candidates"][0]["steps"][0];
  ASSERT_EQ(step["op"], "all_gather");
  // The fit, plus the copy of the device's own 128 x 128 half into the output at the copy
  // bandwidth measured for its 64 KiB (2 bytes of traffic per byte copied).
  const CollectiveFit& ag = fit(p, OpKind::all_gather);
  EXPECT_DOUBLE_EQ(step["time_s"].get<double>(), ag.alpha_s + ag.beta_s_per_byte * 131072 + local_copy_time(p, 65536));
  EXPECT_GT(local_copy_time(p, 65536), 0);

  std::vector<std::string> named = reshard, by_file = reshard, analytic = reshard;
  named.insert(named.end(), {"--hw", "calibrated"});
  by_file.insert(by_file.end(), {"--hw", profile_->string()});
  analytic.insert(analytic.end(), {"--hw", "h100", "--dtype", "f32"});
  EXPECT_EQ(json_of(shardmm_cli(named)), by_default);
  EXPECT_EQ(json_of(shardmm_cli(by_file)), by_default);
  EXPECT_EQ(json_of(shardmm_cli(analytic))["hardware"], "h100");

  const Result text =
      shardmm_cli({"plan", "A[I_X, J] @ B[J, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=256,J=128,K=64"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("calibrated-threads (from " + profile_->string() + ", the calibrated default"));
  EXPECT_THAT(text.out, HasSubstr("calibrated on the threads backend"));
}

// The trace file: one "X" event per step per rank, collectives in the communication lane.
void expect_trace(const std::filesystem::path& file, const json& plan, int ranks) {
  const json trace = json::parse(slurp(file));
  std::map<int, std::vector<json>> by_rank;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") by_rank[e["pid"].get<int>()].push_back(e);
  }
  ASSERT_EQ(static_cast<int>(by_rank.size()), ranks);
  for (const auto& [rank, events] : by_rank) {
    ASSERT_EQ(events.size(), plan["steps"].size()) << "rank " << rank;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const json& step = plan["steps"][i];
      const bool comm = step["op"] != "einsum" && step["op"] != "slice" && step["op"] != "to_partial";
      EXPECT_EQ(events[i]["tid"], comm ? 1 : 0);
      EXPECT_EQ(events[i]["args"]["op"], step["op"]);
      EXPECT_EQ(events[i]["args"]["bytes_sent"], step["bytes_sent"]);
      EXPECT_DOUBLE_EQ(events[i]["args"]["predicted_time_s"].get<double>(), step["time_s"].get<double>());
    }
  }
}

TEST_F(Calibrated, RunReportsMeasuredOverPredictedAndWritesTheTrace) {
  const std::filesystem::path trace = *dir_ / "run-trace.json";
  const json doc = json_of(shardmm_cli({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims",
                                        "I=64,J=96,K=32", "--repeat", "3", "--json", "--trace", trace.string()}));
  EXPECT_EQ(doc["hardware"], "calibrated-threads");
  EXPECT_TRUE(doc["verified"].get<bool>());
  const json& plan = doc["candidates"][doc["executed"].get<std::size_t>()];
  EXPECT_DOUBLE_EQ(doc["predicted_time_s"].get<double>(), plan["total_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(doc["measured_over_predicted"].get<double>(),
                   doc["measured_time_s"].get<double>() / doc["predicted_time_s"].get<double>());
  for (const json& step : plan["steps"]) {
    EXPECT_DOUBLE_EQ(step["measured_over_predicted"].get<double>(),
                     step["measured_time_s"].get<double>() / step["time_s"].get<double>());
  }
  EXPECT_TRUE(doc["predicted_for_this_machine"].get<bool>());
  EXPECT_EQ(doc["trace_file"], trace.string());
  expect_trace(trace, plan, 2);

  const Result text = shardmm_cli(
      {"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=64,J=96,K=32", "--repeat", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("measured/predicted"));
  EXPECT_THAT(text.out, HasSubstr("predicted on calibrated-threads"));
}

// A calibration on X=2 measured no collective on 4 ranks: on X=2,Y=2 the all_gather over both
// axes is predicted by formula, and plan says so on that step, in text and JSON; a run on 4
// ranks adds the shared cores where the machine has fewer, and on a profile of other hardware
// says in its JSON that the profile is not this machine's.
TEST_F(Calibrated, StepsWithoutAFitSayTheirConfidenceIsLow) {
  const std::vector<std::string> plan_args = {
      "plan", "A[I_XY, J] @ B[J, K] -> C[I, K]", "--mesh", "X=2,Y=2", "--dims", "I=64,J=32,K=16"};
  const json doc = json_of(shardmm_cli([&] {
    auto a = plan_args;
    a.push_back("--json");
    return a;
  }()));
  int on_four = 0;
  for (const json& candidate : doc["candidates"]) {
    for (const json& step : candidate["steps"]) {
      SCOPED_TRACE(step.dump());
      const std::string op = step["op"];
      if (step["axes"].size() != 2 || (op != "all_gather" && op != "all_reduce" && op != "reduce_scatter")) continue;
      ASSERT_EQ(step["confidence"], "low");
      EXPECT_THAT(step["why"][0].get<std::string>(), HasSubstr("no " + op + " on 4 ranks was calibrated"));
      EXPECT_GT(step["uncertainty_s"].get<double>(), 0);
      EXPECT_LE(step["uncertainty_s"].get<double>(), 0.15 * step["time_s"].get<double>());
      ++on_four;
    }
  }
  EXPECT_GT(on_four, 0) << doc.dump();
  auto all = plan_args;
  all.push_back("--all");
  const Result text = shardmm_cli(all);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("low confidence (docs/cost-model.md, 'Confidence')"));
  EXPECT_THAT(text.out, HasSubstr("on 4 ranks was calibrated (the profile measured mesh X=2)"));
  // The hardware the built-in profile describes: nothing against it.
  auto analytic = plan_args;
  analytic.insert(analytic.end(), {"--hw", "tpu-v5e"});
  EXPECT_THAT(shardmm_cli(analytic).out, Not(HasSubstr("low confidence")));

  const json run = json_of(shardmm_cli({"run", "A[I_XY, J] @ B[J, K] -> C[I, K]", "--mesh", "X=2,Y=2", "--dims",
                                        "I=64,J=32,K=16", "--repeat", "1", "--warmup-time", "0", "--json"}));
  const bool shared = run["ranks_on_machine"].get<int>() > run["cores"].get<int>();
  for (const json& step : run["candidates"][run["executed"].get<std::size_t>()]["steps"]) {
    SCOPED_TRACE(step.dump());
    const std::string why = step.value("why", json::array()).dump();
    EXPECT_EQ(why.find("4 ranks take turns on") != std::string::npos, shared);
  }
  const json other =
      json_of(shardmm_cli({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=64,J=96,K=32",
                           "--repeat", "1", "--warmup-time", "0", "--hw", "h100", "--json"}));
  for (const json& step : other["candidates"][other["executed"].get<std::size_t>()]["steps"]) {
    EXPECT_EQ(step["confidence"], "low");
    EXPECT_THAT(step["why"].dump(), HasSubstr("the profile h100 models other hardware, not this machine"));
  }
}

TEST_F(Calibrated, ReshardRunTracesToo) {
  const std::filesystem::path trace = *dir_ / "reshard-trace.json";
  const json doc = json_of(shardmm_cli({"reshard", "A[I_X, J]", "A[I, J_X]", "--mesh", "X=2", "--dims", "I=64,J=32",
                                        "--run", "--json", "--trace", trace.string()}));
  EXPECT_EQ(doc["trace_file"], trace.string());
  expect_trace(trace, doc["candidates"][0], 2);
}

TEST_F(Calibrated, WithoutAProfileTheOldDefaultsStand) {
  setenv("SHARDMM_PROFILE", (*dir_ / "none.json").c_str(), 1);
  const std::vector<std::string> reshard = {"reshard", "A[I_X, J]", "A[I, J]",     "--mesh",
                                            "X=2",     "--dims",    "I=256,J=128", "--json"};
  const json plan = json_of(shardmm_cli(reshard));
  EXPECT_EQ(plan["hardware"], "tpu-v5e");
  EXPECT_EQ(plan["dtype"], "bf16");
  const json run = json_of(shardmm_cli({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims",
                                        "I=8,J=8,K=8", "--repeat", "1", "--json"}));
  EXPECT_EQ(run["hardware"], "h100");
  EXPECT_EQ(run["trace_file"], nullptr);
  expect_input_error(
      {"plan", "A[I_X, J] @ B[J, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8", "--hw", "calibrated"},
      "no calibrated hardware profile at " + (*dir_ / "none.json").string() + "; run 'shardmm calibrate' first");
}

TEST_F(Calibrated, ABrokenProfileIsAnErrorNotSkipped) {
  const std::filesystem::path bad = *dir_ / "bad.json";
  json doc = json::parse(profile_to_json(builtin_profile("h100")));
  doc["calibration"] = 1;
  std::ofstream(bad) << doc.dump();
  setenv("SHARDMM_PROFILE", bad.c_str(), 1);
  expect_input_error({"plan", "A[I_X, J] @ B[J, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8"},
                     bad.string() + ": key 'calibration' must be an object, got number");
}

TEST_F(Calibrated, BadFlagsExitTwo) {
  expect_input_error({"calibrate", "--mesh", "X=1", "--quick"}, "cannot calibrate on mesh X=1: it has one device");
  expect_input_error({"calibrate", "--backend", "gloo", "--mesh", "X=2"}, "unknown backend 'gloo'");
  expect_input_error({"calibrate", "--mesh", "X=2", "--out", dir_->string()}, "it is a directory");
  expect_input_error({"calibrate", "--mesh", "X=2", "--gemm-spread", "-0.5"},
                     "--gemm-spread -0.5: must be a fraction >= 0");
  expect_input_error({"calibrate", "--mesh", "X=2", "--gemm-spread", "inf"},
                     "--gemm-spread inf: must be a fraction >= 0");
  const std::vector<std::string> run = {"run",    "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2",
                                        "--dims", "I=8,J=8,K=8",           "--trace"};
  std::vector<std::string> missing_dir = run, is_dir = run;
  missing_dir.push_back("/nonexistent-shardmm/t.json");
  is_dir.push_back(dir_->string());
  expect_input_error(missing_dir, "the directory '/nonexistent-shardmm' does not exist");
  expect_input_error(is_dir, "it is a directory");
  // Files that are not regular are refused before anything runs or blocks (a FIFO would
  // block the open, a device node would be replaced by a regular file).
  const std::string fifo = (*dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<std::string> trace_fifo = run;
  trace_fifo.push_back(fifo);
  expect_input_error(trace_fifo, "--trace '" + fifo + "': it is a FIFO (named pipe), not a regular file");
  expect_input_error({"calibrate", "--mesh", "X=2", "--out", fifo}, "--out '" + fifo + "': it is a FIFO");
  expect_input_error({"calibrate", "--mesh", "X=2", "--out", "/dev/null"}, "it is a character device");
  expect_input_error({"calibrate", "--mesh", "X=2", "--out", ""}, "--out '': give the profile's file name");
  expect_input_error({"plan", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8", "--hw", fifo},
                     fifo + ": cannot read hardware profile: it is a FIFO (named pipe), not a regular file");
  const std::string file = (*dir_ / "a-file").string();
  std::ofstream(file) << "x";
  std::vector<std::string> under_file = run;
  under_file.push_back(file + "/t.json");
  expect_input_error(under_file, "'" + file + "' is a file, not a directory");
  std::filesystem::remove(fifo);
}

// A trace that cannot be written after the run (a full disk; here a file-size limit, which
// fails the write as ENOSPC does) loses neither the report nor the old file, and exits 2.
TEST_F(Calibrated, ATraceThatCannotBeWrittenKeepsTheReport) {
  const std::filesystem::path trace = *dir_ / "t.json";
  std::ofstream(trace) << "old";
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 100;
  std::ostringstream err;
  std::streambuf* const cerr_was = std::cerr.rdbuf(err.rdbuf());
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Result r = shardmm_cli({"run", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8", "--repeat",
                                "1", "--warmup-time", "0", "--trace", trace.string()});
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::cerr.rdbuf(cerr_was);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("verified"));
  EXPECT_THAT(err.str(),
              HasSubstr("shardmm: error: cannot write the trace to '" + trace.string() +
                        "': File too large (nothing was written); the run's report is printed all the same\n"));
  EXPECT_EQ(slurp(trace), "old");
  std::vector<std::string> beside;  // t.json and any temporary written beside it
  for (const auto& e : std::filesystem::directory_iterator(*dir_)) {
    if (e.path().filename().string().rfind("t.json", 0) == 0) beside.push_back(e.path().filename().string());
  }
  std::filesystem::remove(trace);
  EXPECT_EQ(beside, std::vector<std::string>{"t.json"}) << "a temporary file was left";
}

}  // namespace
}  // namespace shardmm
