// A tensor-parallel decoder block (layer norms, attention split by heads, MLP, residuals)
// on the tape: gradients against finite differences, and the seed's count of all_reduces:
// two in the forward pass (inference), four in a training step.
#include <gtest/gtest.h>

#include <cmath>

#include "autodiff_programs.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::Instr;
using testing::Kind;
using testing::Program;

Program decoder_block(const Mesh& mesh) {
  const auto leaf = [&](const char* spec, Shape shape) {
    return testing::Leaf{parse_spec(spec, mesh), std::move(shape), 100 + std::hash<std::string>{}(spec) % 1000};
  };
  const std::int64_t T = 3, D = 4, H = 2, K = 2, F = 6;
  Program p{mesh,
            {leaf("x[T, D]", {T, D}), leaf("g1[D]", {D}), leaf("b1[D]", {D}), leaf("Wq[D, H_X, K]", {D, H, K}),
             leaf("Wk[D, H_X, K]", {D, H, K}), leaf("Wv[D, H_X, K]", {D, H, K}), leaf("Wo[H_X, K, D]", {H, K, D}),
             leaf("g2[D]", {D}), leaf("b2[D]", {D}), leaf("W1[D, F_X]", {D, F}), leaf("W2[F_X, D]", {F, D})},
            {},
            ""};
  Instr scale{Kind::scale, {17}};
  scale.factor = 1 / std::sqrt(double(K));
  p.ops = {
      Instr{Kind::layer_norm, {0, 1, 2}},                    // 11 [T, D]
      Instr{Kind::local_einsum, {11, 3}, {"T", "H", "K"}},   // 12 q [T, H_X, K]: column parallel by heads
      Instr{Kind::local_einsum, {11, 4}, {"T", "H", "K"}},   // 13 k
      Instr{Kind::local_einsum, {11, 5}, {"T", "H", "K"}},   // 14 v
      Instr{Kind::rename, {13}, {}, {}, "T", "S"},           // 15 k [S, H_X, K]
      Instr{Kind::rename, {14}, {}, {}, "T", "S"},           // 16 v [S, H_X, K]
      Instr{Kind::local_einsum, {12, 15}, {"H", "T", "S"}},  // 17 scores [H_X, T, S]
      scale,                                                 // 18
      Instr{Kind::softmax, {18}},                            // 19 over S
      Instr{Kind::local_einsum, {19, 16}, {"T", "H", "K"}},  // 20
      Instr{Kind::local_einsum, {20, 6}, {"T", "D"}},        // 21 [T, D]{U_X}: row parallel
      Instr{Kind::all_reduce, {21}, {}, {}, "", "", {0}},    // 22
      Instr{Kind::add, {0, 22}},                             // 23 residual
      Instr{Kind::layer_norm, {23, 7, 8}},                   // 24
      Instr{Kind::local_einsum, {24, 9}, {"T", "F"}},        // 25 [T, F_X]
      Instr{Kind::gelu, {25}},                               // 26
      Instr{Kind::local_einsum, {26, 10}, {"T", "D"}},       // 27 [T, D]{U_X}
      Instr{Kind::all_reduce, {27}, {}, {}, "", "", {0}},    // 28
      Instr{Kind::add, {23, 28}},                            // 29
      Instr{Kind::mean, {29}},                               // 30
  };
  return p;
}

TEST(DecoderBlock, TwoAllReducesForwardFourInTraining) {
  const Mesh mesh = Mesh::parse("X=2");
  const Program p = decoder_block(mesh);
  const testing::Executed run = testing::execute(p, mesh, false);
  const auto fd = testing::finite_differences(p);
  for (std::size_t l = 0; l < p.leaves.size(); ++l) {
    EXPECT_TRUE(run.grads_in_leaf_spec[l]) << "leaf " << l;
    for (std::size_t i = 0; i < fd[l].size(); ++i) {
      EXPECT_NEAR(run.grads[l][i], fd[l][i], 1e-6 * (1 + std::abs(fd[l][i]))) << "leaf " << l << " element " << i;
    }
  }
  testing::check_symbolic(p, mesh, run);
  int forward = 0, backward = 0, other = 0;
  for (const TapeEvent& e : run.events[0]) {
    if (e.step.op == OpKind::all_reduce && e.step.axes == AxisList{0}) {
      ++(e.phase == Phase::forward ? forward : backward);
    } else if (is_collective(e.step.op)) {
      ++other;
    }
  }
  EXPECT_EQ(forward, 2);
  EXPECT_EQ(backward, 2);
  EXPECT_EQ(other, 0);
}

}  // namespace
}  // namespace shardmm
