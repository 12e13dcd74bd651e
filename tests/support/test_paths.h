// Where the tests find the repository's files and the shardmm command: relative to the test
// program's own file (the build tree lies where the build was configured). Absolute paths
// compiled in made each test's compile command, and so the compiler cache's key, differ in every
// clone: CI's clean clone compiled those tests anew (scripts/compiler-cache.sh). The relative
// ones (SHARDMM_TESTS_FROM_BINARY, SHARDMM_CLI_FROM_BINARY: tests/CMakeLists.txt) are the same
// in every clone built in its own build/.
#pragma once

#include <filesystem>
#include <string>

namespace shardmm::testing {

// The directory of the running test program.
inline std::filesystem::path program_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path(); }

// <repository>/tests
inline std::string tests_dir() { return (program_dir() / SHARDMM_TESTS_FROM_BINARY).lexically_normal().string(); }
// <repository>
inline std::string repo_dir() { return std::filesystem::path(tests_dir()).parent_path().string(); }
#ifdef SHARDMM_CLI_FROM_BINARY
// The built shardmm command.
inline std::string cli_path() { return (program_dir() / SHARDMM_CLI_FROM_BINARY).lexically_normal().string(); }
#endif

}  // namespace shardmm::testing
