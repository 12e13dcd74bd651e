// The dense training steps of reference.h. Deliberately naive loops in f64: they are the
// independent oracle, so they share nothing with the sharded layers but the definitions.
#include "shardmm/nn/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardmm/core/error.h"

namespace shardmm::nn {
namespace {

using Vec = std::vector<double>;

const double kGeluC = std::sqrt(2.0 / M_PI);

std::int64_t count(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

const DenseTensor& param(const Params& p, const std::string& name, const Shape& want) {
  const auto it = p.find(name);
  if (it == p.end()) throw InputError("parameter " + name + " is missing; it should be " + shape_text(want));
  if (it->second.shape != want || count(want) != static_cast<std::int64_t>(it->second.values.size())) {
    throw InputError("parameter " + name + " is " + shape_text(it->second.shape) + "; it should be " +
                     shape_text(want));
  }
  return it->second;
}

// Extent `dim` of a parameter of rank `rank`, 0 when it is missing or of another rank (param()
// then names what is wrong).
std::int64_t extent_of(const Params& p, const std::string& name, std::size_t rank, std::size_t dim) {
  const auto it = p.find(name);
  return it != p.end() && it->second.shape.size() == rank ? it->second.shape[dim] : 0;
}

void check_like(const DenseTensor& dy, const DenseTensor& x) {
  if (dy.shape != x.shape) {
    throw InputError("the output gradient is " + shape_text(dy.shape) + "; it should be shaped as the input, " +
                     shape_text(x.shape));
  }
}

// C[m, n] = sum_k A[m, k] B[k, n], with either operand read transposed.
Vec matmul(const Vec& a, const Vec& b, std::int64_t m, std::int64_t k, std::int64_t n, bool a_t = false,
           bool b_t = false) {
  Vec c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        s += (a_t ? a[l * m + i] : a[i * k + l]) * (b_t ? b[j * k + l] : b[l * n + j]);
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

void add_to(Vec& a, const Vec& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
}

// Softmax of each row of n x e logits, shifted by the row maximum.
Vec softmax_rows(Vec v, std::int64_t n, std::int64_t e) {
  for (std::int64_t t = 0; t < n; ++t) {
    double* row = &v[t * e];
    const double top = *std::max_element(row, row + e);
    double sum = 0;
    for (std::int64_t i = 0; i < e; ++i) sum += row[i] = std::exp(row[i] - top);
    for (std::int64_t i = 0; i < e; ++i) row[i] /= sum;
  }
  return v;
}

double dot(const Vec& a, const Vec& b) { return std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }

// --- MLP on N rows of D: its activations and backward, shared with the block and the experts ---

struct MlpCache {
  Vec pre;   // X W_in [N, F]
  Vec post;  // act(pre)
  Vec out;   // post W_out [N, D]
};

MlpCache mlp_forward(Activation act, const Vec& x, const Vec& w_in, const Vec& w_out, std::int64_t n,
                     std::int64_t d, std::int64_t f) {
  MlpCache c;
  c.pre = matmul(x, w_in, n, d, f);
  c.post.resize(c.pre.size());
  for (std::size_t i = 0; i < c.pre.size(); ++i) c.post[i] = activate(act, c.pre[i]);
  c.out = matmul(c.post, w_out, n, f, d);
  return c;
}

struct MlpGrads {
  Vec dx, dw_in, dw_out;
};

MlpGrads mlp_backward(Activation act, const MlpCache& c, const Vec& x, const Vec& w_in, const Vec& w_out,
                      const Vec& dy, std::int64_t n, std::int64_t d, std::int64_t f) {
  MlpGrads g;
  g.dw_out = matmul(c.post, dy, f, n, d, true);
  Vec dpre = matmul(dy, w_out, n, d, f, false, true);
  for (std::size_t i = 0; i < dpre.size(); ++i) dpre[i] *= activate_grad(act, c.pre[i]);
  g.dw_in = matmul(x, dpre, d, n, f, true);
  g.dx = matmul(dpre, w_in, n, f, d, false, true);
  return g;
}

// --- attention over [B, T, D] ---

struct AttentionCache {
  Vec q, k, v;  // [B, T, H, Dh]
  Vec probs;    // [B, H, T, T]
  Vec heads;    // [B, T, H, Dh], the attention output before Wo
  Vec out;      // [B, T, D]
};

struct AttentionShape {
  std::int64_t b, t, d, h, dh;
};

AttentionCache attention_forward(const AttentionConfig& cfg, const AttentionShape& s, const Vec& x, const Vec& wq,
                                 const Vec& wk, const Vec& wv, const Vec& wo) {
  const std::int64_t n = s.b * s.t, hd = s.h * s.dh;
  AttentionCache c;
  c.q = matmul(x, wq, n, s.d, hd);
  c.k = matmul(x, wk, n, s.d, hd);
  c.v = matmul(x, wv, n, s.d, hd);
  c.probs.assign(static_cast<std::size_t>(s.b * s.h * s.t * s.t), 0.0);
  c.heads.assign(static_cast<std::size_t>(n * hd), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dh));
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.t; ++i) {
        double* p = &c.probs[((b * s.h + h) * s.t + i) * s.t];
        const std::int64_t last = cfg.causal ? i : s.t - 1;
        double top = -INFINITY;
        for (std::int64_t j = 0; j <= last; ++j) {
          double sc = 0;
          for (std::int64_t e = 0; e < s.dh; ++e) {
            sc += c.q[((b * s.t + i) * s.h + h) * s.dh + e] * c.k[((b * s.t + j) * s.h + h) * s.dh + e];
          }
          p[j] = sc * scale;
          top = std::max(top, p[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= last; ++j) sum += p[j] = std::exp(p[j] - top);
        for (std::int64_t j = 0; j <= last; ++j) p[j] /= sum;
        for (std::int64_t j = 0; j <= last; ++j) {
          for (std::int64_t e = 0; e < s.dh; ++e) {
            c.heads[((b * s.t + i) * s.h + h) * s.dh + e] += p[j] * c.v[((b * s.t + j) * s.h + h) * s.dh + e];
          }
        }
      }
    }
  }
  c.out = matmul(c.heads, wo, n, hd, s.d);
  return c;
}

struct AttentionGrads {
  Vec dx, dwq, dwk, dwv, dwo;
};

AttentionGrads attention_backward(const AttentionShape& s, const AttentionCache& c, const Vec& x, const Vec& wq,
                                  const Vec& wk, const Vec& wv, const Vec& wo, const Vec& dy) {
  const std::int64_t n = s.b * s.t, hd = s.h * s.dh;
  AttentionGrads g;
  g.dwo = matmul(c.heads, dy, hd, n, s.d, true);
  const Vec dheads = matmul(dy, wo, n, s.d, hd, false, true);
  Vec dq(c.q.size(), 0.0), dk(c.k.size(), 0.0), dv(c.v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dh));
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t h) { return ((b * s.t + t) * s.h + h) * s.dh; };
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.h; ++h) {
      for (std::int64_t i = 0; i < s.t; ++i) {
        const double* p = &c.probs[((b * s.h + h) * s.t + i) * s.t];
        Vec dp(static_cast<std::size_t>(s.t), 0.0);
        double weighted = 0;  // sum_j p_j dp_j: the softmax backward's shift
        for (std::int64_t j = 0; j < s.t; ++j) {
          for (std::int64_t e = 0; e < s.dh; ++e) {
            dp[j] += dheads[at(b, i, h) + e] * c.v[at(b, j, h) + e];
            dv[at(b, j, h) + e] += p[j] * dheads[at(b, i, h) + e];
          }
          weighted += p[j] * dp[j];
        }
        for (std::int64_t j = 0; j < s.t; ++j) {
          const double dscore = p[j] * (dp[j] - weighted) * scale;
          for (std::int64_t e = 0; e < s.dh; ++e) {
            dq[at(b, i, h) + e] += dscore * c.k[at(b, j, h) + e];
            dk[at(b, j, h) + e] += dscore * c.q[at(b, i, h) + e];
          }
        }
      }
    }
  }
  g.dwq = matmul(x, dq, s.d, n, hd, true);
  g.dwk = matmul(x, dk, s.d, n, hd, true);
  g.dwv = matmul(x, dv, s.d, n, hd, true);
  g.dx = matmul(dq, wq, n, hd, s.d, false, true);
  add_to(g.dx, matmul(dk, wk, n, hd, s.d, false, true));
  add_to(g.dx, matmul(dv, wv, n, hd, s.d, false, true));
  return g;
}

// --- layer norm over rows of D, no affine parameters ---

struct LayerNormCache {
  Vec normalized;  // (x - mean) / sigma
  Vec inv_sigma;   // per row
};

LayerNormCache layer_norm_forward(const Vec& x, std::int64_t n, std::int64_t d) {
  LayerNormCache c;
  c.normalized.resize(x.size());
  c.inv_sigma.resize(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    const double* row = &x[r * d];
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < d; ++i) mean += row[i];
    mean /= static_cast<double>(d);
    for (std::int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= static_cast<double>(d);
    c.inv_sigma[r] = 1.0 / std::sqrt(var + kLayerNormEps);
    for (std::int64_t i = 0; i < d; ++i) c.normalized[r * d + i] = (row[i] - mean) * c.inv_sigma[r];
  }
  return c;
}

Vec layer_norm_backward(const LayerNormCache& c, const Vec& dy, std::int64_t n, std::int64_t d) {
  Vec dx(dy.size());
  for (std::int64_t r = 0; r < n; ++r) {
    double mean_dy = 0, mean_dy_xhat = 0;
    for (std::int64_t i = 0; i < d; ++i) {
      mean_dy += dy[r * d + i];
      mean_dy_xhat += dy[r * d + i] * c.normalized[r * d + i];
    }
    mean_dy /= static_cast<double>(d);
    mean_dy_xhat /= static_cast<double>(d);
    for (std::int64_t i = 0; i < d; ++i) {
      dx[r * d + i] = c.inv_sigma[r] * (dy[r * d + i] - mean_dy - c.normalized[r * d + i] * mean_dy_xhat);
    }
  }
  return dx;
}

// --- the step's bookkeeping ---

void finish(DenseStep& step, const Params& params, const DenseTensor& x, const DenseTensor& dy, Vec out, Vec dx,
            double lr) {
  step.output = {x.shape, std::move(out)};
  step.loss = dot(step.output.values, dy.values);
  step.input_grad = {x.shape, std::move(dx)};
  for (const auto& [name, w] : params) {
    const DenseTensor& g = step.grads.at(name);
    DenseTensor u = w;
    for (std::size_t i = 0; i < u.values.size(); ++i) u.values[i] -= lr * g.values[i];
    step.updated[name] = std::move(u);
  }
}

// D of an activation whose last dimension is the model width, and its row count.
std::int64_t rows_of(const DenseTensor& x) {
  if (x.shape.empty()) throw InputError("the input needs at least one dimension (the model width D)");
  return count(x.shape) / std::max<std::int64_t>(x.shape.back(), 1);
}

AttentionShape attention_shape(const DenseTensor& x, const Params& params) {
  if (x.shape.size() != 3) throw InputError("attention's input is [B, T, D]; got " + shape_text(x.shape));
  const auto it = params.find("Wq");
  if (it == params.end() || it->second.shape.size() != 3) {
    throw InputError("parameter Wq is missing or not [D, H, Dh]");
  }
  return {x.shape[0], x.shape[1], x.shape[2], it->second.shape[1], it->second.shape[2]};
}

}  // namespace

DenseTensor dense(const Shape& shape, const std::function<double(const std::vector<std::int64_t>&)>& value) {
  DenseTensor t{shape, Vec(static_cast<std::size_t>(count(shape)))};
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
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::silu: return "silu";
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
    case Activation::relu: return x > 0 ? x : 0.0;
    case Activation::gelu: return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + 0.044715 * x * x * x)));
    case Activation::silu: return x / (1.0 + std::exp(-x));
  }
  return 0;
}

double activate_grad(Activation a, double x) {
  switch (a) {
    case Activation::relu: return x > 0 ? 1.0 : 0.0;
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

std::int64_t moe_capacity(const MoeConfig& config, std::int64_t tokens, std::int64_t experts) {
  if (experts < 1) throw InputError("an MoE layer needs at least one expert (E >= 1)");
  // In double: a large factor must cap at `tokens`, not overflow on the way.
  const double share = std::ceil(config.capacity_factor * static_cast<double>(tokens) *
                                 static_cast<double>(config.top_k) / static_cast<double>(experts));
  return share >= static_cast<double>(tokens) ? tokens : static_cast<std::int64_t>(share);
}

DenseStep mlp_step(const MlpConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                   double lr) {
  check_like(dy, x);
  const std::int64_t n = rows_of(x), d = x.shape.back();
  const std::int64_t f = extent_of(params, "W_in", 2, 1);
  const Vec& w_in = param(params, "W_in", {d, f}).values;
  const Vec& w_out = param(params, "W_out", {f, d}).values;
  const MlpCache c = mlp_forward(config.activation, x.values, w_in, w_out, n, d, f);
  MlpGrads g = mlp_backward(config.activation, c, x.values, w_in, w_out, dy.values, n, d, f);
  DenseStep step;
  step.grads["W_in"] = {{d, f}, std::move(g.dw_in)};
  step.grads["W_out"] = {{f, d}, std::move(g.dw_out)};
  finish(step, params, x, dy, c.out, std::move(g.dx), lr);
  return step;
}

DenseStep attention_step(const AttentionConfig& config, const Params& params, const DenseTensor& x,
                         const DenseTensor& dy, double lr) {
  check_like(dy, x);
  const AttentionShape s = attention_shape(x, params);
  const Vec& wq = param(params, "Wq", {s.d, s.h, s.dh}).values;
  const Vec& wk = param(params, "Wk", {s.d, s.h, s.dh}).values;
  const Vec& wv = param(params, "Wv", {s.d, s.h, s.dh}).values;
  const Vec& wo = param(params, "Wo", {s.h, s.dh, s.d}).values;
  const AttentionCache c = attention_forward(config, s, x.values, wq, wk, wv, wo);
  AttentionGrads g = attention_backward(s, c, x.values, wq, wk, wv, wo, dy.values);
  DenseStep step;
  step.grads["Wq"] = {{s.d, s.h, s.dh}, std::move(g.dwq)};
  step.grads["Wk"] = {{s.d, s.h, s.dh}, std::move(g.dwk)};
  step.grads["Wv"] = {{s.d, s.h, s.dh}, std::move(g.dwv)};
  step.grads["Wo"] = {{s.h, s.dh, s.d}, std::move(g.dwo)};
  finish(step, params, x, dy, c.out, std::move(g.dx), lr);
  return step;
}

DenseStep block_step(const BlockConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                     double lr) {
  check_like(dy, x);
  const AttentionShape s = attention_shape(x, params);
  const std::int64_t n = s.b * s.t, d = s.d;
  const Vec& wq = param(params, "Wq", {d, s.h, s.dh}).values;
  const Vec& wk = param(params, "Wk", {d, s.h, s.dh}).values;
  const Vec& wv = param(params, "Wv", {d, s.h, s.dh}).values;
  const Vec& wo = param(params, "Wo", {s.h, s.dh, d}).values;
  const std::int64_t f = extent_of(params, "W_in", 2, 1);
  const Vec& w_in = param(params, "W_in", {d, f}).values;
  const Vec& w_out = param(params, "W_out", {f, d}).values;
  const Activation act = config.mlp.activation;

  const LayerNormCache ln1 = layer_norm_forward(x.values, n, d);
  const AttentionCache att = attention_forward(config.attention, s, ln1.normalized, wq, wk, wv, wo);
  Vec a = x.values;
  add_to(a, att.out);
  const LayerNormCache ln2 = layer_norm_forward(a, n, d);
  const MlpCache mlp = mlp_forward(act, ln2.normalized, w_in, w_out, n, d, f);
  Vec y = a;
  add_to(y, mlp.out);

  MlpGrads gm = mlp_backward(act, mlp, ln2.normalized, w_in, w_out, dy.values, n, d, f);
  Vec da = dy.values;  // the residual passes dY straight through
  add_to(da, layer_norm_backward(ln2, gm.dx, n, d));
  AttentionGrads ga = attention_backward(s, att, ln1.normalized, wq, wk, wv, wo, da);
  Vec dx = da;
  add_to(dx, layer_norm_backward(ln1, ga.dx, n, d));

  DenseStep step;
  step.grads["Wq"] = {{d, s.h, s.dh}, std::move(ga.dwq)};
  step.grads["Wk"] = {{d, s.h, s.dh}, std::move(ga.dwk)};
  step.grads["Wv"] = {{d, s.h, s.dh}, std::move(ga.dwv)};
  step.grads["Wo"] = {{s.h, s.dh, d}, std::move(ga.dwo)};
  step.grads["W_in"] = {{d, f}, std::move(gm.dw_in)};
  step.grads["W_out"] = {{f, d}, std::move(gm.dw_out)};
  finish(step, params, x, dy, std::move(y), std::move(dx), lr);
  return step;
}

std::vector<std::vector<MoeChoice>> moe_assign(const MoeConfig& config, const std::vector<double>& probs,
                                               std::int64_t tokens, std::int64_t experts) {
  return moe_assign(probs, tokens, experts, config.top_k, moe_capacity(config, tokens, experts));
}

std::vector<std::vector<MoeChoice>> moe_assign(const std::vector<double>& probs, std::int64_t tokens,
                                               std::int64_t experts, std::int64_t top_k, std::int64_t capacity) {
  if (top_k < 1 || top_k > experts) {
    throw InputError("top-k routing needs 1 <= K <= E; got K=" + std::to_string(top_k) + ", E=" + std::to_string(experts));
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

std::vector<std::vector<MoeChoice>> moe_route(const MoeConfig& config, const DenseTensor& x,
                                              const DenseTensor& w_router) {
  if (x.shape.size() != 3) throw InputError("the MoE input is [B, T, D]; got " + shape_text(x.shape));
  const std::int64_t b = x.shape[0], t = x.shape[1], d = x.shape[2];
  if (w_router.shape.size() != 2 || w_router.shape[0] != d) {
    throw InputError("parameter W_router is " + shape_text(w_router.shape) + "; it should be [D, E] with D = " +
                     std::to_string(d));
  }
  const std::int64_t e = w_router.shape[1];
  const Vec probs = softmax_rows(matmul(x.values, w_router.values, b * t, d, e), b * t, e);
  std::vector<std::vector<MoeChoice>> route;
  for (std::int64_t seq = 0; seq < b; ++seq) {
    const Vec mine(probs.begin() + seq * t * e, probs.begin() + (seq + 1) * t * e);
    for (auto& choices : moe_assign(config, mine, t, e)) route.push_back(std::move(choices));
  }
  return route;
}

DenseStep moe_step(const MoeConfig& config, const Params& params, const DenseTensor& x, const DenseTensor& dy,
                   double lr) {
  check_like(dy, x);
  const std::int64_t n = rows_of(x), d = x.shape.back();
  const std::int64_t e = extent_of(params, "W_router", 2, 1), f = extent_of(params, "W_in", 3, 2);
  const DenseTensor& w_router = param(params, "W_router", {d, e});
  const Vec& w_in = param(params, "W_in", {e, d, f}).values;
  const Vec& w_out = param(params, "W_out", {e, f, d}).values;
  const auto route = moe_route(config, x, w_router);

  // Each expert runs once on the rows routed to it (the kept choices, in token order).
  Vec y(static_cast<std::size_t>(n * d), 0.0), dx(y.size(), 0.0);
  Vec dw_in(w_in.size(), 0.0), dw_out(w_out.size(), 0.0);
  Vec dlogits(static_cast<std::size_t>(n * e), 0.0);
  Vec dgate(static_cast<std::size_t>(n * e), 0.0);  // dL/dprob for the kept choices
  for (std::int64_t ex = 0; ex < e; ++ex) {
    std::vector<std::pair<std::int64_t, double>> rows;  // (token, gate)
    for (std::int64_t t = 0; t < n; ++t) {
      for (const MoeChoice& c : route[t]) {
        if (c.kept && c.expert == ex) rows.emplace_back(t, c.gate);
      }
    }
    const std::int64_t m = static_cast<std::int64_t>(rows.size());
    Vec xin(static_cast<std::size_t>(m * d)), dout(xin.size());
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t i = 0; i < d; ++i) {
        xin[r * d + i] = x.values[rows[r].first * d + i];
        dout[r * d + i] = rows[r].second * dy.values[rows[r].first * d + i];
      }
    }
    const Vec wi(w_in.begin() + ex * d * f, w_in.begin() + (ex + 1) * d * f);
    const Vec wo(w_out.begin() + ex * f * d, w_out.begin() + (ex + 1) * f * d);
    const MlpCache c = mlp_forward(config.expert.activation, xin, wi, wo, m, d, f);
    const MlpGrads g = mlp_backward(config.expert.activation, c, xin, wi, wo, dout, m, d, f);
    std::copy(g.dw_in.begin(), g.dw_in.end(), dw_in.begin() + ex * d * f);
    std::copy(g.dw_out.begin(), g.dw_out.end(), dw_out.begin() + ex * f * d);
    for (std::int64_t r = 0; r < m; ++r) {
      const std::int64_t t = rows[r].first;
      double dg = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        y[t * d + i] += rows[r].second * c.out[r * d + i];
        dx[t * d + i] += g.dx[r * d + i];
        dg += dy.values[t * d + i] * c.out[r * d + i];
      }
      dgate[t * e + ex] = dg;
    }
  }
  // The router: softmax backward from the gates' gradients, then through X W_router.
  const Vec probs = softmax_rows(matmul(x.values, w_router.values, n, d, e), n, e);
  for (std::int64_t t = 0; t < n; ++t) {
    const double* p = &probs[t * e];
    double shift = 0;
    for (std::int64_t i = 0; i < e; ++i) shift += p[i] * dgate[t * e + i];
    for (std::int64_t i = 0; i < e; ++i) dlogits[t * e + i] = p[i] * (dgate[t * e + i] - shift);
  }
  DenseStep step;
  step.grads["W_router"] = {{d, e}, matmul(x.values, dlogits, d, n, e, true)};
  add_to(dx, matmul(dlogits, w_router.values, n, e, d, false, true));
  step.grads["W_in"] = {{e, d, f}, std::move(dw_in)};
  step.grads["W_out"] = {{e, f, d}, std::move(dw_out)};
  finish(step, params, x, dy, std::move(y), std::move(dx), lr);
  return step;
}

}  // namespace shardmm::nn
