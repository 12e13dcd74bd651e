// Files of the repository (examples, docs) read by tests, by their path from its root.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include "test_paths.h"

namespace shardmm::testing {

// The whole file, bytes as they are ("" when it cannot be read: the test's own checks fail).
inline std::string read_repo_file(const std::string& relative) {
  std::ifstream in(repo_dir() + "/" + relative, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace shardmm::testing
