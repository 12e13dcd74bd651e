// bind(): a parsed program unrolled, sized and checked into the Graph that runs.
#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "shardmm/core/error.h"
#include "shardmm/program/program.h"

namespace shardmm::program {

int Graph::find(std::string_view name) const {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Graph::outputs() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.role == Role::computed && t.consumers.empty() && static_cast<int>(i) != loss)
      out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> Graph::leaves() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].role != Role::computed) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<int> Graph::params() const {
  std::vector<int> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].role == Role::param) out.push_back(static_cast<int>(i));
  }
  return out;
}

Spec replicated_spec(const Tensor& tensor) {
  Spec s;
  s.tensor = tensor.name;
  for (const std::string& l : tensor.letters) s.dims.push_back({l, {}});
  return s;
}

namespace {

// The most ops a program unrolls to: a typo'd repeat count fails fast instead of filling memory.
constexpr std::int64_t kMaxOps = 1'000'000;

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return "[" + out + "]";
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::int64_t count_ops(const Expr& e) {
  if (e.is_reference()) return 0;
  std::int64_t n = 1;
  for (const Expr& a : e.args) n += count_ops(a);
  return n;
}

// Ops the items unroll to, saturating at kMaxOps + 1.
std::int64_t count_ops(const std::vector<Item>& items) {
  std::int64_t n = 0;
  for (const Item& item : items) {
    const std::int64_t here = item.kind == Item::Kind::repeat
                                  ? item.count * std::max<std::int64_t>(1, count_ops(item.body))
                                  : std::max<std::int64_t>(1, count_ops(item.statement.expr));
    n = std::min(kMaxOps + 1, n + std::min(kMaxOps + 1, here));
  }
  return n;
}

class Binder {
 public:
  Binder(const Program& p, const BindOptions& o) : program_(p), options_(o) { graph_.file = p.file; }

  Graph bind() {
    bind_mesh();
    bind_dims();
    for (const auto& [name, text] : options_.specs) {
      if (!declared(program_.items, name)) {
        throw InputError("spec for '" + name + "' in " + field(options_.specs_field) + ": the program has no tensor '" +
                         name + "'");
      }
    }
    std::int64_t ops = 0;
    for (const Item& item : program_.items) {
      ops += count_ops(std::vector<Item>{item});
      if (ops > kMaxOps) {
        fail(item.where,
             "the program unrolls to more than " + std::to_string(kMaxOps) + " ops; check the repeat counts");
      }
    }
    Scope top;
    walk(program_.items, top, "");
    for (const Tensor& t : graph_.tensors) {
      if (t.role != Role::computed && t.consumers.empty()) {
        fail(t.where,
             std::string(to_string(t.role)) + " '" + t.source_name + "' is never used; remove it or use it in an op");
      }
    }
    check_dims_used();
    return std::move(graph_);
  }

 private:
  // The names visible at a point: a repeat body sees its enclosing names and may rebind a
  // computed one (the value carried from one iteration to the next).
  struct Scope {
    Scope* parent = nullptr;
    std::map<std::string, int> names;
    std::set<std::string> defined_here;  // in this iteration
    int lookup(const std::string& n) const {
      for (const Scope* s = this; s; s = s->parent) {
        if (auto it = s->names.find(n); it != s->names.end()) return it->second;
      }
      return -1;
    }
  };

  [[noreturn]] void fail(Location at, const std::string& why, std::size_t len = 1) const {
    const std::string head =
        program_.file + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": " + why;
    if (at.line >= 1 && static_cast<std::size_t>(at.line) <= program_.lines.size()) {
      throw InputError(head, program_.lines[static_cast<std::size_t>(at.line - 1)],
                       static_cast<std::size_t>(at.column - 1), len);
    }
    throw InputError(head);
  }

  static bool declared(const std::vector<Item>& items, const std::string& name) {
    for (const Item& item : items) {
      if (item.kind == Item::Kind::repeat ? declared(item.body, name)
                                          : item.kind == Item::Kind::statement && item.statement.name == name) {
        return true;
      }
    }
    return false;
  }

  void bind_mesh() {
    if (options_.mesh) {
      graph_.mesh = *options_.mesh;
      return;
    }
    if (!program_.mesh) {
      throw InputError(program_.file + ": the program has no mesh: add a line like 'mesh X=4' or give the " +
                       field("mesh"));
    }
    try {
      graph_.mesh = Mesh::parse(*program_.mesh, options_.split);
    } catch (const InputError& e) {
      fail(program_.mesh_where, e.headline(), program_.mesh->size());
    }
  }

  void bind_dims() {
    if (program_.dims) {
      try {
        graph_.dims = parse_dims(*program_.dims);
      } catch (const InputError& e) {
        fail(program_.dims_where, e.headline(), program_.dims->size());
      }
    }
    if (options_.dims) {
      for (const auto& [k, v] : *options_.dims) graph_.dims[k] = v;
    }
  }

  void check_dims_used() const {
    std::set<std::string> used;
    for (const Tensor& t : graph_.tensors) used.insert(t.letters.begin(), t.letters.end());
    for (const GraphOp& op : graph_.ops) {
      used.insert(op.op.from.begin(), op.op.from.end());
      used.insert(op.op.to.begin(), op.op.to.end());
    }
    for (const auto& [name, size] : graph_.dims) {
      if (!used.count(name)) {
        const std::string why = "dimension '" + name + "' is given a size but no tensor has it (a typo?)";
        if (program_.dims && !(options_.dims && options_.dims->count(name))) fail(program_.dims_where, why);
        throw InputError(why + " in " + field("dims"));
      }
    }
  }

  std::int64_t size_of(const std::string& letter, Location at) const {
    auto it = graph_.dims.find(letter);
    if (it == graph_.dims.end()) {
      fail(at, "dimension '" + letter + "' has no size; add it to the dims line (dims " + letter + "=...) or " +
                   "give it in " + field("dims"));
    }
    return it->second;
  }

  Shape shape_of(const std::vector<std::string>& letters, Location at) const {
    Shape shape;
    std::int64_t elements = 1;
    for (const std::string& l : letters) {
      const std::int64_t n = size_of(l, at);
      shape.push_back(n);
      if (n > 0 && elements > std::numeric_limits<std::int64_t>::max() / 8 / n) {
        fail(at, "the tensor's element count overflows 64-bit byte counts; give smaller dims");
      }
      elements *= n;
    }
    return shape;
  }

  int add_tensor(Tensor t) {
    t.shape = shape_of(t.letters, t.where);
    graph_.tensors.push_back(std::move(t));
    return static_cast<int>(graph_.tensors.size()) - 1;
  }

  void walk(const std::vector<Item>& items, Scope& scope, const std::string& suffix) {
    for (const Item& item : items) {
      if (item.kind == Item::Kind::repeat) {
        for (int k = 0; k < item.count; ++k) {
          Scope body{&scope, {}, {}};
          walk(item.body, body, suffix + "." + std::to_string(k));
          // Values carried out of the block: the enclosing names the body rebound.
          for (const auto& [name, index] : body.names) {
            if (scope.lookup(name) >= 0) rebind(scope, name, index);
          }
        }
        continue;
      }
      statement(item, scope, suffix);
    }
  }

  // Points the innermost scope holding `name` at a new value.
  static void rebind(Scope& scope, const std::string& name, int index) {
    for (Scope* s = &scope; s; s = s->parent) {
      if (auto it = s->names.find(name); it != s->names.end()) {
        it->second = index;
        return;
      }
    }
  }

  void statement(const Item& item, Scope& scope, const std::string& suffix) {
    const Statement& s = item.statement;
    const bool is_loss = item.kind == Item::Kind::loss;
    if (is_loss && graph_.loss >= 0) fail(item.where, "a second loss; a program has one");
    const int previous = scope.lookup(s.name);
    if (!is_loss && previous >= 0) {
      const Tensor& old = graph_.tensors[static_cast<std::size_t>(previous)];
      const bool carried =
          !suffix.empty() && s.role == Role::computed && scope.parent && scope.parent->lookup(s.name) >= 0;
      if (!carried) {
        fail(s.where,
             "'" + s.name + "' is defined twice (first at line " + std::to_string(old.where.line) +
                 "); a tensor is defined once, except a value a repeat block carries to its next iteration",
             s.name.size());
      }
      if (old.letters != s.letters) {
        fail(s.where,
             "'" + s.name + "' is carried through the repeat block as " + join(old.letters) + " but redefined as " +
                 join(s.letters) + "; a carried value keeps its letters",
             s.name.size());
      }
    }
    Tensor t;
    t.source_name = s.name;
    // A carried value rebound again in the same iteration gets a prime per rebinding (x.0').
    t.name =
        s.name + suffix +
        std::string(static_cast<std::size_t>(scope.defined_here.count(s.name) ? ++rebound_[s.name + suffix] : 0), '\'');
    t.role = s.role;
    t.letters = s.letters;
    t.where = s.where;
    nested_ = 0;
    if (s.role == Role::computed) {
      const int result = expression(s.expr, scope, t.name, &t, suffix);
      if (is_loss) graph_.loss = result;
      scope.names[s.name] = result;
      scope.defined_here.insert(s.name);
      return;
    }
    t.pinned = pinned(s, t.letters, /*leaf=*/true);
    t.regathered = s.regathered;
    const int index = add_tensor(std::move(t));
    scope.names[s.name] = index;
    scope.defined_here.insert(s.name);
  }

  // The spec pinned for a statement (the caller's override first), checked against its letters.
  std::optional<Spec> pinned(const Statement& s, const std::vector<std::string>& letters, bool leaf) const {
    std::string text;
    Location at = s.spec_where;
    std::size_t len = 1;
    if (auto it = options_.specs.find(s.name); it != options_.specs.end()) {
      text = it->second;
      at = {};
    } else if (s.spec) {
      text = *s.spec;
      len = text.size();
    } else {
      return std::nullopt;
    }
    const auto bad = [&](const std::string& why) {
      const std::string full = "spec '" + text + "' of '" + s.name + "': " + why;
      if (at.line == 0) throw InputError(full + " (in " + field(options_.specs_field) + ")");
      fail(at, full, len);
    };
    // The spec's own tensor name may be the statement's (w_in[D, F_X]) or absent ([D, F_X]);
    // names with '_' are not spec names, so the brackets are parsed alone.
    const std::size_t open = text.find('[');
    if (open == std::string::npos) bad("expected the tensor's letters in brackets, e.g. " + s.name + join(letters));
    std::string trimmed = text.substr(0, open);
    trimmed.erase(std::remove(trimmed.begin(), trimmed.end(), ' '), trimmed.end());
    if (!trimmed.empty() && trimmed != s.name)
      bad("it names tensor '" + trimmed + "'; write " + s.name + "[...] or [...]");
    Spec spec;
    try {
      spec = parse_spec(text.substr(open), graph_.mesh);
    } catch (const InputError& e) {
      // parse_spec's own message names the spec and the rule.
      if (at.line == 0)
        throw InputError(e.headline() + " (in " + field(options_.specs_field) + " for '" + s.name + "')");
      fail(at, e.headline(), len);
    }
    spec.tensor = s.name;
    std::vector<std::string> spec_letters;
    for (const DimSpec& d : spec.dims) spec_letters.push_back(d.name);
    if (spec_letters != letters) {
      bad("its letters " + join(spec_letters) + " are not the tensor's " + join(letters) + " in order");
    }
    if (leaf && !spec.unreduced.empty()) {
      bad("an input or param holds whole values; unreduced axes ({U_...}) are only for computed tensors");
    }
    return spec;
  }

  // Flattens `e` into ops; returns the index of its value. `declared` is the statement's
  // tensor (name, letters, pins) when `e` is the statement's whole expression.
  int expression(const Expr& e, Scope& scope, const std::string& name, const Tensor* declared,
                 const std::string& suffix) {
    if (e.is_reference()) {
      const int index = scope.lookup(e.tensor);
      if (index < 0) {
        fail(e.where,
             "'" + e.tensor + "' is not defined before this line" +
                 (declared_anywhere(e.tensor) ? " (it is defined later or inside a repeat block)" : ""),
             e.tensor.size());
      }
      if (declared) {
        fail(e.where,
             "a line that only names '" + e.tensor + "' copies nothing; use '" + e.tensor + "' where it is read",
             e.tensor.size());
      }
      return index;
    }
    GraphOp op;
    op.op = e.op;
    op.expression = e.text;
    op.where = e.where;
    for (const Expr& arg : e.args) op.operands.push_back(expression(arg, scope, name, nullptr, suffix));
    Tensor t;
    if (declared) {
      t = *declared;
    } else {
      t.name = name + "~" + std::to_string(++nested_);
      t.source_name = t.name;
      t.temporary = true;
      t.where = e.where;
    }
    t.role = Role::computed;
    t.letters = result_letters(op, declared ? &declared->letters : nullptr);
    // Routing is data: no gradient flows through a route, nor into what only it feeds.
    t.differentiable = op.op.kind != OpKind::route && std::any_of(op.operands.begin(), op.operands.end(), [&](int x) {
                         return graph_.tensors[static_cast<std::size_t>(x)].differentiable;
                       });
    if (declared) {
      const Statement* s = statement_of(declared->source_name, declared->where);
      if (s) t.pinned = pinned(*s, t.letters, false);
    }
    const int result = add_tensor(std::move(t));
    op.result = result;
    graph_.tensors[static_cast<std::size_t>(result)].producer = static_cast<int>(graph_.ops.size());
    for (int operand : op.operands) {
      graph_.tensors[static_cast<std::size_t>(operand)].consumers.push_back(static_cast<int>(graph_.ops.size()));
    }
    graph_.ops.push_back(std::move(op));
    return result;
  }

  bool declared_anywhere(const std::string& name) const { return declared(program_.items, name); }

  const Statement* statement_of(const std::string& name, Location where) const {
    return find_statement(program_.items, name, where);
  }
  static const Statement* find_statement(const std::vector<Item>& items, const std::string& name, Location where) {
    for (const Item& item : items) {
      if (item.kind == Item::Kind::repeat) {
        if (const Statement* s = find_statement(item.body, name, where)) return s;
      } else if (item.statement.name == name && item.statement.where.line == where.line &&
                 item.statement.where.column == where.column) {
        return &item.statement;
      }
    }
    return nullptr;
  }

  const std::vector<std::string>& letters_of(int tensor) const {
    return graph_.tensors[static_cast<std::size_t>(tensor)].letters;
  }

  // The letters `op` gives, checked against `declared` (the statement's letters) when given.
  std::vector<std::string> result_letters(const GraphOp& g, const std::vector<std::string>* declared) const {
    const Op& op = g.op;
    const Location at = g.where;
    const std::size_t len = g.expression.size();
    const std::vector<std::string>& a = letters_of(g.operands[0]);
    const auto need_letter = [&](const std::string& l, const std::vector<std::string>& of, const char* role) {
      if (!contains(of, l)) {
        fail(at, op.function + ": " + role + " '" + l + "' is not a letter of its operand " + join(of), len);
      }
    };
    const auto same_as_declared = [&](std::vector<std::string> got) {
      if (declared && *declared != got) {
        const bool permutation = std::is_permutation(got.begin(), got.end(), declared->begin(), declared->end());
        fail(at,
             op.function + " gives " + join(got) + " but the line declares " + join(*declared) +
                 (permutation ? "; reorder letters with transpose(...) on a line of its own" : ""),
             len);
      }
      return got;
    };
    switch (op.kind) {
      case OpKind::einsum: {
        const std::vector<std::string>& b = letters_of(g.operands[1]);
        if (!declared) {
          fail(at,
               "an einsum inside an expression has no named output letters; give '" + g.expression +
                   "' a line of its own (NAME[...] = a @ b)",
               len);
        }
        for (const std::string& l : *declared) {
          if (!contains(a, l) && !contains(b, l))
            fail(at, "einsum: output letter '" + l + "' is in neither operand " + join(a) + " nor " + join(b), len);
        }
        for (const auto* x : {&a, &b}) {
          for (const std::string& l : *x) {
            const auto* other = x == &a ? &b : &a;
            if (!contains(*other, l) && !contains(*declared, l)) {
              fail(at,
                   "einsum: letter '" + l + "' of " + join(*x) +
                       " is in neither the other operand nor the output; sum it out first (sum(x, over=" + l + "))",
                   len);
            }
          }
        }
        return *declared;
      }
      case OpKind::binary: {
        std::vector<std::string> both = a;
        for (const std::string& l : letters_of(g.operands[1])) {
          if (!contains(both, l)) both.push_back(l);
        }
        if (declared) {
          if (!std::is_permutation(both.begin(), both.end(), declared->begin(), declared->end())) {
            fail(at,
                 op.function + " gives the letters " + join(both) + " (its operands' together) but the line declares " +
                     join(*declared),
                 len);
          }
          return *declared;
        }
        return both;
      }
      case OpKind::unary:
      case OpKind::scale:
        return same_as_declared(a);
      case OpKind::normalize:
        need_letter(op.over, a, "letter");
        return same_as_declared(a);
      case OpKind::causal_mask:
        need_letter(op.from[0], a, "row letter");
        need_letter(op.to[0], a, "column letter");
        if (op.from[0] == op.to[0]) fail(at, "causal_mask needs two different letters (row, column)", len);
        return same_as_declared(a);
      case OpKind::reduce: {
        if (op.over.empty()) return same_as_declared({});
        need_letter(op.over, a, "letter");
        std::vector<std::string> out;
        for (const std::string& l : a) {
          if (l != op.over) out.push_back(l);
        }
        return same_as_declared(out);
      }
      case OpKind::transpose:
        if (!declared)
          fail(at, "transpose inside an expression has no named output order; give it a line of its own", len);
        if (!std::is_permutation(a.begin(), a.end(), declared->begin(), declared->end())) {
          fail(at, "transpose gives a permutation of " + join(a) + "; the line declares " + join(*declared), len);
        }
        return *declared;
      case OpKind::rename: {
        need_letter(op.from[0], a, "letter");
        if (contains(a, op.to[0])) fail(at, "rename: '" + op.to[0] + "' is already a letter of " + join(a), len);
        if (size_of(op.from[0], at) != size_of(op.to[0], at)) {
          fail(at,
               "rename: '" + op.from[0] + "' has size " + std::to_string(size_of(op.from[0], at)) + " but '" +
                   op.to[0] + "' " + std::to_string(size_of(op.to[0], at)) + "; a renamed letter keeps its size",
               len);
        }
        std::vector<std::string> out = a;
        *std::find(out.begin(), out.end(), op.from[0]) = op.to[0];
        return same_as_declared(out);
      }
      case OpKind::route: {
        if (!declared) {
          fail(at,
               "route inside an expression has no capacity letter; give it a line of its own "
               "(d[B, T, E, C] = route(p, over=E, tokens=T, top=2))",
               len);
        }
        need_letter(op.over, a, "experts' letter");
        need_letter(op.from[0], a, "tokens' letter");
        if (op.over == op.from[0])
          fail(at, "route needs different letters for the experts (over=) and the tokens (tokens=)", len);
        if (op.top > size_of(op.over, at)) {
          fail(at,
               "route: top=" + std::to_string(op.top) + " but there are " + std::to_string(size_of(op.over, at)) +
                   " experts ('" + op.over + "'); a token goes to 1 <= top <= " + op.over + " experts",
               len);
        }
        if (declared->size() != a.size() + 1 || !std::equal(a.begin(), a.end(), declared->begin()) ||
            contains(a, declared->back())) {
          fail(at,
               "route gives its operand's letters " + join(a) +
                   " then a new capacity letter (each expert's slots), "
                   "but the line declares " +
                   join(*declared),
               len);
        }
        size_of(declared->back(), at);
        return *declared;
      }
      case OpKind::split:
      case OpKind::merge: {
        const bool split = op.kind == OpKind::split;
        const std::vector<std::string>& many = split ? op.to : op.from;
        const std::string& one = split ? op.from[0] : op.to[0];
        std::vector<std::string> out;
        std::int64_t product = 1;
        for (const std::string& l : many) {
          product *= size_of(l, at);
          if (std::count(many.begin(), many.end(), l) > 1)
            fail(at, op.function + ": letter '" + l + "' appears twice", len);
        }
        if (size_of(one, at) != product) {
          fail(at,
               op.function + ": '" + one + "' has size " + std::to_string(size_of(one, at)) +
                   " but the parts multiply to " + std::to_string(product),
               len);
        }
        if (split) {
          need_letter(one, a, "letter");
          for (const std::string& l : many) {
            if (contains(a, l)) fail(at, "split: '" + l + "' is already a letter of " + join(a), len);
          }
          for (const std::string& l : a) {
            if (l == one) {
              out.insert(out.end(), many.begin(), many.end());
            } else {
              out.push_back(l);
            }
          }
        } else {
          auto first = std::find(a.begin(), a.end(), many[0]);
          if (first == a.end() || a.end() - first < static_cast<std::ptrdiff_t>(many.size()) ||
              !std::equal(many.begin(), many.end(), first)) {
            fail(at, "merge: " + join(many) + " must be consecutive letters of " + join(a) + ", in that order", len);
          }
          if (contains(a, one)) fail(at, "merge: '" + one + "' is already a letter of " + join(a), len);
          out.insert(out.end(), a.begin(), first);
          out.push_back(one);
          out.insert(out.end(), first + static_cast<std::ptrdiff_t>(many.size()), a.end());
        }
        return same_as_declared(out);
      }
    }
    return a;
  }

  const Program& program_;
  const BindOptions& options_;
  Graph graph_;
  int nested_ = 0;                      // temporaries named so far in the current statement
  std::map<std::string, int> rebound_;  // rebindings of a carried value within one iteration
};

}  // namespace

Graph bind(const Program& program, const BindOptions& options) { return Binder(program, options).bind(); }

}  // namespace shardmm::program
