#include "core/text.h"

#include <algorithm>
#include <cstdio>

namespace shardmm::text {

std::size_t utf8_length(std::string_view s, std::size_t pos) {
  const auto uc = static_cast<unsigned char>(s[pos]);
  const std::size_t len = uc >= 0xC2 && uc <= 0xDF ? 2 : uc >= 0xE0 && uc <= 0xEF ? 3 : uc >= 0xF0 && uc <= 0xF4 ? 4 : 0;
  if (len == 0 || pos + len > s.size()) return 0;
  for (std::size_t i = 1; i < len; ++i) {
    if ((static_cast<unsigned char>(s[pos + i]) & 0xC0) != 0x80) return 0;
  }
  return len;
}

std::size_t byte_of_column(std::string_view s, std::size_t column) {
  std::size_t i = 0;
  for (; i < s.size() && column > 0; --column) i += std::max<std::size_t>(1, utf8_length(s, i));
  return i;
}

std::string show_char(std::string_view s, std::size_t pos) {
  const auto uc = static_cast<unsigned char>(s[pos]);
  if (uc >= 0x20 && uc < 0x7f) return std::string(1, s[pos]);
  if (const std::size_t len = utf8_length(s, pos)) return std::string(s.substr(pos, len));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", uc);
  return buf;
}

bool parse_size(std::string_view digits, std::int64_t& value, std::string& why) {
  if (digits.empty()) {
    why = "is empty";
    return false;
  }
  if (digits[0] == '-') {
    why = "is negative";
    return false;
  }
  std::int64_t v = 0;
  for (char c : digits) {
    if (!is_digit(c)) {
      why = "is not a whole number";
      return false;
    }
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) {
      why = "overflows 64 bits";
      return false;
    }
  }
  value = v;
  return true;
}

void trim(std::string_view s, std::size_t& from, std::size_t& to) {
  while (from < to && is_space(s[from])) ++from;
  while (to > from && is_space(s[to - 1])) --to;
}

}  // namespace shardmm::text
