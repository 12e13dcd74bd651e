// Runs the shardmm command in this process (cli::run_cli) and keeps what it printed; for
// tests under tests/cli, which link the command's library.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace shardmm::testing {

struct CliResult {
  int status = -1;
  std::string out, err;
};

// `args` after the program name, e.g. {"model", "mlp", "--strategy", "tp", ...}.
inline CliResult run_cli_in_process(std::vector<std::string> args) {
  args.insert(args.begin(), "shardmm");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  CliResult r;
  r.status = cli::run_cli(static_cast<int>(args.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

}  // namespace shardmm::testing
