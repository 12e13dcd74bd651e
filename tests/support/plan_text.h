// A plan as text with every figure in full (times in hex floats), for tests that require two
// ways of planning to give the same answer to the last bit.
#pragma once

#include <cstdio>
#include <string>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/planner.h"

namespace shardmm::testing {

inline std::string exact(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%a", x);
  return text;
}

// Everything a plan says, times in full.
inline std::string everything(const Plan& p, const Mesh& m) {
  std::string out = p.description + " -> " + format_spec(p.output, m) + " t=" + exact(p.total_time_s) +
                    " comm=" + exact(p.comm_time_s) + " compute=" + exact(p.compute_time_s) +
                    " overlapped=" + exact(p.overlapped_time_s) + " peak=" + std::to_string(p.peak_bytes_per_device) +
                    (p.fits_memory ? " fits" : " over");
  for (const Step& s : p.steps) {
    out += "\n  ";
    out += std::string(to_string(s.op)) + " " + s.tensor + " " + m.axis_names(s.axes) + " " + std::to_string(s.dim) +
           "/" + std::to_string(s.dst_dim) + " op" + std::to_string(s.operand) + " " + format_spec(s.from, m) + " " +
           (s.from_b.dims.empty() ? "" : format_spec(s.from_b, m) + " ") + format_spec(s.to, m) +
           " sent=" + std::to_string(s.bytes_sent) + " received=" + std::to_string(s.bytes_received) +
           " flops=" + exact(s.flops) + " t=" + exact(s.time_s) + " comm=" + exact(s.comm_time_s) +
           " compute=" + exact(s.compute_time_s) + " ring=" + std::to_string(s.ring_steps) +
           (s.bidirectional ? " both" : "") + " uncertainty=" + exact(s.confidence.uncertainty_s);
  }
  return out;
}

inline std::string everything(const MatmulPlanning& p, const Mesh& m) {
  std::string out = "chosen " + std::to_string(p.chosen) + (p.every_output_layout ? "" : " (some layouts)");
  for (const Plan& plan : p.candidates) {
    out += '\n';
    out += everything(plan, m);
  }
  return out;
}

}  // namespace shardmm::testing
