#include "shardmm/core/contraction.h"

#include <algorithm>

#include "core/text.h"
#include "shardmm/core/error.h"

namespace shardmm {

const char* to_string(DimRole role) {
  switch (role) {
    case DimRole::batch:
      return "batch";
    case DimRole::contracted:
      return "contracted";
    case DimRole::free_a:
      return "free";
    case DimRole::free_b:
      return "free";
  }
  return "?";
}

DimRole Contraction::role(std::string_view dim) const {
  const bool in_a = a.find_dim(dim) >= 0, in_b = b.find_dim(dim) >= 0;
  const bool in_out = std::find(out_dims.begin(), out_dims.end(), dim) != out_dims.end();
  if (in_a && in_b) return in_out ? DimRole::batch : DimRole::contracted;
  return in_a ? DimRole::free_a : DimRole::free_b;
}

std::vector<std::string> Contraction::contracted() const {
  std::vector<std::string> out;
  for (const DimSpec& d : a.dims) {
    if (role(d.name) == DimRole::contracted) out.push_back(d.name);
  }
  return out;
}

std::vector<std::string> Contraction::all_dims() const {
  std::vector<std::string> out;
  for (const DimSpec& d : a.dims) out.push_back(d.name);
  for (const DimSpec& d : b.dims) {
    if (a.find_dim(d.name) < 0) out.push_back(d.name);
  }
  return out;
}

namespace {

// Finds `token` at bracket depth 0 in [from, size); npos if absent.
std::size_t find_top_level(std::string_view s, std::string_view token, std::size_t from) {
  int depth = 0;
  for (std::size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (depth == 0 && s.substr(i, token.size()) == token) return i;
  }
  return std::string_view::npos;
}

// Parses the operand in src[from, to) and re-raises errors with the whole expression quoted.
Spec parse_operand(std::string_view src, std::size_t from, std::size_t to, const Mesh& mesh, const char* default_name) {
  text::trim(src, from, to);
  if (from == to) {
    throw InputError(
        "bad contraction '" + std::string(src) + "': an operand is missing; write A[I, J] @ B[J, K] -> C[I, K]", src,
        std::min(from, src.size() ? src.size() - 1 : 0), 1);
  }
  const std::string_view part = src.substr(from, to - from);
  Spec spec;
  try {
    spec = parse_spec(part, mesh);
  } catch (const InputError& e) {
    // Move the caret from the operand's text to the expression's. The context's second
    // line is "  " then one space per column before the caret.
    const std::string& ctx = e.context();
    const std::size_t line2 = ctx.find('\n');
    const std::size_t caret = line2 == std::string::npos ? line2 : ctx.find('^', line2);  // the text may hold '^' too
    std::size_t pos = 0, len = 1;
    if (caret != std::string::npos && line2 != std::string::npos) {
      const std::size_t col = caret - (line2 + 3), width = ctx.size() - caret;
      pos = text::byte_of_column(part, col);
      len = std::max<std::size_t>(1, text::byte_of_column(part, col + width) - pos);
    }
    throw InputError(e.headline(field), src, from + pos, len);
  }
  if (spec.tensor.empty()) spec.tensor = default_name;
  return spec;
}

}  // namespace

Contraction parse_contraction(std::string_view src, const Mesh& mesh) {
  const std::size_t at = find_top_level(src, "@", 0);
  if (at == std::string_view::npos) {
    throw InputError("bad contraction '" + std::string(src) +
                     "': no '@'; a contraction is written A[I, J] @ B[J, K] -> C[I, K] (the output part is optional)");
  }
  const std::size_t arrow = find_top_level(src, "->", at + 1);
  const std::size_t b_end = arrow == std::string_view::npos ? src.size() : arrow;
  const std::size_t second_at = find_top_level(src, "@", at + 1);
  if (second_at != std::string_view::npos && second_at < b_end) {
    throw InputError("bad contraction '" + std::string(src) +
                         "': more than two operands; shardmm contracts two operands at a time (chain the products)",
                     src, second_at, 1);
  }
  Contraction c;
  c.a = parse_operand(src, 0, at, mesh, "A");
  c.b = parse_operand(src, at + 1, b_end, mesh, "B");
  if (arrow != std::string_view::npos) {
    c.out = parse_operand(src, arrow + 2, src.size(), mesh, "C");
    c.out_tensor = c.out->tensor;
    for (const DimSpec& d : c.out->dims) c.out_dims.push_back(d.name);
  } else {
    for (const DimSpec& d : c.a.dims) {
      if (c.b.find_dim(d.name) < 0) c.out_dims.push_back(d.name);
    }
    for (const DimSpec& d : c.b.dims) {
      if (c.a.find_dim(d.name) < 0) c.out_dims.push_back(d.name);
    }
  }
  if (c.out_dims.empty()) {
    throw InputError("bad contraction '" + std::string(src) +
                     "': the output has no dimensions (a full contraction to a scalar); a spec needs at least one "
                     "dimension, so keep one in the output (e.g. A[I, J] @ B[J, K] -> C[I, K])");
  }
  const auto where = [&](const std::string& name) {
    const std::size_t p = src.find(name, arrow == std::string_view::npos ? 0 : arrow);
    return p == std::string_view::npos ? 0 : p;
  };
  for (const std::string& name : c.out_dims) {
    if (c.a.find_dim(name) < 0 && c.b.find_dim(name) < 0) {
      throw InputError("bad contraction '" + std::string(src) + "': output dimension '" + name + "' is in neither " +
                           c.a.tensor + " nor " + c.b.tensor + "; every output dimension must come from an input",
                       src, where(name), name.size());
    }
  }
  for (const Spec* in : {&c.a, &c.b}) {
    const Spec& other = in == &c.a ? c.b : c.a;
    for (const DimSpec& d : in->dims) {
      const bool in_out = std::find(c.out_dims.begin(), c.out_dims.end(), d.name) != c.out_dims.end();
      if (!in_out && other.find_dim(d.name) < 0) {
        throw InputError("bad contraction '" + std::string(src) + "': dimension '" + d.name + "' appears only in " +
                         in->tensor +
                         " and not in the output; a contracted dimension must appear in both inputs "
                         "(sum it away first, or keep it in the output)");
      }
    }
  }
  return c;
}

std::string format_contraction(const Contraction& c, const Mesh& mesh) {
  std::string out = format_spec(c.a, mesh) + " @ " + format_spec(c.b, mesh);
  if (c.out) out += " -> " + format_spec(*c.out, mesh);
  return out;
}

}  // namespace shardmm
