// Every transcript in README.md and docs/*.md is what the command prints today. A transcript
// is a fenced block's "$ shardmm ..." line and the lines after it; a line "..." (or
// "... words ...") in the expected output stands for any run of lines. Commands that time
// something (run, bench, calibrate, --run, --time-limit) print measured figures: for them numbers and the
// width of the spaces between words are not compared, everything else is.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_in_process.h"
#include "test_paths.h"

namespace shardmm {
namespace {

// A fenced block of a document, as written.
struct Block {
  std::string file;        // "docs/cli.md"
  std::size_t first_line;  // of the block's first line inside the fences, from 1
  std::vector<std::string> lines;
};

// The words of a shell command line; 'quoted' words whole (the docs quote no other way).
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  for (std::size_t at = 0; at < line.size();) {
    if (line[at] == ' ') {
      ++at;
    } else if (line[at] == '\'') {
      const std::size_t close = line.find('\'', at + 1);
      words.push_back(line.substr(at + 1, close - at - 1));
      at = close == std::string::npos ? line.size() : close + 1;
    } else {
      const std::size_t end = std::min(line.find(' ', at), line.size());
      words.push_back(line.substr(at, end - at));
      at = end;
    }
  }
  return words;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  while (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

std::vector<Block> blocks_in(const std::filesystem::path& file, const std::string& name) {
  std::ifstream in(file);
  EXPECT_TRUE(in) << file;
  std::vector<Block> blocks;
  bool fenced = false;
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      if (fenced) blocks.push_back({name, number + 1, {}});
    } else if (fenced) {
      blocks.back().lines.push_back(line);
    }
  }
  return blocks;
}

bool is_elision(const std::string& line) {
  const std::size_t first = line.find_first_not_of(' ');
  if (first == std::string::npos) return false;
  const std::string trimmed = line.substr(first);
  return trimmed.rfind("...", 0) == 0 && trimmed.size() >= 3 && trimmed.compare(trimmed.size() - 3, 3, "...") == 0;
}

// Numbers, with their units (a time may be 417 µs in the docs and 2.01 ms today), become '#';
// runs of spaces one space.
std::string masked(const std::string& line) {
  static const std::regex number(
      R"([0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?( ?(ns|µs|ms|s|B|KiB|MiB|GiB|TiB|FLOP|kFLOP|MFLOP|GFLOP|TFLOP)(/s)?)?(?![A-Za-z]))");
  static const std::regex spaces(" +");
  return std::regex_replace(std::regex_replace(line, number, "#"), spaces, " ");
}

// Whether actual[a..] is expected[e..end), elisions matching any run of lines.
bool matches(const std::vector<std::string>& expected, std::size_t e, std::size_t end,
             const std::vector<std::string>& actual, std::size_t a, bool mask) {
  if (e == end) return a == actual.size();
  if (is_elision(expected[e])) {
    for (std::size_t skip = a; skip <= actual.size(); ++skip) {
      if (matches(expected, e + 1, end, actual, skip, mask)) return true;
    }
    return false;
  }
  if (a == actual.size()) return false;
  const bool same = mask ? masked(expected[e]) == masked(actual[a]) : expected[e] == actual[a];
  return same && matches(expected, e + 1, end, actual, a + 1, mask);
}

bool measures(const std::vector<std::string>& args) {
  if (args.empty()) return false;
  const auto has = [&](const char* flag) { return std::find(args.begin(), args.end(), flag) != args.end(); };
  return args[0] == "run" || args[0] == "bench" || args[0] == "calibrate" || has("--run") || has("--time-limit");
}

std::string joined(const std::vector<std::string>& lines, std::size_t from, std::size_t to) {
  std::string s;
  for (std::size_t i = from; i < to; ++i) s += lines[i] + "\n";
  return s;
}

bool is_command(const std::string& line) { return line.rfind("$ ", 0) == 0; }

// Runs the command on block line `at` and returns the line where its output ends: the first
// of the block's later "$ " lines (or its end) up to which the output matches; a demo's
// output holds "$ shardmm ..." lines of its own.
std::size_t check_transcript(const Block& b, std::size_t at) {
  const std::string& command = b.lines[at];
  SCOPED_TRACE(b.file + ":" + std::to_string(b.first_line + at) + ": " + command);
  const std::vector<std::string> words = shell_words(command.substr(2));
  // Every command shown is run: one this test cannot run has no place in a transcript.
  if (words.empty() || (words[0] != "shardmm" && words[0] != "build/src/shardmm")) {
    ADD_FAILURE() << "a transcript of a command other than shardmm";
    return at + 1;
  }
  const std::vector<std::string> args(words.begin() + 1, words.end());
  // From the repository's root, as the README's commands run (the docs name files from there).
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(std::filesystem::path(shardmm::testing::repo_dir()));
  const testing::CliResult r = testing::run_cli_in_process(args);
  std::filesystem::current_path(cwd);
  const bool error = at + 1 < b.lines.size() && b.lines[at + 1].rfind("shardmm: error: ", 0) == 0;
  EXPECT_EQ(r.status, error ? 2 : 0) << r.err;
  const std::vector<std::string> actual = lines_of(error ? r.err : r.out);
  std::size_t next = at + 1;
  while (next < b.lines.size() && !is_command(b.lines[next])) ++next;
  for (std::size_t end = next;; ++end) {
    if (end == b.lines.size() || is_command(b.lines[end])) {
      std::size_t last = end;
      while (last > at + 1 && b.lines[last - 1].empty()) --last;
      if (matches(b.lines, at + 1, last, actual, 0, measures(args))) return end;
    }
    if (end == b.lines.size()) break;
  }
  ADD_FAILURE() << "the docs show:\n"
                << joined(b.lines, at + 1, next) << "the command printed:\n"
                << joined(actual, 0, actual.size());
  return next;
}

TEST(CliDocs, EveryTranscriptIsWhatTheCommandPrints) {
  const std::filesystem::path root = std::filesystem::path(shardmm::testing::repo_dir());
  std::vector<std::filesystem::path> files{root / "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(root / "docs")) {
    if (entry.path().extension() == ".md") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  int transcripts = 0;
  for (const auto& file : files) {
    for (const Block& b : blocks_in(file, std::filesystem::relative(file, root).string())) {
      std::size_t at = 0;
      while (at < b.lines.size() && !is_command(b.lines[at])) ++at;
      while (at < b.lines.size()) {
        at = check_transcript(b, at);
        ++transcripts;
      }
    }
  }
  EXPECT_GE(transcripts, 18);
}

}  // namespace
}  // namespace shardmm
