// The dense single-device step of a program in f64 with plain loops over named letters:
// the oracle `shardmm program --run` and the program tests check every sharded run against.
// It shares nothing with the tape but the op definitions of docs/programs.md.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"

namespace shardmm::nn {

using program::Graph;
using program::GraphOp;
using program::OpKind;

namespace {

// The normalizations' epsilons, the tape's defaults (autodiff/reductions.h).
constexpr double kLayerNormEps = 1e-5;
constexpr double kRmsNormEps = 1e-6;
constexpr double kAdamEps = 1e-8;

// A loop nest's strides of one tensor, by the nest's letters: an element's offset is their dot
// product with the nest's index. Worked out once per loop, not per element (by letter, through
// maps, the loops ran at ~10 MFLOP/s).
using Strides = std::vector<std::int64_t>;

std::int64_t offset(const Index& index, const Strides& strides) {
  std::int64_t o = 0;
  for (std::size_t k = 0; k < index.size(); ++k) o += index[k] * strides[k];
  return o;
}

// The position of `letter` in a loop nest's letters.
std::size_t position(const std::vector<std::string>& nest, const std::string& letter) {
  const auto it = std::find(nest.begin(), nest.end(), letter);
  if (it == nest.end()) throw std::logic_error("a loop of the dense step has no letter " + letter);
  return static_cast<std::size_t>(it - nest.begin());
}

// A tensor's letters with their strides.
struct Layout {
  std::vector<std::string> letters;
  Shape shape;
  std::map<std::string, std::int64_t> stride;
  Layout(const std::vector<std::string>& l, const Shape& s) : letters(l), shape(s) {
    std::int64_t st = 1;
    for (std::size_t i = letters.size(); i-- > 0;) {
      stride[letters[i]] = st;
      st *= shape[i];
    }
  }
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    return n;
  }
  // Its strides along a loop nest over `nest` (0 for a letter it lacks); every letter of the
  // tensor must be one of the nest's.
  Strides along(const std::vector<std::string>& nest) const {
    Strides s(nest.size(), 0);
    for (const std::string& l : letters) s[position(nest, l)] = stride.at(l);
    return s;
  }
};

// Calls f(index) for every index of the letters `letters` sized by `sizes`, row-major:
// index[k] is letters[k]'s value.
template <class F>
void for_each_index(const std::vector<std::string>& letters, const DimSizes& sizes, F&& f) {
  Shape extent;
  for (const std::string& l : letters) {
    extent.push_back(sizes.at(l));
    if (extent.back() == 0) return;
  }
  Index index(letters.size(), 0);
  for (;;) {
    f(index);
    std::size_t d = letters.size();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < extent[d]) break;
      index[d] = 0;
    }
  }
}

double unary(const std::string& f, double x) {
  if (f == "tanh") return std::tanh(x);
  if (f == "exp") return std::exp(x);
  return activate(parse_activation(f), x);
}

double unary_grad(const std::string& f, double x) {
  if (f == "tanh") return 1 - std::tanh(x) * std::tanh(x);
  if (f == "exp") return std::exp(x);
  return activate_grad(parse_activation(f), x);
}

class DenseProgram {
 public:
  DenseProgram(const Graph& g, const ProgramOptions& o) : g_(g), o_(o) {
    step_.values.resize(g.tensors.size());
    for (int i : g.leaves()) {
      const auto& t = g.tensors[static_cast<std::size_t>(i)];
      const DistTensor::Generator gen = leaf_values(g, i, o);
      step_.values[static_cast<std::size_t>(i)] =
          dense(t.shape, [&](const std::vector<std::int64_t>& idx) { return gen(idx, 0); });
    }
  }

  DenseProgramStep run() {
    for (const GraphOp& op : g_.ops) forward(op);
    if (!o_.train || g_.loss < 0) return std::move(step_);
    grads_.resize(g_.tensors.size());
    for (std::size_t i = 0; i < g_.tensors.size(); ++i) grads_[i].assign(step_.values[i].values.size(), 0.0);
    grads_[static_cast<std::size_t>(g_.loss)][0] = 1.0;
    for (std::size_t k = g_.ops.size(); k-- > 0;) backward(g_.ops[k]);
    step_.grads.resize(g_.tensors.size());
    step_.updated.resize(g_.tensors.size());
    for (int i : g_.leaves()) {
      const auto u = static_cast<std::size_t>(i);
      step_.grads[u] = {step_.values[u].shape, grads_[u]};
      if (g_.tensors[u].role != program::Role::param) continue;
      DenseTensor w = step_.values[u];
      for (std::size_t e = 0; e < w.values.size(); ++e)
        w.values[e] = updated_value(o_.optimizer, w.values[e], grads_[u][e], o_.lr);
      step_.updated[u] = std::move(w);
    }
    return std::move(step_);
  }

 private:
  const program::Tensor& tensor(int i) const { return g_.tensors[static_cast<std::size_t>(i)]; }
  std::vector<double>& value(int i) { return step_.values[static_cast<std::size_t>(i)].values; }
  std::vector<double>& grad(int i) { return grads_[static_cast<std::size_t>(i)]; }
  Layout layout(int i) const { return Layout(tensor(i).letters, tensor(i).shape); }

  // The letters of the op's operands and result together (an einsum's loop nest).
  std::vector<std::string> all_letters(const GraphOp& op) const {
    std::vector<std::string> out = tensor(op.result).letters;
    for (int x : op.operands) {
      for (const std::string& l : tensor(x).letters) {
        if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
      }
    }
    return out;
  }

  // The rows of a reduction or normalization over `over`: f(offset of the row's first
  // element in x, the stride along `over`, its length, offset of the row's slot in out).
  template <class F>
  void for_each_row(int x, const std::string& over, const Layout* out, F&& f) const {
    const Layout in = layout(x);
    std::vector<std::string> rest;
    for (const std::string& l : in.letters) {
      if (l != over) rest.push_back(l);
    }
    const std::int64_t n = over.empty() ? in.elements() : g_.dims.at(over);
    const std::int64_t stride = over.empty() ? 1 : in.stride.at(over);
    if (over.empty()) {
      f(0, 1, n, 0);
      return;
    }
    Strides in_strides;  // `over` at 0
    for (const std::string& l : rest) in_strides.push_back(in.stride.at(l));
    const Strides out_strides = out ? out->along(rest) : in_strides;
    for_each_index(rest, g_.dims, [&](const Index& idx) {
      f(offset(idx, in_strides), stride, n, offset(idx, out_strides));
    });
  }

  void forward(const GraphOp& op) {
    const int r = op.result;
    const Layout out = layout(r);
    auto& y = step_.values[static_cast<std::size_t>(r)];
    y.shape = out.shape;
    y.values.assign(static_cast<std::size_t>(out.elements()), 0.0);
    const int a = op.operands[0];
    const Layout la = layout(a);
    const std::vector<double>& va = value(a);
    switch (op.op.kind) {
      case OpKind::einsum:
      case OpKind::binary: {
        const int b = op.operands[1];
        const Layout lb = layout(b);
        const std::vector<double>& vb = value(b);
        const std::string& f = op.op.function;
        const std::vector<std::string> nest = all_letters(op);
        const Strides sa = la.along(nest), sb = lb.along(nest), sy = out.along(nest);
        for_each_index(nest, g_.dims, [&](const Index& i) {
          const double x = va[offset(i, sa)], z = vb[offset(i, sb)];
          double& dst = y.values[offset(i, sy)];
          if (op.op.kind == OpKind::einsum) {
            dst += x * z;
          } else {
            dst = f == "add" ? x + z : f == "sub" ? x - z : x * z;
          }
        });
        break;
      }
      case OpKind::unary:
        for (std::size_t i = 0; i < va.size(); ++i) y.values[i] = unary(op.op.function, va[i]);
        break;
      case OpKind::scale:
        for (std::size_t i = 0; i < va.size(); ++i) y.values[i] = op.op.constant * va[i];
        break;
      case OpKind::causal_mask: {
        const Strides sa = la.along(la.letters);
        const std::size_t to = position(la.letters, op.op.to[0]), from = position(la.letters, op.op.from[0]);
        for_each_index(la.letters, g_.dims, [&](const Index& i) {
          const std::int64_t o = offset(i, sa);
          y.values[o] = i[to] <= i[from] ? va[o] : -std::numeric_limits<double>::infinity();
        });
        break;
      }
      case OpKind::transpose:
      case OpKind::rename:
      case OpKind::split:
      case OpKind::merge:
        if (op.op.kind == OpKind::transpose) {
          const Strides sa = la.along(la.letters), sy = out.along(la.letters);
          for_each_index(la.letters, g_.dims, [&](const Index& i) { y.values[offset(i, sy)] = va[offset(i, sa)]; });
        } else {
          y.values = va;  // the same elements in the same order under other letters
        }
        break;
      case OpKind::route:
        route(op, la, va, out, y.values);
        break;
      case OpKind::reduce: {
        const std::string& f = op.op.function;
        for_each_row(a, op.op.over, &out, [&](std::int64_t base, std::int64_t st, std::int64_t n, std::int64_t o) {
          double acc = f == "max" ? -std::numeric_limits<double>::infinity() : 0.0;
          for (std::int64_t k = 0; k < n; ++k) {
            const double v = va[base + k * st];
            acc = f == "max" ? std::max(acc, v) : acc + v;
          }
          y.values[o] = f == "mean" ? acc / static_cast<double>(n) : acc;
        });
        break;
      }
      case OpKind::normalize:
        for_each_row(a, op.op.over, nullptr, [&](std::int64_t base, std::int64_t st, std::int64_t n, std::int64_t) {
          normalize_row(op.op.function, &va[base], &y.values[base], st, n);
        });
        break;
    }
  }

  // Each group's (every index of the letters besides the tokens and the experts) routing:
  // a 1 at (token, expert, slot) for every choice an expert keeps.
  void route(const GraphOp& op, const Layout& probs, const std::vector<double>& p, const Layout& out,
             std::vector<double>& y) const {
    const std::string &experts = op.op.over, &tokens = op.op.from[0], &slots = out.letters.back();
    std::vector<std::string> groups;
    for (const std::string& l : probs.letters) {
      if (l != experts && l != tokens) groups.push_back(l);
    }
    const std::int64_t nt = g_.dims.at(tokens), ne = g_.dims.at(experts), nc = g_.dims.at(slots);
    // The groups' letters, then the tokens, the experts and the slots.
    std::vector<std::string> nest = groups;
    nest.insert(nest.end(), {tokens, experts, slots});
    const Strides sp = probs.along(nest), sy = out.along(nest);
    const std::size_t t = groups.size(), e = t + 1, c = t + 2;
    for_each_index(groups, g_.dims, [&](const Index& group) {
      Index i = group;
      i.resize(nest.size(), 0);
      std::vector<double> mine(static_cast<std::size_t>(nt * ne));
      for (i[t] = 0; i[t] < nt; ++i[t]) {
        for (i[e] = 0; i[e] < ne; ++i[e]) mine[static_cast<std::size_t>(i[t] * ne + i[e])] = p[offset(i, sp)];
      }
      const auto choices = moe_assign(mine, nt, ne, op.op.top, nc);
      for (i[t] = 0; i[t] < nt; ++i[t]) {
        for (const MoeChoice& choice : choices[static_cast<std::size_t>(i[t])]) {
          if (!choice.kept) continue;
          i[e] = choice.expert;
          i[c] = choice.slot;
          y[offset(i, sy)] = 1.0;
        }
      }
    });
  }

  // A norm's row statistics: the mean it subtracts (0 for rms_norm) and 1 / the scale it divides by.
  static std::pair<double, double> norm_stats(const std::string& f, const double* x, std::int64_t st, std::int64_t n) {
    const double count = static_cast<double>(n);
    double mean = 0, sq = 0;
    if (f == "layer_norm") {
      for (std::int64_t k = 0; k < n; ++k) mean += x[k * st];
      mean /= count;
    }
    for (std::int64_t k = 0; k < n; ++k) sq += (x[k * st] - mean) * (x[k * st] - mean);
    return {mean, 1 / std::sqrt(sq / count + (f == "layer_norm" ? kLayerNormEps : kRmsNormEps))};
  }

  static void normalize_row(const std::string& f, const double* x, double* y, std::int64_t st, std::int64_t n) {
    if (f == "softmax") {
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (std::int64_t k = 0; k < n; ++k) m = std::max(m, x[k * st]);
      for (std::int64_t k = 0; k < n; ++k) s += std::exp(x[k * st] - m);
      for (std::int64_t k = 0; k < n; ++k) y[k * st] = std::exp(x[k * st] - m) / s;
    } else {
      const auto [mean, inv] = norm_stats(f, x, st, n);
      for (std::int64_t k = 0; k < n; ++k) y[k * st] = (x[k * st] - mean) * inv;
    }
  }

  void backward(const GraphOp& op) {
    const int r = op.result, a = op.operands[0];
    const std::vector<double>& gy = grad(r);
    const std::vector<double>& va = value(a);
    const std::vector<double>& vy = value(r);
    std::vector<double>& ga = grad(a);
    const Layout out = layout(r), la = layout(a);
    switch (op.op.kind) {
      case OpKind::einsum:
      case OpKind::binary: {
        const int b = op.operands[1];
        const Layout lb = layout(b);
        const std::vector<double>& vb = value(b);
        std::vector<double>& gb = grad(b);
        const std::string& f = op.op.function;
        const std::vector<std::string> nest = all_letters(op);
        const Strides sa = la.along(nest), sb = lb.along(nest), sy = out.along(nest);
        for_each_index(nest, g_.dims, [&](const Index& i) {
          const double g = gy[offset(i, sy)];
          const std::int64_t ia = offset(i, sa), ib = offset(i, sb);
          if (op.op.kind == OpKind::einsum || f == "mul") {
            ga[ia] += g * vb[ib];
            gb[ib] += g * va[ia];
          } else {
            ga[ia] += g;
            gb[ib] += f == "add" ? g : -g;
          }
        });
        break;
      }
      case OpKind::unary:
        for (std::size_t i = 0; i < va.size(); ++i) ga[i] += gy[i] * unary_grad(op.op.function, va[i]);
        break;
      case OpKind::scale:
        for (std::size_t i = 0; i < va.size(); ++i) ga[i] += op.op.constant * gy[i];
        break;
      case OpKind::causal_mask: {
        const Strides sa = la.along(la.letters);
        const std::size_t to = position(la.letters, op.op.to[0]), from = position(la.letters, op.op.from[0]);
        for_each_index(la.letters, g_.dims, [&](const Index& i) {
          const std::int64_t o = offset(i, sa);
          if (i[to] <= i[from]) ga[o] += gy[o];
        });
        break;
      }
      case OpKind::transpose: {
        const Strides sa = la.along(la.letters), sy = out.along(la.letters);
        for_each_index(la.letters, g_.dims, [&](const Index& i) { ga[offset(i, sa)] += gy[offset(i, sy)]; });
        break;
      }
      case OpKind::rename:
      case OpKind::split:
      case OpKind::merge:
        for (std::size_t i = 0; i < va.size(); ++i) ga[i] += gy[i];
        break;
      case OpKind::route:
        break;  // routing is data: no gradient
      case OpKind::reduce: {
        const std::string& f = op.op.function;
        for_each_row(a, op.op.over, &out, [&](std::int64_t base, std::int64_t st, std::int64_t n, std::int64_t o) {
          if (f != "max") {
            const double g = f == "mean" ? gy[o] / static_cast<double>(n) : gy[o];
            for (std::int64_t k = 0; k < n; ++k) ga[base + k * st] += g;
            return;
          }
          // The gradient is split evenly among the elements equal to the max (torch.amax).
          std::int64_t ties = 0;
          for (std::int64_t k = 0; k < n; ++k) ties += va[base + k * st] == vy[o];
          for (std::int64_t k = 0; k < n; ++k) {
            if (va[base + k * st] == vy[o]) ga[base + k * st] += gy[o] / static_cast<double>(ties);
          }
        });
        break;
      }
      case OpKind::normalize:
        for_each_row(a, op.op.over, nullptr, [&](std::int64_t base, std::int64_t st, std::int64_t n, std::int64_t) {
          normalize_row_grad(op.op.function, &va[base], &vy[base], &gy[base], &ga[base], st, n);
        });
        break;
    }
  }

  static void normalize_row_grad(const std::string& f, const double* x, const double* y, const double* g, double* gx,
                                 std::int64_t st, std::int64_t n) {
    const double count = static_cast<double>(n);
    double gy = 0, gsum = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      gy += g[k * st] * (f == "rms_norm" ? x[k * st] : y[k * st]);
      gsum += g[k * st];
    }
    if (f == "softmax") {
      for (std::int64_t k = 0; k < n; ++k) gx[k * st] += y[k * st] * (g[k * st] - gy);
    } else if (f == "layer_norm") {
      const double inv = norm_stats(f, x, st, n).second;
      for (std::int64_t k = 0; k < n; ++k) gx[k * st] += inv * (g[k * st] - gsum / count - y[k * st] * gy / count);
    } else {
      const double inv = norm_stats(f, x, st, n).second;
      for (std::int64_t k = 0; k < n; ++k) gx[k * st] += g[k * st] * inv - x[k * st] * gy * inv * inv * inv / count;
    }
  }

  const Graph& g_;
  const ProgramOptions& o_;
  DenseProgramStep step_;
  std::vector<std::vector<double>> grads_;
};

}  // namespace

double updated_value(Optimizer o, double w, double g, double lr) {
  if (o == Optimizer::sgd) return w - lr * g;
  // Adam's first step: m = (1 - b1) g and v = (1 - b2) g^2, bias-corrected to g and g^2.
  return w - lr * g / (std::abs(g) + kAdamEps);
}

DenseProgramStep dense_program_step(const Graph& g, const ProgramOptions& options) {
  return DenseProgram(g, options).run();
}

}  // namespace shardmm::nn
