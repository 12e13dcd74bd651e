// Random sharded programs for the autodiff tests: generated once (a symbolic tape keeps
// track of the layouts), then replayed on executed tapes (any backend), on one device,
// and on a dense single-device interpreter written independently of the library's ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "autodiff_testing.h"
#include "dense_reference.h"
#include "random_cases.h"
#include "shardmm/autodiff/reductions.h"
#include "shardmm/autodiff/shape_ops.h"
#include "shardmm/autodiff/tape.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::testing {

// The ops "over" a dimension (reductions.h) take it from Instr::dim; softmax and layer_norm
// are tape.h's, over the last dimension.
enum class Kind {
  local_einsum,
  planned_einsum,
  relu,
  gelu,
  silu,
  swiglu,
  add,
  softmax,
  layer_norm,
  reshard,
  all_gather,
  all_to_all,
  slice,
  reduce_scatter,
  all_reduce,
  mul,
  scale,
  rename,
  sum,
  mean,
  reduce_sum,
  reduce_mean,
  reduce_max,
  softmax_over,
  layer_norm_over,
  rms_norm_over,
  tanh,
  exp,
  binary_add,
  binary_sub,
  binary_mul,
  transpose,
  split,
  merge
};
constexpr Kind kLastKind = Kind::merge;
inline const char* kind_name(Kind k) {
  static const char* names[] = {"local_einsum",
                                "planned_einsum",
                                "relu",
                                "gelu",
                                "silu",
                                "swiglu",
                                "add",
                                "softmax",
                                "layer_norm",
                                "reshard",
                                "all_gather",
                                "all_to_all",
                                "slice",
                                "reduce_scatter",
                                "all_reduce",
                                "mul",
                                "scale",
                                "rename",
                                "sum",
                                "mean",
                                "reduce_sum",
                                "reduce_mean",
                                "reduce_max",
                                "softmax_over",
                                "layer_norm_over",
                                "rms_norm_over",
                                "tanh",
                                "exp",
                                "binary_add",
                                "binary_sub",
                                "binary_mul",
                                "transpose",
                                "split",
                                "merge"};
  static_assert(std::size(names) == static_cast<std::size_t>(kLastKind) + 1);
  return names[static_cast<int>(k)];
}

// One op; operands index the program's values (leaves first, then each op's result).
struct Instr {
  Kind kind = Kind::sum;
  std::vector<int> args = {};
  std::vector<std::string> out_dims = {};  // einsums, binary, transpose; merge's letters
  Spec spec = {};                          // reshard target, planned einsum output
  std::string dim = {}, dim2 = {};         // collectives; split's letter, merge's result
  AxisList axes = {};
  double factor = 1;                                             // scale
  autodiff::Gathered keep = autodiff::Gathered::kept;            // all_gather
  std::vector<std::pair<std::string, std::int64_t>> parts = {};  // split
};

struct Leaf {
  Spec spec;
  Shape shape;
  std::uint64_t seed;
};

inline Leaf leaf(const Mesh& mesh, const char* spec, Shape shape, std::uint64_t seed) {
  return {parse_spec(spec, mesh), std::move(shape), seed};
}

struct Program {
  Mesh mesh;
  std::vector<Leaf> leaves;
  std::vector<Instr> ops;  // the last one is the loss
  std::string text;        // for failure messages
};

// ---- replay on a tape (executed or symbolic). With `one_device`, every spec loses its
// axes and the layout-only ops vanish: the same program on a single device.
inline Spec strip(Spec s) {
  for (DimSpec& d : s.dims) d.axes.clear();
  s.unreduced.clear();
  return s;
}

// Records one op on a tape; `v` holds the program's values so far.
inline autodiff::Var apply_op(const Instr& in, const std::vector<autodiff::Var>& v, bool one_device) {
  using namespace autodiff;
  const auto arg = [&](std::size_t i) { return v[static_cast<std::size_t>(in.args[i])]; };
  switch (in.kind) {
    case Kind::local_einsum:
      return einsum(arg(0), arg(1), in.out_dims);
    case Kind::planned_einsum:
      return one_device ? einsum(arg(0), arg(1), in.out_dims) : planned_einsum(arg(0), arg(1), in.spec);
    case Kind::relu:
      return relu(arg(0));
    case Kind::gelu:
      return gelu(arg(0));
    case Kind::silu:
      return silu(arg(0));
    case Kind::swiglu:
      return swiglu(arg(0), arg(1));
    case Kind::add:
      return add(arg(0), arg(1));
    case Kind::softmax:
      return softmax(arg(0));
    case Kind::layer_norm:
      return layer_norm(arg(0), arg(1), arg(2));
    case Kind::reshard:
      return one_device ? arg(0) : reshard(arg(0), in.spec);
    case Kind::all_gather:
      return one_device ? arg(0) : all_gather(arg(0), in.dim, in.axes, in.keep);
    case Kind::all_to_all:
      return one_device ? arg(0) : all_to_all(arg(0), in.dim, in.dim2, in.axes);
    case Kind::slice:
      return one_device ? arg(0) : slice(arg(0), in.dim, in.axes);
    case Kind::reduce_scatter:
      return one_device ? arg(0) : reduce_scatter(arg(0), in.dim, in.axes);
    case Kind::all_reduce:
      return one_device ? arg(0) : all_reduce(arg(0), in.axes);
    case Kind::mul:
      return mul(arg(0), arg(1));
    case Kind::scale:
      return scale(arg(0), in.factor);
    case Kind::rename:
      return rename(arg(0), in.dim, in.dim2);
    case Kind::tanh:
      return autodiff::tanh(arg(0));
    case Kind::exp:
      return autodiff::exp(arg(0));
    case Kind::binary_add:
      return binary(arg(0), arg(1), BinaryOp::add, in.out_dims);
    case Kind::binary_sub:
      return binary(arg(0), arg(1), BinaryOp::sub, in.out_dims);
    case Kind::binary_mul:
      return binary(arg(0), arg(1), BinaryOp::mul, in.out_dims);
    case Kind::transpose:
      return transpose(arg(0), in.out_dims);
    case Kind::split:
      return split_dim(arg(0), in.dim, in.parts);
    case Kind::merge:
      return merge_dims(arg(0), in.out_dims, in.dim);
    case Kind::sum:
      return sum(arg(0));
    case Kind::mean:
      return mean(arg(0));
    case Kind::reduce_sum:
      return reduce_sum(arg(0), in.dim);
    case Kind::reduce_mean:
      return reduce_mean(arg(0), in.dim);
    case Kind::reduce_max:
      return reduce_max(arg(0), in.dim);
    case Kind::softmax_over:
      return softmax(arg(0), in.dim);
    case Kind::layer_norm_over:
      return layer_norm(arg(0), in.dim);
    case Kind::rms_norm_over:
      return rms_norm(arg(0), in.dim);
  }
  return {};
}

// The program's values on `tape`: leaves, then each op's result.
inline std::vector<autodiff::Var> replay(autodiff::Tape& tape, const Program& p, bool one_device = false) {
  std::vector<autodiff::Var> v;
  for (const Leaf& l : p.leaves) {
    v.push_back(tape.input(one_device ? strip(l.spec) : l.spec, l.shape, uniform_values(l.seed), true));
  }
  for (const Instr& in : p.ops) v.push_back(apply_op(in, v, one_device));
  return v;
}

// ---- the dense interpreter: plain loops over logical tensors, in double.
struct Dense {
  std::vector<std::string> dims;
  Shape shape;
  std::vector<double> v;
};

inline double dense_act(Kind k, double x) {
  switch (k) {
    case Kind::relu:
      return x > 0 ? x : 0;
    case Kind::gelu:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Kind::silu:
      return x / (1 + std::exp(-x));
    default:
      return 0;
  }
}

// Calls f(base, stride, n) for each row of `t` along dimension `dim` (its element i at
// base + i * stride), rows in the row-major order of t's other dimensions.
template <class F>
void dense_rows(const Dense& t, const std::string& dim, F f) {
  const auto d = static_cast<std::size_t>(std::find(t.dims.begin(), t.dims.end(), dim) - t.dims.begin());
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    if (i < d) outer *= t.shape[i];
    if (i > d) inner *= t.shape[i];
  }
  const std::int64_t n = t.shape.at(d);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t k = 0; k < inner; ++k) f(o * n * inner + k, inner, n);
  }
}

// `t` without dimension `dim`, each row replaced by f(row): the reductions.
template <class F>
Dense dense_reduce(const Dense& t, const std::string& dim, F f) {
  Dense out = t;
  const auto d = std::find(out.dims.begin(), out.dims.end(), dim) - out.dims.begin();
  out.dims.erase(out.dims.begin() + d);
  out.shape.erase(out.shape.begin() + d);
  out.v.clear();
  dense_rows(t, dim, [&](std::int64_t base, std::int64_t stride, std::int64_t n) {
    std::vector<double> row;
    for (std::int64_t i = 0; i < n; ++i) row.push_back(t.v[static_cast<std::size_t>(base + i * stride)]);
    out.v.push_back(f(row));
  });
  return out;
}

// Each row of `t` along `dim` replaced by f(row) (a row of the same length): the normalizations.
template <class F>
void dense_normalize(Dense& t, const std::string& dim, F f) {
  dense_rows(t, dim, [&](std::int64_t base, std::int64_t stride, std::int64_t n) {
    std::vector<double> row;
    for (std::int64_t i = 0; i < n; ++i) row.push_back(t.v[static_cast<std::size_t>(base + i * stride)]);
    row = f(std::move(row));
    for (std::int64_t i = 0; i < n; ++i) {
      t.v[static_cast<std::size_t>(base + i * stride)] = row[static_cast<std::size_t>(i)];
    }
  });
}

inline double dense_sum(const std::vector<double>& row) {
  double s = 0;
  for (double x : row) s += x;
  return s;
}

inline std::size_t letter_index(const std::vector<std::string>& dims, const std::string& l) {
  return static_cast<std::size_t>(std::find(dims.begin(), dims.end(), l) - dims.begin());
}

// x's value at each index of a tensor of letters `dims` and extents `shape` (row-major), read
// by letter: x broadcast over the letters it lacks, permuted to their order.
inline std::vector<double> dense_read(const Dense& x, const std::vector<std::string>& dims, const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  std::vector<double> out(static_cast<std::size_t>(n));
  Index at(dims.size());
  for (std::int64_t pos = 0; pos < n; ++pos) {
    std::int64_t rest = pos;
    for (std::size_t i = dims.size(); i-- > 0;) {
      at[i] = rest % shape[i];
      rest /= shape[i];
    }
    std::int64_t src = 0;
    for (std::size_t j = 0; j < x.dims.size(); ++j) {
      src = src * x.shape[j] + at[letter_index(dims, x.dims[j])];
    }
    out[static_cast<std::size_t>(pos)] = x.v[static_cast<std::size_t>(src)];
  }
  return out;
}

// The loss of program `p` with leaf values `leaves` (dense, row-major).
inline double dense_loss(const Program& p, const std::vector<std::vector<double>>& leaves) {
  std::vector<Dense> v;
  for (std::size_t i = 0; i < p.leaves.size(); ++i)
    v.push_back({dim_names(p.leaves[i].spec), p.leaves[i].shape, leaves[i]});
  for (const Instr& in : p.ops) {
    const auto arg = [&](std::size_t i) -> const Dense& { return v[static_cast<std::size_t>(in.args[i])]; };
    Dense out = arg(0);
    const std::int64_t n = out.shape.empty() ? 1 : out.shape.back();
    const std::int64_t rows = n == 0 ? 0 : static_cast<std::int64_t>(out.v.size()) / n;
    switch (in.kind) {
      case Kind::local_einsum:
      case Kind::planned_einsum: {
        DimSizes sizes;
        for (const Dense* d : {&arg(0), &arg(1)}) {
          for (std::size_t i = 0; i < d->dims.size(); ++i) sizes[d->dims[i]] = d->shape[i];
        }
        out.dims = in.out_dims;
        out.shape.clear();
        for (const std::string& d : in.out_dims) out.shape.push_back(sizes.at(d));
        out.v = dense_einsum(arg(0).dims, arg(0).v, arg(1).dims, arg(1).v, in.out_dims, sizes);
        break;
      }
      case Kind::relu:
      case Kind::gelu:
      case Kind::silu:
        for (double& x : out.v) x = dense_act(in.kind, x);
        break;
      case Kind::swiglu:
        for (std::size_t i = 0; i < out.v.size(); ++i) out.v[i] = dense_act(Kind::silu, arg(0).v[i]) * arg(1).v[i];
        break;
      case Kind::add:
        for (std::size_t i = 0; i < out.v.size(); ++i) out.v[i] += arg(1).v[i];
        break;
      case Kind::mul:
        for (std::size_t i = 0; i < out.v.size(); ++i) out.v[i] *= arg(1).v[i];
        break;
      case Kind::scale:
        for (double& x : out.v) x *= in.factor;
        break;
      case Kind::rename:
        *std::find(out.dims.begin(), out.dims.end(), in.dim) = in.dim2;
        break;
      case Kind::tanh:
        for (double& x : out.v) x = std::tanh(x);
        break;
      case Kind::exp:
        for (double& x : out.v) x = std::exp(x);
        break;
      case Kind::binary_add:
      case Kind::binary_sub:
      case Kind::binary_mul: {
        out.dims = in.out_dims;
        out.shape.clear();
        for (const std::string& l : in.out_dims) {
          const Dense& from = std::count(arg(0).dims.begin(), arg(0).dims.end(), l) ? arg(0) : arg(1);
          out.shape.push_back(from.shape[letter_index(from.dims, l)]);
        }
        const std::vector<double> x = dense_read(arg(0), out.dims, out.shape);
        const std::vector<double> z = dense_read(arg(1), out.dims, out.shape);
        out.v.resize(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          out.v[i] = in.kind == Kind::binary_add   ? x[i] + z[i]
                     : in.kind == Kind::binary_sub ? x[i] - z[i]
                                                   : x[i] * z[i];
        }
        break;
      }
      case Kind::transpose:
        out.dims = in.out_dims;
        for (std::size_t i = 0; i < out.dims.size(); ++i) {
          out.shape[i] = arg(0).shape[letter_index(arg(0).dims, out.dims[i])];
        }
        out.v = dense_read(arg(0), out.dims, out.shape);
        break;
      case Kind::split: {  // row-major: the values stay where they are
        const auto at = std::find(out.dims.begin(), out.dims.end(), in.dim) - out.dims.begin();
        out.dims.erase(out.dims.begin() + at);
        out.shape.erase(out.shape.begin() + at);
        for (std::size_t i = 0; i < in.parts.size(); ++i) {
          out.dims.insert(out.dims.begin() + at + static_cast<std::ptrdiff_t>(i), in.parts[i].first);
          out.shape.insert(out.shape.begin() + at + static_cast<std::ptrdiff_t>(i), in.parts[i].second);
        }
        break;
      }
      case Kind::merge: {
        const auto at = std::find(out.dims.begin(), out.dims.end(), in.out_dims[0]) - out.dims.begin();
        const auto end = at + static_cast<std::ptrdiff_t>(in.out_dims.size());
        std::int64_t merged = 1;
        for (auto i = at; i < end; ++i) merged *= out.shape[static_cast<std::size_t>(i)];
        out.dims.erase(out.dims.begin() + at + 1, out.dims.begin() + end);
        out.shape.erase(out.shape.begin() + at + 1, out.shape.begin() + end);
        out.dims[static_cast<std::size_t>(at)] = in.dim;
        out.shape[static_cast<std::size_t>(at)] = merged;
        break;
      }
      case Kind::softmax:
        for (std::int64_t r = 0; r < rows; ++r) {
          double* x = out.v.data() + r * n;
          double m = x[0], s = 0;
          for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
          for (std::int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
          for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - m) / s;
        }
        break;
      case Kind::layer_norm:
        for (std::int64_t r = 0; r < rows; ++r) {
          double* x = out.v.data() + r * n;
          double mu = 0, var = 0;
          for (std::int64_t i = 0; i < n; ++i) mu += x[i] / static_cast<double>(n);
          for (std::int64_t i = 0; i < n; ++i) var += (x[i] - mu) * (x[i] - mu) / static_cast<double>(n);
          for (std::int64_t i = 0; i < n; ++i) {
            x[i] = (x[i] - mu) / std::sqrt(var + 1e-5) * arg(1).v[static_cast<std::size_t>(i)] +
                   arg(2).v[static_cast<std::size_t>(i)];
          }
        }
        break;
      case Kind::reduce_sum:
        out = dense_reduce(out, in.dim, dense_sum);
        break;
      case Kind::reduce_mean:
        out = dense_reduce(out, in.dim,
                           [](const std::vector<double>& r) { return dense_sum(r) / static_cast<double>(r.size()); });
        break;
      case Kind::reduce_max:
        out = dense_reduce(out, in.dim, [](const std::vector<double>& r) {
          return r.empty() ? -INFINITY : *std::max_element(r.begin(), r.end());
        });
        break;
      case Kind::softmax_over:
        dense_normalize(out, in.dim, [](std::vector<double> r) {
          const double m = r.empty() ? 0 : *std::max_element(r.begin(), r.end());
          double s = 0;
          for (double x : r) s += std::exp(x - m);
          for (double& x : r) x = std::exp(x - m) / s;
          return r;
        });
        break;
      case Kind::layer_norm_over:
      case Kind::rms_norm_over:
        dense_normalize(out, in.dim, [center = in.kind == Kind::layer_norm_over](std::vector<double> r) {
          const double n = static_cast<double>(r.size());
          const double mu = center ? dense_sum(r) / n : 0;
          double var = 0;
          for (double x : r) var += (x - mu) * (x - mu) / n;
          for (double& x : r) x = (x - mu) / std::sqrt(var + (center ? 1e-5 : 1e-6));
          return r;
        });
        break;
      case Kind::sum:
      case Kind::mean: {
        double s = 0;
        for (double x : out.v) s += x;
        if (in.kind == Kind::mean) s /= static_cast<double>(out.v.size());
        out = {{}, {}, {s}};
        break;
      }
      default:  // layouts only
        break;
    }
    v.push_back(std::move(out));
  }
  return v.back().v.at(0);
}

// The leaves' logical values.
inline std::vector<std::vector<double>> dense_leaves(const Program& p) {
  std::vector<std::vector<double>> out;
  for (const Leaf& l : p.leaves)
    out.push_back(dense_logical(p.mesh, l.spec, l.shape, DType::f64, uniform_values(l.seed)));
  return out;
}

// Central differences of the dense loss for every element of every leaf, Richardson-
// extrapolated from steps h and h/2: the error is O(h^4), not O(h^2). A layer norm of nearly
// constant rows (a softmax's, say) divides by a small deviation, and its high derivatives
// then put a plain central difference 0.2% off a correct gradient.
inline std::vector<std::vector<double>> finite_differences(const Program& p, double h = 1e-5) {
  std::vector<std::vector<double>> x = dense_leaves(p), grads;
  for (std::size_t l = 0; l < x.size(); ++l) {
    grads.emplace_back(x[l].size());
    for (std::size_t i = 0; i < x[l].size(); ++i) {
      const double keep = x[l][i];
      const auto central = [&](double step) {
        x[l][i] = keep + step;
        const double up = dense_loss(p, x);
        x[l][i] = keep - step;
        const double down = dense_loss(p, x);
        x[l][i] = keep;
        return (up - down) / (2 * step);
      };
      grads[l][i] = (4 * central(h / 2) - central(h)) / 3;
    }
  }
  return grads;
}

// ---- generation
class ProgramGenerator {
 public:
  explicit ProgramGenerator(Rng& rng) : rng_(rng) {}

  Program generate(const Mesh& mesh, int length) {
    p_ = Program{mesh, {}, {}, ""};
    tape_ = std::make_unique<autodiff::Tape>(mesh, autodiff::TapeOptions{DType::f64});
    vars_.clear();
    next_letter_ = 0;
    const std::string i = letter(), j = letter();
    int cur = leaf(whole_spec("X", {i, j}), {size(), size()});
    for (int step = 0; step < length; ++step) cur = random_op(cur);
    cur = push({uniform(rng_, 0, 1) ? Kind::mean : Kind::sum, {cur}});
    p_.text = "mesh " + mesh.to_string() + ": ";
    for (std::size_t k = 0; k < p_.ops.size(); ++k) {
      p_.text += std::string(kind_name(p_.ops[k].kind)) + " -> " +
                 format_spec(vars_[p_.leaves.size() + k].spec(), mesh) + "; ";
    }
    return p_;
  }

  // The symbolic tape the program was generated on (backward not yet run).
  autodiff::Tape& symbolic_tape() { return *tape_; }

 private:
  // I..W, then I1..W1, and so on (the shape ops use up letters).
  std::string letter() {
    const int n = next_letter_++;
    std::string l(1, "IJKLMNOPQRSTUVW"[n % 15]);
    return n < 15 ? l : l + std::to_string(n / 15);
  }
  std::int64_t size() { return uniform(rng_, 1, 5); }

  int leaf(Spec spec, Shape shape) {
    p_.leaves.push_back({spec, shape, static_cast<std::uint64_t>(p_.leaves.size() * 7919 + 17)});
    // Leaves come before every op in `replay`: keep the values list in that order.
    vars_.insert(vars_.begin() + static_cast<std::ptrdiff_t>(p_.leaves.size() - 1),
                 tape_->input(spec, shape, uniform_values(0), true));
    for (Instr& in : p_.ops) {
      for (int& a : in.args) a = after_leaf(a, static_cast<int>(p_.leaves.size()) - 1);
    }
    return static_cast<int>(p_.leaves.size()) - 1;
  }

  // Where value `v` sits once leaf `added` went in before the ops' values.
  static int after_leaf(int v, int added) { return v >= added ? v + 1 : v; }

  // Records `in` on the symbolic tape (which checks it) and in the program.
  int push(Instr in) {
    vars_.push_back(apply_op(in, vars_, false));
    p_.ops.push_back(std::move(in));
    return static_cast<int>(vars_.size()) - 1;
  }

  Spec whole_spec(const std::string& tensor, const std::vector<std::string>& dims) {
    return random_spec(rng_, mesh(), tensor, dims, false);
  }

  const Spec& spec(int v) const { return vars_[static_cast<std::size_t>(v)].spec(); }
  const Shape& shape(int v) const { return vars_[static_cast<std::size_t>(v)].shape(); }
  const Mesh& mesh() const { return p_.mesh; }

  AxisList unused_axes(const Spec& s) const {
    AxisList out;
    for (int a = 0; a < mesh().rank(); ++a) {
      if (!s.uses(a)) out.push_back(a);
    }
    std::shuffle(out.begin(), out.end(), rng_);
    return out;
  }

  // Makes `cur` whole: reduce_scatter onto a dimension, all_reduce the rest.
  int make_whole(int cur) {
    if (spec(cur).unreduced.empty()) return cur;
    AxisList u = spec(cur).unreduced;
    if (uniform(rng_, 0, 1)) {
      const std::size_t d = static_cast<std::size_t>(uniform(rng_, 0, spec(cur).rank() - 1));
      cur = push({Kind::reduce_scatter, {cur}, {}, {}, spec(cur).dims[d].name, "", {u[0]}});
      u.erase(u.begin());
    }
    if (!u.empty()) cur = push({Kind::all_reduce, {cur}, {}, {}, "", "", u});
    return cur;
  }

  // Half the time, when `cur`'s letter `d` is not sharded, a reshard moves a mesh axis (one
  // with no sum pending over it) onto `d`: the ops over a letter meet a sharded one more often
  // than the letters' random layouts alone give them.
  int maybe_sharded_along(int cur, const std::string& d) {
    Spec to = spec(cur);
    const std::size_t at = static_cast<std::size_t>(to.find_dim(d));
    AxisList movable;
    for (int a = 0; a < mesh().rank(); ++a) {
      if (!to.is_unreduced(a)) movable.push_back(a);
    }
    if (!to.dims[at].axes.empty() || movable.empty() || uniform(rng_, 0, 1) == 0) return cur;
    const int axis = movable[static_cast<std::size_t>(uniform(rng_, 0, static_cast<int>(movable.size()) - 1))];
    for (DimSpec& other : to.dims)
      other.axes.erase(std::remove(other.axes.begin(), other.axes.end(), axis), other.axes.end());
    to.dims[at].axes.push_back(axis);
    return push({Kind::reshard, {cur}, {}, to});
  }

  // Gathers the last dimension whole (softmax and layer norm need whole rows).
  int whole_rows(int cur) {
    cur = make_whole(cur);
    const DimSpec& last = spec(cur).dims.back();
    if (!last.axes.empty()) cur = push({Kind::all_gather, {cur}, {}, {}, last.name, "", last.axes});
    return cur;
  }

  // Gathers every axis of `dims` in `cur` (keeping the other letters' and the unreduced axes).
  int gathered(int cur, const std::vector<std::string>& dims) {
    Spec to = spec(cur);
    for (DimSpec& d : to.dims) {
      if (std::find(dims.begin(), dims.end(), d.name) != dims.end()) d.axes.clear();
    }
    return to == spec(cur) ? cur : push({Kind::reshard, {cur}, {}, to});
  }

  // Permutes `cur`'s letters to `dims` (nothing when they are in that order).
  int transposed(int cur, const std::vector<std::string>& dims) {
    return dims == dim_names(spec(cur)) ? cur : push({Kind::transpose, {cur}, dims});
  }

  // Merges `cur`'s letters `dims` (consecutive, in order) into a fresh letter, gathering first
  // when the layout does not allow it locally.
  int merged(int cur, const std::vector<std::string>& dims) {
    if (!autodiff::can_merge_locally(mesh(), spec(cur), shape(cur), dims)) cur = gathered(cur, dims);
    Instr in{Kind::merge, {cur}, dims};
    in.dim = letter();
    return push(in);
  }

  // cur op leaf, the leaf over some of cur's letters (sharded alike) and perhaps a fresh one;
  // a fresh letter is then merged with its neighbour to keep two letters.
  int broadcast_op(int cur) {
    const Kind kinds[] = {Kind::binary_add, Kind::binary_sub, Kind::binary_mul};
    const Kind k = kinds[uniform(rng_, 0, 2)];
    if (k == Kind::binary_mul) cur = make_whole(cur);
    const Spec s = spec(cur);
    std::vector<std::pair<DimSpec, std::int64_t>> dims;
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      if (uniform(rng_, 0, 2) > 0) dims.emplace_back(s.dims[d], shape(cur)[d]);
    }
    const std::string fresh = uniform(rng_, 0, 1) ? letter() : "";
    if (!fresh.empty()) {
      DimSpec d{fresh, {}};
      const AxisList free = unused_axes(s);
      if (!free.empty() && uniform(rng_, 0, 1)) d.axes.push_back(free[0]);
      dims.emplace_back(d, size());
    }
    std::shuffle(dims.begin(), dims.end(), rng_);
    Spec w;
    w.tensor = "B";
    Shape wshape;
    for (const auto& [d, n] : dims) {
      w.dims.push_back(d);
      wshape.push_back(n);
    }
    int operand = leaf(w, wshape);
    cur = after_leaf(cur, operand);
    if (k != Kind::binary_mul && !s.unreduced.empty()) {  // partial sums add over the same axes
      w.unreduced = s.unreduced;
      operand = push({Kind::reshard, {operand}, {}, w});
    }
    std::vector<std::string> out = dim_names(s);
    if (!fresh.empty()) out.push_back(fresh);
    std::shuffle(out.begin(), out.end(), rng_);
    cur = uniform(rng_, 0, 1) ? push({k, {cur, operand}, out}) : push({k, {operand, cur}, out});
    return fresh.empty() ? cur : merged(cur, {out[0], out[1]});
  }

  // Attention's heads: the second letter split in two, the three letters permuted (perhaps
  // resharded, perhaps through tanh), then back in order and merged.
  int heads_op(int cur) {
    const std::string first = spec(cur).dims[0].name, second = spec(cur).dims[1].name;
    const std::int64_t n = shape(cur)[1];
    std::vector<std::int64_t> divisors;
    for (std::int64_t h = 1; h <= n; ++h) {
      if (n % h == 0) divisors.push_back(h);
    }
    const std::int64_t h = divisors[static_cast<std::size_t>(uniform(rng_, 0, static_cast<int>(divisors.size()) - 1))];
    Instr split{Kind::split, {cur}};
    split.dim = second;
    split.parts = {{letter(), h}, {letter(), n / h}};
    const std::string p = split.parts[0].first, q = split.parts[1].first;
    if (!autodiff::can_split_locally(mesh(), spec(cur), shape(cur), second, split.parts)) {
      split.args = {gathered(cur, {second})};
    }
    cur = push(split);
    std::vector<std::string> order = {first, p, q};
    std::shuffle(order.begin(), order.end(), rng_);
    cur = transposed(cur, order);
    switch (uniform(rng_, 0, 2)) {
      case 0:
        cur = push({Kind::tanh, {make_whole(cur)}});
        break;
      case 1:
        cur = push({Kind::reshard, {cur}, {}, random_spec(rng_, mesh(), spec(cur).tensor, order, true)});
        break;
      default:
        break;
    }
    const bool heads_last = uniform(rng_, 0, 1) == 1;
    cur = transposed(cur, heads_last ? std::vector<std::string>{first, p, q} : std::vector<std::string>{p, q, first});
    return merged(cur, {p, q});
  }

  int random_op(int cur) {
    switch (uniform(rng_, 0, 18)) {
      case 0: {  // local einsum with a weight sharded to match
        const Spec s = spec(cur);
        const std::string l = letter();
        Spec w;
        w.tensor = "W" + l;
        w.dims = {{s.dims.back().name, s.dims.back().axes}, {l, {}}};
        for (int a : unused_axes(s)) {
          if (uniform(rng_, 0, 1)) w.dims[1].axes.push_back(a);
        }
        const int wv = leaf(w, {shape(cur).back(), size()});
        cur = after_leaf(cur, wv);
        return push({Kind::local_einsum, {cur, wv}, {s.dims.front().name, l}, {}, "", "", {}});
      }
      case 1: {  // planned einsum: any weight layout, any output layout
        const Spec s = spec(cur);
        const std::string l = letter();
        const int wv = leaf(whole_spec("W" + l, {s.dims.back().name, l}), {shape(cur).back(), size()});
        cur = after_leaf(cur, wv);
        Spec out = random_spec(rng_, mesh(), "Y", {s.dims.front().name, l}, true);
        return push({Kind::planned_einsum, {cur, wv}, {s.dims.front().name, l}, out, "", "", {}});
      }
      case 2: {
        cur = make_whole(cur);
        const Kind k[] = {Kind::relu, Kind::gelu, Kind::silu};
        return push({k[uniform(rng_, 0, 2)], {cur}});
      }
      case 3: {  // SwiGLU pairing a value with an activation of itself
        cur = make_whole(cur);
        const int up = push({Kind::gelu, {cur}});
        return push({Kind::swiglu, {cur, up}});
      }
      case 4: {  // residual whose branch runs in another layout: two gradient layouts meet
        cur = make_whole(cur);
        const Spec home = spec(cur);
        int branch = push({Kind::reshard, {cur}, {}, whole_spec(home.tensor, dim_names(home))});
        branch = push({Kind::silu, {branch}});
        branch = push({Kind::reshard, {branch}, {}, home});
        return push({Kind::add, {cur, branch}});
      }
      case 5: {
        cur = whole_rows(cur);
        return push({Kind::softmax, {cur}});
      }
      case 6: {
        cur = whole_rows(cur);
        const std::string d = spec(cur).dims.back().name;
        Spec p;
        p.dims = {{d, {}}};
        p.tensor = "gamma";
        const int g = leaf(p, {shape(cur).back()});
        cur = after_leaf(cur, g);
        p.tensor = "beta";
        const int b = leaf(p, {shape(cur).back()});
        cur = after_leaf(cur, b);
        return push({Kind::layer_norm, {cur, g, b}});
      }
      case 7: {  // reshard anywhere, partial sums included (to_partial)
        const Spec s = spec(cur);
        return push({Kind::reshard, {cur}, {}, random_spec(rng_, mesh(), s.tensor, dim_names(s), true)});
      }
      case 8: {  // gather the minor-most axes of a sharded dimension, else slice an unused axis in
        const Spec s = spec(cur);
        for (const DimSpec& d : s.dims) {
          if (!d.axes.empty()) {
            const std::size_t k = static_cast<std::size_t>(uniform(rng_, 1, static_cast<int>(d.axes.size())));
            return push({Kind::all_gather,
                         {cur},
                         {},
                         {},
                         d.name,
                         "",
                         AxisList(d.axes.end() - static_cast<std::ptrdiff_t>(k), d.axes.end())});
          }
        }
        [[fallthrough]];
      }
      case 9: {
        const Spec s = spec(cur);
        const AxisList free = unused_axes(s);
        if (free.empty()) return cur;
        const std::size_t d = static_cast<std::size_t>(uniform(rng_, 0, s.rank() - 1));
        return push({Kind::slice, {cur}, {}, {}, s.dims[d].name, "", {free[0]}});
      }
      case 11: {  // gating by an activation of itself
        cur = make_whole(cur);
        const int gate = push({Kind::silu, {cur}});
        return push({Kind::mul, {gate, cur}});
      }
      case 12: {  // a linear op, on partial sums too
        Instr in{Kind::scale, {cur}};
        in.factor = uniform(rng_, -3, 3) / 2.0 + 0.25;
        return push(in);
      }
      case 13: {  // rename one dimension to a fresh letter
        const Spec s = spec(cur);
        return push(
            {Kind::rename, {cur}, {}, {}, s.dims[static_cast<std::size_t>(uniform(rng_, 0, 1))].name, letter()});
      }
      case 14: {  // softmax or a norm over either dimension, sharded or not
        cur = make_whole(cur);
        const Kind k[] = {Kind::softmax_over, Kind::layer_norm_over, Kind::rms_norm_over};
        Instr in{k[uniform(rng_, 0, 2)], {cur}};
        in.dim = spec(cur).dims[static_cast<std::size_t>(uniform(rng_, 0, 1))].name;
        in.args = {maybe_sharded_along(cur, in.dim)};
        return push(in);
      }
      case 15: {  // a reduction over either dimension (sums of partial sums too), then an outer
                  // product with a fresh vector for two dimensions again
        const Kind k[] = {Kind::reduce_sum, Kind::reduce_mean, Kind::reduce_max};
        const Kind kind = k[uniform(rng_, 0, 2)];
        if (kind == Kind::reduce_max) cur = make_whole(cur);
        Instr in{kind, {cur}};
        in.dim = spec(cur).dims[static_cast<std::size_t>(uniform(rng_, 0, 1))].name;
        in.args = {maybe_sharded_along(cur, in.dim)};
        const int r = push(in);
        const Spec s = spec(r);
        const std::string l = letter();
        Spec w;
        w.tensor = "w" + l;
        w.dims = {{l, {}}};
        for (int a : unused_axes(s)) {
          if (uniform(rng_, 0, 1)) w.dims[0].axes.push_back(a);
        }
        const int wv = leaf(w, {size()});
        return push({Kind::local_einsum, {after_leaf(r, wv), wv}, {s.dims.front().name, l}, {}, "", "", {}});
      }
      case 16: {  // tanh, and exp of it (bounded: e^tanh)
        cur = push({Kind::tanh, {make_whole(cur)}});
        return uniform(rng_, 0, 1) ? push({Kind::exp, {cur}}) : cur;
      }
      case 17:
        return broadcast_op(cur);
      case 18:
        return heads_op(cur);
      default: {  // all_to_all the minor-most axis of one dimension to the other
        const Spec s = spec(cur);
        for (std::size_t d = 0; d < s.dims.size(); ++d) {
          if (!s.dims[d].axes.empty()) {
            return push({Kind::all_to_all, {cur}, {}, {}, s.dims[d].name, s.dims[1 - d].name, {s.dims[d].axes.back()}});
          }
        }
        return cur;
      }
    }
  }

  Rng& rng_;
  Program p_;
  std::unique_ptr<autodiff::Tape> tape_;
  std::vector<autodiff::Var> vars_;
  int next_letter_ = 0;
};

// ---- running a program
using autodiff::Tape;
using autodiff::TapeEvent;
using autodiff::TapeMemory;
using autodiff::Var;

// (Appending, not operator+: GCC 12 warns falsely about "d" + std::string.)
inline std::string grad_key(std::size_t leaf) {
  std::string key = "d";
  key += std::to_string(leaf);
  return key;
}

struct Executed {
  std::vector<std::vector<double>> grads;  // per leaf, logical
  double loss = 0;
  std::vector<std::vector<TapeEvent>> events;  // per device
  std::vector<TapeMemory> memory;              // per device
  std::vector<bool> grads_in_leaf_spec;        // per leaf, on every device
};

inline Executed execute(const Program& p, const Mesh& mesh, bool one_device) {
  Collected out(mesh);
  Executed r;
  r.events.resize(static_cast<std::size_t>(mesh.device_count()));
  r.memory.resize(r.events.size());
  std::vector<std::vector<bool>> in_spec(r.events.size());
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    const std::vector<Var> v = replay(tape, p, one_device);
    out.put("loss", v.back().value());
    tape.backward(v.back());
    const auto me = static_cast<std::size_t>(comm.rank());
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      out.put(grad_key(l), tape.grad(v[l]));
      in_spec[me].push_back(tape.grad(v[l]).spec() == v[l].spec());
    }
    r.events[me] = tape.events();
    r.memory[me] = tape.memory();
  });
  r.loss = out.global("loss").at(0);
  for (std::size_t l = 0; l < p.leaves.size(); ++l) r.grads.push_back(out.global(grad_key(l)));
  r.grads_in_leaf_spec.assign(p.leaves.size(), true);
  for (const auto& dev : in_spec) {
    for (std::size_t l = 0; l < dev.size(); ++l) r.grads_in_leaf_spec[l] = r.grads_in_leaf_spec[l] && dev[l];
  }
  return r;
}

// A symbolic tape for each device predicts that device's executed run: the same steps in
// the same order and phase, the plan layer's bytes and FLOPs equal to the most any device
// measured, and the same memory figures.
inline void check_symbolic(const Program& p, const Mesh& mesh, const Executed& run) {
  std::vector<TapeEvent> predicted;
  for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
    Tape tape(mesh, {DType::f64, builtin_profile("h100"), d});
    const std::vector<Var> v = replay(tape, p);
    tape.backward(v.back());
    const std::vector<TapeEvent>& got = run.events[static_cast<std::size_t>(d)];
    ASSERT_EQ(tape.events().size(), got.size()) << "device " << d;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const Step& want = tape.events()[i].step;
      EXPECT_EQ(tape.events()[i].phase, got[i].phase) << "event " << i;
      EXPECT_FALSE(tape.events()[i].executed);
      EXPECT_TRUE(got[i].executed);
      EXPECT_EQ(want.op, got[i].step.op) << "event " << i;
      EXPECT_EQ(op_name(want), op_name(got[i].step)) << "event " << i;
      EXPECT_EQ(want.axes, got[i].step.axes) << "event " << i;
      EXPECT_EQ(want.from, got[i].step.from) << "event " << i;
      EXPECT_EQ(want.to, got[i].step.to) << "event " << i;
      EXPECT_EQ(want.bytes_sent, got[i].step.bytes_sent) << "event " << i;
    }
    const TapeMemory m = tape.memory(), e = run.memory[static_cast<std::size_t>(d)];
    EXPECT_EQ(m.leaves, e.leaves) << "device " << d;
    EXPECT_EQ(m.activations, e.activations) << "device " << d;
    EXPECT_EQ(m.gradients, e.gradients) << "device " << d;
    if (d == 0) predicted = tape.events();
  }
  // The most any device moved or computed is what the plan layer predicts.
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    std::int64_t sent = 0, received = 0;
    double flops = 0;
    for (const auto& dev : run.events) {
      sent = std::max(sent, dev[i].measured.bytes_sent);
      received = std::max(received, dev[i].measured.bytes_received);
      flops = std::max(flops, dev[i].measured.flops);
    }
    EXPECT_EQ(sent, predicted[i].step.bytes_sent) << "event " << i << " " << to_string(predicted[i].step.op);
    EXPECT_EQ(received, predicted[i].step.bytes_received) << "event " << i;
    EXPECT_EQ(flops, predicted[i].step.flops) << "event " << i;
  }
}

inline bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * (1 + std::abs(b)); }

// Runs `p` on threads over its mesh and checks it: the loss against the dense interpreter,
// each leaf's gradient in the leaf's spec and against central finite differences and the
// same program on one device, and the symbolic tapes against the run. Returns the run.
inline Executed check_program(const Program& p) {
  const Executed sharded = execute(p, p.mesh, false);
  const Executed single = execute(p, Mesh::parse("X=1"), true);
  const std::vector<std::vector<double>> fd = finite_differences(p);
  const double dense = dense_loss(p, dense_leaves(p));
  EXPECT_TRUE(close(sharded.loss, dense, 1e-12)) << sharded.loss << " vs dense " << dense;
  for (std::size_t l = 0; l < p.leaves.size(); ++l) {
    EXPECT_TRUE(sharded.grads_in_leaf_spec[l]) << "leaf " << l << " gradient not in the leaf's spec";
    EXPECT_EQ(sharded.grads[l].size(), fd[l].size()) << "leaf " << l;
    for (std::size_t i = 0; i < std::min(fd[l].size(), sharded.grads[l].size()); ++i) {
      EXPECT_TRUE(close(sharded.grads[l][i], fd[l][i], 1e-6))
          << "leaf " << l << " (" << format_spec(p.leaves[l].spec, p.mesh) << ") element " << i << ": "
          << sharded.grads[l][i] << " vs finite difference " << fd[l][i];
      EXPECT_TRUE(close(sharded.grads[l][i], single.grads[l][i], 1e-11))
          << "leaf " << l << " element " << i << ": " << sharded.grads[l][i] << " vs one device " << single.grads[l][i];
    }
  }
  check_symbolic(p, p.mesh, sharded);
  return sharded;
}

}  // namespace shardmm::testing
