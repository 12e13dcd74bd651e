// The fuzzers' checked-in corpora (fuzz/corpus/parse, cli, program), replayed through the
// fuzz harnesses themselves in the ordinary build, so that every input the fuzzer ever
// found (each one is added to the corpus) stays a regression test without clang. A harness
// aborts on a broken rule (fuzz/fuzz_parse.cpp, fuzz/fuzz_cli.cpp); an exception other than
// InputError escapes it and fails the test.
// tests/CMakeLists.txt compiles the harnesses into this test with their entry points renamed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "test_paths.h"

extern "C" int fuzz_parse_one(const std::uint8_t* data, std::size_t size);
extern "C" int fuzz_cli_one(const std::uint8_t* data, std::size_t size);
extern "C" int fuzz_program_one(const std::uint8_t* data, std::size_t size);

namespace shardmm {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = fs::path(shardmm::testing::repo_dir());

std::vector<fs::path> corpus(const std::string& name) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kRoot / "fuzz" / "corpus" / name)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

void replay(const std::string& name, int (*harness)(const std::uint8_t*, std::size_t)) {
  // The CLI corpus names profile files relative to the repository root, as scripts/fuzz.sh runs.
  const fs::path cwd = fs::current_path();
  fs::current_path(kRoot);
  const std::vector<fs::path> files = corpus(name);
  EXPECT_GE(files.size(), 20u) << "fuzz/corpus/" << name << " is nearly empty";
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    std::ifstream in(file, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EXPECT_EQ(harness(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), 0);
  }
  fs::current_path(cwd);
}

TEST(FuzzCorpus, ParseInputsKeepTheParsersRules) { replay("parse", fuzz_parse_one); }

TEST(FuzzCorpus, CommandLinesEndWithSuccessOrOneErrorLine) { replay("cli", fuzz_cli_one); }

TEST(FuzzCorpus, ProgramsPrintBackAndRecordOrFailWithAnInputError) { replay("program", fuzz_program_one); }

}  // namespace
}  // namespace shardmm
