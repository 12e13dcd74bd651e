// Ops by letter: binary arithmetic with broadcasting, transpose, split and merge. Each rank
// works on its own block; the only steps they record are the alignments of gradients in
// backward (tape.h's rule for local ops).
#include "shardmm/autodiff/shape_ops.h"

#include <algorithm>
#include <functional>

#include "autodiff/local_ops.h"
#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"

namespace shardmm::autodiff {

namespace {

Shape row_major_strides(const Shape& extents) {
  Shape s(extents.size(), 1);
  for (std::size_t i = extents.size(); i-- > 1;) s[i - 1] = s[i] * extents[i];
  return s;
}

// Calls f(a, b) for each index of `extents` in row-major order, where a and b are offsets
// that advance by `sa` and `sb` along each dimension (a stride of 0 broadcasts).
template <class F>
void for_each_index(const Shape& extents, const Shape& sa, const Shape& sb, F f) {
  for (std::int64_t e : extents) {
    if (e == 0) return;
  }
  Shape at(extents.size(), 0);
  std::int64_t a = 0, b = 0;
  for (;;) {
    f(a, b);
    std::size_t d = extents.size();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++at[d] < extents[d]) break;
      at[d] = 0;
      a -= sa[d] * (extents[d] - 1);
      b -= sb[d] * (extents[d] - 1);
    }
    a += sa[d];
    b += sb[d];
  }
}

// The stride, in a block of `v`'s letters, of each of `letters` (0 for a letter v lacks).
Shape strides_by_letter(const Value& v, const std::vector<std::string>& letters) {
  const Shape own = row_major_strides(v.data->local_shape());
  Shape out;
  for (const std::string& l : letters) {
    const int d = v.spec.find_dim(l);
    out.push_back(d < 0 ? 0 : own[static_cast<std::size_t>(d)]);
  }
  return out;
}

// out = f(a, b) over the block of `spec`, each operand read at the letters it has and
// broadcast over the others; the layout only on symbolic tapes.
template <class F>
Value broadcast(Tape::Impl& t, Spec spec, const Shape& shape, const Value& a, const Value& b, F f) {
  Value out{std::move(spec), nullptr};
  if (!a.data) return out;
  auto data = t.make_shard(out.spec, shape);
  const std::vector<std::string> letters = dim_names(out.spec);
  const Shape sa = strides_by_letter(a, letters), sb = strides_by_letter(b, letters);
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* x = in<T>(a);
    const T* z = in<T>(b);
    T* dst = data->buffer().as<T>();
    for_each_index(data->local_shape(), sa, sb,
                   [&](std::int64_t i, std::int64_t j) { *dst++ = static_cast<T>(f(x[i], z[j])); });
  });
  out.data = std::move(data);
  return out;
}

const char* name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
  }
  return "?";
}

double apply(BinaryOp op, double x, double z) {
  switch (op) {
    case BinaryOp::add:
      return x + z;
    case BinaryOp::sub:
      return x - z;
    case BinaryOp::mul:
      return x * z;
  }
  return 0;
}

std::string axes_text(const Mesh& mesh, const AxisList& axes) { return axes.empty() ? "none" : mesh.axis_names(axes); }

std::string list_text(const std::vector<std::string>& letters) {
  std::string out;
  for (const std::string& l : letters) out += (out.empty() ? "" : ", ") + l;
  return out;
}

bool has(const std::vector<std::string>& letters, const std::string& l) {
  return std::find(letters.begin(), letters.end(), l) != letters.end();
}

// The output layout of a op b (see binary in shape_ops.h); InputError naming what breaks it.
Spec binary_spec(const Mesh& mesh, const Spec& a, const Shape& a_shape, const Spec& b, const Shape& b_shape,
                 BinaryOp op, const std::vector<std::string>& out_dims, Shape& out_shape) {
  const std::string what = std::string(name(op)) + " of " + format_spec(a, mesh) + " and " + format_spec(b, mesh);
  for (std::size_t i = 0; i < out_dims.size(); ++i) {
    if (std::find(out_dims.begin(), out_dims.begin() + static_cast<std::ptrdiff_t>(i), out_dims[i]) !=
        out_dims.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw InputError(what + ": output letter '" + out_dims[i] + "' is named twice");
    }
    if (a.find_dim(out_dims[i]) < 0 && b.find_dim(out_dims[i]) < 0) {
      throw InputError(what + ": output letter '" + out_dims[i] + "' is in neither operand");
    }
  }
  for (const Spec* s : {&a, &b}) {
    for (const DimSpec& d : s->dims) {
      if (!has(out_dims, d.name)) {
        throw InputError(what + ": letter '" + d.name + "' of " + format_spec(*s, mesh) +
                         " is not among the output letters (" + list_text(out_dims) +
                         "); the output keeps every operand letter (sum it out first)");
      }
    }
  }
  if (op == BinaryOp::mul) {
    require_whole(mesh, a, "mul");
    require_whole(mesh, b, "mul");
  } else if (a.unreduced != b.unreduced) {
    throw InputError(what + ": the operands are unreduced over different axes (" + axes_text(mesh, a.unreduced) +
                     " vs " + axes_text(mesh, b.unreduced) +
                     "); partial sums add only over the same axes, so all_reduce or reduce_scatter first");
  }
  Spec out;
  out.tensor = a.tensor + (op == BinaryOp::add ? "+" : op == BinaryOp::sub ? "-" : "*") + b.tensor;
  out.unreduced = op == BinaryOp::mul ? AxisList{} : a.unreduced;
  out_shape.clear();
  for (const std::string& l : out_dims) {
    const int i = a.find_dim(l), j = b.find_dim(l);
    const std::size_t k = static_cast<std::size_t>(i >= 0 ? i : j);
    const DimSpec& from = (i >= 0 ? a : b).dims[k];
    const std::int64_t size = (i >= 0 ? a_shape : b_shape)[k];
    if (i >= 0 && j >= 0) {
      const DimSpec& other = b.dims[static_cast<std::size_t>(j)];
      if (b_shape[static_cast<std::size_t>(j)] != size) {
        throw InputError(what + ": letter '" + l + "' has size " + std::to_string(size) + " in " +
                         format_spec(a, mesh) + " but " + std::to_string(b_shape[static_cast<std::size_t>(j)]) +
                         " in " + format_spec(b, mesh));
      }
      if (other.axes != from.axes) {
        throw InputError(what + ": letter '" + l + "' must be sharded alike in both operands (" +
                         (from.axes.empty() ? "replicated" : mesh.axis_names(from.axes)) + " vs " +
                         (other.axes.empty() ? "replicated" : mesh.axis_names(other.axes)) +
                         "); reshard or slice one first");
      }
    }
    out.dims.push_back(from);
    out_shape.push_back(size);
  }
  try {
    validate_spec(out, mesh);
  } catch (const InputError& e) {
    throw InputError(what + " cannot run locally: its output would be " + format_spec(out, mesh) + ", and " +
                     e.headline(field) + "; reshard an operand");
  }
  return out;
}

// An operand's share of the output gradient `g`: summed over the letters it lacks, in its
// letter order; `g` itself when it has the output's letters in the output's order. `work`
// counts the sum's passes (g read, the share written).
Value to_operand(Tape::Impl& t, const Value& g, const Shape& shape, const Spec& operand, LocalWork& work) {
  const std::vector<std::string> letters = dim_names(operand);
  if (letters == dim_names(g.spec)) return g;
  Shape out_shape;
  Value out = sum_to_letters(t, g, shape, letters, &out_shape);
  work.pass(g.spec, shape).pass(out.spec, out_shape);
  return out;
}

// A split or merge: the new layout and, when it cannot run locally, why.
struct Regrouped {
  Spec spec;
  Shape shape;
  std::string refusal;
};

// Why letter `sharded`, split over `axes`, cannot go to (or come from) the major letter
// `first` of size `size` with `rest` elements a row in the minor ones ("" when it can: each
// shard then holds whole rows of `first`).
std::string uneven_rows(const Mesh& mesh, const std::string& sharded, const AxisList& axes, const std::string& first,
                        std::int64_t size, std::int64_t rest) {
  const std::int64_t p = mesh.group_size(axes);
  if (size % p == 0 || rest <= 1) return "";
  // An uneven split can still cut whole rows under torch.chunk (7 rows of 2 over 4: 4,4,4,2
  // elements are 2,2,2,1 rows; array_split's 4,4,3,3 are not): ask the geometry.
  bool whole_rows = true;
  for (std::int64_t device : mesh.group_members(0, axes)) {
    const Range rows = shard_range(mesh, size, axes, device), elements = shard_range(mesh, size * rest, axes, device);
    whole_rows = whole_rows && elements.offset == rows.offset * rest && elements.extent == rows.extent * rest;
  }
  if (whole_rows) return "";
  return sharded + " is sharded over " + mesh.axis_names(axes) + " (" + std::to_string(p) + " devices), and " + first +
         "'s size " + std::to_string(size) + " is not a multiple of " + std::to_string(p) +
         ", so the shards would not hold whole rows of " + first + "; all_gather " + sharded + " first";
}

void validate_regrouped(const Spec& spec, const Mesh& mesh, const std::string& what) {
  try {
    validate_spec(spec, mesh);
  } catch (const InputError& e) {
    throw InputError(what + ": " + e.headline(field));
  }
}

using Parts = std::vector<std::pair<std::string, std::int64_t>>;

Regrouped split_layout(const Mesh& mesh, const Spec& spec, const Shape& shape, std::string_view dim,
                       const Parts& parts) {
  std::string what = "split_dim of " + format_spec(spec, mesh) + " (" + std::string(dim) + " into ";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    what += (i ? ", " : "") + parts[i].first + "=" + std::to_string(parts[i].second);
  }
  what += ")";
  const int d = spec.find_dim(dim);
  if (d < 0) throw InputError(what + ": it has no dimension '" + std::string(dim) + "'");
  if (parts.empty()) throw InputError(what + ": no parts given");
  std::int64_t total = 1, rest = 1;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].second < 0) throw InputError(what + ": part " + parts[i].first + " has a negative size");
    total = checked_mul(total, parts[i].second, "the parts' product");
    if (i > 0) rest = checked_mul(rest, parts[i].second, "the parts' product");
  }
  const auto k = static_cast<std::size_t>(d);
  if (total != shape[k]) {
    throw InputError(what + ": the parts' sizes multiply to " + std::to_string(total) + ", not " + std::string(dim) +
                     "'s size " + std::to_string(shape[k]));
  }
  Regrouped r{spec, {}, {}};
  r.spec.dims.erase(r.spec.dims.begin() + d);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    r.spec.dims.insert(r.spec.dims.begin() + d + static_cast<std::ptrdiff_t>(i),
                       DimSpec{parts[i].first, i == 0 ? spec.dims[k].axes : AxisList{}});
  }
  r.shape = shape;
  r.shape.erase(r.shape.begin() + d);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    r.shape.insert(r.shape.begin() + d + static_cast<std::ptrdiff_t>(i), parts[i].second);
  }
  validate_regrouped(r.spec, mesh, what);
  const std::string why = uneven_rows(mesh, std::string(dim), spec.dims[k].axes, parts[0].first, parts[0].second, rest);
  if (!why.empty()) r.refusal = what + ": " + why;
  return r;
}

Regrouped merge_layout(const Mesh& mesh, const Spec& spec, const Shape& shape, const std::vector<std::string>& dims,
                       std::string_view into) {
  const std::string what =
      "merge_dims of " + format_spec(spec, mesh) + " (" + list_text(dims) + " into " + std::string(into) + ")";
  if (dims.empty()) throw InputError(what + ": no letters given");
  const int first = spec.find_dim(dims[0]);
  std::int64_t total = 1, rest = 1;
  std::string sharded_minor;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = spec.find_dim(dims[i]);
    if (d < 0) throw InputError(what + ": it has no dimension '" + dims[i] + "'");
    if (d != first + static_cast<int>(i)) {
      throw InputError(what + ": the letters must be consecutive in the spec and in its order (transpose first)");
    }
    const auto k = static_cast<std::size_t>(d);
    total = checked_mul(total, shape[k], "the merged size");
    if (i > 0) {
      rest = checked_mul(rest, shape[k], "the merged size");
      if (!spec.dims[k].axes.empty() && sharded_minor.empty()) {
        sharded_minor = dims[i] + " is sharded over " + mesh.axis_names(spec.dims[k].axes) +
                        ", and only the first merged letter may be; all_gather " + dims[i] + " first";
      }
    }
  }
  const auto f = static_cast<std::size_t>(first);
  Regrouped r{spec, shape, {}};
  const auto end = first + static_cast<std::ptrdiff_t>(dims.size());
  r.spec.dims.erase(r.spec.dims.begin() + first + 1, r.spec.dims.begin() + end);
  r.spec.dims[f].name = std::string(into);
  r.shape.erase(r.shape.begin() + first + 1, r.shape.begin() + end);
  r.shape[f] = total;
  validate_regrouped(r.spec, mesh, what);
  const std::string why =
      sharded_minor.empty() ? uneven_rows(mesh, dims[0], spec.dims[f].axes, dims[0], shape[f], rest) : sharded_minor;
  if (!why.empty()) r.refusal = what + ": " + why;
  return r;
}

// The layout that undoes a regrouping, for the gradient's spec and shape.
using Inverse = std::function<Regrouped(const Mesh&, const Spec&, const Shape&)>;

// x's blocks under the regrouped layout (the same bytes: each shard holds whole rows), copied
// as the local step `function`.
Var regroup(Var x, Regrouped r, Inverse inverse, std::string function) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  if (!r.refusal.empty()) throw InputError(r.refusal);
  Value y = relabeled(t, t.node(x).value, std::move(r.spec), r.shape, function);
  return t.add_node(tape, std::move(y), r.shape, {x.id()},
                    [inverse = std::move(inverse), function](Tape::Impl& impl, const Node& self, const Value& grad) {
                      Value g = grad;
                      Regrouped back = inverse(impl.mesh, g.spec, self.shape);
                      if (!back.refusal.empty()) {
                        // The gradient came sharded in a way the inverse cannot regroup locally; the output's
                        // own layout can (the forward ran on it).
                        g = impl.align(grad, self.value.spec, self.shape);
                        back = inverse(impl.mesh, g.spec, self.shape);
                      }
                      back.spec.tensor = "d" + self.value.spec.tensor;
                      impl.accumulate(self.inputs[0], relabeled(impl, g, std::move(back.spec), back.shape, function));
                    });
}

std::vector<std::string> part_names(const Parts& parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.push_back(p.first);
  return out;
}

}  // namespace

Value sum_to_letters(Tape::Impl& t, const Value& v, const Shape& shape, const std::vector<std::string>& letters,
                     Shape* out_shape) {
  Value out{{v.spec.tensor, {}, v.spec.unreduced}, nullptr};
  out_shape->clear();
  // Where each of v's dimensions goes in the result; -1: summed.
  std::vector<int> dest(v.spec.dims.size(), -1);
  for (std::size_t i = 0; i < letters.size(); ++i) {
    const auto d = static_cast<std::size_t>(v.spec.find_dim(letters[i]));
    dest[d] = static_cast<int>(i);
    out.spec.dims.push_back(v.spec.dims[d]);
    out_shape->push_back(shape[d]);
  }
  for (std::size_t d = 0; d < dest.size(); ++d) {
    if (dest[d] < 0) {
      out.spec.unreduced.insert(out.spec.unreduced.end(), v.spec.dims[d].axes.begin(), v.spec.dims[d].axes.end());
    }
  }
  std::sort(out.spec.unreduced.begin(), out.spec.unreduced.end());
  if (!v.data) return out;
  auto data = t.make_shard(out.spec, *out_shape);
  const Shape to = row_major_strides(data->local_shape());
  Shape strides(dest.size(), 0);
  for (std::size_t d = 0; d < dest.size(); ++d) {
    if (dest[d] >= 0) strides[d] = to[static_cast<std::size_t>(dest[d])];
  }
  std::vector<double> total(static_cast<std::size_t>(data->elements()), 0.0);
  with_type(t.options.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const T* src = in<T>(v);
    for_each_index(v.data->local_shape(), strides, Shape(dest.size(), 0),
                   [&](std::int64_t o, std::int64_t) { total[static_cast<std::size_t>(o)] += *src++; });
    T* dst = data->buffer().as<T>();
    for (std::size_t i = 0; i < total.size(); ++i) dst[i] = static_cast<T>(total[i]);
  });
  out.data = std::move(data);
  return out;
}

Var binary(Var a, Var b, BinaryOp op, const std::vector<std::string>& out_dims) {
  Tape& tape = same_tape(a, b, name(op));
  Tape::Impl& t = tape.impl();
  Shape shape;
  Spec spec = binary_spec(t.mesh, a.spec(), a.shape(), b.spec(), b.shape(), op, out_dims, shape);
  const Node& na = t.node(a);
  const Node& nb = t.node(b);
  LocalWork work(t, name(op), spec.tensor);
  Value y =
      broadcast(t, std::move(spec), shape, na.value, nb.value, [op](double x, double z) { return apply(op, x, z); });
  // Each operand's block read once (a broadcast one is re-read from cache), y's written.
  work.pass(na.value.spec, na.shape).pass(nb.value.spec, nb.shape).pass(y.spec, shape).finish();
  if (op == BinaryOp::mul) {
    // Each operand's gradient is the output's times the other operand.
    const bool a_grad = na.requires_grad, b_grad = nb.requires_grad;
    t.node(a).saved = t.node(a).saved || b_grad;
    t.node(b).saved = t.node(b).saved || a_grad;
  }
  return t.add_node(
      tape, std::move(y), shape, {a.id(), b.id()}, [op](Tape::Impl& impl, const Node& self, const Value& grad) {
        const int ia = self.inputs[0], ib = self.inputs[1];
        // Both operands' gradients are computed (one local step) before either is
        // accumulated (which may move it).
        std::vector<std::pair<int, Value>> out;
        if (op == BinaryOp::mul) {
          const Value g = impl.align(grad, self.value.spec, self.shape);
          std::vector<std::pair<int, const Value*>> targets;
          for (const auto& [target, other] : {std::pair{ia, ib}, std::pair{ib, ia}}) {
            if (impl.node(target).requires_grad) targets.emplace_back(target, &impl.saved_value(other));
          }
          LocalWork work(impl, name(op), "d" + self.value.spec.tensor);
          for (const auto& [target, other] : targets) {
            const Node& o = impl.node(target == ia ? ib : ia);
            const Value product =
                broadcast(impl, g.spec, self.shape, g, *other, [](double x, double z) { return x * z; });
            work.pass(g.spec, self.shape).pass(o.value.spec, o.shape).pass(g.spec, self.shape);
            out.emplace_back(target, to_operand(impl, product, self.shape, impl.node(target).value.spec, work));
          }
          work.finish();
        } else {
          // Linear: the gradient is summed and negated in whatever layout it came.
          LocalWork work(impl, name(op), "d" + self.value.spec.tensor);
          if (impl.node(ia).requires_grad)
            out.emplace_back(ia, to_operand(impl, grad, self.shape, impl.node(ia).value.spec, work));
          if (impl.node(ib).requires_grad) {
            const Node& nb = impl.node(ib);
            Value gb = to_operand(impl, grad, self.shape, nb.value.spec, work);
            if (op == BinaryOp::sub) {
              gb = elementwise(impl, gb.spec, nb.shape, gb, nullptr, [](double x, double) { return -x; });
              work.pass(gb.spec, nb.shape, 2);
            }
            out.emplace_back(ib, std::move(gb));
          }
          work.finish();
        }
        for (auto& [target, g] : out) impl.accumulate(target, std::move(g));
      });
}

Var transpose(Var x, const std::vector<std::string>& dims) {
  Tape& tape = x.tape();
  Tape::Impl& t = tape.impl();
  const Node& nx = t.node(x);
  std::vector<std::string> have = dim_names(nx.value.spec), want = dims;
  std::sort(have.begin(), have.end());
  std::sort(want.begin(), want.end());
  if (have != want) {
    throw InputError("transpose of " + format_spec(nx.value.spec, t.mesh) + ": (" + list_text(dims) +
                     ") is not a permutation of its letters");
  }
  Shape shape;
  LocalWork work(t, "transpose", nx.value.spec.tensor);
  Value y = sum_to_letters(t, nx.value, nx.shape, dims, &shape);
  work.pass(nx.value.spec, nx.shape, 2).finish();  // a permuted copy: read and written
  return t.add_node(tape, std::move(y), shape, {x.id()}, [](Tape::Impl& impl, const Node& self, const Value& grad) {
    const int ix = self.inputs[0];
    Shape unused;
    LocalWork work(impl, "transpose", "d" + self.value.spec.tensor);
    Value dx = sum_to_letters(impl, grad, self.shape, dim_names(impl.node(ix).value.spec), &unused);
    work.pass(grad.spec, self.shape, 2).finish();
    impl.accumulate(ix, std::move(dx));
  });
}

bool can_split_locally(const Mesh& mesh, const Spec& spec, const Shape& shape, std::string_view dim,
                       const Parts& parts) {
  return split_layout(mesh, spec, shape, dim, parts).refusal.empty();
}

bool can_merge_locally(const Mesh& mesh, const Spec& spec, const Shape& shape, const std::vector<std::string>& dims) {
  // The merged letter's name does not change whether it runs locally; the first letter's own is free.
  return merge_layout(mesh, spec, shape, dims, dims.empty() ? "" : dims[0]).refusal.empty();
}

Var split_dim(Var x, std::string_view dim, const Parts& parts) {
  const Regrouped r = split_layout(x.tape().mesh(), x.spec(), x.shape(), dim, parts);
  return regroup(
      x, r,
      [names = part_names(parts), dim = std::string(dim)](const Mesh& mesh, const Spec& s, const Shape& shape) {
        return merge_layout(mesh, s, shape, names, dim);
      },
      "split_dim");
}

Var merge_dims(Var x, const std::vector<std::string>& dims, std::string_view into) {
  Parts parts;
  for (const std::string& d : dims) {
    const int i = x.spec().find_dim(d);
    parts.emplace_back(d, i < 0 ? 0 : x.shape()[static_cast<std::size_t>(i)]);
  }
  const Regrouped r = merge_layout(x.tape().mesh(), x.spec(), x.shape(), dims, into);
  return regroup(
      x, r,
      [parts, into = std::string(into)](const Mesh& mesh, const Spec& s, const Shape& shape) {
        return split_layout(mesh, s, shape, into, parts);
      },
      "merge_dims");
}

}  // namespace shardmm::autodiff
