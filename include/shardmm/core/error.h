// Errors a user can cause, with the offending text quoted and the rule named.
//
//   try { parse_spec("A[I_X, J_X]", mesh); }
//   catch (const shardmm::InputError& e) {
//     std::cerr << e.what();  // headline, then the text with a caret under the culprit
//   }
//
// InputError means "the input is wrong" (the CLI exits 2); anything else escaping
// the library is a bug or a resource problem.
//
// Messages name an input by its field, not by any front end's spelling of it:
//   throw InputError("give smaller " + field("dims"));
// what() and headline() say "give smaller dims"; headline(spell) lets the CLI say "--dims".
#pragma once

#include <cstdint>
#include <limits>

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardmm {

class InputError : public std::runtime_error {
 public:
  // `headline` is one line naming what is wrong and the rule.
  explicit InputError(std::string headline);
  // Adds the quoted `text` with a caret under [pos, pos+len).
  InputError(std::string headline, std::string_view text, std::size_t pos, std::size_t len = 1);

  const std::string& headline() const { return headline_; }
  // The headline with each field it names (field() below) written as `spell` writes it.
  std::string headline(const std::function<std::string(std::string_view field)>& spell) const;
  // The quoted text and caret line ("" when the error has no source text).
  const std::string& context() const { return context_; }

 private:
  struct FieldName {
    std::size_t pos, len;  // in headline_
  };
  struct Headline {
    std::string text;
    std::vector<FieldName> fields;
  };
  static Headline parse_headline(std::string_view marked);
  InputError(Headline headline, std::string context);
  std::string headline_;
  std::vector<FieldName> fields_;
  std::string context_;
};

// `name`, marked as a field of the caller's input inside an InputError's headline.
std::string field(std::string_view name);

// A bug in the calling code, not in its input: a precondition that only code can break (an
// index or count out of range, a call out of order). The CLI reports it as an internal error.
class UsageError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
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
