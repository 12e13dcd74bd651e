// Errors a user can cause, with the offending text quoted and the rule named.
//
//   try { parse_spec("A[I_X, J_X]", mesh); }
//   catch (const shardmm::InputError& e) {
//     std::cerr << e.what();  // headline, then the text with a caret under the culprit
//   }
//
// InputError means "the input is wrong" (the CLI exits 2); anything else escaping
// the library is a bug or a resource problem.
#pragma once

#include <cstdint>
#include <limits>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardmm {

class InputError : public std::runtime_error {
 public:
  // `headline` is one line naming what is wrong and the rule.
  explicit InputError(std::string headline);
  // Adds the quoted `text` with a caret under [pos, pos+len).
  InputError(std::string headline, std::string_view text, std::size_t pos, std::size_t len = 1);

  const std::string& headline() const { return headline_; }
  // The quoted text and caret line ("" when the error has no source text).
  const std::string& context() const { return context_; }

 private:
  std::string headline_;
  std::string context_;
};

// Checked 64-bit arithmetic: sizes, products and byte counts never wrap silently.
// `what` names the quantity in the error message.
long long checked_mul(long long a, long long b, std::string_view what);
long long checked_add(long long a, long long b, std::string_view what);

// Saturating arithmetic on non-negative byte counts, for estimates compared against a limit
// (peak memory): past 2^63 - 1 they stay there, and the limit refuses them all the same.
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  return a > max - b ? max : a + b;
}
inline std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  return b != 0 && a > max / b ? max : a * b;
}

}  // namespace shardmm
