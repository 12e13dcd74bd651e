// The pieces that the dense f64 reference of a program (nn/program.h, dense_program_step)
// and the sharded route share with nothing else: dense arrays, the activations and their
// derivatives, and MoE routing.
//
//   nn::DenseTensor x = nn::dense({2, 3}, [](const std::vector<std::int64_t>& i) { return i[0] - i[1]; });
//   nn::activate(nn::Activation::gelu, 0.5);       // the tanh form
//   // One sequence's routing: 4 tokens over 2 experts, top-1, 2 slots per expert.
//   auto choices = nn::moe_assign(probs, 4, 2, 1, 2);
//   choices[3][0].kept;                            // false when its expert filled up first
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shardmm::nn {

using Shape = std::vector<std::int64_t>;

// A dense row-major array.
struct DenseTensor {
  Shape shape;
  std::vector<double> values;
};

// `value(index)` at every index of `shape`, row-major.
DenseTensor dense(const Shape& shape, const std::function<double(const std::vector<std::int64_t>&)>& value);

enum class Activation { relu, gelu, silu };
// "relu", "gelu" (the tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), "silu"; parse throws InputError on other names.
const char* to_string(Activation a);
Activation parse_activation(const std::string& name);
double activate(Activation a, double x);
double activate_grad(Activation a, double x);  // d act(x) / dx

// Which (token, expert) choices an MoE group keeps: for each token its k choices (expert,
// gate probability, kept, and the kept choice's slot in its expert's buffer of C).
struct MoeChoice {
  std::int64_t expert = 0;
  double gate = 0;
  bool kept = false;
  std::int64_t slot = -1;
};
// One group's routing (a sequence: GShard's groups) from its router probabilities
// ([tokens, experts], row-major), each expert's capacity given (a program's route: its
// capacity letter's size): each token's top_k experts by probability (ties to the lower
// index), slots taken in token order for each choice rank in turn (every token's first
// choice before any second choice), choices past an expert's capacity dropped.
std::vector<std::vector<MoeChoice>> moe_assign(const std::vector<double>& probs, std::int64_t tokens,
                                               std::int64_t experts, std::int64_t top_k, std::int64_t capacity);

}  // namespace shardmm::nn
