// Small lexing helpers shared by the core parsers (private to the library).
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardmm::text {

inline bool is_letter(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
// Axis names: a letter followed by letters or digits.
inline bool is_identifier(std::string_view s) {
  if (s.empty() || !is_letter(s[0])) return false;
  for (char c : s) {
    if (!is_letter(c) && !is_digit(c)) return false;
  }
  return true;
}

// The byte length of the well-formed multi-byte UTF-8 character at s[pos], or 0 when
// s[pos] is ASCII or starts no well-formed character.
std::size_t utf8_length(std::string_view s, std::size_t pos);
// The byte offset in `s` of the character that error messages show at `column` (one
// column per well-formed UTF-8 character or other byte; see InputError's caret line).
std::size_t byte_of_column(std::string_view s, std::size_t column);

// Shows the character at s[pos] for an error message: printable ASCII as itself, a
// well-formed multi-byte UTF-8 character whole (so 'é' reads as 'é', not as its lead
// byte), any other byte as \xNN.
std::string show_char(std::string_view s, std::size_t pos);

// Parses a positive decimal integer that fits in int64 from `digits` (all of it).
// Returns false and sets `why` ("not a number", "overflows 64 bits", ...) on failure.
bool parse_size(std::string_view digits, std::int64_t& value, std::string& why);

// Where the NAME=SIZE entry s[from, to) (the text up to the next comma) is two entries run
// together, its size's digits followed by another NAME=SIZE ("X=4 Y=2", "I=8;J=4"): the
// span between them to point at (empty when nothing separates them, as in "X=4Y=2") and
// the message "expected ',' between X=4 and Y=2; ...". Nothing when the entry is one.
struct RunOn {
  std::size_t at = 0, len = 0;
  std::string message;
};
std::optional<RunOn> run_on_entries(std::string_view s, std::size_t from, std::size_t to);

// Trimmed span [begin, end) of `s` within [from, to).
void trim(std::string_view s, std::size_t& from, std::size_t& to);

}  // namespace shardmm::text
