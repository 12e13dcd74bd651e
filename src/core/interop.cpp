#include "shardmm/core/interop.h"

#include <algorithm>

#include "core/text.h"
#include "shardmm/core/error.h"

namespace shardmm {

namespace {

std::string quoted(const std::string& name) { return "'" + name + "'"; }

std::string axis_entry(const AxisList& axes, const Mesh& mesh) {
  if (axes.empty()) return "None";
  if (axes.size() == 1) return quoted(mesh.axis(axes[0]).name);
  std::string out;
  for (int a : axes) out += (out.empty() ? "(" : ", ") + quoted(mesh.axis(a).name);
  return out + ")";
}

struct Token {
  enum Kind { name, string, number, punct, end } kind = end;
  std::string text;  // a string's without its quotes
  std::size_t pos = 0, len = 0;
};

// Python-like text: names (dots allowed, as in torch.distributed.tensor.Shard), quoted
// strings, integers and the punctuation the two forms use.
class FormParser {
 public:
  FormParser(std::string_view src, std::size_t from, std::string what, const Spec& letters, const Mesh& mesh)
      : src_(src),
        what_(std::move(what)),
        mesh_(mesh),
        spec_(letters),
        owner_(static_cast<std::size_t>(mesh.rank()), -1) {
    for (DimSpec& d : spec_.dims) d.axes.clear();
    spec_.unreduced.clear();
    tokenize(from);
  }

  Spec partition_spec() {
    const Token head = take();
    const bool named_p = head.text == "P" || head.text == "PartitionSpec" || ends_with(head.text, ".PartitionSpec");
    if (head.kind != Token::name || !named_p) {
      fail("a PartitionSpec is written P(...), e.g. P('X', None) or P(('X', 'Y'), None)", head);
    }
    expect("(", "after " + head.text);
    std::size_t dim = 0;
    while (!peek_is(")")) {
      if (peek().kind == Token::name && peek().text == "unreduced") {
        unreduced();
        if (peek_is(",")) take();
        if (!peek_is(")")) fail("unreduced= comes last in a PartitionSpec, after the dimensions' entries", peek());
        break;
      }
      const Token& first = peek();
      if (dim >= spec_.dims.size()) {
        fail("more entries than " + letters_text() + " has dimensions (" + std::to_string(spec_.dims.size()) +
                 "); a PartitionSpec has one entry per dimension",
             first);
      }
      entry(dim++);
      if (!peek_is(")")) expect(",", "between a PartitionSpec's entries");
    }
    take();
    finish();
    return spec_;
  }

  Spec placements() {
    const Token open = take();
    if (open.kind != Token::punct || (open.text != "[" && open.text != "(")) {
      fail("placements are written as a list, one per mesh axis, e.g. [Shard(0), Replicate()]", open);
    }
    const std::string close = open.text == "[" ? "]" : ")";
    int axis = 0;
    while (!peek_is(close)) {
      const Token& at = peek();
      if (axis >= mesh_.rank()) fail(count_rule(), at);
      placement(axis++);
      if (!peek_is(close)) expect(",", "between placements");
    }
    const Token end = take();
    if (axis != mesh_.rank()) fail(count_rule() + "; got " + std::to_string(axis), end);
    finish();
    return spec_;
  }

 private:
  static bool ends_with(const std::string& s, std::string_view tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  }

  [[noreturn]] void fail(const std::string& why, const Token& at) const {
    const std::size_t pos = at.kind == Token::end ? src_.size() - (src_.empty() ? 0 : 1) : at.pos;
    throw InputError("bad " + what_ + " '" + std::string(src_) + "': " + why, src_, pos,
                     std::max<std::size_t>(1, at.len));
  }

  void tokenize(std::size_t pos) {
    while (true) {
      while (pos < src_.size() && text::is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) break;
      const char c = src_[pos];
      Token t;
      t.pos = pos;
      if (text::is_letter(c) || c == '_') {
        std::size_t end = pos;
        const auto in_name = [](char ch) {
          return text::is_letter(ch) || text::is_digit(ch) || ch == '_' || ch == '.';
        };
        while (end < src_.size() && in_name(src_[end])) ++end;
        t.kind = Token::name;
        t.text = std::string(src_.substr(pos, end - pos));
      } else if (c == '\'' || c == '"') {
        const std::size_t close = src_.find(c, pos + 1);
        if (close == std::string_view::npos) {
          fail(std::string("the quote ") + c + " is never closed", Token{Token::punct, "", pos, 1});
        }
        t.kind = Token::string;
        t.text = std::string(src_.substr(pos + 1, close - pos - 1));
        t.len = close + 1 - pos;
      } else if (text::is_digit(c) || (c == '-' && pos + 1 < src_.size() && text::is_digit(src_[pos + 1]))) {
        std::size_t end = pos + 1;
        while (end < src_.size() && text::is_digit(src_[end])) ++end;
        t.kind = Token::number;
        t.text = std::string(src_.substr(pos, end - pos));
      } else if (std::string_view("()[]{},=").find(c) != std::string_view::npos) {
        t.kind = Token::punct;
        t.text = std::string(1, c);
      } else {
        fail("unexpected '" + text::show_char(src_, pos) + "'", Token{Token::punct, "", pos, 1});
      }
      if (t.len == 0) t.len = t.kind == Token::name || t.kind == Token::number ? t.text.size() : 1;
      pos = t.pos + t.len;
      tokens_.push_back(std::move(t));
    }
    tokens_.push_back(Token{Token::end, "", src_.size(), 1});
  }

  const Token& peek() const { return tokens_[next_]; }
  bool peek_is(const std::string& punct) const { return peek().kind == Token::punct && peek().text == punct; }
  Token take() {
    const Token t = tokens_[next_];
    if (t.kind != Token::end) ++next_;
    return t;
  }
  void expect(const std::string& punct, const std::string& where) {
    const Token t = take();
    if (t.kind != Token::punct || t.text != punct) {
      fail(t.kind == Token::end ? "the text ends before every bracket is closed"
                                : "expected '" + punct + "' " + where + ", got '" + t.text + "'",
           t);
    }
  }
  void finish() {
    if (peek().kind != Token::end) fail("unexpected '" + peek().text + "' after the end", peek());
  }

  std::string letters_text() const {
    std::string out = spec_.tensor + "[";
    for (std::size_t i = 0; i < spec_.dims.size(); ++i) out += (i ? ", " : "") + spec_.dims[i].name;
    return out + "]";
  }

  std::string count_rule() const {
    return "placements are one per mesh axis, in mesh order, and the mesh " + mesh_.to_string() + " has " +
           std::to_string(mesh_.rank()) + (mesh_.rank() == 1 ? " axis" : " axes");
  }

  // A quoted mesh axis name, not used before in the spec.
  int axis(const Token& t, bool unreduced = false) {
    if (t.kind != Token::string) {
      fail(t.kind == Token::name ? "mesh axis names are quoted strings: write '" + t.text + "'"
                                 : "expected a mesh axis name in quotes, e.g. 'X'",
           t);
    }
    const auto found = mesh_.find(t.text);
    if (!found) {
      std::string names;
      for (int i = 0; i < mesh_.rank(); ++i) names += (i ? ", " : "") + mesh_.axis(i).name;
      fail("unknown mesh axis '" + t.text + "'; the mesh " + mesh_.to_string() + " has axes " + names, t);
    }
    const int owner = owner_[static_cast<std::size_t>(*found)];
    if (unreduced && owner >= 0) {
      fail("mesh axis '" + t.text + "' both shards dimension " + spec_.dims[static_cast<std::size_t>(owner)].name +
               " and is unreduced; an axis either shards a dimension or holds partial sums, not both",
           t);
    }
    if (owner != -1 || spec_.is_unreduced(*found)) {
      fail("mesh axis '" + t.text + "' is named twice; a mesh axis can shard only one dimension, once", t);
    }
    return *found;
  }

  void entry(std::size_t dim) {
    const Token t = take();
    AxisList& axes = spec_.dims[dim].axes;
    if (t.kind == Token::name && t.text == "None") return;
    if (t.kind == Token::punct && t.text == "(") {
      while (!peek_is(")")) {
        const int a = axis(take());
        owner_[static_cast<std::size_t>(a)] = static_cast<int>(dim);
        axes.push_back(a);
        if (!peek_is(")")) expect(",", "between the axes of a tuple");
      }
      take();
      return;
    }
    const int a = axis(t);
    owner_[static_cast<std::size_t>(a)] = static_cast<int>(dim);
    axes.push_back(a);
  }

  void unreduced() {
    take();
    expect("=", "after unreduced");
    const Token open = take();
    const std::string close = open.text == "{" ? "}" : open.text == "(" ? ")" : open.text == "[" ? "]" : "";
    if (open.kind != Token::punct || close.empty()) {
      fail("write the unreduced axes as a set, e.g. unreduced={'X'}", open);
    }
    while (!peek_is(close)) {
      spec_.unreduced.push_back(axis(take(), true));
      if (!peek_is(close)) expect(",", "between unreduced axes");
    }
    take();
    std::sort(spec_.unreduced.begin(), spec_.unreduced.end());
  }

  void placement(int axis) {
    const Token t = take();
    const std::string kind = t.kind == Token::name ? t.text.substr(t.text.rfind('.') + 1) : "";
    if (kind != "Shard" && kind != "Replicate" && kind != "Partial") {
      fail("expected a placement, Shard(d), Replicate() or Partial(), got '" + t.text + "'", t);
    }
    expect("(", "after " + kind);
    if (kind == "Shard") {
      if (peek().kind == Token::name && peek().text == "dim") {
        take();
        expect("=", "after dim");
      }
      const Token n = take();
      const auto rank = static_cast<long long>(spec_.dims.size());
      long long d = 0;
      const bool number = n.kind == Token::number && n.text.size() < 10;
      if (number) d = std::stoll(n.text);
      if (!number || d < -rank || d >= rank) {
        fail("Shard takes a dimension of " + letters_text() + ", 0 to " + std::to_string(rank - 1) +
                 " (or -1 for the last)",
             n);
      }
      if (d < 0) d += rank;
      spec_.dims[static_cast<std::size_t>(d)].axes.push_back(axis);
      owner_[static_cast<std::size_t>(axis)] = static_cast<int>(d);
    } else if (kind == "Partial") {
      if (!peek_is(")")) {
        if (peek().kind == Token::name && peek().text == "reduce_op") {
          take();
          expect("=", "after reduce_op");
        }
        const Token op = take();
        // 'sum' as written, or sum as a Partial's repr prints it.
        if ((op.kind != Token::string && op.kind != Token::name) || op.text != "sum") {
          fail("shardmm's partial values are sums: write Partial() or Partial('sum')", op);
        }
      }
      spec_.unreduced.push_back(axis);
    }
    expect(")", "to close " + kind);
  }

  std::string_view src_;
  std::string what_;
  const Mesh& mesh_;
  Spec spec_;
  std::vector<int> owner_;  // per mesh axis: the dimension it shards, or -1
  std::vector<Token> tokens_;
  std::size_t next_ = 0;
};

// The standalone converters' letters: dimension names as a spec writes them, distinct, and
// none a mesh axis name (which would read as an axis).
Spec letters_spec(const std::vector<std::string>& letters, const Mesh& mesh) {
  Spec spec;
  for (const std::string& l : letters) {
    bool ok = !l.empty() && text::is_letter(l[0]);
    for (std::size_t i = 1; ok && i < l.size(); ++i) ok = text::is_digit(l[i]);
    if (!ok) {
      throw InputError("bad dimension letter '" + l + "'; a dimension name is a letter, optionally followed by digits");
    }
    if (spec.find_dim(l) >= 0) {
      throw InputError("dimension letter '" + l + "' is given twice; name each dimension once");
    }
    if (mesh.find(l)) {
      throw InputError("dimension letter '" + l + "' is also a mesh axis of " + mesh.to_string() +
                       "; name dimensions apart from mesh axes (I, J, K, ...)");
    }
    spec.dims.push_back({l, {}});
  }
  if (spec.dims.empty()) throw InputError("no dimension letters; name the tensor's dimensions, e.g. I, J");
  return spec;
}

}  // namespace

std::string to_partition_spec(const Spec& spec, const Mesh& mesh) {
  std::string out = "P(";
  for (std::size_t i = 0; i < spec.dims.size(); ++i) out += (i ? ", " : "") + axis_entry(spec.dims[i].axes, mesh);
  if (!spec.unreduced.empty()) {
    std::string set;
    for (int a : spec.unreduced) set += (set.empty() ? "{" : ", ") + quoted(mesh.axis(a).name);
    out += (spec.dims.empty() ? "" : ", ") + std::string("unreduced=") + set + "}";
  }
  return out + ")";
}

std::string placements_problem(const Spec& spec, const Mesh& mesh) {
  for (const DimSpec& d : spec.dims) {
    if (std::is_sorted(d.axes.begin(), d.axes.end())) continue;
    AxisList in_order = d.axes;
    std::sort(in_order.begin(), in_order.end());
    return d.name + "_" + mesh.axis_names(d.axes) + " splits " + d.name + " over " + mesh.axis(d.axes[0]).name +
           " first; DTensor nests one dimension's Shard placements in mesh order, so only " + d.name + "_" +
           mesh.axis_names(in_order) + " has a placements form";
  }
  return "";
}

std::string to_placements(const Spec& spec, const Mesh& mesh) {
  if (const std::string why = placements_problem(spec, mesh); !why.empty()) {
    throw InputError(format_spec(spec, mesh) + " has no DTensor placements form: " + why);
  }
  std::string out = "[";
  for (int a = 0; a < mesh.rank(); ++a) {
    const int d = spec.dim_of_axis(a);
    out += a ? ", " : "";
    out += d >= 0 ? "Shard(" + std::to_string(d) + ")" : spec.is_unreduced(a) ? "Partial()" : "Replicate()";
  }
  return out + "]";
}

Spec from_partition_spec(std::string_view text, const std::vector<std::string>& letters, const Mesh& mesh) {
  return FormParser(text, 0, "PartitionSpec", letters_spec(letters, mesh), mesh).partition_spec();
}

Spec from_placements(std::string_view text, const std::vector<std::string>& letters, const Mesh& mesh) {
  return FormParser(text, 0, "placements", letters_spec(letters, mesh), mesh).placements();
}

namespace detail {

Spec parse_interop_form(std::string_view src, std::size_t from, const Spec& letters, const Mesh& mesh) {
  std::size_t at = from;
  while (at < src.size() && text::is_space(src[at])) ++at;
  FormParser parser(src, from, "spec", letters, mesh);
  return at < src.size() && (src[at] == '[' || src[at] == '(') ? parser.placements() : parser.partition_spec();
}

}  // namespace detail

}  // namespace shardmm
