// Every bad command line in golden/cli_errors.txt exits 2 with nothing on stdout and
// exactly the stderr written there: one headline "shardmm: error: ..." naming the offending
// text and the rule (then, for text errors, the text with a caret under the culprit).
// The command runs in-process (cli::run_cli, what main() calls) from the tests/ directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_in_process.h"
#include "shardmm/runtime/runner.h"
#include "test_paths.h"

namespace shardmm {
namespace {

struct Case {
  int line = 0;
  std::vector<std::string> args;
  std::string expected_err;
};

// "\n" -> newline, "\t" -> tab, "\\" -> backslash.
std::string unescape(const std::string& s, int line) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    if (next == 'n') {
      out += '\n';
    } else if (next == 't') {
      out += '\t';
    } else if (next == '\\') {
      out += '\\';
    } else {
      ADD_FAILURE() << "golden/cli_errors.txt:" << line << ": unknown escape in '" << s << "'";
    }
    ++i;
  }
  return out;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else {
      out += c;
    }
  }
  return out;
}

// The backends this build has, as the "unknown backend" message lists them.
std::string backends_text() {
  std::string out;
  for (const std::string& b : available_backends()) out += (out.empty() ? "" : ", ") + b;
  return out;
}

std::vector<Case> load_cases() {
  const std::string path = shardmm::testing::tests_dir() + "/golden/cli_errors.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::vector<Case> cases;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.empty() || text[0] == '#') continue;
    const std::string arrow = text.rfind("=> ", 0) == 0 ? "=> " : " => ";
    const std::size_t at = text.find(arrow);
    if (at == std::string::npos) {
      ADD_FAILURE() << path << ":" << line << ": no ' => ' in '" << text << "'";
      continue;
    }
    Case c;
    c.line = line;
    const std::string args = text.substr(0, at);
    for (std::size_t from = 0; !args.empty() && from <= args.size();) {
      const std::size_t tab = std::min(args.find('\t', from), args.size());
      const std::string arg = args.substr(from, tab - from);
      c.args.push_back(arg == "\"\"" ? "" : unescape(arg, line));
      from = tab + 1;
    }
    c.expected_err = unescape(text.substr(at + arrow.size()), line);
    for (std::size_t pos; (pos = c.expected_err.find("{backends}")) != std::string::npos;) {
      c.expected_err.replace(pos, 10, backends_text());
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// The command run from the tests directory, where the golden lines' file arguments lie.
testing::CliResult run_in_tests_dir(const std::vector<std::string>& args) {
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(shardmm::testing::tests_dir());
  testing::CliResult r = testing::run_cli_in_process(args);
  std::filesystem::current_path(cwd);
  return r;
}

// A refused write (a full disk: > /dev/full) is an error, not success with nothing written.
TEST(CliOutput, AStdoutThatRefusesTheOutputExitsTwo) {
  std::vector<std::string> args = {"shardmm", "plan",       "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2",
                                   "--dims",  "I=8,J=4,K=2"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  out.setstate(std::ios::badbit);
  EXPECT_EQ(cli::run_cli(static_cast<int>(argv.size()), argv.data(), out, err), 2);
  EXPECT_EQ(err.str(),
            "shardmm: error: cannot write the output: standard output refused it (a full disk or a closed file); "
            "nothing else went wrong\n");
}

TEST(CliGolden, TheFileHoldsAtLeastFiftyDistinctBadCommandLines) {
  const std::vector<Case> cases = load_cases();
  std::set<std::vector<std::string>> distinct;
  for (const Case& c : cases) {
    EXPECT_TRUE(distinct.insert(c.args).second) << "golden/cli_errors.txt:" << c.line << ": a repeated command line";
    EXPECT_EQ(c.expected_err.rfind("shardmm: error: ", 0), 0u)
        << "golden/cli_errors.txt:" << c.line << ": stderr must start with 'shardmm: error: '";
    EXPECT_EQ(c.expected_err.back(), '\n') << "golden/cli_errors.txt:" << c.line << ": stderr must end with \\n";
  }
  EXPECT_GE(distinct.size(), 50u);
}

TEST(CliGolden, EveryBadCommandLineExitsTwoWithItsExactMessage) {
  for (const Case& c : load_cases()) {
    std::string shown;
    for (const std::string& a : c.args) shown += (shown.empty() ? "" : "\t") + (a.empty() ? "\"\"" : escape(a));
    SCOPED_TRACE("golden/cli_errors.txt:" + std::to_string(c.line) + ": " + shown);
    const testing::CliResult r = run_in_tests_dir(c.args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, c.expected_err) << "the line as it would read now:\n" << shown << " => " << escape(r.err);
  }
}

}  // namespace
}  // namespace shardmm
