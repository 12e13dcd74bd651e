// Programs the tape refuses, each with one line naming the offending layout and the rule;
// and the symbolic tape on its own (no data, any dtype).
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm {
namespace {

using namespace autodiff;
using ::testing::HasSubstr;

DistTensor::Generator zeros() {
  return [](const Index&, std::int64_t) { return 0.0; };
}

// The message of the InputError `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    return e.what();
  }
  return "";
}

struct Errors : ::testing::Test {
  Tape tape{Mesh::parse("X=2,Y=2"), {DType::f32}};
  Var in(const char* spec, const DimSizes& sizes, bool grad = false) { return tape.input(spec, sizes, zeros(), grad); }
  DimSizes sizes{{"I", 4}, {"J", 6}, {"K", 5}};
};

TEST_F(Errors, NonlinearOpsRefusePartialSums) {
  Var p = einsum(in("A[I, J_X]", sizes), in("B[J_X, K]", sizes), {"I", "K"});
  EXPECT_EQ(format_spec(p.spec(), tape.mesh()), "AB[I, K]{U_X}");
  for (auto op : {relu, gelu, silu, softmax}) {
    EXPECT_THAT(error_of([&] { op(p); }), HasSubstr("unreduced over X (partial sums)"));
  }
  EXPECT_THAT(error_of([&] { swiglu(p, p); }), HasSubstr("needs whole values"));
  EXPECT_THAT(error_of([&] { mul(p, p); }), HasSubstr("needs whole values"));
  // Linear ops take partial sums.
  EXPECT_EQ(scale(p, 2).spec(), p.spec());
  EXPECT_EQ(add(p, p).spec(), p.spec());
  EXPECT_TRUE(sum(p).spec().dims.empty());
  EXPECT_EQ(sum(p).spec().unreduced, tape.axes("X"));
}

TEST_F(Errors, LocalEinsumNeedsCompatibleShards) {
  EXPECT_THAT(error_of([&] {
                einsum(in("A[I, J_X]", sizes), in("B[J, K]", sizes), {"I", "K"});
              }),
              HasSubstr("contracted dimension 'J' must be sharded alike in both operands (X vs replicated)"));
  EXPECT_THAT(error_of([&] {
                einsum(in("A[I_X, J]", sizes), in("B[J, K_X]", sizes), {"I", "K"});
              }),
              HasSubstr("cannot run locally: its output would be AB[I_X, K_X]"));
  Var p = einsum(in("A[I, J_X]", sizes), in("B[J_X, K]", sizes), {"I", "K"});
  EXPECT_THAT(error_of([&] { einsum(p, p, {"I"}); }), HasSubstr("the product of two partial sums"));
  EXPECT_THAT(error_of([&] {
                einsum(in("A[I, J]", sizes), in("B[J, K]", {{"J", 7}, {"K", 5}}), {"I", "K"});
              }),
              HasSubstr("dimension 'J' has size 6"));
  EXPECT_THAT(error_of([&] {
                einsum(in("A[I, J]", sizes), in("B[K]", sizes), {"I", "K"});
              }),
              HasSubstr("dimension 'J' of A[I, J] is in neither the other operand nor the output"));
  EXPECT_THAT(error_of([&] {
                einsum(in("A[I, J]", sizes), in("B[J, K]", sizes), {"I", "L"});
              }),
              HasSubstr("output dimension 'L' is in neither"));
  // The planned einsum moves data instead.
  Var c = planned_einsum(in("A[I, J_X]", sizes), in("B[J, K_X]", sizes), tape.spec("C[I_Y, K_X]"));
  EXPECT_EQ(format_spec(c.spec(), tape.mesh()), "C[I_Y, K_X]");
}

TEST_F(Errors, CollectivesCheckTheirTransition) {
  Var x = in("x[I_{XY}, J]", sizes);
  EXPECT_THAT(error_of([&] { all_gather(x, "I", tape.axes("X")); }),
              HasSubstr("the axes must be the minor-most ones sharding dimension 'I'"));
  EXPECT_EQ(all_gather(x, "I", tape.axes("Y")).spec(), tape.spec("[I_X, J]"));
  EXPECT_THAT(error_of([&] { all_gather(x, "Q", tape.axes("Y")); }), HasSubstr("has no dimension 'Q'"));
  EXPECT_THAT(error_of([&] { reduce_scatter(x, "J", tape.axes("X")); }), HasSubstr("not unreduced over X"));
  EXPECT_THAT(error_of([&] { all_reduce(x, tape.axes("Y")); }), HasSubstr("not unreduced over Y"));
  EXPECT_THAT(error_of([&] { slice(x, "J", tape.axes("X")); }), HasSubstr("mesh axis X is already in use"));
  EXPECT_THAT(error_of([&] { all_to_all(x, "I", "I", tape.axes("Y")); }), HasSubstr("source and destination"));
  EXPECT_THAT(error_of([&] { all_gather(x, "I", {}); }), HasSubstr("no mesh axes given"));
  EXPECT_THAT(error_of([&] { tape.axes("XZ"); }), HasSubstr("mesh axis 'Z' in 'XZ' is not in mesh X=2,Y=2"));
  EXPECT_THAT(error_of([&] { tape.axes("XX"); }), HasSubstr("appears twice"));
  EXPECT_THAT(error_of([&] { reshard(x, tape.spec("[J, I]")); }), HasSubstr("same dimensions in the same order"));
}

TEST_F(Errors, RowOpsNeedARowAndParametersOverIt) {
  EXPECT_THAT(error_of([&] { softmax(sum(in("x[I, J]", sizes))); }),
              HasSubstr("softmax needs a dimension to normalize over"));
  // A sharded last dimension is fine: the rows' statistics are all-reduced (reductions.h).
  EXPECT_EQ(softmax(in("x[I, J_X]", sizes)).spec().dims, tape.spec("x[I, J_X]").dims);
  Var x = in("x[I_X, J]", sizes);
  EXPECT_THAT(error_of([&] { layer_norm(x, in("g[J_Y]", sizes), in("b[J]", sizes)); }),
              HasSubstr("scale and bias must be [J] replicated, of size 6"));
  EXPECT_THAT(error_of([&] { layer_norm(x, in("g[J]", sizes), in("b[J]", sizes), 0); }),
              HasSubstr("eps must be positive"));
  EXPECT_EQ(layer_norm(x, in("g[J]", sizes), in("b[J]", sizes)).spec(), x.spec());
}

TEST_F(Errors, SameSpecOpsAndLeavesAndBackward) {
  EXPECT_THAT(error_of([&] { add(in("a[I_X, J]", sizes), in("b[I, J]", sizes)); }),
              HasSubstr("needs both operands in one layout"));
  // A symbolic tape may start from partial sums (solve costs an op alone on them); an executed one may not.
  EXPECT_EQ(in("a[I]{U_X}", sizes).spec().unreduced.size(), 1u);
  run_backend("threads", Mesh::parse("X=2"), [&](Communicator& comm) {
    Tape executed(comm, {DType::f32});
    EXPECT_THAT(error_of([&] { executed.input("a[I]{U_X}", sizes, zeros()); }), HasSubstr("a leaf holds whole values"));
  });
  EXPECT_THAT(error_of([&] { rename(in("a[I, J]", sizes), "I", "J"); }), HasSubstr("already has a dimension 'J'"));
  Var x = in("x[I_X, J]", sizes, true);
  EXPECT_THAT(error_of([&] { tape.backward(x); }), HasSubstr("must be a rank-0 value"));
  Tape other(Mesh::parse("X=2,Y=2"), {DType::f32});
  Var y = other.input("y[I]", sizes, zeros());
  EXPECT_THAT(error_of([&] { add(x, y); }), HasSubstr("different tapes"));
  EXPECT_THAT(error_of([&] { x.value(); }), HasSubstr("a symbolic tape holds no data"));
  EXPECT_THAT(error_of([&] { tape.grad(x); }), HasSubstr("call backward(loss) first"));
  tape.backward(mean(relu(x)));
  EXPECT_THAT(error_of([&] { tape.backward(mean(x)); }), HasSubstr("record a new program on a new tape"));
  EXPECT_THAT(error_of([&] { tape.grad(x); }), HasSubstr("a symbolic tape computes no gradients"));
  EXPECT_THAT(error_of([&] {
                Tape(Mesh::parse("X=2"), {DType::f32, builtin_profile("h100"), 2});
              }),
              HasSubstr("device 2 is not in mesh X=2"));
  EXPECT_THAT(
      error_of([&] { run_threads(Mesh::parse("X=1"), [](Communicator& comm) { Tape t(comm, {DType::bf16}); }); }),
      HasSubstr("computes in f32 or f64; got bf16"));
}

TEST(Executed, ShardInputsRegatheredValuesAndEmptyMeans) {
  const Mesh mesh = Mesh::parse("X=2");
  std::vector<std::string> errors(2);
  std::vector<double> sums(2);
  run_threads(mesh, [&](Communicator& comm) {
    const auto me = static_cast<std::size_t>(comm.rank());
    Tape tape(comm, {DType::f64});
    const Spec w_spec = tape.spec("W[D_X, F]");
    const auto ones = [](const Index&, std::int64_t) { return 1.0; };
    // A shard the rank already holds is a leaf like any other.
    Var w = tape.input(DistTensor::filled(mesh, comm.rank(), w_spec, {4, 3}, DType::f64, ones), true);
    Var x = tape.input("x[B, D]", {{"B", 2}, {"D", 4}}, ones);
    Var g = all_gather(w, "D", tape.axes("X"), Gathered::regathered);
    Var y = einsum(x, g, {"B", "F"});
    tape.backward(sum(y));
    // dW = x^T 1: every entry 2 (two rows of ones); x needs no gradient, so the gathered
    // weight was never read again: it stays dropped.
    const DistTensor& dw = tape.grad(w);
    double total = 0;
    for (std::int64_t i = 0; i < dw.elements(); ++i) total += dw.buffer().as<double>()[i];
    sums[me] = total;
    errors[me] = error_of([&] { g.value(); });
    if (me == 0) {
      EXPECT_THAT(error_of([&] {
                    tape.input(DistTensor::filled(mesh, 1, w_spec, {4, 3}, DType::f64, ones));
                  }),
                  HasSubstr("input shard is for device 1 in f64; this tape runs device 0 in f64"));
    }
    Tape next(comm, {DType::f64});
    EXPECT_THAT(error_of([&] { mean(next.input("e[I]", {{"I", 0}}, ones)); }), HasSubstr("it has no elements"));
  });
  EXPECT_EQ(sums, (std::vector<double>{2 * 2 * 3, 2 * 2 * 3}));  // each rank's 2 x 3 block of 2s
  for (const std::string& e : errors)
    EXPECT_THAT(e, HasSubstr("this gathered value was dropped for the backward pass"));
}

TEST(Symbolic, Bf16ProgramPredictsBytesAndTimes) {
  // The MLP of the seeds at model size, never allocated: 8 devices, bf16.
  Tape tape(Mesh::parse("X=8"), {DType::bf16, builtin_profile("h100")});
  const DimSizes sizes{{"B", 4096}, {"D", 8192}, {"F", 32768}};
  Var x = tape.input("x[B, D]", sizes, zeros(), true);
  Var w1 = tape.input("W1[D, F_X]", sizes, zeros(), true);
  Var w2 = tape.input("W2[F_X, D]", sizes, zeros(), true);
  Var y = all_reduce(einsum(gelu(einsum(x, w1, {"B", "F"})), w2, {"B", "D"}), tape.axes("X"));
  tape.backward(mean(y));
  std::vector<std::pair<Phase, OpKind>> comm;
  double flops = 0;
  for (const TapeEvent& e : tape.events()) {
    if (is_collective(e.step.op)) comm.push_back({e.phase, e.step.op});
    flops += e.step.flops;
    EXPECT_GT(e.step.time_s, 0);
    if (e.step.op == OpKind::all_reduce) {
      // B x D bf16, all-reduced over 8: 2 (n - n/8) elements of 2 bytes.
      EXPECT_EQ(e.step.bytes_sent, 2 * (4096LL * 8192 - 4096LL * 8192 / 8) * 2);
    }
  }
  EXPECT_EQ(comm, (std::vector<std::pair<Phase, OpKind>>{{Phase::forward, OpKind::all_reduce},
                                                         {Phase::backward, OpKind::all_reduce}}));
  // Forward 2 einsums, backward 4 (two operand gradients each): 6 x 2 B D F / 8 per device.
  EXPECT_DOUBLE_EQ(flops, 6 * 2.0 * 4096 * 8192 * 32768 / 8);
  const TapeMemory m = tape.memory();
  EXPECT_EQ(m.leaves, (4096LL * 8192 + 2 * 8192LL * 32768 / 8) * 2);
  // Saved for backward: x (for dW1), W1 and W2, the pre-activation and the activation;
  // leaves are not activations: the [B, F/8] pre-activation and GELU output.
  EXPECT_EQ(m.activations, 2 * 4096LL * 32768 / 8 * 2);
  EXPECT_EQ(m.gradients, m.leaves);
}

}  // namespace
}  // namespace shardmm
