#include "shardmm/core/error.h"

namespace shardmm {

namespace {

// Two indented lines: the text (control characters shown as '?', so the caret lines up)
// and a caret under the offending span.
std::string quote_with_caret(std::string_view text, std::size_t pos, std::size_t len) {
  std::string shown;
  shown.reserve(text.size());
  for (char ch : text) {
    const auto uc = static_cast<unsigned char>(ch);
    shown.push_back(uc < 0x20 || uc == 0x7f ? '?' : ch);
  }
  if (pos > shown.size()) pos = shown.size();
  if (len == 0) len = 1;
  // Multi-byte UTF-8 sequences take one column each: count only their lead bytes.
  std::size_t columns = 0;
  for (std::size_t i = 0; i < pos; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++columns;
  }
  std::string caret(columns, ' ');
  caret.append(len, '^');
  return "  " + shown + "\n  " + caret;
}

// The headline quotes user text: escape control bytes so it stays one printable line.
std::string printable(std::string s) {
  std::string out;
  for (char ch : s) {
    const auto uc = static_cast<unsigned char>(ch);
    if (uc < 0x20 || uc == 0x7f) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[uc >> 4];
      out += hex[uc & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

InputError::InputError(std::string headline)
    : std::runtime_error(printable(headline)), headline_(printable(std::move(headline))) {}

InputError::InputError(std::string headline, std::string_view text, std::size_t pos, std::size_t len)
    : std::runtime_error(printable(headline) + "\n" + quote_with_caret(text, pos, len)),
      headline_(printable(std::move(headline))),
      context_(quote_with_caret(text, pos, len)) {}

long long checked_mul(long long a, long long b, std::string_view what) {
  long long r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw InputError(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " x " +
                     std::to_string(b) + "); sizes must fit in a signed 64-bit integer");
  }
  return r;
}

long long checked_add(long long a, long long b, std::string_view what) {
  long long r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    throw InputError(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " + " +
                     std::to_string(b) + "); sizes must fit in a signed 64-bit integer");
  }
  return r;
}

}  // namespace shardmm
