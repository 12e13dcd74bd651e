// Symbolic tapes that share a PlanCache (solve's recordings) record what tapes without one
// record: the same steps, times and memory, however many tapes planned through it before. And
// backward after a Tape::rewind (solve's, one per layout of an op's result gradient) records
// what backward on a fresh tape that recorded the same forward pass records; so does a pass
// in two halves, the one below the contraction run once and spliced on (Tape::backward_below).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
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

// A plan in full: every step's op, tensor, specs (names included), figures and operand, and the
// plan's output, description and totals.
std::string plan_text(const Plan& p, const Mesh& mesh) {
  std::string text;
  for (const Step& s : p.steps) {
    text += std::string(to_string(s.op)) + " " + s.tensor + " " + format_spec(s.from, mesh) + " -> " +
            format_spec(s.to, mesh) + " axes " + mesh.axis_names(s.axes) + " dim " + std::to_string(s.dim) +
            " t=" + exact(s.time_s) + " sent=" + std::to_string(s.bytes_sent) +
            " received=" + std::to_string(s.bytes_received) + " operand " + std::to_string(s.operand) + "\n";
  }
  return text + "output " + format_spec(p.output, mesh) + " | " + p.description + " | t=" + exact(p.total_time_s) +
         " peak=" + std::to_string(p.peak_bytes_per_device) + " fits " + std::to_string(p.fits_memory);
}

// A reshard asked under names it was not planned with (other tensors, other letters, the two
// specs naming one tensor or two) is what plan_reshard plans under those names, whichever
// names the cache planned the layouts with first, before and after it forgets its contractions.
TEST(PlanCache, ReshardsUnderOtherNamesAreThePlansOfThoseNames) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  PlanOptions options;
  options.dtype = DType::bf16;
  options.hw = builtin_profile("h100");
  const std::vector<std::pair<std::string, std::string>> layouts{
      {"[B_X, D]", "[B, D_X]"},       {"[B, D]{U_X}", "[B_X, D]"},   {"[B_XY, D]", "[B, D_YX]"},
      {"[B_X, D_Y]", "[B_Y, D_X]"},   {"[B, D]{U_XY}", "[B_Y, D]"},  {"[B_X, D]{U_Y}", "[B, D]"},
      {"[B, D_XY]", "[B_Y, D]{U_X}"}, {"[B_Y, D]", "[B_Y, D]{U_X}"},
  };
  // Tensor names (from, to) and the letters of the two dimensions.
  const std::vector<std::array<std::string, 4>> names{
      {"x", "x", "B", "D"}, {"dx", "dx", "I", "J"}, {"x", "y", "B", "D"}, {"w", "g", "K", "B"}, {"", "", "B", "D"}};
  const auto named = [](std::string layout, const std::array<std::string, 4>& n, bool to) {
    std::string text;
    for (const char c : layout) text += c == 'B' ? n[2] : c == 'D' ? n[3] : std::string(1, c);
    return (to ? n[1] : n[0]) + text;
  };
  const Shape shape{64, 32};
  PlanCache cache;
  int compared = 0;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) cache.forget_contractions();
    for (std::size_t first = 0; first < names.size(); ++first) {
      for (const auto& [from_layout, to_layout] : layouts) {
        // The layouts planned under `first`'s names, then asked under every set of names.
        for (std::size_t k = 0; k < names.size(); ++k) {
          const std::array<std::string, 4>& n = names[(first + k) % names.size()];
          const Spec from = parse_spec(named(from_layout, n, false), mesh);
          const Spec to = parse_spec(named(to_layout, n, true), mesh);
          ASSERT_EQ(plan_text(*cache.reshard(mesh, from, to, shape, options), mesh),
                    plan_text(plan_reshard(mesh, from, to, shape, options), mesh))
              << format_spec(from, mesh) << " -> " << format_spec(to, mesh);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 5 * 8 * 5);
  // Names the layouts' plan does not check: refused as plan_reshard refuses them.
  const Spec from = parse_spec("x[B_X, D]", mesh);
  for (const std::string to : {"x[B, E_X]", "x[D, B_X]"}) {
    std::string fresh, cached;
    try {
      plan_reshard(mesh, from, parse_spec(to, mesh), shape, options);
    } catch (const InputError& e) {
      fresh = e.what();
    }
    try {
      cache.reshard(mesh, from, parse_spec(to, mesh), shape, options);
    } catch (const InputError& e) {
      cached = e.what();
    }
    EXPECT_FALSE(fresh.empty()) << to;
    EXPECT_EQ(cached, fresh) << to;
  }
}

// Tapes of other tensors and letters recording through one cache record what tapes without
// one record.
TEST(PlanCache, TapesOfOtherNamesShareItAndRecordTheirOwn) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  const auto rename = [](std::string text, bool other) {
    if (!other) return text;
    for (char& c : text) {
      c = c == 'x' ? 'a' : c == 'w' ? 'b' : c == 'y' ? 'c' : c;
    }
    return text;
  };
  PlanCache cache;
  int compared = 0;
  for (const std::string x : {"x[B, D]", "x[B_X, D]", "x[B_X, D_Y]", "x[B_XY, D]"}) {
    for (const std::string w : {"w[D, F]", "w[D_X, F]", "w[D_Y, F_X]"}) {
      for (const std::string out : {"y[B, F]", "y[B_X, F_Y]", "y[B, F]{U_Y}"}) {
        for (const bool other : {false, true}) {
          const std::string partial = out.find('X') == std::string::npos ? "X" : "";
          const std::string fresh =
              record(mesh, nullptr, rename(x, other), rename(w, other), rename(out, other), partial);
          ASSERT_EQ(record(mesh, &cache, rename(x, other), rename(w, other), rename(out, other), partial), fresh)
              << rename(x, other) << " @ " << rename(w, other) << " -> " << rename(out, other);
          ++compared;
        }
      }
      cache.forget_contractions();
    }
  }
  EXPECT_EQ(compared, 4 * 3 * 3 * 2);
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

// Everything a recording reads off a tape after backward: text_of(), the timeline, and the
// figures of the op recorded under scope 0.
std::string whole_text(Tape& tape, const Mesh& mesh, Var y) {
  const Tape::OpMemory m = tape.op_memory(0, y, true);
  return text_of(tape, mesh) + "\n" + timeline_text(tape) + "op kept " + std::to_string(m.kept) + " transient " +
         std::to_string(m.transient) + " with result " + std::to_string(m.transient_with_result) + " backward " +
         std::to_string(m.backward);
}

// One op recorded under scope 0 (as solve records each), backward from each layout of its
// result's gradient: the pass below its contraction run once and spliced onto the pass down to
// it leaves the tape as the whole pass does, the events in the same order, and a rewind after
// it the forward pass as it was. Over meshes of two and three axes, operands and results
// sharded, partial or replicated, the weight kept or regathered (FSDP), nested expressions
// around the contraction.
TEST(TapeHalves, SplicedBelowTheContractionRecordWhatTheWholePassDoes) {
  struct MeshCase {
    const char* mesh;
    std::vector<std::string> xs, ws, outs;
  };
  const std::vector<MeshCase> meshes{
      {"X=2,Y=2",
       {"x[B, D]", "x[B_X, D]", "x[B, D_Y]", "x[B_X, D_Y]", "x[B_XY, D]", "x[B, D]{U_X}"},
       {"w[D, F]", "w[D_X, F]", "w[D, F_Y]", "w[D_Y, F_X]", "w[D_XY, F]"},
       {"y[B, F]", "y[B_X, F_Y]", "y[B, F]{U_Y}", "y[B_X, F]", "y[B, F_YX]"}},
      {"X=2,Y=3,Z=2",
       {"x[B_Z, D]", "x[B_X, D_Y]", "x[B, D_ZY]"},
       {"w[D_Y, F]", "w[D, F_XZ]", "w[D_Y, F_Z]"},
       {"y[B, F]", "y[B_Z, F_Y]", "y[B, F]{U_XY}", "y[B_X, F_Z]{U_Y}"}},
  };
  int spliced = 0, whole = 0;
  for (const MeshCase& m : meshes) {
    const Mesh mesh = Mesh::parse(m.mesh);
    std::vector<std::string> partials;
    for (int mask = 0; mask < 1 << mesh.rank(); ++mask) {
      std::string p;
      for (int a = 0; a < mesh.rank(); ++a) {
        if (mask >> a & 1) p += mesh.axis(a).name;
      }
      partials.push_back(p);
    }
    for (const Gathered keep_w : {Gathered::kept, Gathered::regathered})
      for (const bool nested : {false, true})
        for (const std::string& x : m.xs)
          for (const std::string& w : m.ws)
            for (const std::string& out : m.outs) {
              const auto record_forward = [&](Tape& tape) {
                const DimSizes sizes = parse_dims("B=64,D=36,F=48");
                tape.set_scope(0);
                const Var a = tape.input(x, sizes, {}, true);
                const Var b = tape.input(w, sizes, {}, true);
                // Nested: a local op below the contraction, one above it.
                const Var y = planned_einsum(nested ? scale(a, 0.5) : a, b, tape.spec(out), Gathered::kept, keep_w);
                return nested ? scale(y, 2.0) : y;
              };
              Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
              const Var y = record_forward(tape);
              const std::string forward_only = text_of(tape, mesh);
              const std::optional<Var> contraction = tape.contraction_in(0);
              ASSERT_TRUE(contraction.has_value()) << x << " @ " << w << " -> " << out;
              std::shared_ptr<const Tape::Below> below;
              try {
                below = tape.backward_below(*contraction);
              } catch (const InputError&) {
                continue;  // every pass fails below the contraction
              }
              EXPECT_EQ(text_of(tape, mesh), forward_only);
              for (const std::string& partial : partials) {
                const std::string what = x + " @ " + w + " -> " + out + " partial over '" + partial + "'";
                Tape fresh(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
                const Var fresh_y = record_forward(fresh);
                std::string expected;
                try {
                  fresh.backward_from(fresh_y, axes(fresh, partial));
                  expected = whole_text(fresh, mesh, fresh_y);
                } catch (const InputError& e) {
                  expected = std::string("fails: ") + e.what();
                }
                std::string got;
                try {
                  if (tape.backward_from(y, axes(tape, partial), *below)) {
                    ++spliced;
                  } else {
                    ++whole;
                    tape.rewind();
                    tape.backward_from(y, axes(tape, partial));
                  }
                  got = whole_text(tape, mesh, y);
                } catch (const InputError& e) {
                  got = std::string("fails: ") + e.what();
                }
                EXPECT_EQ(got, expected) << what;
                tape.rewind();
                EXPECT_EQ(text_of(tape, mesh), forward_only) << what;
              }
            }
  }
  // Every pass that ran backward (a gradient is never partial over an axis sharding its value;
  // those fail in both) was spliced.
  EXPECT_GT(spliced, 2000);
  EXPECT_EQ(whole, 0);
}

// Where a value below the contraction receives its gradient before the contraction runs (read
// again above it), or a leaf above it has its gradient reduced, the halves do not make the pass:
// backward_from says so, and the whole pass after a rewind is what a fresh tape records.
TEST(TapeHalves, RefusedWhereTheHalvesDoNotMakeThePass) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  for (const bool read_above : {false, true}) {
    const auto record_forward = [&](Tape& tape) {
      const DimSizes sizes = parse_dims("B=64,D=32,F=32");
      tape.set_scope(0);
      const Var a = tape.input("x[B_X, D]", sizes, {}, true);
      const Var b = tape.input("w[D, F_Y]", sizes, {}, true);
      const Var before = tape.input("v[B_X, D]", sizes, {}, true);
      const Var y = planned_einsum(a, b, tape.spec("y[B_X, F_Y]"), Gathered::kept, Gathered::kept);
      const Var after = tape.input("u[B_X, F]", sizes, {}, true);
      const Var other = read_above ? rename(before, "D", "F") : after;
      Spec as_y = other.spec();
      as_y.dims[1].axes = tape.axes("Y");
      return add(y, reshard(other, as_y));
    };
    Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
    const Var y = record_forward(tape);
    const std::shared_ptr<const Tape::Below> below = tape.backward_below(*tape.contraction_in(0));
    EXPECT_FALSE(tape.backward_from(y, {}, *below)) << read_above;
    tape.rewind();
    tape.backward_from(y, {});
    Tape fresh(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
    const Var fresh_y = record_forward(fresh);
    fresh.backward_from(fresh_y, {});
    EXPECT_EQ(whole_text(tape, mesh, y), whole_text(fresh, mesh, fresh_y)) << read_above;
  }
}

// A pass below is spliced only onto the tape and the forward pass it was run on.
TEST(TapeHalves, RefusesAPassBelowOfAnotherTapeOrForwardPass) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  Tape tape(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
  Tape other(mesh, {DType::bf16, builtin_profile("h100"), 0, nullptr});
  tape.set_scope(0);
  other.set_scope(0);
  const Var y = forward(tape, "x[B_X, D]", "w[D, F]", "y[B_X, F]");
  forward(other, "x[B_X, D]", "w[D, F]", "y[B_X, F]");
  const std::shared_ptr<const Tape::Below> below = tape.backward_below(*tape.contraction_in(0));
  const std::shared_ptr<const Tape::Below> others = other.backward_below(*other.contraction_in(0));
  EXPECT_THROW(tape.backward_from(y, {}, *others), std::logic_error);
  scale(y, 2.0);  // the forward pass goes on
  EXPECT_THROW(tape.backward_from(y, {}, *below), std::logic_error);
}

}  // namespace
}  // namespace shardmm::autodiff
