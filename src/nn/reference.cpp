// What reference.h declares: dense arrays, the activations, MoE routing. Deliberately naive
// loops in f64: the dense reference of a program (program_reference.cpp) is the independent
// oracle of every sharded step, so it shares nothing with the tape but the definitions.
#include "shardmm/nn/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardmm/core/error.h"

namespace shardmm::nn {
namespace {

const double kGeluC = std::sqrt(2.0 / M_PI);

std::int64_t count(const Shape& s) { return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>()); }

}  // namespace

DenseTensor dense(const Shape& shape, const std::function<double(const std::vector<std::int64_t>&)>& value) {
  DenseTensor t{shape, std::vector<double>(static_cast<std::size_t>(count(shape)))};
  std::vector<std::int64_t> index(shape.size(), 0);
  for (double& v : t.values) {
    v = value(index);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return t;
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::silu:
      return "silu";
  }
  return "?";
}

Activation parse_activation(const std::string& name) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::silu}) {
    if (name == to_string(a)) return a;
  }
  throw InputError("activation '" + name + "' is not one of relu, gelu, silu");
}

double activate(Activation a, double x) {
  switch (a) {
    case Activation::relu:
      return x > 0 ? x : 0.0;
    case Activation::gelu:
      return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + 0.044715 * x * x * x)));
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
  }
  return 0;
}

double activate_grad(Activation a, double x) {
  switch (a) {
    case Activation::relu:
      return x > 0 ? 1.0 : 0.0;
    case Activation::gelu: {
      const double th = std::tanh(kGeluC * (x + 0.044715 * x * x * x));
      return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * kGeluC * (1.0 + 3 * 0.044715 * x * x);
    }
    case Activation::silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
  }
  return 0;
}

std::vector<std::vector<MoeChoice>> moe_assign(const std::vector<double>& probs, std::int64_t tokens,
                                               std::int64_t experts, std::int64_t top_k, std::int64_t capacity) {
  if (top_k < 1 || top_k > experts) {
    throw InputError("top-k routing needs 1 <= K <= E; got K=" + std::to_string(top_k) +
                     ", E=" + std::to_string(experts));
  }
  std::vector<std::vector<MoeChoice>> route(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const double* p = &probs[t * experts];
    std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t i, std::int64_t j) { return p[i] > p[j]; });
    for (std::int64_t k = 0; k < top_k; ++k) route[t].push_back({order[k], p[order[k]], false, 0});
  }
  std::vector<std::int64_t> load(static_cast<std::size_t>(experts), 0);
  for (std::int64_t k = 0; k < top_k; ++k) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      MoeChoice& c = route[t][k];
      c.kept = load[c.expert] < capacity;
      c.slot = c.kept ? load[c.expert]++ : -1;
    }
  }
  return route;
}

}  // namespace shardmm::nn
