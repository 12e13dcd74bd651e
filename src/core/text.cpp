#include "core/text.h"

#include <algorithm>
#include <cstdio>

namespace shardmm::text {

std::size_t utf8_length(std::string_view s, std::size_t pos) {
  const auto uc = static_cast<unsigned char>(s[pos]);
  const std::size_t len = uc >= 0xC2 && uc <= 0xDF   ? 2
                          : uc >= 0xE0 && uc <= 0xEF ? 3
                          : uc >= 0xF0 && uc <= 0xF4 ? 4
                                                     : 0;
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

std::optional<RunOn> run_on_entries(std::string_view s, std::size_t from, std::size_t to) {
  const std::size_t eq = s.find('=', from);
  if (eq >= to) return std::nullopt;
  std::size_t at = eq + 1;
  while (at < to && is_space(s[at])) ++at;
  const std::size_t digits = at;
  while (at < to && is_digit(s[at])) ++at;
  if (at == digits) return std::nullopt;
  std::size_t next = at;
  while (next < to && !is_letter(s[next]) && !is_digit(s[next]) && s[next] != '=') ++next;
  const std::size_t next_eq = s.find('=', next);
  if (next_eq >= to) return std::nullopt;
  std::size_t name_from = next, name_to = next_eq;
  trim(s, name_from, name_to);
  if (!is_identifier(s.substr(name_from, name_to - name_from))) return std::nullopt;
  std::size_t next_end = next_eq + 1;
  while (next_end < to && is_space(s[next_end])) ++next_end;
  while (next_end < to && is_digit(s[next_end])) ++next_end;
  const std::string one(s.substr(from, at - from)), two(s.substr(next, next_end - next));
  return RunOn{at, std::max<std::size_t>(1, next - at),
               "expected ',' between " + one + " and " + two + "; NAME=SIZE entries are separated by commas: " + one +
                   "," + two};
}

void trim(std::string_view s, std::size_t& from, std::size_t& to) {
  while (from < to && is_space(s[from])) ++from;
  while (to > from && is_space(s[to - 1])) --to;
}

}  // namespace shardmm::text
