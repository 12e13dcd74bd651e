// Command-line flags of the bench programs: each flag checked, a bad one named with its rule
// (shardmm::InputError, which the programs print as one line and exit 2 on), and --help.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "shardmm/core/error.h"

namespace shardmm::bench {

// --help or -h was given: the program prints its usage and exits 0.
struct HelpWanted {};

// "a,b,,c" -> {"a", "b", "", "c"}: the items of a comma-separated flag value.
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    items.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

// `text`, the value of `flag`, as a whole number of at least `least`.
inline std::int64_t parse_whole(const std::string& flag, const std::string& text, std::int64_t least,
                                std::int64_t most = INT64_MAX) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < least || value > most) {
    throw InputError(flag + ": '" + text + "' is not a whole number from " + std::to_string(least) +
                     (most >= INT32_MAX ? std::string(" up") : " to " + std::to_string(most)));
  }
  return value;
}

// Walks argv: next() gives each flag in turn; value() takes the one after it.
class FlagReader {
 public:
  FlagReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // The next flag, into `flag`; false after the last. Throws HelpWanted for --help or -h.
  bool next(std::string& flag) {
    if (++at_ >= argc_) return false;
    flag_ = flag = argv_[at_];
    if (flag == "--help" || flag == "-h") throw HelpWanted{};
    return true;
  }
  // The current flag's value.
  std::string value() {
    if (at_ + 1 >= argc_) throw InputError(flag_ + " needs a value");
    return argv_[++at_];
  }
  int count(int least) { return static_cast<int>(parse_whole(flag_, value(), least, INT32_MAX)); }
  std::int64_t whole(std::int64_t least) { return parse_whole(flag_, value(), least); }
  // A comma-separated list of whole numbers, each at least `least`.
  std::vector<std::int64_t> wholes(std::int64_t least) {
    std::vector<std::int64_t> out;
    for (const std::string& item : split_list(value())) out.push_back(parse_whole(flag_, item, least));
    return out;
  }
  // An unknown flag: its name and the flags there are.
  [[noreturn]] void unknown(const std::string& flags) const {
    throw InputError("unknown flag '" + flag_ + "'; flags: " + flags + " (--help for more)");
  }

 private:
  int argc_;
  char** argv_;
  int at_ = 0;
  std::string flag_;
};

// Runs `parse` (which reads the flags with a FlagReader): the status the program exits with
// where it stops there, 0 after printing `usage` for --help, 2 after printing a bad flag's
// line; nothing where it goes on.
template <class Parse>
std::optional<int> parse_flags(const char* program, const char* usage, Parse&& parse) {
  try {
    parse();
  } catch (const HelpWanted&) {
    std::fputs(usage, stdout);
    return 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace shardmm::bench
