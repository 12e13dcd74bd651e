// The dense layer steps against finite differences of their loss, the seeds' worked
// example and closed forms; they are the oracle of every sharded layer, so they are
// checked against nothing but the definitions.
#include "shardmm/nn/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "shardmm/core/error.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::nn {
namespace {

// Values in [-scale, scale), a function of the index and seed only.
DenseTensor random(const Shape& shape, std::uint64_t seed, double scale = 1.0) {
  const auto gen = uniform_values(seed);
  return dense(shape, [&](const std::vector<std::int64_t>& i) { return scale * gen(i, 0); });
}

using StepFn = std::function<DenseStep(const Params&, const DenseTensor&, const DenseTensor&, double)>;

// The loss <dY, Y> at (params, x).
double loss_of(const StepFn& step, const Params& p, const DenseTensor& x, const DenseTensor& dy) {
  return step(p, x, dy, 0.0).loss;
}

// Central differences of the loss against every analytic gradient, and the SGD update.
void expect_gradients(const StepFn& step, const Params& params, const DenseTensor& x, const DenseTensor& dy) {
  const double h = 1e-5, lr = 0.25;
  const DenseStep s = step(params, x, dy, lr);
  auto check = [&](const std::string& what, const std::vector<double>& grad, auto&& perturb) {
    ASSERT_EQ(grad.size(), perturb.size);
    for (std::size_t i = 0; i < grad.size(); ++i) {
      const double up = perturb(i, h), down = perturb(i, -h);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[i], numeric, 1e-6 * (1 + std::abs(numeric))) << what << " element " << i;
    }
  };
  struct Perturb {
    std::size_t size;
    std::function<double(std::size_t, double)> f;
    double operator()(std::size_t i, double d) const { return f(i, d); }
  };
  check("dX", s.input_grad.values, Perturb{x.values.size(), [&](std::size_t i, double d) {
                                             DenseTensor moved = x;
                                             moved.values[i] += d;
                                             return loss_of(step, params, moved, dy);
                                           }});
  for (const auto& [name, w] : params) {
    check(name, s.grads.at(name).values, Perturb{w.values.size(), [&, name = name](std::size_t i, double d) {
                                                   Params moved = params;
                                                   moved.at(name).values[i] += d;
                                                   return loss_of(step, moved, x, dy);
                                                 }});
    for (std::size_t i = 0; i < w.values.size(); ++i) {
      EXPECT_DOUBLE_EQ(s.updated.at(name).values[i], w.values[i] - lr * s.grads.at(name).values[i]);
    }
  }
}

TEST(ReferenceTest, SeedsWorkedExampleTwoRankMlp) {
  // Seeds 003: input [2, -1], A = [A0 | A1], B = [B0; B1], ReLU, loss = sum(output).
  const Params p = {{"W_in", {{2, 4}, {1, 0, -1, 2, 1, 1, 0, 0}}}, {"W_out", {{4, 2}, {1, 2, 0, 1, 1, 0, 2, 1}}}};
  const DenseTensor x{{1, 2}, {2, -1}}, ones{{1, 2}, {1, 1}};
  const DenseStep s = mlp_step({Activation::relu}, p, x, ones, 0.0);
  EXPECT_EQ(s.output.values, (std::vector<double>{9, 6}));
  EXPECT_EQ(s.input_grad.values, (std::vector<double>{9, 3}));
  EXPECT_EQ(s.loss, 15);
}

TEST(ReferenceTest, ActivationDerivativesMatchDifferences) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::silu}) {
    for (double x : {-2.5, -0.7, 0.3, 1.9}) {
      const double numeric = (activate(a, x + 1e-6) - activate(a, x - 1e-6)) / 2e-6;
      EXPECT_NEAR(activate_grad(a, x), numeric, 1e-8) << to_string(a) << " at " << x;
    }
    EXPECT_EQ(parse_activation(to_string(a)), a);
  }
  EXPECT_NEAR(activate(Activation::gelu, 1.0), 0.8411919906082768, 1e-15);  // the tanh form at 1
  EXPECT_THROW(parse_activation("tanh"), InputError);
}

TEST(ReferenceTest, MlpGradientsMatchFiniteDifferences) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::silu}) {
    const Params p = {{"W_in", random({4, 6}, 1)}, {"W_out", random({6, 4}, 2)}};
    expect_gradients([a](const auto&... args) { return mlp_step({a}, args...); }, p, random({2, 3, 4}, 3),
                     random({2, 3, 4}, 4));
  }
}

TEST(ReferenceTest, AttentionGradientsMatchFiniteDifferences) {
  for (bool causal : {false, true}) {
    const Params p = {{"Wq", random({6, 3, 2}, 5)},
                      {"Wk", random({6, 3, 2}, 6)},
                      {"Wv", random({6, 3, 2}, 7)},
                      {"Wo", random({3, 2, 6}, 8)}};
    expect_gradients([causal](const auto&... args) { return attention_step({causal}, args...); }, p,
                     random({2, 4, 6}, 9), random({2, 4, 6}, 10));
  }
}

TEST(ReferenceTest, AttentionOfOnePositionIsValueThenOutputProjection) {
  // One position: the softmax is 1, so Y = X Wv Wo whatever Wq and Wk are.
  const Params p = {{"Wq", random({2, 1, 2}, 11)},
                    {"Wk", random({2, 1, 2}, 12)},
                    {"Wv", {{2, 1, 2}, {1, 2, 3, 4}}},
                    {"Wo", {{1, 2, 2}, {1, 0, 1, 1}}}};
  const DenseTensor x{{1, 1, 2}, {1, -1}};
  const DenseStep s = attention_step({false}, p, x, x, 0.0);
  // X Wv = [1*1 - 3, 2 - 4] = [-2, -2]; times Wo = [-2 - 2, -2] = [-4, -2].
  EXPECT_EQ(s.output.values, (std::vector<double>{-4, -2}));
}

TEST(ReferenceTest, CausalAttentionIgnoresLaterPositions) {
  const Params p = {{"Wq", random({4, 2, 2}, 13)},
                    {"Wk", random({4, 2, 2}, 14)},
                    {"Wv", random({4, 2, 2}, 15)},
                    {"Wo", random({2, 2, 4}, 16)}};
  DenseTensor x = random({1, 3, 4}, 17);
  const DenseStep before = attention_step({true}, p, x, x, 0.0);
  for (int i = 8; i < 12; ++i) x.values[i] += 1.0;  // change the last position only
  const DenseStep after = attention_step({true}, p, x, x, 0.0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(before.output.values[i], after.output.values[i]);
  EXPECT_NE(before.output.values[8], after.output.values[8]);
}

TEST(ReferenceTest, BlockGradientsMatchFiniteDifferences) {
  const Params p = {{"Wq", random({6, 2, 3}, 18)}, {"Wk", random({6, 2, 3}, 19)}, {"Wv", random({6, 2, 3}, 20)},
                    {"Wo", random({2, 3, 6}, 21)}, {"W_in", random({6, 5}, 22)},  {"W_out", random({5, 6}, 23)}};
  expect_gradients([](const auto&... args) { return block_step({{true}, {Activation::gelu}}, args...); }, p,
                   random({2, 3, 6}, 24), random({2, 3, 6}, 25));
}

TEST(ReferenceTest, BlockIsResidualAroundItsSublayers) {
  // With zero output projections both sublayers add nothing: Y = X, dX = dY.
  Params p = {{"Wq", random({4, 2, 2}, 26)}, {"Wk", random({4, 2, 2}, 27)}, {"Wv", random({4, 2, 2}, 28)},
              {"Wo", {{2, 2, 4}, std::vector<double>(16, 0.0)}}, {"W_in", random({4, 3}, 29)},
              {"W_out", {{3, 4}, std::vector<double>(12, 0.0)}}};
  const DenseTensor x = random({1, 2, 4}, 30), dy = random({1, 2, 4}, 31);
  const DenseStep s = block_step({}, p, x, dy, 0.0);
  EXPECT_EQ(s.output.values, x.values);
  EXPECT_EQ(s.input_grad.values, dy.values);
}

TEST(ReferenceTest, MoeGradientsMatchFiniteDifferences) {
  for (std::int64_t k : {1, 2}) {
    for (double capacity : {0.5, 4.0}) {  // with and without dropped choices
      const MoeConfig cfg{k, capacity, {Activation::silu}};
      const Params p = {{"W_router", random({4, 3}, 32, 2.0)}, {"W_in", random({3, 4, 5}, 33)},
                        {"W_out", random({3, 5, 4}, 34)}};
      expect_gradients([cfg](const auto&... args) { return moe_step(cfg, args...); }, p, random({2, 4, 4}, 35),
                       random({2, 4, 4}, 36));
    }
  }
}

TEST(ReferenceTest, MoeWithOneExpertIsItsMlpScaledByAGateOfOne) {
  const Params mlp = {{"W_in", random({4, 5}, 37)}, {"W_out", random({5, 4}, 38)}};
  Params moe = {{"W_router", random({4, 1}, 39)}, {"W_in", mlp.at("W_in")}, {"W_out", mlp.at("W_out")}};
  moe.at("W_in").shape = {1, 4, 5};
  moe.at("W_out").shape = {1, 5, 4};
  const DenseTensor x = random({1, 3, 4}, 40), dy = random({1, 3, 4}, 41);
  const DenseStep a = mlp_step({Activation::gelu}, mlp, x, dy, 0.5);
  const DenseStep b = moe_step({1, 1.0, {Activation::gelu}}, moe, x, dy, 0.5);
  for (std::size_t i = 0; i < a.output.values.size(); ++i) {
    EXPECT_NEAR(a.output.values[i], b.output.values[i], 1e-14);
    EXPECT_NEAR(a.input_grad.values[i], b.input_grad.values[i], 1e-14);
  }
  for (double g : b.grads.at("W_router").values) EXPECT_EQ(g, 0.0);  // softmax over one expert is constant
}

// No expert sees a token twice: capacity stops at the sequence's T tokens, however large the
// factor (1e19 * T * k overflowed 64 bits before).
TEST(ReferenceTest, MoeCapacityIsAtMostTheSequence) {
  EXPECT_EQ(moe_capacity(MoeConfig{2, 1e19, {}}, 4, 2), 4);
  EXPECT_EQ(moe_capacity(MoeConfig{1, 1e300, {}}, 7, 3), 7);
  EXPECT_EQ(moe_capacity(MoeConfig{2, 1.0, {}}, 4, 2), 4);  // exactly T: the cap changes nothing
  EXPECT_EQ(moe_capacity(MoeConfig{1, 1.25, {}}, 8, 4), 3);
}

TEST(ReferenceTest, MoeCapacityDropsLaterChoicesFirst) {
  // Four tokens, two experts, k = 2, capacity ceil(0.5 * 4 * 2 / 2) = 2: every expert
  // fills up with first choices before any second choice is queued.
  const MoeConfig cfg{2, 0.5, {}};
  EXPECT_EQ(moe_capacity(cfg, 4, 2), 2);
  const DenseTensor w_router{{1, 2}, {1, -1}};
  const DenseTensor x{{1, 4, 1}, {1, 2, -1, 3}};  // tokens 0, 1, 3 prefer expert 0; token 2 expert 1
  const auto route = moe_route(cfg, x, w_router);
  EXPECT_EQ(route[0][0].expert, 0);
  EXPECT_TRUE(route[0][0].kept);
  EXPECT_TRUE(route[1][0].kept);
  EXPECT_FALSE(route[3][0].kept);  // expert 0 is full after tokens 0 and 1
  EXPECT_TRUE(route[2][0].kept);   // expert 1's first choice
  EXPECT_EQ(route[1][0].slot, 1);
  EXPECT_TRUE(route[0][1].kept);   // token 0's second choice, expert 1, is its second row
  EXPECT_EQ(route[0][1].slot, 1);
  EXPECT_FALSE(route[1][1].kept);
  EXPECT_NEAR(route[0][0].gate + route[0][1].gate, 1.0, 1e-15);
  const DenseStep s = moe_step(cfg, {{"W_router", w_router}, {"W_in", random({2, 1, 3}, 42)},
                                     {"W_out", random({2, 3, 1}, 43)}},
                               x, x, 0.0);
  // Token 3's second choice (expert 1) finds it full too: the token gets no output and no gradient.
  EXPECT_FALSE(route[3][1].kept);
  EXPECT_EQ(s.output.values[3], 0.0);
  EXPECT_EQ(route[3][1].slot, -1);
  EXPECT_EQ(s.input_grad.values[3], 0.0);
  EXPECT_NE(s.output.values[0], 0.0);
  EXPECT_THROW(moe_route({3, 1.0, {}}, x, w_router), InputError);  // K > E
}

TEST(ReferenceTest, MoeCapacityIsPerSequence) {
  // Two sequences of two tokens, all preferring expert 0, capacity ceil(0.5 * 2 / 2) = 1:
  // the first token of each sequence is kept, as if the sequences were routed alone.
  const MoeConfig cfg{1, 0.5, {}};
  const auto route = moe_route(cfg, {{2, 2, 1}, {1, 2, 3, 4}}, {{1, 2}, {1, -1}});
  ASSERT_EQ(route.size(), 4u);
  EXPECT_TRUE(route[0][0].kept);
  EXPECT_FALSE(route[1][0].kept);
  EXPECT_TRUE(route[2][0].kept);
  EXPECT_EQ(route[2][0].slot, 0);
  EXPECT_FALSE(route[3][0].kept);
}

TEST(ReferenceTest, MisshapenParametersAreInputErrors) {
  const DenseTensor x = random({2, 4}, 44);
  EXPECT_THROW(mlp_step({}, {{"W_in", random({4, 3}, 1)}}, x, x, 0.1), InputError);
  EXPECT_THROW(mlp_step({}, {{"W_in", random({4, 3}, 1)}, {"W_out", random({4, 3}, 2)}}, x, x, 0.1), InputError);
  EXPECT_THROW(mlp_step({}, {{"W_in", random({4, 3}, 1)}, {"W_out", random({3, 4}, 2)}}, x, random({4, 2}, 3), 0.1),
               InputError);
  EXPECT_THROW(attention_step({}, {}, x, x, 0.1), InputError);  // not [B, T, D]
}

}  // namespace
}  // namespace shardmm::nn
