// Symbolic tapes that share a PlanCache (solve's recordings) record what tapes without one
// record: the same steps, times and memory, however many tapes planned through it before. And
// backward after a Tape::rewind (solve's, one per layout of an op's result gradient) records
// what backward on a fresh tape that recorded the same forward pass records.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
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

// Every event on `tape` and its memory figures; after backward, the axes the gradients of its
// first two values (the inputs) arrived partial over.
std::string text_of(Tape& tape, const Mesh& mesh) {
  std::string text;
  for (const TapeEvent& e : tape.events()) {
    text += std::string(to_string(e.phase)) + " " + to_string(e.step.op) + " " + e.step.tensor + " " +
            format_spec(e.step.from, mesh) + " -> " + format_spec(e.step.to, mesh) + " t=" + exact(e.step.time_s) +
            " sent=" + std::to_string(e.step.bytes_sent) + "\n";
  }
  const TapeMemory m = tape.memory();
  text += "activations " + std::to_string(m.activations) + " gradients " + std::to_string(m.gradients);
  for (int input : {0, 1}) {
    if (!tape.events().empty() && tape.events().back().phase == Phase::backward)
      text += " arrived " + mesh.axis_names(tape.gradient_arrived_unreduced(tape.var(input)));
  }
  return text;
}

// x[B, D] @ w[D, F] -> y[B, F] planned into `out` on `tape`, w's gathers kept as `keep_w`: y.
Var forward(Tape& tape, const std::string& x, const std::string& w, const std::string& out,
            Gathered keep_w = Gathered::kept) {
  const DimSizes sizes = parse_dims("B=64,D=32,F=48");
  const Var a = tape.input(x, sizes, {}, true);
  const Var b = tape.input(w, sizes, {}, true);
  return planned_einsum(a, b, tape.spec(out), Gathered::kept, keep_w);
}

AxisList axes(Tape& tape, const std::string& partial) { return partial.empty() ? AxisList{} : tape.axes(partial); }

// forward(), then backward from y partial over `partial`: text_of() the tape.
std::string record(const Mesh& mesh, PlanCache* cache, const std::string& x, const std::string& w,
                   const std::string& out, const std::string& partial, Gathered keep_w = Gathered::kept) {
  Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, cache});
  const Var y = forward(tape, x, w, out, keep_w);
  tape.backward_from(y, axes(tape, partial));
  return text_of(tape, mesh);
}

TEST(PlanCache, SharedByManyTapesChangesNoRecording) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const std::vector<std::string> xs{"x[B, D]", "x[B_X, D]", "x[B, D_Y]", "x[B_X, D_Y]", "x[B_XY, D]"};
  const std::vector<std::string> ws{"w[D, F]", "w[D_X, F]", "w[D, F_Y]", "w[D_Y, F_X]"};
  const std::vector<std::string> outs{"y[B, F]", "y[B_X, F_Y]", "y[B, F]{U_Y}", "y[B_X, F]"};
  PlanCache cache;
  int compared = 0;
  // Three times over: the second round reads every plan from the cache; the third plans again
  // after the cache forgot its contractions (as solve's recorder makes it after each op),
  // with the steps' costs its memos kept.
  for (int round = 0; round < 3; ++round) {
    if (round == 2) cache.forget_contractions();
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
  EXPECT_EQ(compared, 3 * 5 * 4 * 6);
}

// A tape's memory timeline as text, to compare.
std::string timeline_text(const Tape& tape) {
  std::string text;
  for (const MemoryPoint& p : tape.memory_timeline()) {
    text += std::string(to_string(p.phase)) + " " + p.tensor + " " + std::to_string(p.activations) + " " +
            std::to_string(p.gradients) + " " + std::to_string(p.transient) + "\n";
  }
  return text;
}

// One forward pass, rewound after each backward: each backward records what a fresh tape's
// does (a regathered weight gathered again included), and each rewind leaves the forward pass
// as it was.
TEST(TapeRewind, BackwardAfterARewindRecordsWhatAFreshTapeDoes) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  int compared = 0;
  for (const Gathered keep_w : {Gathered::kept, Gathered::regathered})
    for (const std::string x : {"x[B, D]", "x[B_X, D_Y]", "x[B, D_XY]"}) {
      for (const std::string w : {"w[D, F]", "w[D_Y, F_X]"}) {
        for (const std::string out : {"y[B, F]", "y[B_X, F]", "y[B, F]{U_Y}"}) {
          Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
          const Var y = forward(tape, x, w, out, keep_w);
          const std::string forward_only = text_of(tape, mesh);
          const std::string forward_timeline = timeline_text(tape);
          for (const std::string partial : {"", "X", "Y", "XY"}) {
            // A gradient is never partial over an axis that shards its value.
            const std::string dims = out.substr(0, out.find('{'));
            if (std::any_of(partial.begin(), partial.end(), [&](char a) { return dims.find(a) != std::string::npos; }))
              continue;
            tape.backward_from(y, axes(tape, partial));
            EXPECT_EQ(text_of(tape, mesh), record(mesh, nullptr, x, w, out, partial, keep_w))
                << x << " @ " << w << " -> " << out << " partial over '" << partial << "'";
            tape.rewind();
            EXPECT_EQ(text_of(tape, mesh), forward_only);
            EXPECT_EQ(timeline_text(tape), forward_timeline);
            ++compared;
          }
        }
      }
    }
  EXPECT_EQ(compared, 2 * 3 * 2 * (4 + 2 + 4));  // y[B_X, F]'s gradient is never partial over X
}

}  // namespace
}  // namespace shardmm::autodiff
