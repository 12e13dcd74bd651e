// The shardmm command (exit codes in cli/cli.h).
#include <iostream>

#include "cli/cli.h"

int main(int argc, char** argv) { return shardmm::cli::run_cli(argc, argv, std::cout, std::cerr); }
