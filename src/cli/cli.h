// The shardmm command as a function, so that main() and the CLI fuzzer (fuzz/fuzz_cli.cpp)
// run the same code:
//
//   std::ostringstream out, err;
//   int status = shardmm::cli::run_cli(argc, argv, out, err);
//
// Exit codes:
//   0  success
//   1  internal error (a bug): one line on `err`
//   2  bad input (InputError, unknown command or flag, missing argument), or `out` refusing
//      the output: one line "shardmm: error: <headline>" on `err`, then the caret lines when
//      the error has them
//   3  `run` or `reshard --run` computed a wrong result
// A command's output reaches `out` only when it succeeds. The progress lines of `run`,
// `reshard --run` and `bench` go straight to std::cerr, as they happen.
#pragma once

#include <iosfwd>

namespace shardmm::cli {

int run_cli(int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace shardmm::cli
