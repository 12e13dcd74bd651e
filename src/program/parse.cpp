// The program text: lines, a small expression grammar, and the canonical printer.
// docs/programs.md is the grammar's reference; each error names FILE:LINE:COL.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/text.h"
#include "shardmm/core/error.h"
#include "shardmm/program/program.h"

namespace shardmm::program {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::einsum:
      return "einsum";
    case OpKind::unary:
      return "unary";
    case OpKind::scale:
      return "scale";
    case OpKind::binary:
      return "binary";
    case OpKind::reduce:
      return "reduce";
    case OpKind::normalize:
      return "normalize";
    case OpKind::causal_mask:
      return "causal_mask";
    case OpKind::transpose:
      return "transpose";
    case OpKind::split:
      return "split";
    case OpKind::merge:
      return "merge";
    case OpKind::rename:
      return "rename";
    case OpKind::route:
      return "route";
  }
  return "?";
}

const char* to_string(Role role) {
  switch (role) {
    case Role::input:
      return "input";
    case Role::param:
      return "param";
    case Role::computed:
      return "computed";
  }
  return "?";
}

namespace {

constexpr std::array kKeywords = {"mesh", "dims", "input", "param", "loss", "repeat"};
constexpr std::array kUnary = {"relu", "gelu", "silu", "tanh", "exp"};
constexpr std::array kReduce = {"sum", "mean", "max"};
constexpr std::array kNormalize = {"softmax", "layer_norm", "rms_norm"};
constexpr std::array kShape = {"transpose", "split", "merge", "rename", "causal_mask", "scale", "route"};
// The most repeat blocks nest, and the most iterations a program unrolls to (bind()).
constexpr int kMaxRepeatDepth = 8;
// The most an expression nests (parentheses and op calls) and the most ops a statement holds:
// the parser, the binder and the formatter recurse over an expression, and a line of nested
// parentheses found by the fuzzer (1,593 bytes) overflowed the stack.
constexpr int kMaxNesting = 64;
constexpr int kMaxOpsPerStatement = 256;

template <std::size_t N>
bool one_of(const std::array<const char*, N>& names, std::string_view s) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

std::string function_list() {
  std::string out;
  auto add = [&](const auto& names) {
    for (const char* n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  };
  add(kUnary);
  add(kReduce);
  add(kNormalize);
  add(kShape);
  return out;
}

bool is_name_char(char c) { return text::is_letter(c) || text::is_digit(c) || c == '_'; }

// One line's text, and the position of everything in it, for messages.
class LineParser {
 public:
  LineParser(std::string_view file, int line_number, std::string_view line)
      : file_(file), number_(line_number), src_(line) {}

  [[noreturn]] void fail(const std::string& why, std::size_t pos, std::size_t len = 1) const {
    pos = std::min(pos, src_.size());
    throw InputError(std::string(file_) + ":" + std::to_string(number_) + ":" + std::to_string(pos + 1) + ": " + why,
                     src_, pos, std::max<std::size_t>(1, len));
  }

  Location at(std::size_t pos) const { return {number_, static_cast<int>(pos) + 1}; }
  std::size_t pos() const { return pos_; }
  std::string_view src() const { return src_; }

  void skip_space() {
    while (pos_ < src_.size() && text::is_space(src_[pos_])) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ >= src_.size();
  }
  bool peek(char c) {
    skip_space();
    return pos_ < src_.size() && src_[pos_] == c;
  }
  bool peek(std::string_view s) {
    skip_space();
    return src_.substr(pos_, s.size()) == s;
  }
  bool accept(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c, std::string_view what) {
    if (accept(c)) return;
    fail("expected '" + std::string(1, c) + "' " + std::string(what) + ", found " + found(), pos_);
  }
  std::string found() {
    skip_space();
    if (pos_ >= src_.size()) return "the end of the line";
    return "'" + text::show_char(src_, pos_) + "'";
  }

  // A name: a letter or '_' then letters, digits and '_'.
  std::string name(std::string_view what) {
    skip_space();
    const std::size_t start = pos_;
    if (pos_ < src_.size() && (text::is_letter(src_[pos_]) || src_[pos_] == '_')) {
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      return std::string(src_.substr(start, pos_ - start));
    }
    fail("expected " + std::string(what) + ", found " + found(), pos_);
  }
  bool peek_name() {
    skip_space();
    return pos_ < src_.size() && (text::is_letter(src_[pos_]) || src_[pos_] == '_');
  }

  // A dimension letter: one letter then digits (I, D2), as in specs.
  std::string letter(std::string_view what) {
    skip_space();
    const std::size_t start = pos_;
    const std::string n = name(what);
    if (!text::is_letter(n[0]) || !std::all_of(n.begin() + 1, n.end(), text::is_digit)) {
      fail("'" + n + "' is not a dimension letter: a letter, optionally followed by digits (I, D2)", start, n.size());
    }
    return n;
  }

  // [L1, L2, ...]; an empty list is a scalar.
  std::vector<std::string> letters() {
    expect('[', "to open the tensor's letters");
    std::vector<std::string> out;
    if (accept(']')) return out;
    for (;;) {
      const std::size_t start = (skip_space(), pos_);
      std::string l = letter("a dimension letter");
      if (std::find(out.begin(), out.end(), l) != out.end()) {
        fail("dimension '" + l + "' is named twice; a tensor names each dimension once", start, l.size());
      }
      out.push_back(std::move(l));
      if (accept(']')) return out;
      expect(',', "between dimension letters");
    }
  }

  // Letters separated by spaces up to `stop` ("H A" in split(x, D -> H A)).
  std::vector<std::string> letter_run() {
    std::vector<std::string> out;
    while (peek_name()) out.push_back(letter("a dimension letter"));
    if (out.empty()) fail("expected dimension letters, found " + found(), pos_);
    return out;
  }

  // The rest of the line after `from`, trimmed: a mesh, dims or spec text.
  std::string rest(std::size_t from, std::size_t to) const {
    text::trim(src_, from, to);
    return std::string(src_.substr(from, to - from));
  }

  double number() {
    skip_space();
    const std::size_t start = pos_;
    std::size_t end = pos_;
    if (end < src_.size() && (src_[end] == '-' || src_[end] == '+')) ++end;
    while (end < src_.size() &&
           (text::is_digit(src_[end]) || src_[end] == '.' || src_[end] == 'e' || src_[end] == 'E' ||
            ((src_[end] == '-' || src_[end] == '+') && (src_[end - 1] == 'e' || src_[end - 1] == 'E')))) {
      ++end;
    }
    const std::string digits(src_.substr(start, end - start));
    char* stop = nullptr;
    const double v = digits.empty() ? 0 : std::strtod(digits.c_str(), &stop);
    if (digits.empty() || stop != digits.c_str() + digits.size() || !std::isfinite(v)) {
      fail("expected a finite number, found " + (digits.empty() ? found() : "'" + digits + "'"), start,
           std::max<std::size_t>(1, digits.size()));
    }
    pos_ = end;
    return v;
  }

  void set_pos(std::size_t p) { pos_ = p; }

  // ---- expressions: sum := term (('+'|'-') term)*; term := factor (('*'|'@') factor)*
  Expr expression() {
    skip_space();
    const std::size_t start = pos_;
    const Nesting nesting(*this, start);
    Expr left = term();
    for (;;) {
      skip_space();
      if (peek('+') || (peek('-') && !peek("->"))) {
        const char op = src_[pos_++];
        Expr right = term();
        left = binary(op == '+' ? "add" : "sub", std::move(left), std::move(right), start);
      } else {
        return left;
      }
    }
  }

 private:
  // One level of expression(), refused past kMaxNesting.
  struct Nesting {
    LineParser& parser;
    Nesting(LineParser& p, std::size_t at) : parser(p) {
      if (++parser.nesting_ > kMaxNesting)
        parser.fail("an expression nests at most " + std::to_string(kMaxNesting) + " deep (parentheses and op calls)",
                    at);
    }
    ~Nesting() { --parser.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
  };
  void count_op(std::size_t at) {
    if (++ops_ > kMaxOpsPerStatement)
      fail("a statement holds at most " + std::to_string(kMaxOpsPerStatement) + " ops (split it into statements)", at);
  }

  Expr binary(const char* function, Expr left, Expr right, std::size_t start) {
    count_op(start);
    Expr e;
    e.op.kind = std::string_view(function) == "einsum" ? OpKind::einsum : OpKind::binary;
    e.op.function = function;
    e.where = at(start);
    e.args.push_back(std::move(left));
    e.args.push_back(std::move(right));
    e.text = rest(start, pos_);
    return e;
  }

  Expr term() {
    skip_space();
    const std::size_t start = pos_;
    Expr left = factor();
    for (;;) {
      if (accept('*')) {
        left = binary("mul", std::move(left), factor(), start);
      } else if (accept('@')) {
        left = binary("einsum", std::move(left), factor(), start);
      } else {
        return left;
      }
    }
  }

  Expr factor() {
    skip_space();
    const std::size_t start = pos_;
    if (accept('(')) {
      Expr inner = expression();
      expect(')', "to close '('");
      return inner;
    }
    if (!peek_name()) fail("expected a tensor name or an op, found " + found(), pos_);
    const std::string n = name("a tensor name");
    if (!peek('(')) {
      Expr ref;
      ref.tensor = n;
      ref.where = at(start);
      ref.text = n;
      return ref;
    }
    return call(n, start);
  }

  // f(args): the ops written as calls.
  Expr call(const std::string& f, std::size_t start) {
    count_op(start);
    Expr e;
    e.where = at(start);
    e.op.function = f;
    expect('(', "after the op's name");
    if (one_of(kUnary, f)) {
      e.op.kind = OpKind::unary;
      e.args.push_back(expression());
    } else if (one_of(kReduce, f) || one_of(kNormalize, f)) {
      e.op.kind = one_of(kReduce, f) ? OpKind::reduce : OpKind::normalize;
      e.args.push_back(expression());
      if (accept(',')) {
        const std::size_t kw = (skip_space(), pos_);
        if (name("'over='") != "over") fail("expected 'over=LETTER', e.g. " + f + "(x, over=D)", kw);
        expect('=', "after 'over'");
        e.op.over = letter("the letter to reduce over");
      } else if (e.op.kind == OpKind::normalize) {
        fail(f + " needs the letter it normalizes over, e.g. " + f + "(x, over=D)", pos_);
      }
    } else if (f == "scale") {
      e.op.kind = OpKind::scale;
      e.args.push_back(expression());
      expect(',', "between scale's tensor and its factor, e.g. scale(s, 0.125)");
      e.op.constant = number();
    } else if (f == "transpose") {
      e.op.kind = OpKind::transpose;
      e.args.push_back(expression());
    } else if (f == "split" || f == "merge" || f == "rename") {
      e.op.kind = f == "split" ? OpKind::split : f == "merge" ? OpKind::merge : OpKind::rename;
      e.args.push_back(expression());
      expect(',', "before the letters, e.g. " + f +
                      (f == "split"   ? "(qd, D -> H A)"
                       : f == "merge" ? "(q, H A -> D)"
                                      : "(k, T -> S)"));
      e.op.from = letter_run();
      skip_space();
      if (!peek("->")) fail("expected '->' between the letters before and after, found " + found(), pos_);
      pos_ += 2;
      e.op.to = letter_run();
      const bool many_from = f == "merge", many_to = f == "split";
      if ((!many_from && e.op.from.size() != 1) || (!many_to && e.op.to.size() != 1) ||
          (f != "rename" && (many_from ? e.op.from : e.op.to).size() < 2)) {
        fail(f == "split"   ? "split takes one letter into two or more: split(x, D -> H A)"
             : f == "merge" ? "merge takes two or more letters into one: merge(x, H A -> D)"
                            : "rename takes one letter to another: rename(x, T -> S)",
             start, pos_ - start);
      }
    } else if (f == "causal_mask") {
      e.op.kind = OpKind::causal_mask;
      e.args.push_back(expression());
      expect(',', "before the row letter, e.g. causal_mask(s, T, S)");
      e.op.from = {letter("the row (query) letter")};
      expect(',', "before the column letter, e.g. causal_mask(s, T, S)");
      e.op.to = {letter("the column (key) letter")};
    } else if (f == "route") {
      e.op.kind = OpKind::route;
      e.args.push_back(expression());
      const auto keyword = [&](const char* kw) {
        expect(',', std::string("before '") + kw + "=', e.g. route(p, over=E, tokens=T, top=2)");
        const std::size_t at_kw = (skip_space(), pos_);
        if (name(std::string("'") + kw + "='") != kw) {
          fail(std::string("expected '") + kw + "=' here: route(p, over=E, tokens=T, top=2)", at_kw);
        }
        expect('=', std::string("after '") + kw + "'");
      };
      keyword("over");
      e.op.over = letter("the experts' letter");
      keyword("tokens");
      e.op.from = {letter("the tokens' letter")};
      keyword("top");
      const std::size_t at_top = (skip_space(), pos_);
      const double top = number();
      if (top < 1 || top != std::floor(top) || top > 1e9) {
        fail("route's top (the experts each token goes to) is a whole number >= 1, got " + rest(at_top, pos_), at_top,
             pos_ - at_top);
      }
      e.op.top = static_cast<int>(top);
    } else {
      fail("unknown op '" + f + "'; the ops are " + function_list() + ", and a @ b, a + b, a - b, a * b", start,
           f.size());
    }
    expect(')', "to close " + f + "(");
    e.text = rest(start, pos_);
    return e;
  }

  std::string_view file_;
  int number_;
  std::string_view src_;
  std::size_t pos_ = 0;
  int nesting_ = 0;  // expression() levels open (Nesting)
  int ops_ = 0;      // ops this line holds so far (count_op)
};

// The end of the code on a line: a '#' starts a comment.
std::size_t code_end(std::string_view line) {
  const std::size_t hash = line.find('#');
  return hash == std::string_view::npos ? line.size() : hash;
}

// The first ':' outside brackets, parentheses and braces, or npos.
std::size_t spec_colon(std::string_view line, std::size_t from, std::size_t to) {
  int depth = 0;
  for (std::size_t i = from; i < to; ++i) {
    const char c = line[i];
    if (c == '[' || c == '(' || c == '{') ++depth;
    if (c == ']' || c == ')' || c == '}') --depth;
    if (c == ':' && depth == 0) return i;
  }
  return std::string_view::npos;
}

std::string hex_byte(unsigned char c) {
  static const char* hex = "0123456789abcdef";
  return std::string("\\x") + hex[c >> 4] + hex[c & 15];
}

// Text the program cannot hold: NUL and other control bytes, malformed UTF-8 (a binary
// file given by mistake), said once at the first offender.
void check_characters(std::string_view file, int number, std::string_view line) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    const std::size_t n = c >= 0x80 ? text::utf8_length(line, i) : 1;
    const char* why = c >= 0x80
                          ? (n == 0 ? " is not UTF-8 text" : nullptr)
                          : ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f ? " is a control character" : nullptr);
    if (why) {
      throw InputError(std::string(file) + ":" + std::to_string(number) + ":" + std::to_string(i + 1) + ": byte " +
                       hex_byte(c) + why + "; a program is a text file (docs/programs.md)");
    }
    i += std::max<std::size_t>(n, 1) - 1;
  }
}

class ProgramParser {
 public:
  ProgramParser(std::string_view text, std::string_view file) : text_(text), file_(file) { program_.file = file; }

  Program parse() {
    std::vector<std::vector<Item>*> blocks{&program_.items};
    std::vector<std::pair<int, std::string>> open;  // line and text of each open repeat
    std::size_t start = 0;
    int number = 0;
    while (start <= text_.size()) {
      std::size_t end = text_.find('\n', start);
      if (end == std::string_view::npos) end = text_.size();
      ++number;
      const std::string_view line = text_.substr(start, end - start);
      check_characters(file_, number, line);
      program_.lines.emplace_back(line);
      parse_line(number, line, blocks, open);
      if (end == text_.size()) break;
      start = end + 1;
    }
    if (!open.empty()) {
      LineParser p(file_, open.back().first, open.back().second);
      p.fail("this repeat block is never closed; end it with '}' on a line of its own", 0, open.back().second.size());
    }
    return std::move(program_);
  }

 private:
  void parse_line(int number, std::string_view line, std::vector<std::vector<Item>*>& blocks,
                  std::vector<std::pair<int, std::string>>& open) {
    LineParser p(file_, number, line);
    const std::size_t end = code_end(line);
    LineParser code(file_, number, line.substr(0, end));
    if (code.at_end()) return;
    const std::size_t first = code.pos();
    if (code.accept('}')) {
      if (open.empty()) code.fail("'}' closes no repeat block", first);
      if (!code.at_end()) code.fail("'}' stands on a line of its own", code.pos());
      open.pop_back();
      blocks.pop_back();
      return;
    }
    const std::string word = code.name("a statement: mesh, dims, input, param, loss, repeat or NAME[...] = ...");
    const bool assignment = code.peek('[');
    if (word == "mesh" || word == "dims") {
      if (assignment) code.fail("'" + word + "' is a keyword, not a tensor name", first, word.size());
      if (blocks.size() > 1)
        code.fail("'" + word + "' belongs at the top of the program, not inside a repeat block", first, word.size());
      std::optional<std::string>& slot = word == "mesh" ? program_.mesh : program_.dims;
      if (slot) code.fail("a second '" + word + "' line; a program has one", first, word.size());
      slot = code.rest(code.pos(), end);
      if (slot->empty())
        code.fail("'" + word + "' needs its entries, e.g. " + (word == "mesh" ? "mesh X=4, Y=2" : "dims B=8, D=1024"),
                  code.pos());
      (word == "mesh" ? program_.mesh_where : program_.dims_where) = code.at(code.pos());
      // Entries may be separated by ", " as in the examples; the mesh and dims
      // parsers take "X=4,Y=2".
      slot->erase(std::remove(slot->begin(), slot->end(), ' '), slot->end());
      return;
    }
    Item item;
    item.where = code.at(first);
    if (word == "repeat" && !assignment) {
      const std::size_t at = (code.skip_space(), code.pos());
      const double count = code.number();
      if (count != std::floor(count) || count < 1 || count > 1e6) {
        code.fail("repeat takes a whole count of at least 1 (and at most 1000000), e.g. repeat 32 {", at,
                  code.pos() - at);
      }
      code.expect('{', "after the repeat count; the block's lines follow, closed by '}'");
      if (!code.at_end()) code.fail("a repeat block's first line starts below 'repeat N {'", code.pos());
      if (blocks.size() > kMaxRepeatDepth) code.fail("repeat blocks nest at most 8 deep", first, word.size());
      item.kind = Item::Kind::repeat;
      item.count = static_cast<int>(count);
      blocks.back()->push_back(std::move(item));
      blocks.push_back(&blocks.back()->back().body);
      open.emplace_back(number, std::string(line));
      return;
    }
    if (word == "loss" && !assignment) {
      item.kind = Item::Kind::loss;
      item.statement.name = "loss";
      item.statement.where = item.where;
      const std::size_t at = (code.skip_space(), code.pos());
      item.statement.expr = code.expression();
      if (!code.at_end()) code.fail("unexpected " + code.found() + " after the loss expression", code.pos());
      if (item.statement.expr.is_reference() ||
          (item.statement.expr.op.kind != OpKind::reduce || item.statement.expr.op.function == "max" ||
           !item.statement.expr.op.over.empty())) {
        code.fail("the loss is sum(...) or mean(...) of a tensor over all its letters, e.g. loss sum(out * g)", at,
                  end - at);
      }
      blocks.back()->push_back(std::move(item));
      return;
    }
    Statement& s = item.statement;
    s.where = item.where;
    s.name = word;
    if (word == "input" || word == "param") {
      s.role = word == "input" ? Role::input : Role::param;
      if (assignment) code.fail("'" + word + "' is a keyword, not a tensor name", first, word.size());
      const std::size_t at = (code.skip_space(), code.pos());
      s.name = code.name("the " + word + "'s name");
      s.where = code.at(at);
    } else if (!assignment) {
      if (code.peek('=') || code.peek('(')) {
        code.fail("'" + word + "' needs its letters: NAME[L1, L2] = ..., e.g. u[B, F] = x @ w", code.pos());
      }
      code.fail("unknown statement '" + word +
                    "'; a line is mesh, dims, input, param, loss, repeat N {, } or NAME[...] = ...",
                first, word.size());
    }
    check_tensor_name(code, s.name, s.where);
    s.letters = code.letters();
    const std::size_t colon = spec_colon(line, code.pos(), end);
    const std::size_t body_end = colon == std::string_view::npos ? end : colon;
    LineParser body(file_, number, line.substr(0, body_end));
    body.set_pos(code.pos());
    if (s.role == Role::computed) {
      body.expect('=', "after the tensor's letters: NAME[L1, L2] = EXPRESSION");
      if (body.at_end()) body.fail("expected an expression after '='", body.pos());
      s.expr = body.expression();
    }
    if (s.role == Role::param && body.peek_name()) {
      const std::size_t at = body.pos();
      if (body.name("'regathered'") != "regathered") {
        body.fail(
            "after a param's letters: 'regathered' (FSDP: its gathered copy is dropped after the forward pass and "
            "gathered again for backward) or ':' and its pinned spec",
            at, body.pos() - at);
      }
      s.regathered = true;
    }
    if (!body.at_end()) {
      body.fail(
          "unexpected " + body.found() +
              (s.role == Role::computed ? " after the expression" : "; a pinned spec follows ':', e.g. : w[D, F_X]"),
          body.pos());
    }
    if (colon != std::string_view::npos) {
      s.spec = code.rest(colon + 1, end);
      std::size_t at = colon + 1;
      while (at < end && text::is_space(line[at])) ++at;
      s.spec_where = code.at(at);
      if (s.spec->empty()) code.fail("expected a spec after ':', e.g. " + s.name + "[...]", colon);
    }
    blocks.back()->push_back(std::move(item));
  }

  void check_tensor_name(LineParser& p, const std::string& name, Location where) {
    const std::size_t at = static_cast<std::size_t>(where.column - 1);
    if (one_of(kKeywords, name)) p.fail("'" + name + "' is a keyword; name the tensor otherwise", at, name.size());
    if (one_of(kUnary, name) || one_of(kReduce, name) || one_of(kNormalize, name) || one_of(kShape, name)) {
      p.fail("'" + name + "' is an op; name the tensor otherwise", at, name.size());
    }
    if (name.find('.') != std::string::npos) p.fail("tensor names have no '.'", at, name.size());
  }

  std::string_view text_;
  std::string_view file_;
  Program program_;
};

// ---- printing

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string format_number(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

int precedence(const Expr& e) {
  if (e.is_reference() || (e.op.kind != OpKind::binary && e.op.kind != OpKind::einsum)) return 3;
  return e.op.function == "add" || e.op.function == "sub" ? 1 : 2;
}

std::string format_expr(const Expr& e) {
  if (e.is_reference()) return e.tensor;
  const Op& op = e.op;
  if (op.kind == OpKind::binary || op.kind == OpKind::einsum) {
    const char* sym = op.kind == OpKind::einsum ? " @ "
                      : op.function == "add"    ? " + "
                      : op.function == "sub"    ? " - "
                                                : " * ";
    const int mine = precedence(e);
    std::string l = format_expr(e.args[0]), r = format_expr(e.args[1]);
    if (precedence(e.args[0]) < mine) l = "(" + l + ")";
    if (precedence(e.args[1]) <= mine) r = "(" + r + ")";  // left-associative: a - (b - c) keeps its parentheses
    return l + sym + r;
  }
  std::string out = op.function + "(" + format_expr(e.args[0]);
  switch (op.kind) {
    case OpKind::reduce:
    case OpKind::normalize:
      if (!op.over.empty()) out += ", over=" + op.over;
      break;
    case OpKind::scale:
      out += ", " + format_number(op.constant);
      break;
    case OpKind::split:
    case OpKind::merge:
    case OpKind::rename:
      out += ", " + join(op.from, " ") + " -> " + join(op.to, " ");
      break;
    case OpKind::causal_mask:
      out += ", " + op.from[0] + ", " + op.to[0];
      break;
    case OpKind::route:
      out += ", over=" + op.over + ", tokens=" + op.from[0] + ", top=" + std::to_string(op.top);
      break;
    default:
      break;
  }
  return out + ")";
}

void format_items(std::ostringstream& os, const std::vector<Item>& items, const std::string& indent) {
  for (const Item& item : items) {
    const Statement& s = item.statement;
    switch (item.kind) {
      case Item::Kind::repeat:
        os << indent << "repeat " << item.count << " {\n";
        format_items(os, item.body, indent + "  ");
        os << indent << "}\n";
        break;
      case Item::Kind::loss:
        os << indent << "loss " << format_expr(s.expr) << "\n";
        break;
      case Item::Kind::statement:
        os << indent;
        if (s.role != Role::computed) os << to_string(s.role) << " ";
        os << s.name << "[" << join(s.letters, ", ") << "]";
        if (s.regathered) os << " regathered";
        if (s.role == Role::computed) os << " = " << format_expr(s.expr);
        if (s.spec) os << " : " << *s.spec;
        os << "\n";
        break;
    }
  }
}

}  // namespace

Program parse_program(std::string_view text, std::string_view file) { return ProgramParser(text, file).parse(); }

std::string format_program(const Program& program) {
  std::ostringstream os;
  if (program.mesh) os << "mesh " << *program.mesh << "\n";
  if (program.dims) os << "dims " << *program.dims << "\n";
  format_items(os, program.items, "");
  return os.str();
}

}  // namespace shardmm::program
