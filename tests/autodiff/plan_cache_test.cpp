// Symbolic tapes that share a PlanCache (solve's recordings) record what tapes without one
// record: the same steps, times and memory, however many tapes planned through it before.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/spec.h"

namespace shardmm::autodiff {
namespace {

std::string exact(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%a", x);
  return text;
}

// x[B, D] @ w[D, F] -> y[B, F] planned into `out`, then backward from y partial over `partial`:
// every event and the memory figures.
std::string record(const Mesh& mesh, PlanCache* cache, const std::string& x, const std::string& w,
                   const std::string& out, const std::string& partial) {
  Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, cache});
  const DimSizes sizes = parse_dims("B=64,D=32,F=48");
  const Var a = tape.input(x, sizes, {}, true);
  const Var b = tape.input(w, sizes, {}, true);
  const Var y = planned_einsum(a, b, tape.spec(out));
  tape.backward_from(y, partial.empty() ? AxisList{} : tape.axes(partial));
  std::string text;
  for (const TapeEvent& e : tape.events()) {
    text += std::string(to_string(e.phase)) + " " + to_string(e.step.op) + " " + e.step.tensor + " " +
            format_spec(e.step.from, mesh) + " -> " + format_spec(e.step.to, mesh) + " t=" + exact(e.step.time_s) +
            " sent=" + std::to_string(e.step.bytes_sent) + "\n";
  }
  const TapeMemory m = tape.memory();
  return text + "activations " + std::to_string(m.activations) + " gradients " + std::to_string(m.gradients);
}

TEST(PlanCache, SharedByManyTapesChangesNoRecording) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const std::vector<std::string> xs{"x[B, D]", "x[B_X, D]", "x[B, D_Y]", "x[B_X, D_Y]", "x[B_XY, D]"};
  const std::vector<std::string> ws{"w[D, F]", "w[D_X, F]", "w[D, F_Y]", "w[D_Y, F_X]"};
  const std::vector<std::string> outs{"y[B, F]", "y[B_X, F_Y]", "y[B, F]{U_Y}", "y[B_X, F]"};
  PlanCache cache;
  int compared = 0;
  // Twice over: the second round reads every plan from the cache.
  for (int round = 0; round < 2; ++round) {
    for (const std::string& x : xs) {
      for (const std::string& w : ws) {
        for (const std::string& out : outs) {
          for (const std::string partial : {"", "X"}) {
            // A gradient is never partial over an axis that shards its value.
            if (partial == "X" && out.find('X') != std::string::npos) continue;
            const std::string fresh = record(mesh, nullptr, x, w, out, partial);
            ASSERT_EQ(record(mesh, &cache, x, w, out, partial), fresh)
                << x << " @ " << w << " -> " << out << " partial over '" << partial << "'";
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 5 * 4 * 6);
}

}  // namespace
}  // namespace shardmm::autodiff
