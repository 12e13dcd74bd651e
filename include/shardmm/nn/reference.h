// Dense single-device training steps of the parallel layers, in f64 with plain loops: the
// oracles that every sharded layer (and `shardmm model --run`) is checked against.
//
//   nn::Params w = {{"W_in", nn::dense({4, 8}, init)}, {"W_out", nn::dense({8, 4}, init)}};
//   nn::DenseTensor x = nn::dense({2, 3, 4}, init), dy = nn::dense({2, 3, 4}, init);
//   nn::DenseStep s = nn::mlp_step({nn::Activation::gelu}, w, x, dy, /*lr=*/0.1);
//   s.output;              // Y [2, 3, 4]
//   s.grads.at("W_in");    // dL/dW_in, with L = <dY, Y> (dY is the backward's seed)
//   s.updated.at("W_in");  // W_in - lr * dL/dW_in
//
// The loss of every step is L = sum(dY * Y) for a given dY, so dY is exactly the output
// gradient that the backward pass starts from; the step is forward, backward and one SGD
// update. Leading dimensions of an activation are tokens: [B, T, D] is B*T rows of D.
//
// Layers (weights are named as in the sharded layers, nn/layers.h):
//   MLP        Y = act(X W_in) W_out                        W_in [D, F], W_out [F, D]
//   attention  per head h: softmax(Q_h K_h^T / sqrt(Dh)) V_h, then the output projection
//              Q = X Wq, K = X Wk, V = X Wv                  Wq, Wk, Wv [D, H, Dh], Wo [H, Dh, D]
//              causal: position t attends to positions <= t of its own sequence.
//   block      A = X + attention(LN(X)); Y = A + MLP(LN(A))  (layer norm without affine
//              parameters, eps 1e-5, so that no replicated parameter needs a gradient sum)
//   MoE        X is [B, T, D]. Router logits X W_router [D, E], probabilities softmax over
//              E; each token's top-k experts (ties: lower index), the gate is the
//              probability (not renormalized); expert e is an MLP (W_in [E, D, F],
//              W_out [E, F, D]); Y[t] = sum over kept choices of gate * expert(X[t]).
//              Capacity is per sequence (GShard's groups are the B sequences): each
//              sequence may send C = min(T, ceil(capacity_factor * T * k / E)) tokens to
//              each expert (no expert sees a token twice, so more than T would stay empty).
//              Within a sequence choices are queued choice-rank first (every
//              token's 1st choice, in position order, then the 2nd choices, ...) and a
//              choice that finds its expert full is dropped (it contributes nothing).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace shardmm::nn {

using Shape = std::vector<std::int64_t>;

// A dense row-major array.
struct DenseTensor {
  Shape shape;
  std::vector<double> values;
};
using Params = std::map<std::string, DenseTensor>;

// `value(index)` at every index of `shape`, row-major.
DenseTensor dense(const Shape& shape, const std::function<double(const std::vector<std::int64_t>&)>& value);

enum class Activation { relu, gelu, silu };
// "relu", "gelu" (the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), "silu"; parse throws InputError on other names.
const char* to_string(Activation a);
Activation parse_activation(const std::string& name);
double activate(Activation a, double x);
double activate_grad(Activation a, double x);  // d act(x) / dx

inline constexpr double kLayerNormEps = 1e-5;

struct MlpConfig {
  Activation activation = Activation::gelu;
};
struct AttentionConfig {
  bool causal = false;
};
struct BlockConfig {
  AttentionConfig attention;
  MlpConfig mlp;
};
struct MoeConfig {
  std::int64_t top_k = 1;
  double capacity_factor = 1.25;
  MlpConfig expert;
};

// The per-expert capacity of a group of `tokens` tokens (one sequence: T).
std::int64_t moe_capacity(const MoeConfig& config, std::int64_t tokens, std::int64_t experts);

struct DenseStep {
  DenseTensor output;      // Y
  double loss = 0;         // <dY, Y>
  DenseTensor input_grad;  // dL/dX
  Params grads;            // dL/dW per parameter
  Params updated;          // W - lr * dL/dW per parameter
};

// Each takes the input X, the parameters named above, the output gradient dY (shaped as
// X) and the learning rate. Throws InputError when a parameter is missing or misshapen.
DenseStep mlp_step(const MlpConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                   double lr);
// X is [B, T, D].
DenseStep attention_step(const AttentionConfig& config, const Params& params, const DenseTensor& x,
                         const DenseTensor& dy, double lr);
// Parameters: Wq, Wk, Wv, Wo, W_in, W_out. X is [B, T, D].
DenseStep block_step(const BlockConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                     double lr);
// Parameters: W_router, W_in, W_out. X is [B, T, D].
DenseStep moe_step(const MoeConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                   double lr);

// Which (token, expert) choices the MoE keeps: for each token its k choices (expert, gate
// probability, kept, and the kept choice's slot in its expert's buffer of C).
struct MoeChoice {
  std::int64_t expert = 0;
  double gate = 0;
  bool kept = false;
  std::int64_t slot = -1;
};
// One group's routing from its router probabilities ([tokens, experts], row-major): the
// rule above. The sharded layer routes its own sequences with it.
std::vector<std::vector<MoeChoice>> moe_assign(const MoeConfig& config, const std::vector<double>& probs,
                                               std::int64_t tokens, std::int64_t experts);
// The same rule with each expert's capacity given (a program's route: its capacity letter's
// size): each token's top_k experts by probability (ties to the lower index), slots taken in
// token order for each choice rank in turn, choices past an expert's capacity dropped.
std::vector<std::vector<MoeChoice>> moe_assign(const std::vector<double>& probs, std::int64_t tokens,
                                               std::int64_t experts, std::int64_t top_k, std::int64_t capacity);
// The routing of every token of X [B, T, D], in row-major token order.
std::vector<std::vector<MoeChoice>> moe_route(const MoeConfig& config, const DenseTensor& x,
                                              const DenseTensor& w_router);

}  // namespace shardmm::nn
