#include "core/text.h"

#include <cstdio>

namespace shardmm::text {

std::string show_char(char c) {
  const auto uc = static_cast<unsigned char>(c);
  if (uc >= 0x20 && uc < 0x7f) return std::string(1, c);
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
