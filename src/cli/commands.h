// The shardmm subcommands, one file each (cmd_<name>.cpp). run_cli (cli.cpp) registers
// every command listed here, in this order (the order of `shardmm --help`).
#pragma once

#include "cli/common.h"

namespace shardmm::cli {

Command add_check_command(CLI::App& root);      // cmd_check.cpp
Command add_plan_command(CLI::App& root);       // cmd_plan.cpp
Command add_reshard_command(CLI::App& root);    // cmd_reshard.cpp
Command add_run_command(CLI::App& root);        // cmd_run.cpp
Command add_bench_command(CLI::App& root);      // cmd_bench.cpp
Command add_calibrate_command(CLI::App& root);  // cmd_calibrate.cpp
Command add_demo_command(CLI::App& root);       // cmd_demo.cpp
Command add_model_command(CLI::App& root);      // cmd_model.cpp
Command add_program_command(CLI::App& root);    // cmd_program.cpp
Command add_solve_command(CLI::App& root);      // cmd_solve.cpp

}  // namespace shardmm::cli
