#include "shardmm/runtime/chrome_trace.h"

#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "shardmm/core/error.h"
#include "shardmm/core/files.h"

namespace shardmm {

std::vector<int> trace_lanes(OpKind op) {
  if (is_collective_matmul(op)) return {kComputeLane, kCommunicationLane};
  return {is_collective(op) ? kCommunicationLane : kComputeLane};
}

std::vector<ChromeTraceEvent> run_trace_events(const Plan& plan, const Mesh& mesh, const RunReport& report) {
  std::vector<ChromeTraceEvent> events;
  for (std::size_t rank = 0; rank < report.timeline.size(); ++rank) {
    const std::vector<StepSpan>& spans = report.timeline[rank];
    for (std::size_t i = 0; i < spans.size() && i < plan.steps.size(); ++i) {
      const Step& s = plan.steps[i];
      for (const int lane : trace_lanes(s.op)) {
        ChromeTraceEvent e;
        e.name = op_name(s) + " " + s.tensor;
        e.category = lane == kCommunicationLane ? "communication" : "compute";
        e.pid = static_cast<int>(rank);
        e.tid = lane;
        e.start_s = spans[i].start_s;
        e.duration_s = spans[i].end_s - spans[i].start_s;
        e.args = {{"step", static_cast<std::int64_t>(i + 1)},
                  {"op", op_name(s)},
                  {"tensor", s.tensor},
                  {"axes", s.axes.empty() ? std::string("-") : mesh.axis_names(s.axes)},
                  {"bytes_sent", s.bytes_sent},
                  {"bytes_received", s.bytes_received},
                  {"flops", s.flops},
                  {"predicted_time_s", s.time_s},
                  {"measured_time_s", e.duration_s}};
        events.push_back(std::move(e));
      }
    }
  }
  return events;
}

void write_chrome_trace(std::ostream& out, const std::vector<ChromeTraceEvent>& events) {
  using json = nlohmann::ordered_json;
  json list = json::array();
  std::set<int> pids;
  for (const ChromeTraceEvent& e : events) pids.insert(e.pid);
  for (int pid : pids) {
    list.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(pid)}}}});
    list.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
    for (const auto& [tid, lane] :
         {std::pair{kComputeLane, "compute"}, std::pair{kCommunicationLane, "communication"}}) {
      list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", lane}}}});
    }
  }
  for (const ChromeTraceEvent& e : events) {
    json args = json::object();
    for (const auto& [key, value] : e.args) std::visit([&, k = key](const auto& v) { args[k] = v; }, value);
    if (e.counter) {
      list.push_back({{"name", e.name}, {"ph", "C"}, {"pid", e.pid}, {"ts", e.start_s * 1e6}, {"args", args}});
      continue;
    }
    list.push_back({{"name", e.name},
                    {"cat", e.category},
                    {"ph", "X"},
                    {"pid", e.pid},
                    {"tid", e.tid},
                    {"ts", e.start_s * 1e6},
                    {"dur", e.duration_s * 1e6},
                    {"args", args}});
  }
  out << json{{"traceEvents", list}, {"displayTimeUnit", "ns"}}.dump(1) << "\n";
}

void write_chrome_trace_file(const std::string& path, const std::vector<ChromeTraceEvent>& events) {
  std::ostringstream text;
  write_chrome_trace(text, events);
  write_file_atomically(path, text.str(), "cannot write the trace to '" + path + "'");
}

}  // namespace shardmm
