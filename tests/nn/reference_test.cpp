// The dense reference's pieces against their definitions (activations by differences, MoE
// routing by hand), and the dense f64 step of each layer's program (the oracle every sharded
// `shardmm model` step is verified against) against finite differences of its loss.
#include "shardmm/nn/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "shardmm/core/error.h"
#include "shardmm/nn/model.h"
#include "shardmm/nn/program.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::nn {
namespace {

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

TEST(ReferenceTest, MoeCapacityDropsLaterChoicesFirst) {
  // Four tokens, two experts, k = 2, capacity 2: every expert fills up with first choices
  // before any second choice is queued. Tokens 0, 1, 3 prefer expert 0; token 2 expert 1.
  const std::vector<double> probs = {0.7, 0.3, 0.6, 0.4, 0.2, 0.8, 0.9, 0.1};
  const auto route = moe_assign(probs, 4, 2, 2, 2);
  EXPECT_EQ(route[0][0].expert, 0);
  EXPECT_TRUE(route[0][0].kept);
  EXPECT_TRUE(route[1][0].kept);
  EXPECT_FALSE(route[3][0].kept);  // expert 0 is full after tokens 0 and 1
  EXPECT_TRUE(route[2][0].kept);   // expert 1's first choice
  EXPECT_EQ(route[1][0].slot, 1);
  EXPECT_TRUE(route[0][1].kept);  // token 0's second choice, expert 1, is its second row
  EXPECT_EQ(route[0][1].slot, 1);
  EXPECT_FALSE(route[1][1].kept);
  EXPECT_FALSE(route[3][1].kept);  // token 3's second choice finds expert 1 full too
  EXPECT_EQ(route[3][1].slot, -1);
  EXPECT_DOUBLE_EQ(route[0][0].gate, 0.7);
  EXPECT_THROW(moe_assign(probs, 4, 2, 3, 2), InputError);  // K > E
}

// Ties go to the lower expert.
TEST(ReferenceTest, MoeTiesGoToTheLowerExpert) {
  const auto route = moe_assign({0.5, 0.5}, 1, 2, 1, 1);
  EXPECT_EQ(route[0][0].expert, 0);
}

// Central differences of the program's loss against the dense step's gradient of a few
// elements of every leaf, for each layer (causal attention, top-2 routing with drops).
void expect_gradients(const char* layer, const char* dims) {
  ModelConfig m =
      make_model_config(layer, layer == std::string("moe") ? "ep" : "tp", Mesh::parse("X=2"), parse_dims(dims));
  m.causal = true;
  m.capacity_factor = 0.8;
  const program::Graph g = model_program(m);
  ProgramOptions o;
  o.seed = 3;
  const DenseProgramStep s = dense_program_step(g, o);
  for (int leaf : g.leaves()) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(leaf)];
    o.inputs[t.name] = s.values[static_cast<std::size_t>(leaf)];
  }
  const auto loss_with = [&](const std::string& name, std::size_t i, double delta) {
    ProgramOptions moved = o;
    moved.inputs[name].values[i] += delta;
    moved.train = false;
    return dense_program_step(g, moved).values[static_cast<std::size_t>(g.loss)].values[0];
  };
  const double h = 1e-5;
  for (int leaf : g.leaves()) {
    const program::Tensor& t = g.tensors[static_cast<std::size_t>(leaf)];
    const std::vector<double>& grad = s.grads[static_cast<std::size_t>(leaf)].values;
    for (std::size_t i = 0; i < grad.size(); i += 1 + grad.size() / 5) {
      const double numeric = (loss_with(t.name, i, h) - loss_with(t.name, i, -h)) / (2 * h);
      EXPECT_NEAR(grad[i], numeric, 1e-6 * (1 + std::abs(numeric))) << layer << ": d" << t.name << " element " << i;
    }
  }
}

// The values of `tensor` in the dense step of `m`'s program with the leaves given.
std::vector<double> dense_values(const ModelConfig& m, const std::map<std::string, DenseTensor>& inputs,
                                 const std::string& tensor) {
  const program::Graph g = model_program(m);
  ProgramOptions o;
  o.inputs = inputs;
  o.train = false;
  return dense_program_step(g, o).values[static_cast<std::size_t>(g.find(tensor))].values;
}

// Capacity is per sequence (GShard's groups): two sequences of two tokens, all preferring
// expert 0, capacity ceil(0.5 * 2 / 2) = 1: the first token of each sequence is kept, as if
// the sequences were routed alone.
TEST(ReferenceTest, MoeCapacityIsPerSequence) {
  ModelConfig m = make_model_config("moe", "dp", Mesh::parse("X=2"), parse_dims("B=2,T=2,D=1,F=1,E=2"));
  m.capacity_factor = 0.5;
  const std::map<std::string, DenseTensor> in = {{"X", {{2, 2, 1}, {1, 2, 3, 4}}},
                                                 {"W_router", {{1, 2}, {1, -1}}},
                                                 {"W_in", {{2, 1, 1}, {1, 1}}},
                                                 {"W_out", {{2, 1, 1}, {1, 1}}},
                                                 {"G", {{2, 2, 1}, {1, 1, 1, 1}}}};
  // dispatch[B, T, E, C] with C = 1: (b, t, e) -> b * 4 + t * 2 + e.
  EXPECT_EQ(dense_values(m, in, "dispatch"), (std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0}));
}

// Causal attention: the first position's output does not see the later positions' inputs.
TEST(ReferenceTest, CausalAttentionIgnoresLaterPositions) {
  ModelConfig m = make_model_config("attention", "tp", Mesh::parse("X=2"), parse_dims("B=1,T=3,D=2,H=1"));
  const auto values = [](std::uint64_t seed, const Shape& shape) {
    const auto gen = uniform_values(seed);
    return dense(shape, [&](const std::vector<std::int64_t>& i) { return gen(i, 0); });
  };
  std::map<std::string, DenseTensor> in = {{"X", values(1, {1, 3, 2})},  {"Wq", values(2, {2, 1, 2})},
                                           {"Wk", values(3, {2, 1, 2})}, {"Wv", values(4, {2, 1, 2})},
                                           {"Wo", values(5, {1, 2, 2})}, {"G", values(6, {1, 3, 2})}};
  for (bool causal : {true, false}) {
    m.causal = causal;
    const std::vector<double> before = dense_values(m, in, "Y");
    std::map<std::string, DenseTensor> moved = in;
    moved["X"].values[4] += 1;  // position 2
    const std::vector<double> after = dense_values(m, moved, "Y");
    EXPECT_EQ(before[0] == after[0] && before[1] == after[1], causal);
    EXPECT_NE(before[4], after[4]);
  }
}

TEST(ReferenceTest, EachLayersDenseStepMatchesFiniteDifferences) {
  expect_gradients("mlp", "B=2,T=3,D=4,F=5");
  expect_gradients("attention", "B=2,T=3,D=4,H=2");
  expect_gradients("block", "B=2,T=3,D=4,F=5,H=2");
  expect_gradients("moe", "B=2,T=4,D=3,F=4,E=3,K=2");
}

}  // namespace
}  // namespace shardmm::nn
