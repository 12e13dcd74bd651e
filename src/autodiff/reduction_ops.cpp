// Reductions and normalizations over one dimension (reductions.h), and tape.h's softmax and
// layer norm over the last dimension, which are these with that dimension (the layer norm's
// scale and bias applied in the same pass). Each rank works on its block's rows; where the
// dimension is sharded, a row's statistics are completed by an all_reduce over the axes that
// shard it, recorded as a step like any collective.
#include "shardmm/autodiff/reductions.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autodiff/local_ops.h"
#include "autodiff/tape_impl.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/plan/step_builder.h"

namespace shardmm::autodiff {

namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// The rows of a block along one of its dimensions: row r = o * inner + k (o over the
// dimensions before it, k over those after) holds n elements, `inner` apart. Rows are
// numbered as the block of the layout without that dimension numbers its elements.
struct Rows {
  std::int64_t count = 0, n = 0, inner = 1;

  Rows(const Shape& local, int dim) {
    std::int64_t outer = 1;
    for (int i = 0; i < static_cast<int>(local.size()); ++i) {
      if (i < dim) outer *= local[static_cast<std::size_t>(i)];
      if (i > dim) inner *= local[static_cast<std::size_t>(i)];
    }
    n = local[static_cast<std::size_t>(dim)];
    count = outer * inner;
  }
  // Element i of row r, as an offset into the block.
  std::int64_t at(std::int64_t r, std::int64_t i) const { return (r / inner * n + i) * inner + r % inner; }
};

// What a reduction over dimension `dim` of a value works with.
struct Reduced {
  int dim = -1;
  AxisList axes;            // the axes sharding dim, sorted (the all_reduce group); empty: unsharded
  Spec spec;                // the layout without dim, unreduced over `axes` (and x's own unreduced axes)
  Shape shape;              // global, without dim
  std::int64_t extent = 0;  // dim's global extent
  std::int64_t offset = 0;  // where this rank's block of dim starts
  Rows rows;                // this rank's block, along dim
};

// How many rows' statistics a tape keeps: this rank's rows when it computes, none when it is
// symbolic (a symbolic tape of a large model must not hold per-row vectors of its shards).
std::size_t stat_rows(const Tape::Impl& t, const Rows& rows) {
  return t.symbolic() ? 0 : static_cast<std::size_t>(rows.count);
}

Reduced reduced(const Tape::Impl& t, const Node& x, std::string_view dim, const char* op) {
  const Spec& s = x.value.spec;
  const int d = dim_index(s, dim, t.mesh, op);
  const auto at = static_cast<std::size_t>(d);
  Reduced r{d, s.dims[at].axes, s, x.shape, x.shape[at], 0, Rows(local_shape(t.mesh, s, x.shape, t.device()), d)};
  std::sort(r.axes.begin(), r.axes.end());
  r.spec.dims.erase(r.spec.dims.begin() + d);
  r.spec.unreduced.insert(r.spec.unreduced.end(), r.axes.begin(), r.axes.end());
  std::sort(r.spec.unreduced.begin(), r.spec.unreduced.end());
  r.shape.erase(r.shape.begin() + d);
  r.offset = shard_box(t.mesh, s, x.shape, t.device())[at].offset;
  return r;
}

// Completes each row's statistic over the axes that shard the dimension: `partial` holds this
// rank's part of every row, and becomes the whole row's. An all_reduce(op) of a tensor laid
// out as x without the dimension (`name` names it), recorded as a costed step in the tape's
// current phase; nothing when the dimension is not sharded. Symbolic tapes record the step.
// The op's local work so far is one event, its next starts after the step.
void complete(Tape::Impl& t, const Reduced& r, ReduceOp op, const std::string& name, std::vector<double>& partial,
              LocalWork& work) {
  if (r.axes.empty()) return;
  work.split();
  Spec from = r.spec;
  from.tensor = name;
  Step step = make_step(OpKind::all_reduce, from, r.axes);
  step.reduce = op;
  t.cost(step, r.shape);
  Value parts{from, nullptr};
  if (!t.symbolic()) {
    auto data = t.make_shard(from, r.shape);
    with_type(t.options.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      std::copy(partial.begin(), partial.end(), data->buffer().as<T>());
    });
    parts.data = std::move(data);
  }
  const Value out = t.run_step(step, parts, r.shape);
  if (out.data) {
    with_type(t.options.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      std::copy(in<T>(out), in<T>(out) + partial.size(), partial.begin());
    });
  }
  work.resume();
}

// A new shard of `spec` with element i of row r set to f(r, i) (executed tapes; null otherwise).
template <class F>
std::shared_ptr<const DistTensor> fill_rows(Tape::Impl& t, const Spec& spec, const Shape& shape, const Rows& rows,
                                            F f) {
  if (t.symbolic()) return nullptr;
  auto out = t.make_shard(spec, shape);
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    T* dst = out->buffer().as<T>();
    for (std::int64_t r = 0; r < rows.count; ++r) {
      for (std::int64_t i = 0; i < rows.n; ++i) dst[rows.at(r, i)] = static_cast<T>(f(r, i));
    }
  });
  return out;
}

// f(r, i, v) for every element v of `value`'s shard (element i of row r), in double.
template <class F>
void for_rows(const Tape::Impl& t, const Value& value, const Rows& rows, F f) {
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* src = in<T>(value);
    for (std::int64_t r = 0; r < rows.count; ++r) {
      for (std::int64_t i = 0; i < rows.n; ++i) f(r, i, static_cast<double>(src[rows.at(r, i)]));
    }
  });
}

// Reads element i of row r of a shard in double (executed tapes).
double element(const Tape::Impl& t, const Value& v, std::int64_t at) {
  return t.options.dtype == DType::f32 ? static_cast<double>(in<float>(v)[at]) : in<double>(v)[at];
}

// reduce_sum and reduce_mean: the sum over dim times `scale`.
Var scaled_reduce(Var x, std::string_view dim, double scale, const char* op) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& nx = t.node(x);
  const Reduced r = reduced(t, nx, dim, op);
  Value y{r.spec, nullptr};
  y.spec.tensor = std::string(op) + "(" + nx.value.spec.tensor + ")";
  LocalWork work(t, op, y.spec.tensor);
  if (nx.value.data) {
    std::vector<double> sums(stat_rows(t, r.rows), 0.0);
    for_rows(t, nx.value, r.rows,
             [&](std::int64_t row, std::int64_t, double v) { sums[static_cast<std::size_t>(row)] += v; });
    const Rows one(Shape{r.rows.count, 1}, 1);
    y.data = fill_rows(t, y.spec, r.shape, one,
                       [&](std::int64_t row, std::int64_t) { return sums[static_cast<std::size_t>(row)] * scale; });
  }
  work.pass(nx.value.spec, nx.shape).pass(y.spec, r.shape).finish();
  return t.add_node(tape, std::move(y), r.shape, {x.id()},
                    [scale, op, d = r.dim](Tape::Impl& impl, const Node& self, const Value& grad) {
                      // Each element's gradient is its row's, scaled: the output gradient spread along dim.
                      const int ix = self.inputs[0];
                      const Node& nx = impl.node(ix);
                      const Value g = impl.align(grad, self.value.spec, self.shape);
                      LocalWork work(impl, op, "d" + self.value.spec.tensor);
                      Value dx{nx.value.spec, nullptr};
                      dx.spec.unreduced = g.spec.unreduced;
                      if (g.data) {
                        const Rows rows(local_shape(impl.mesh, dx.spec, nx.shape, impl.device()), d);
                        dx.data = fill_rows(impl, dx.spec, nx.shape, rows,
                                            [&](std::int64_t r, std::int64_t) { return element(impl, g, r) * scale; });
                      }
                      work.pass(g.spec, self.shape).pass(dx.spec, nx.shape).finish();
                      impl.accumulate(ix, std::move(dx));
                    });
}

// The layer norm's optional scale and bias: 1-D over the normalized dimension, replicated.
struct Affine {
  Var scale, bias;
};

// (x - mean) / sqrt(var + eps) over dim (`center`; else x / sqrt(mean(x^2) + eps)), then
// times scale plus bias when `affine`. Per row it keeps the mean and 1 / sqrt(var + eps) for
// the backward pass, as doubles.
Var normalize(Var x, std::string_view dim, double eps, bool center, const std::optional<Affine>& affine,
              const char* op) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, x.spec(), op);
  if (!(eps > 0)) throw InputError(std::string(op) + ": eps must be positive; got " + std::to_string(eps));
  const Node& nx = t.node(x);
  const Reduced r = reduced(t, nx, dim, op);
  const std::size_t rows = stat_rows(t, r.rows);
  const double n = static_cast<double>(r.extent);
  Value y{nx.value.spec, nullptr};
  y.spec.tensor = std::string(op) + "(" + nx.value.spec.tensor + ")";
  auto mean = std::make_shared<std::vector<double>>(rows, 0.0);
  auto rstd = std::make_shared<std::vector<double>>(rows, 0.0);
  const bool data = nx.value.data != nullptr;
  // Passes over x: its rows' sums (centered), their squared deviations, then y.
  LocalWork work(t, op, y.spec.tensor);
  if (center) {
    if (data) {
      for_rows(t, nx.value, r.rows,
               [&](std::int64_t row, std::int64_t, double v) { (*mean)[static_cast<std::size_t>(row)] += v; });
    }
    work.pass(nx.value.spec, nx.shape);
    complete(t, r, ReduceOp::sum, y.spec.tensor + ".sum", *mean, work);
    for (double& m : *mean) m /= n;
  }
  // The squared deviations from the mean (0 for the RMS norm), summed in a second pass.
  if (data) {
    for_rows(t, nx.value, r.rows, [&](std::int64_t row, std::int64_t, double v) {
      const double dev = v - (*mean)[static_cast<std::size_t>(row)];
      (*rstd)[static_cast<std::size_t>(row)] += dev * dev;
    });
  }
  work.pass(nx.value.spec, nx.shape);
  complete(t, r, ReduceOp::sum, y.spec.tensor + (center ? ".squared_deviations" : ".squares"), *rstd, work);
  for (double& s : *rstd) s = 1.0 / std::sqrt(s / n + eps);
  const Value* gamma = affine ? &t.node(affine->scale).value : nullptr;
  const Value* beta = affine ? &t.node(affine->bias).value : nullptr;
  if (data) {
    y.data = fill_rows(t, y.spec, nx.shape, r.rows, [&](std::int64_t row, std::int64_t i) {
      const auto k = static_cast<std::size_t>(row);
      const double v = (element(t, nx.value, r.rows.at(row, i)) - (*mean)[k]) * (*rstd)[k];
      return gamma ? v * element(t, *gamma, r.offset + i) + element(t, *beta, r.offset + i) : v;
    });
  }
  work.pass(nx.value.spec, nx.shape).pass(y.spec, nx.shape);
  if (affine) {
    for (Var p : {affine->scale, affine->bias}) work.pass(p.spec(), p.shape());
  }
  work.finish();
  const bool x_grad = nx.requires_grad;
  const bool needs = x_grad || (affine && t.node(affine->scale).requires_grad);
  t.node(x).saved = t.node(x).saved || needs;
  std::vector<int> inputs = {x.id()};
  if (affine) {
    t.node(affine->scale).saved = t.node(affine->scale).saved || x_grad;
    inputs.push_back(affine->scale.id());
    inputs.push_back(affine->bias.id());
  }
  const Shape shape = nx.shape;
  const std::string name = y.spec.tensor;
  Var out = t.add_node(
      tape, std::move(y), shape, std::move(inputs),
      [mean, rstd, center, r, name, op](Tape::Impl& impl, const Node& self, const Value& grad) {
        // dx = rstd (g' - mean(g') - xhat mean(g' xhat)) with g' = g scale (mean(g') dropped
        // without centering); the means over the whole row.
        const int ix = self.inputs[0];
        const bool has_affine = self.inputs.size() == 3;
        const Value g = impl.align(grad, self.value.spec, self.shape);
        const std::size_t rows = mean->size();
        std::vector<double> sum_g(rows, 0.0), sum_g_xhat(rows, 0.0);
        const Value* xv = g.data ? &impl.saved_value(ix) : nullptr;
        const Value* gamma = g.data && has_affine ? &impl.saved_value(self.inputs[1]) : nullptr;
        // Passes: g and x (and the scale) for the rows' sums, again for dx written, and (with
        // scale and bias) again for their gradients.
        LocalWork work(impl, op, "d" + self.value.spec.tensor);
        const Node& nx = impl.node(ix);
        const auto read_rows = [&] {
          work.pass(g.spec, self.shape).pass(nx.value.spec, self.shape);
          if (has_affine) work.pass(impl.node(self.inputs[1]).value.spec, impl.node(self.inputs[1]).shape);
        };
        const auto xhat = [&](std::int64_t row, std::int64_t i) {
          const auto k = static_cast<std::size_t>(row);
          return (element(impl, *xv, r.rows.at(row, i)) - (*mean)[k]) * (*rstd)[k];
        };
        const auto scaled_g = [&](std::int64_t row, std::int64_t i) {
          const double gr = element(impl, g, r.rows.at(row, i));
          return gamma ? gr * element(impl, *gamma, r.offset + i) : gr;
        };
        if (g.data) {
          for (std::int64_t row = 0; row < r.rows.count; ++row) {
            for (std::int64_t i = 0; i < r.rows.n; ++i) {
              const double gy = scaled_g(row, i);
              sum_g[static_cast<std::size_t>(row)] += gy;
              sum_g_xhat[static_cast<std::size_t>(row)] += gy * xhat(row, i);
            }
          }
        }
        read_rows();
        const double n = static_cast<double>(r.extent);
        if (center) {
          complete(impl, r, ReduceOp::sum, "d" + name + ".sum", sum_g, work);
          for (double& s : sum_g) s /= n;
        } else {
          std::fill(sum_g.begin(), sum_g.end(), 0.0);
        }
        complete(impl, r, ReduceOp::sum, "d" + name + ".dot", sum_g_xhat, work);
        for (double& s : sum_g_xhat) s /= n;
        Value dx{g.spec, nullptr};
        if (g.data) {
          dx.data = fill_rows(impl, g.spec, self.shape, r.rows, [&](std::int64_t row, std::int64_t i) {
            const auto k = static_cast<std::size_t>(row);
            return (*rstd)[k] * (scaled_g(row, i) - sum_g[k] - xhat(row, i) * sum_g_xhat[k]);
          });
        }
        read_rows();
        work.pass(dx.spec, self.shape);
        if (!has_affine) {
          work.finish();
          impl.accumulate(ix, std::move(dx));
          return;
        }
        // The parameters' gradients sum over this rank's rows and its part of dim: partial over
        // every axis that splits x (zeros outside its part of dim), and over g's own partial sums.
        const int is = self.inputs[1], ib = self.inputs[2];
        const Node& ns = impl.node(is);
        Value dparam{ns.value.spec, nullptr};
        dparam.spec.unreduced = sharding_axes(self.value.spec);
        dparam.spec.unreduced.insert(dparam.spec.unreduced.end(), g.spec.unreduced.begin(), g.spec.unreduced.end());
        std::sort(dparam.spec.unreduced.begin(), dparam.spec.unreduced.end());
        Value dscale = dparam, dbias = dparam;
        if (g.data) {
          const auto size = static_cast<std::size_t>(ns.shape[0]);
          std::vector<double> ds(size, 0.0), db(size, 0.0);
          for (std::int64_t row = 0; row < r.rows.count; ++row) {
            for (std::int64_t i = 0; i < r.rows.n; ++i) {
              const double gr = element(impl, g, r.rows.at(row, i));
              ds[static_cast<std::size_t>(r.offset + i)] += gr * xhat(row, i);
              db[static_cast<std::size_t>(r.offset + i)] += gr;
            }
          }
          const Rows whole(ns.shape, 0);
          dscale.data = fill_rows(impl, dparam.spec, ns.shape, whole,
                                  [&](std::int64_t, std::int64_t i) { return ds[static_cast<std::size_t>(i)]; });
          dbias.data = fill_rows(impl, dparam.spec, ns.shape, whole,
                                 [&](std::int64_t, std::int64_t i) { return db[static_cast<std::size_t>(i)]; });
        }
        work.pass(g.spec, self.shape).pass(nx.value.spec, self.shape).pass(dparam.spec, ns.shape, 2).finish();
        impl.accumulate(ix, std::move(dx));
        impl.accumulate(is, std::move(dscale));
        impl.accumulate(ib, std::move(dbias));
      });
  // The statistics kept per row: mean and 1 / sqrt(var + eps), or the latter alone.
  t.node(out).extra_saved_bytes = needs ? (center ? 2 : 1) * r.rows.count * dtype_bytes(t.options.dtype) : 0;
  return out;
}

// The last dimension's letter (tape.h's row ops).
std::string last_dim(Var x, const char* op) {
  const Spec& s = x.spec();
  if (s.dims.empty()) throw InputError(std::string(op) + " needs a dimension to normalize over; got a rank-0 value");
  return s.dims.back().name;
}

}  // namespace

Var reduce_sum(Var x, std::string_view dim) { return scaled_reduce(x, dim, 1.0, "reduce_sum"); }

Var reduce_mean(Var x, std::string_view dim) {
  const Tape::Impl& t = x.tape().impl();
  const int d = dim_index(x.spec(), dim, t.mesh, "reduce_mean");
  const std::int64_t extent = x.shape()[static_cast<std::size_t>(d)];
  if (extent == 0) {
    throw InputError("reduce_mean of " + format_spec(x.spec(), t.mesh) + " over '" + std::string(dim) +
                     "': the dimension is empty (a mean of no elements)");
  }
  return scaled_reduce(x, dim, 1.0 / static_cast<double>(extent), "reduce_mean");
}

Var reduce_max(Var x, std::string_view dim) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, x.spec(), "reduce_max");
  const Node& nx = t.node(x);
  const Reduced r = reduced(t, nx, dim, "reduce_max");
  Value y{r.spec, nullptr};
  y.spec.tensor = "reduce_max(" + nx.value.spec.tensor + ")";
  std::vector<double> peak(stat_rows(t, r.rows), kMinusInfinity);
  LocalWork work(t, "reduce_max", y.spec.tensor);
  if (nx.value.data) {
    for_rows(t, nx.value, r.rows, [&](std::int64_t row, std::int64_t, double v) {
      double& p = peak[static_cast<std::size_t>(row)];
      p = std::max(p, v);
    });
  }
  work.pass(nx.value.spec, nx.shape);
  complete(t, r, ReduceOp::max, y.spec.tensor, peak, work);
  y.spec.unreduced.clear();  // every member now holds the whole row's maximum
  const Rows one(Shape{r.rows.count, 1}, 1);
  y.data = fill_rows(t, y.spec, r.shape, one,
                     [&](std::int64_t row, std::int64_t) { return peak[static_cast<std::size_t>(row)]; });
  work.pass(y.spec, r.shape).finish();
  const bool needs = nx.requires_grad;
  t.node(x).saved = t.node(x).saved || needs;
  Var out =
      t.add_node(tape, std::move(y), r.shape, {x.id()}, [r](Tape::Impl& impl, const Node& self, const Value& grad) {
        const int ix = self.inputs[0];
        const Value g = impl.align(grad, self.value.spec, self.shape);
        const Value* xv = g.data ? &impl.saved_value(ix) : nullptr;
        const auto is_peak = [&](std::int64_t row, std::int64_t i) {
          return element(impl, *xv, r.rows.at(row, i)) == element(impl, self.value, row);
        };
        // Passes: x and the maxima to count ties, then x, the maxima and g for dx written.
        const Node& nx = impl.node(ix);
        LocalWork work(impl, "reduce_max", "d" + self.value.spec.tensor);
        work.pass(nx.value.spec, nx.shape).pass(self.value.spec, self.shape);
        std::vector<double> ties(stat_rows(impl, r.rows), 0.0);
        if (g.data) {
          for (std::int64_t row = 0; row < r.rows.count; ++row) {
            for (std::int64_t i = 0; i < r.rows.n; ++i) ties[static_cast<std::size_t>(row)] += is_peak(row, i) ? 1 : 0;
          }
        }
        complete(impl, r, ReduceOp::sum, "d" + self.value.spec.tensor + ".ties", ties, work);
        Value dx{nx.value.spec, nullptr};
        dx.spec.tensor = "d" + dx.spec.tensor;
        if (g.data) {
          dx.data = fill_rows(impl, dx.spec, nx.shape, r.rows, [&](std::int64_t row, std::int64_t i) {
            return is_peak(row, i) ? element(impl, g, row) / ties[static_cast<std::size_t>(row)] : 0.0;
          });
        }
        work.pass(nx.value.spec, nx.shape).pass(self.value.spec, self.shape).pass(g.spec, self.shape);
        work.pass(dx.spec, nx.shape).finish();
        impl.accumulate(ix, std::move(dx));
      });
  t.node(out).saved = needs;
  return out;
}

Var softmax(Var x, std::string_view dim) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  require_whole(t.mesh, x.spec(), "softmax");
  const Node& nx = t.node(x);
  const Reduced r = reduced(t, nx, dim, "softmax");
  const std::size_t rows = stat_rows(t, r.rows);
  Value y{nx.value.spec, nullptr};
  y.spec.tensor = "softmax(" + nx.value.spec.tensor + ")";
  std::vector<double> peak(rows, kMinusInfinity), total(rows, 0.0);
  const bool data = nx.value.data != nullptr;
  // Passes over x: the rows' maxima, their sums of exponentials, then y.
  LocalWork work(t, "softmax", y.spec.tensor);
  if (data) {
    for_rows(t, nx.value, r.rows, [&](std::int64_t row, std::int64_t, double v) {
      double& p = peak[static_cast<std::size_t>(row)];
      p = std::max(p, v);
    });
  }
  work.pass(nx.value.spec, nx.shape);
  complete(t, r, ReduceOp::max, y.spec.tensor + ".max", peak, work);
  if (data) {
    for_rows(t, nx.value, r.rows, [&](std::int64_t row, std::int64_t, double v) {
      total[static_cast<std::size_t>(row)] += std::exp(v - peak[static_cast<std::size_t>(row)]);
    });
  }
  work.pass(nx.value.spec, nx.shape);
  complete(t, r, ReduceOp::sum, y.spec.tensor + ".sum", total, work);
  if (data) {
    y.data = fill_rows(t, y.spec, nx.shape, r.rows, [&](std::int64_t row, std::int64_t i) {
      const auto k = static_cast<std::size_t>(row);
      return std::exp(element(t, nx.value, r.rows.at(row, i)) - peak[k]) / total[k];
    });
  }
  work.pass(nx.value.spec, nx.shape).pass(y.spec, nx.shape).finish();
  const Shape shape = nx.shape;
  const bool needs = nx.requires_grad;
  Var out = t.add_node(tape, std::move(y), shape, {x.id()}, [r](Tape::Impl& impl, const Node& self, const Value& grad) {
    // dx = y (g - sum_row(g y)), from the saved output: passes over g and y for the rows'
    // dot products, then over both again for dx written.
    const Value g = impl.align(grad, self.value.spec, self.shape);
    LocalWork work(impl, "softmax", "d" + self.value.spec.tensor);
    work.pass(g.spec, self.shape).pass(self.value.spec, self.shape);
    std::vector<double> dot(stat_rows(impl, r.rows), 0.0);
    const auto gy = [&](std::int64_t row, std::int64_t i) {
      const std::int64_t at = r.rows.at(row, i);
      return std::pair{element(impl, g, at), element(impl, self.value, at)};
    };
    if (g.data) {
      for (std::int64_t row = 0; row < r.rows.count; ++row) {
        for (std::int64_t i = 0; i < r.rows.n; ++i) {
          const auto [gr, y] = gy(row, i);
          dot[static_cast<std::size_t>(row)] += gr * y;
        }
      }
    }
    complete(impl, r, ReduceOp::sum, "d" + self.value.spec.tensor + ".dot", dot, work);
    Value dx{g.spec, nullptr};
    if (g.data) {
      dx.data = fill_rows(impl, g.spec, self.shape, r.rows, [&](std::int64_t row, std::int64_t i) {
        const auto [gr, y] = gy(row, i);
        return y * (gr - dot[static_cast<std::size_t>(row)]);
      });
    }
    work.pass(g.spec, self.shape, 2).pass(self.value.spec, self.shape).finish();
    impl.accumulate(self.inputs[0], std::move(dx));
  });
  t.node(out).saved = needs;
  return out;
}

Var layer_norm(Var x, std::string_view dim, double eps) {
  return normalize(x, dim, eps, true, std::nullopt, "layer_norm");
}

Var rms_norm(Var x, std::string_view dim, double eps) {
  return normalize(x, dim, eps, false, std::nullopt, "rms_norm");
}

Var softmax(Var x) { return softmax(x, last_dim(x, "softmax")); }

Var layer_norm(Var x, Var scale, Var bias, double eps) {
  same_tape(x, scale, "layer_norm");
  same_tape(x, bias, "layer_norm");
  const Mesh& mesh = x.tape().mesh();
  const std::string last = last_dim(x, "layer_norm");
  for (Var p : {scale, bias}) {
    const Spec& s = p.spec();
    if (s.dims.size() != 1 || s.dims[0].name != last || !s.dims[0].axes.empty() || !s.unreduced.empty() ||
        p.shape()[0] != x.shape().back()) {
      throw InputError("layer_norm of " + format_spec(x.spec(), mesh) + ": scale and bias must be [" + last +
                       "] replicated, of size " + std::to_string(x.shape().back()) + "; got " + format_spec(s, mesh));
    }
  }
  return normalize(x, last, eps, true, Affine{scale, bias}, "layer_norm");
}

}  // namespace shardmm::autodiff
