#include "shardmm/core/error.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/text.h"

namespace shardmm {

namespace {

// One printable column per character of `text`: printable ASCII and well-formed UTF-8 as
// themselves, any other byte (control bytes, stray or truncated UTF-8) as `other(byte)`.
// `columns[i]` is the column where byte i starts (columns[size] is the end).
template <class Other>
std::string show(std::string_view text, Other other, std::vector<std::size_t>* columns = nullptr) {
  std::string out;
  std::size_t column = 0;
  for (std::size_t i = 0; i < text.size();) {
    const auto uc = static_cast<unsigned char>(text[i]);
    std::size_t len = uc >= 0x20 && uc < 0x7f ? 1 : text::utf8_length(text, i);
    if (len > 0) {
      out.append(text.substr(i, len));
    } else {
      out += other(uc);
      len = 1;
    }
    if (columns) columns->insert(columns->end(), len, column);
    ++column;
    i += len;
  }
  if (columns) columns->push_back(column);
  return out;
}

// Two indented lines: the text (unprintable bytes shown as '?', so the caret lines up) and
// a caret under the offending span.
std::string quote_with_caret(std::string_view text, std::size_t pos, std::size_t len) {
  std::vector<std::size_t> columns;
  const std::string shown = show(
      text, [](unsigned char) { return std::string("?"); }, &columns);
  pos = std::min(pos, text.size());
  const std::size_t end = std::min(pos + std::max<std::size_t>(len, 1), text.size());
  const std::size_t width = std::max<std::size_t>(1, columns[end] - columns[pos]);
  return "  " + shown + "\n  " + std::string(columns[pos], ' ') + std::string(width, '^');
}

// The headline quotes user text: escape unprintable bytes so it stays one printable line.
std::string printable(std::string_view s) {
  return show(s, [](unsigned char uc) {
    static const char* hex = "0123456789ABCDEF";
    return std::string("\\x") + hex[uc >> 4] + hex[uc & 15];
  });
}

// Control characters bracket a field's name: printable() escapes any in user text, so only
// field() writes them where they mark a field.
constexpr char kFieldOpen = '\x1e', kFieldClose = '\x1f';

}  // namespace

std::string field(std::string_view name) { return kFieldOpen + std::string(name) + kFieldClose; }

// The marks come out before printable() runs on the pieces between them. A pair of marks in
// user text is taken for a field, so at worst a front end respells the user's own text; the
// headline stays printable.
InputError::Headline InputError::parse_headline(std::string_view marked) {
  Headline h;
  std::size_t from = 0;
  while (true) {
    const std::size_t open = marked.find(kFieldOpen, from);
    const std::size_t close = open == marked.npos ? marked.npos : marked.find(kFieldClose, open + 1);
    if (close == marked.npos) break;
    h.text += printable(marked.substr(from, open - from));
    const std::string name = printable(marked.substr(open + 1, close - open - 1));
    h.fields.push_back({h.text.size(), name.size()});
    h.text += name;
    from = close + 1;
  }
  h.text += printable(marked.substr(from));
  return h;
}

InputError::InputError(std::string headline) : InputError(parse_headline(headline), "") {}

InputError::InputError(std::string headline, std::string_view text, std::size_t pos, std::size_t len)
    : InputError(parse_headline(headline), quote_with_caret(text, pos, len)) {}

InputError::InputError(Headline headline, std::string context)
    : std::runtime_error(context.empty() ? headline.text : headline.text + "\n" + context),
      headline_(std::move(headline.text)),
      fields_(std::move(headline.fields)),
      context_(std::move(context)) {}

std::string InputError::headline(const std::function<std::string(std::string_view field)>& spell) const {
  std::string out;
  std::size_t from = 0;
  for (const FieldName& f : fields_) {
    out.append(headline_, from, f.pos - from);
    out += spell(std::string_view(headline_).substr(f.pos, f.len));
    from = f.pos + f.len;
  }
  return out + headline_.substr(from);
}

long long checked_mul(long long a, long long b, std::string_view what) {
  long long r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InputError(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " x " + std::to_string(b) +
                     "); sizes must fit in a signed 64-bit integer");
  }
  return r;
}

long long checked_add(long long a, long long b, std::string_view what) {
  long long r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw InputError(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " + " + std::to_string(b) +
                     "); sizes must fit in a signed 64-bit integer");
  }
  return r;
}

}  // namespace shardmm
