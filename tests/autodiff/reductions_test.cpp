// reductions.h on a [4, 6] tensor whose reduced letter is sharded: evenly (X=2), unevenly
// (X=3) and with empty shards (X=8). Each op's value and gradients equal the unsharded ones
// (and finite differences), the symbolic tape predicts the run, and the collectives each op
// records are counted. Hand-computed values where they are easy: partial row sums, the max's
// gradient split among ties on different ranks.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <cmath>
#include <string>
#include <vector>

#include "autodiff_programs.h"
#include "autodiff_testing.h"
#include "input_error.h"
#include "shardmm/autodiff/reductions.h"

namespace shardmm {
namespace {

using namespace autodiff;
using ::testing::HasSubstr;
using testing::Instr;
using testing::Kind;
using testing::Program;

// "forward all_reduce(max) over X" for each collective of `events`, in order.
std::vector<std::string> collectives(const Mesh& mesh, const std::vector<TapeEvent>& events) {
  std::vector<std::string> out;
  for (const TapeEvent& e : events) {
    if (!is_collective(e.step.op)) continue;
    out.push_back(std::string(to_string(e.phase)) + " " + op_name(e.step) + " over " + mesh.axis_names(e.step.axes));
  }
  return out;
}

bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * (1 + std::abs(b)); }

// A [4, 6] x in `spec`, `op` over `dim`, then a loss that weighs each output element
// differently (mul by a leaf c in the output's layout, then sum): sums are all-reduced first.
Program program(const Mesh& mesh, const char* spec, Kind op, const char* dim) {
  Program p{mesh, {{parse_spec(spec, mesh), {4, 6}, 11}}, {}, ""};
  Tape tape(mesh, {DType::f64});
  Var x = tape.input(p.leaves[0].spec, p.leaves[0].shape, uniform_values(0), true);
  Instr in{op, {0}};
  in.dim = dim;
  Var y = testing::apply_op(in, {x}, false);
  p.ops.push_back(in);
  int at = 1;
  if (!y.spec().unreduced.empty()) {
    p.ops.push_back(Instr{Kind::all_reduce, {at++}, {}, {}, "", "", y.spec().unreduced});
    y = all_reduce(y, y.spec().unreduced);
  }
  Spec c = y.spec();
  c.tensor = "c";
  p.leaves.push_back({c, y.shape(), 23});
  // The leaf goes before the ops' values.
  for (Instr& i : p.ops) {
    for (int& a : i.args) a = a >= 1 ? a + 1 : a;
  }
  ++at;
  p.ops.push_back(Instr{Kind::mul, {at, 1}});
  p.ops.push_back(Instr{Kind::sum, {at + 1}});
  p.text = std::string(testing::kind_name(op)) + " over " + dim + " of " + spec + " on " + mesh.to_string();
  return p;
}

struct Case {
  const char* mesh;
  const char* spec;
  const char* dim;
};
// The reduced letter split 3 + 3, then 2 + 1 + 1, then 1 + 1 + 1 + 1 + 1 + 1 + 0 + 0.
const Case kCases[] = {{"X=2", "x[I, J_X]", "J"}, {"X=3", "x[I_X, J]", "I"}, {"X=8", "x[I, J_X]", "J"}};

// Runs op over each case's sharded letter: loss and gradients against one device and finite
// differences, the symbolic tapes against the run; returns device 0's collectives per case.
std::vector<std::vector<std::string>> check_op(Kind op) {
  std::vector<std::vector<std::string>> out;
  for (const Case& c : kCases) {
    const Mesh mesh = Mesh::parse(c.mesh);
    const Program p = program(mesh, c.spec, op, c.dim);
    SCOPED_TRACE(p.text);
    const testing::Executed sharded = testing::execute(p, mesh, false);
    const testing::Executed single = testing::execute(p, Mesh::parse("X=1"), true);
    const auto fd = testing::finite_differences(p);
    EXPECT_TRUE(close(sharded.loss, single.loss, 1e-12)) << sharded.loss << " vs one device " << single.loss;
    EXPECT_TRUE(close(sharded.loss, testing::dense_loss(p, testing::dense_leaves(p)), 1e-12));
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      EXPECT_TRUE(sharded.grads_in_leaf_spec[l]) << "leaf " << l;
      for (std::size_t i = 0; i < fd[l].size(); ++i) {
        EXPECT_TRUE(close(sharded.grads[l][i], single.grads[l][i], 1e-12))
            << "leaf " << l << " element " << i << ": " << sharded.grads[l][i] << " vs one device "
            << single.grads[l][i];
        EXPECT_TRUE(close(sharded.grads[l][i], fd[l][i], 1e-6))
            << "leaf " << l << " element " << i << ": " << sharded.grads[l][i] << " vs finite difference " << fd[l][i];
      }
    }
    testing::check_symbolic(p, mesh, sharded);
    out.push_back(collectives(mesh, sharded.events.at(0)));
    // Every device runs the same collectives, the empty-shard ones included.
    for (const auto& events : sharded.events) EXPECT_EQ(collectives(mesh, events), out.back());
  }
  return out;
}

const std::vector<std::string> kNone;

TEST(Reductions, SumAndMeanOverAShardedLetterArePartialAndMoveNothing) {
  for (Kind op : {Kind::reduce_sum, Kind::reduce_mean}) {
    // The only collective is the loss's own all_reduce of the partial sums.
    for (const auto& got : check_op(op)) EXPECT_EQ(got, (std::vector<std::string>{"forward all_reduce over X"}));
  }
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  Tape tape(mesh, {DType::f64});
  Var p = einsum(tape.input("a[I, K_Y]", {{"I", 4}, {"K", 2}}, uniform_values(1)),
                 tape.input("b[K_Y, J_X]", {{"K", 2}, {"J", 6}}, uniform_values(2)), {"I", "J"});
  EXPECT_EQ(format_spec(reduce_sum(p, "J").spec(), mesh), "reduce_sum(ab)[I]{U_XY}");  // x's own {U_Y} kept
  EXPECT_EQ(format_spec(reduce_mean(p, "I").spec(), mesh), "reduce_mean(ab)[J_X]{U_Y}");
  // Nothing moved: the einsum, then each reduction's local step.
  std::vector<std::string> names;
  for (const TapeEvent& e : tape.events()) names.push_back(op_name(e.step));
  EXPECT_EQ(names, (std::vector<std::string>{"einsum", "reduce_sum", "reduce_mean"}));
}

TEST(Reductions, MaxAllReducesTheRowMaximaAndBackwardTheTieCounts) {
  for (const auto& got : check_op(Kind::reduce_max)) {
    EXPECT_EQ(got, (std::vector<std::string>{"forward all_reduce(max) over X", "backward all_reduce over X"}));
  }
}

TEST(Reductions, SoftmaxAllReducesMaxAndSumForwardAndOneSumBackward) {
  for (const auto& got : check_op(Kind::softmax_over)) {
    EXPECT_EQ(got, (std::vector<std::string>{"forward all_reduce(max) over X", "forward all_reduce over X",
                                             "backward all_reduce over X"}));
  }
}

TEST(Reductions, LayerNormAllReducesTwoStatisticsEachWay) {
  for (const auto& got : check_op(Kind::layer_norm_over)) {
    EXPECT_EQ(got, (std::vector<std::string>{"forward all_reduce over X", "forward all_reduce over X",
                                             "backward all_reduce over X", "backward all_reduce over X"}));
  }
}

TEST(Reductions, RmsNormAllReducesOneStatisticEachWay) {
  for (const auto& got : check_op(Kind::rms_norm_over)) {
    EXPECT_EQ(got, (std::vector<std::string>{"forward all_reduce over X", "backward all_reduce over X"}));
  }
}

TEST(Reductions, OverAnUnshardedLetterNothingMoves) {
  const Mesh mesh = Mesh::parse("X=2");
  for (Kind op : {Kind::reduce_max, Kind::softmax_over, Kind::layer_norm_over, Kind::rms_norm_over}) {
    const Program p = program(mesh, "x[I_X, J]", op, "J");
    SCOPED_TRACE(p.text);
    const testing::Executed run = testing::execute(p, mesh, false);
    testing::check_symbolic(p, mesh, run);
    EXPECT_EQ(collectives(mesh, run.events.at(0)), kNone);
  }
}

TEST(Reductions, HandValuesPartialSumsAndTiesOnDifferentRanks) {
  const Mesh mesh = Mesh::parse("X=2");
  testing::Collected got(mesh);
  std::vector<std::string> specs, names;
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    // Row 0 has its maximum 5 twice, at J = 1 (device 0) and J = 4 (device 1).
    std::vector<double> values = {1, 5, 2, 3, 5, 0};
    for (int k = 6; k < 24; ++k) values.push_back(k);
    Var x = tape.input("x[I, J_X]", {{"I", 4}, {"J", 6}}, testing::from_dense(values, {4, 6}), true);
    Var s = reduce_sum(x, "J");
    Var m = reduce_max(x, "J");
    got.put("partial", s.value());
    got.put("sum", all_reduce(s, tape.axes("X")).value());
    got.put("max", m.value());
    tape.backward(sum(m));
    got.put("dx", tape.grad(x));
    if (comm.rank() == 0) {
      specs = {format_spec(s.spec(), mesh), format_spec(m.spec(), mesh)};
      for (const TapeEvent& e : tape.events()) names.push_back(op_name(e.step));
    }
  });
  EXPECT_EQ(specs, (std::vector<std::string>{"reduce_sum(x)[I]{U_X}", "reduce_max(x)[I]"}));
  // reduce_max's local work is cut by its collectives: the rows' maxima, all_reduce(max), the
  // result written; backward the ties counted, their all_reduce, dx written.
  EXPECT_EQ(names, (std::vector<std::string>{"reduce_sum", "reduce_max", "all_reduce(max)", "reduce_max", "all_reduce",
                                             "sum", "sum", "reduce_max", "all_reduce", "reduce_max"}));
  // Rows 1..3 hold 6r + J.
  EXPECT_EQ(got.global("sum"), (std::vector<double>{16, 51, 87, 123}));
  EXPECT_EQ(got.global("max"), (std::vector<double>{5, 11, 17, 23}));
  std::vector<double> dx(24, 0.0);
  dx[1] = dx[4] = 0.5;  // one tie on each rank: split over the whole row
  dx[11] = dx[17] = dx[23] = 1;
  EXPECT_EQ(got.global("dx"), dx);
}

TEST(Reductions, SavedValuesAreCountedInMemory) {
  const Mesh mesh = Mesh::parse("X=2");
  Tape tape(mesh, {DType::f64});
  // A non-leaf x (leaves count as leaves), [4, 3] per device: 96 bytes.
  Var x = scale(tape.input("x[I, J_X]", {{"I", 4}, {"J", 6}}, uniform_values(1), true), 2);
  Var y = layer_norm(x, "J");
  tape.backward(sum(y));
  // x, and the mean and 1 / sqrt(var + eps) of the 4 rows.
  EXPECT_EQ(tape.memory().activations, 96 + 2 * 4 * 8);
  Tape other(mesh, {DType::f64});
  Var z = scale(other.input("x[I, J_X]", {{"I", 4}, {"J", 6}}, uniform_values(1), true), 2);
  Var m = reduce_max(z, "J");
  EXPECT_EQ(other.bytes_saved_for_backward(z), 96);
  EXPECT_EQ(other.bytes_saved_for_backward(m), 4 * 8);
  Var r = rms_norm(scale(m, 1), "I");
  other.backward(sum(r));
  // z and m (reduce_max's), scale(m) (rms_norm's) and 1 / rms of its one row.
  EXPECT_EQ(other.memory().activations, 96 + 32 + 32 + 8);
}

TEST(Reductions, BadInputIsRefused) {
  const Mesh mesh = Mesh::parse("X=2");
  Tape tape(mesh, {DType::f32});
  const DimSizes sizes{{"I", 4}, {"J", 6}, {"K", 0}};
  Var partial = einsum(tape.input("a[I, J_X]", sizes, uniform_values(1)),
                       tape.input("b[J_X, K]", {{"J", 6}, {"K", 2}}, uniform_values(2)), {"I", "K"});
  Var x = tape.input("x[I, J_X]", sizes, uniform_values(3));
  EXPECT_THAT(testing::input_error([&] { reduce_max(partial, "I"); }), HasSubstr("unreduced over X (partial sums)"));
  EXPECT_THAT(testing::input_error([&] { softmax(partial, "K"); }), HasSubstr("needs whole values"));
  EXPECT_THAT(testing::input_error([&] { rms_norm(x, "Q"); }), HasSubstr("rms_norm: x[I, J_X] has no dimension 'Q'"));
  EXPECT_THAT(testing::input_error([&] { layer_norm(x, "J", 0); }), HasSubstr("layer_norm: eps must be positive"));
  EXPECT_THAT(testing::input_error([&] { reduce_mean(tape.input("e[I, K]", sizes, uniform_values(4)), "K"); }),
              HasSubstr("over 'K': the dimension is empty"));
}

}  // namespace
}  // namespace shardmm
