// Chrome traces of real runs (chrome_trace.h): one event per executed step per rank, in
// the lane its op belongs to, carrying the plan's figures; the file is valid JSON in the
// Trace Event Format; the run's timeline is every rank's steps in order.
#include "shardmm/runtime/chrome_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardmm/core/contraction.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {
namespace {

using json = nlohmann::json;

struct Traced {
  Mesh mesh;
  Contraction contraction;
  Plan plan;
  RunReport report;
};

// A 2x2 mesh where the chosen plan gathers, multiplies and reduces: both lanes in use.
Traced traced_run(int repeat) {
  Traced t;
  t.mesh = Mesh::parse("X=2,Y=2");
  t.contraction = parse_contraction("A[I_X, J_Y] @ B[J_Y, K] -> C[I, K]", t.mesh);
  const DimSizes sizes = parse_dims("I=64,J=48,K=32");
  const MatmulPlanning m =
      plan_matmul(t.mesh, t.contraction, sizes, {DType::f32, builtin_profile("h100"), std::nullopt});
  t.plan = m.candidates[static_cast<std::size_t>(m.chosen)];
  RunRequest req;
  req.mesh = t.mesh;
  req.plan = t.plan;
  req.sizes = sizes;
  req.dtype = DType::f32;
  req.contraction = &t.contraction;
  req.repeat = repeat;
  t.report = run_plan(req);
  return t;
}

TEST(RunTimeline, EveryRankHasEveryStepInOrder) {
  const Traced t = traced_run(4);
  ASSERT_TRUE(t.report.verification.verified);
  ASSERT_EQ(t.report.timeline.size(), 4u);
  EXPECT_GE(t.report.timeline_repeat, 0);
  EXPECT_LT(t.report.timeline_repeat, 4);
  for (const auto& spans : t.report.timeline) {
    ASSERT_EQ(spans.size(), t.plan.steps.size());
    double previous_end = 0;
    for (const StepSpan& s : spans) {
      EXPECT_GE(s.start_s, previous_end);  // the executor runs one step after the other
      EXPECT_GE(s.end_s, s.start_s);
      previous_end = s.end_s;
    }
  }
}

TEST(ChromeTrace, LanesOfEachStepKind) {
  EXPECT_EQ(trace_lanes(OpKind::einsum), std::vector<int>{kComputeLane});
  EXPECT_EQ(trace_lanes(OpKind::slice), std::vector<int>{kComputeLane});
  EXPECT_EQ(trace_lanes(OpKind::to_partial), std::vector<int>{kComputeLane});
  for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
    EXPECT_EQ(trace_lanes(op), std::vector<int>{kCommunicationLane}) << to_string(op);
  }
  for (OpKind op : {OpKind::all_gather_einsum, OpKind::einsum_reduce_scatter}) {
    EXPECT_EQ(trace_lanes(op), (std::vector<int>{kComputeLane, kCommunicationLane})) << to_string(op);
  }
}

TEST(ChromeTrace, OneEventPerStepPerRankInItsLanes) {
  const Traced t = traced_run(2);
  bool has_collective = false, has_einsum = false;
  for (const Step& s : t.plan.steps) (is_collective(s.op) ? has_collective : has_einsum) = true;
  ASSERT_TRUE(has_collective && has_einsum) << t.plan.description;

  const std::vector<ChromeTraceEvent> events = run_trace_events(t.plan, t.mesh, t.report);
  std::ostringstream text;
  write_chrome_trace(text, events);
  const json doc = json::parse(text.str());
  ASSERT_TRUE(doc.contains("traceEvents"));
  std::map<std::pair<int, int>, std::string> lane_names;
  std::map<int, std::string> process_names;
  std::map<int, std::vector<json>> spans_by_rank;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") lane_names[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "process_name") process_names[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "X") spans_by_rank[e["pid"].get<int>()].push_back(e);
  }
  ASSERT_EQ(spans_by_rank.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(process_names[rank], "rank " + std::to_string(rank));
    EXPECT_EQ((lane_names[{rank, kComputeLane}]), "compute");
    EXPECT_EQ((lane_names[{rank, kCommunicationLane}]), "communication");
    const std::vector<json>& spans = spans_by_rank[rank];
    // One span per step and lane, in step order (a collective matmul has one in each lane).
    std::vector<std::pair<std::size_t, int>> expected;
    for (std::size_t i = 0; i < t.plan.steps.size(); ++i) {
      for (int lane : trace_lanes(t.plan.steps[i].op)) expected.emplace_back(i, lane);
    }
    ASSERT_EQ(spans.size(), expected.size());
    for (std::size_t k = 0; k < spans.size(); ++k) {
      const auto [i, lane] = expected[k];
      const Step& s = t.plan.steps[i];
      const json& e = spans[k];
      EXPECT_EQ(e["tid"], lane);
      EXPECT_EQ(e["cat"], lane == kCommunicationLane ? "communication" : "compute");
      EXPECT_EQ(e["name"], std::string(to_string(s.op)) + " " + s.tensor);
      EXPECT_EQ(e["args"]["step"], i + 1);
      EXPECT_EQ(e["args"]["op"], to_string(s.op));
      EXPECT_EQ(e["args"]["axes"], s.axes.empty() ? "-" : t.mesh.axis_names(s.axes));
      EXPECT_EQ(e["args"]["bytes_sent"], s.bytes_sent);
      EXPECT_EQ(e["args"]["bytes_received"], s.bytes_received);
      EXPECT_DOUBLE_EQ(e["args"]["predicted_time_s"].get<double>(), s.time_s);
      const StepSpan& span = t.report.timeline[static_cast<std::size_t>(rank)][i];
      EXPECT_NEAR(e["ts"].get<double>(), span.start_s * 1e6, 1e-6);
      EXPECT_NEAR(e["dur"].get<double>(), (span.end_s - span.start_s) * 1e6, 1e-6);
      EXPECT_DOUBLE_EQ(e["args"]["measured_time_s"].get<double>(), span.end_s - span.start_s);
    }
  }
}

TEST(ChromeTrace, FileThatCannotBeWrittenIsAnInputError) {
  const std::string path = "/nonexistent-shardmm-dir/trace.json";
  try {
    write_chrome_trace_file(path, {});
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.headline(), ::testing::HasSubstr("cannot write the trace to '" + path + "'"));
  }
}

TEST(ChromeTrace, FileHoldsWhatTheStreamGets) {
  ChromeTraceEvent e;
  e.name = "all_gather \"A\"";  // quotes must come out escaped
  e.category = "communication";
  e.pid = 3;
  e.tid = kCommunicationLane;
  e.start_s = 1.5e-3;
  e.duration_s = 2e-6;
  e.args = {{"bytes_sent", std::int64_t{4096}}, {"axes", std::string("XY")}, {"predicted_time_s", 1e-6}};
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("shardmm-trace-" + std::to_string(getpid()) + ".json");
  write_chrome_trace_file(file.string(), {e});
  std::ifstream in(file);
  const json doc = json::parse(in);
  std::filesystem::remove(file);
  const json& x = doc["traceEvents"].back();
  EXPECT_EQ(x["ph"], "X");
  EXPECT_EQ(x["name"], "all_gather \"A\"");
  EXPECT_EQ(x["pid"], 3);
  EXPECT_DOUBLE_EQ(x["ts"].get<double>(), 1500);
  EXPECT_DOUBLE_EQ(x["dur"].get<double>(), 2);
  EXPECT_EQ(x["args"]["bytes_sent"], 4096);
  EXPECT_EQ(x["args"]["axes"], "XY");
  EXPECT_DOUBLE_EQ(x["args"]["predicted_time_s"].get<double>(), 1e-6);
  EXPECT_EQ(doc["traceEvents"].size(), 5u);  // process name, sort index, two lane names, the span
}

}  // namespace
}  // namespace shardmm
