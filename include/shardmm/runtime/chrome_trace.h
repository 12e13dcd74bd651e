// Chrome trace files (the Trace Event Format's "X" complete events), which Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one process per rank, one lane (thread)
// for compute and one for communication, so overlap, or its absence, shows.
//
//   RunReport r = run_plan(req);                       // runner.h
//   if (r.is_root) write_chrome_trace_file("run.json", run_trace_events(req.plan, req.mesh, r));
//
// Any program can draw its own spans the same way: fill ChromeTraceEvent and call
// write_chrome_trace. docs/calibration.md, "Trace", shows a file.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/plan/step.h"
#include "shardmm/runtime/runner.h"

namespace shardmm {

inline constexpr int kComputeLane = 0;        // tid of local work: einsum, slice, to_partial
inline constexpr int kCommunicationLane = 1;  // tid of collectives

using TraceArg = std::variant<std::int64_t, double, std::string>;

struct ChromeTraceEvent {
  std::string name;      // shown on the span, e.g. "all_gather A"
  std::string category;  // "compute" or "communication"
  int pid = 0;           // the rank
  int tid = kComputeLane;
  double start_s = 0;  // from the trace's zero
  double duration_s = 0;
  std::vector<std::pair<std::string, TraceArg>> args;  // shown when the span is selected
  // A counter sample ("ph": "C") instead of a span: a track named `name` whose series (the
  // numeric args) hold these values from start_s until the next sample; no lane, no duration.
  bool counter = false;
};

// The lanes a step runs in: a collective's is communication, local work's is compute, and a
// collective matmul (all_gather_einsum, einsum_reduce_scatter) is in both at once: its ring
// moves the next chunk while it multiplies this one.
std::vector<int> trace_lanes(OpKind op);

// One event per step, rank and lane of the run's median repeat (RunReport::timeline), args:
// step (1-based), op, tensor, axes, bytes_sent, bytes_received, flops,
// predicted_time_s (the plan's) and measured_time_s (this rank's span).
std::vector<ChromeTraceEvent> run_trace_events(const Plan& plan, const Mesh& mesh, const RunReport& report);

// A JSON object {"traceEvents": [...], "displayTimeUnit": "ns"}: metadata events naming
// every pid "rank N" and its lanes "compute" and "communication", then the events, times
// in microseconds.
void write_chrome_trace(std::ostream& out, const std::vector<ChromeTraceEvent>& events);
// The same into a file, written whole or not at all (core/files.h); InputError naming the
// file and the reason when it cannot be written.
void write_chrome_trace_file(const std::string& path, const std::vector<ChromeTraceEvent>& events);

}  // namespace shardmm
