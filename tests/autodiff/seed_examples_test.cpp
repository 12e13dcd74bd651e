// The seeds' worked examples: 003's two-rank FFN (output [9, 6], input gradient [9, 3])
// and 004's sharded GEMM backprop over row, column and inner splits.
#include <gtest/gtest.h>

#include <random>

#include "autodiff_testing.h"
#include "random_cases.h"
#include "shardmm/autodiff/tape.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::Collected;
using testing::from_dense;

// Seed 003: x = [2, -1]; A = [A0 | A1] split by output channel, B = [B0; B1] by input
// channel; ReLU between; loss = sum(output).
void seed_003(DType dtype, Collected& out, std::vector<std::vector<TapeEvent>>& events) {
  const Mesh mesh = Mesh::parse("X=2");
  events.assign(2, {});
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {dtype});
    Var x = tape.input("x[N, D]", {{"N", 1}, {"D", 2}}, from_dense({2, -1}, {1, 2}), true);
    Var a = tape.input("A[D, F_X]", {{"D", 2}, {"F", 4}}, from_dense({1, 0, -1, 2, 1, 1, 0, 0}, {2, 4}), true);
    Var b = tape.input("B[F_X, E]", {{"F", 4}, {"E", 2}}, from_dense({1, 2, 0, 1, 1, 0, 2, 1}, {4, 2}), true);
    Var u = relu(einsum(x, a, {"N", "F"}));
    Var z = einsum(u, b, {"N", "E"});
    Var y = all_reduce(z, tape.axes("X"));
    out.put("z", z.value());
    out.put("y", y.value());
    tape.backward(sum(y));
    out.put("dx", tape.grad(x));
    out.put("dA", tape.grad(a));
    out.put("dB", tape.grad(b));
    // Gradients come in their leaves' own specs (assembling would hide a partial one).
    for (Var leaf : {x, a, b}) EXPECT_EQ(tape.grad(leaf).spec(), leaf.spec());
    events[static_cast<std::size_t>(comm.rank())] = tape.events();
  });
}

TEST(SeedExamples, TensorParallelFfnOutputAndInputGradient) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const Mesh mesh = Mesh::parse("X=2");
    Collected out(mesh);
    std::vector<std::vector<TapeEvent>> events;
    seed_003(dtype, out, events);
    EXPECT_EQ(out.global("y"), (std::vector<double>{9, 6}));
    // Each rank's partial sum ([1, 2] and [8, 4]) adds up to the output, not concatenation or mean.
    EXPECT_EQ(out.global("z"), (std::vector<double>{9, 6}));
    EXPECT_EQ(out.global("dx"), (std::vector<double>{9, 3}));
    // dB = U^T G with U = [1, 0, 0, 4]; dA = x^T D with D = [3, 0, 0, 3].
    EXPECT_EQ(out.global("dB"), (std::vector<double>{1, 1, 0, 0, 0, 0, 4, 4}));
    EXPECT_EQ(out.global("dA"), (std::vector<double>{6, 0, 0, 6, -3, 0, 0, -3}));
    // One all_reduce forward, one backward: it sums the ranks' partial input gradients
    // (the seed's [3, 3] and [6, 0]) into dx's replicated spec. Nothing else moves.
    for (const auto& rank_events : events) {
      ASSERT_FALSE(rank_events.empty());
      EXPECT_EQ(format_spec(rank_events.back().step.from, mesh), "dx[N, D]{U_X}");
      std::vector<std::pair<Phase, OpKind>> collectives;
      for (const TapeEvent& e : rank_events) {
        if (is_collective(e.step.op)) collectives.push_back({e.phase, e.step.op});
      }
      EXPECT_EQ(collectives, (std::vector<std::pair<Phase, OpKind>>{{Phase::forward, OpKind::all_reduce},
                                                                    {Phase::backward, OpKind::all_reduce}}));
    }
  }
}

// Seed 004: L = <G, A B>; Y, dA = G B^T, dB = A^T G against the dense products, exactly
// (small integers), for uneven and empty shards.
enum class Split { rows, columns, inner };

struct Gemm {
  std::int64_t m, k, n;
  std::vector<double> a, b, g;
};

std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& y, std::int64_t m, std::int64_t k,
                           std::int64_t n, bool tx, bool ty) {
  // x is m x k (or k x m when tx), y is k x n (or n x k when ty).
  std::vector<double> out(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        s += x[static_cast<std::size_t>(tx ? l * m + i : i * k + l)] *
             y[static_cast<std::size_t>(ty ? j * k + l : l * n + j)];
      }
      out[static_cast<std::size_t>(i * n + j)] = s;
    }
  }
  return out;
}

void check_split(Split split, DType dtype, std::int64_t parts, const Gemm& p) {
  const Mesh mesh = Mesh({{"X", parts}});
  const char* a_spec = split == Split::rows ? "A[M_X, K]" : split == Split::inner ? "A[M, K_X]" : "A[M, K]";
  const char* b_spec = split == Split::columns ? "B[K, N_X]" : split == Split::inner ? "B[K_X, N]" : "B[K, N]";
  const char* g_spec = split == Split::rows ? "G[M_X, N]" : split == Split::columns ? "G[M, N_X]" : "G[M, N]";
  const DimSizes sizes{{"M", p.m}, {"K", p.k}, {"N", p.n}};
  Collected out(mesh);
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {dtype});
    Var a = tape.input(a_spec, sizes, from_dense(p.a, {p.m, p.k}), true);
    Var b = tape.input(b_spec, sizes, from_dense(p.b, {p.k, p.n}), true);
    Var g = tape.input(g_spec, sizes, from_dense(p.g, {p.m, p.n}));
    Var y = einsum(a, b, {"M", "N"});
    if (split == Split::inner) y = all_reduce(y, tape.axes("X"));  // the forward sum of partial products
    out.put("y", y.value());
    tape.backward(einsum(y, g, {}));
    out.put("dA", tape.grad(a));
    out.put("dB", tape.grad(b));
    EXPECT_EQ(tape.grad(a).spec(), a.spec());
    EXPECT_EQ(tape.grad(b).spec(), b.spec());
  });
  const std::string where = "split " + std::to_string(static_cast<int>(split)) + " parts " + std::to_string(parts) +
                            " M,K,N = " + std::to_string(p.m) + "," + std::to_string(p.k) + "," + std::to_string(p.n);
  ASSERT_EQ(out.global("y"), matmul(p.a, p.b, p.m, p.k, p.n, false, false)) << where;
  ASSERT_EQ(out.global("dA"), matmul(p.g, p.b, p.m, p.n, p.k, false, true)) << where;
  ASSERT_EQ(out.global("dB"), matmul(p.a, p.g, p.k, p.m, p.n, true, false)) << where;
}

TEST(SeedExamples, ShardedGemmBackpropThousandSizesPerSplit) {
  std::mt19937_64 rng(4004);
  std::uniform_int_distribution<int> small(-3, 3);
  const auto fill = [&](std::int64_t count) {
    std::vector<double> v(static_cast<std::size_t>(count));
    for (double& x : v) x = small(rng);
    return v;
  };
  // A thousand per split, fewer under the sanitizers (testing::scaled_cases).
  const unsigned trials = testing::scaled_cases(1000);
  for (Split split : {Split::rows, Split::columns, Split::inner}) {
    for (unsigned trial = 0; trial < trials; ++trial) {
      Gemm p;
      p.m = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
      p.k = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
      p.n = std::uniform_int_distribution<std::int64_t>(0, 9)(rng);
      p.a = fill(p.m * p.k);
      p.b = fill(p.k * p.n);
      p.g = fill(p.m * p.n);
      // 1..6 parts: more parts than rows, columns or inner size gives empty shards.
      const std::int64_t parts = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
      check_split(split, trial % 2 ? DType::f32 : DType::f64, parts, p);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SeedExamples, WorkedSizesThreeFiveFourInnerSplitUneven) {
  // The seed's hand case: M=3, K=5, N=4, inner split 3/2.
  Gemm p{3, 5, 4, {}, {}, {}};
  for (int i = 0; i < 15; ++i) p.a.push_back(i % 7 - 3);
  for (int i = 0; i < 20; ++i) p.b.push_back(i % 5 - 2);
  for (int i = 0; i < 12; ++i) p.g.push_back(i % 3 - 1);
  check_split(Split::inner, DType::f64, 2, p);
}

}  // namespace
}  // namespace shardmm
