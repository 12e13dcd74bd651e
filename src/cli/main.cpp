// The shardmm command: parses flags, runs one subcommand, maps errors to exit codes.
//   0  success
//   1  internal error (a bug): one line on stderr
//   2  bad input (InputError, unknown command or flag, missing argument): one line
//      "shardmm: error: <headline>" on stderr, then the caret lines when the error has them
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/runner.h"

// The build passes the project's version (src/CMakeLists.txt).
#ifndef SHARDMM_VERSION
#define SHARDMM_VERSION "unknown"
#endif

namespace {

using shardmm::cli::Command;

// Under mpirun every rank parses the same flags and fails alike: only rank 0 says so.
bool quiet_rank() { return shardmm::process_rank("mpi") != 0; }

int input_error(const std::string& headline, const std::string& context = "") {
  if (quiet_rank()) return 2;
  std::cerr << "shardmm: error: " << headline << "\n";
  if (!context.empty()) std::cerr << context << "\n";
  return 2;
}

std::string command_names(const std::vector<Command>& commands) {
  std::vector<std::string> names;
  for (const Command& c : commands) names.push_back(c.app->get_name());
  return shardmm::cli::join(names, ", ");
}

// CLI11's messages name the flag but not where to read about it.
std::string help_hint(const CLI::App& root, int argc, char** argv) {
  if (argc > 1) {
    for (const CLI::App* sub : root.get_subcommands({})) {
      if (sub->get_name() == argv[1]) return " (see 'shardmm " + sub->get_name() + " --help')";
    }
  }
  return " (see 'shardmm --help')";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "shardmm: sharded tensors on a named device mesh, in the JAX Scaling Book's notation.\n"
      "Says which of the four sharded-matmul cases a contraction is, which collectives it needs\n"
      "and what they cost on given hardware.",
      "shardmm"};
  app.set_version_flag("--version", std::string("shardmm ") + SHARDMM_VERSION);
  app.require_subcommand(1);
  app.footer(std::string(shardmm::cli::kNotationHint) +
             "\n\nExamples:\n"
             "  shardmm check 'A[I_X, J_Y]' --mesh X=4,Y=2 --dims I=8192,J=4096\n"
             "  shardmm plan 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=8192,J=4096,K=16384\n"
             "  shardmm reshard 'A[I, J_X]' 'A[I_X, J]' --mesh X=4 --dims I=8192,J=4096\n"
             "  shardmm demo\n"
             "Run 'shardmm COMMAND --help' for a command's flags.\n" +
             shardmm::cli::kDocsHint);

  const std::vector<Command> commands = {
      shardmm::cli::add_check_command(app),
      shardmm::cli::add_plan_command(app),
      shardmm::cli::add_reshard_command(app),
      shardmm::cli::add_run_command(app),
      shardmm::cli::add_bench_command(app),
      shardmm::cli::add_demo_command(app),
  };

  try {
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      for (const Command& c : commands) known = known || c.app->get_name() == argv[1];
      if (!known) {
        return input_error("unknown command '" + std::string(argv[1]) + "'; the commands are " +
                           command_names(commands) + " (see 'shardmm --help')");
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed on stdout, exit 0
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty()) {
      return input_error("no command given; the commands are " + command_names(commands) + " (see 'shardmm --help')");
    }
    return input_error(e.what() + help_hint(app, argc, argv));
  } catch (const CLI::ParseError& e) {
    return input_error(e.what() + help_hint(app, argc, argv));
  }

  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    // The output is buffered so that a command that fails prints nothing on stdout.
    std::ostringstream out;
    try {
      const int status = c.run(out);
      std::cout << out.str() << std::flush;
      return status;
    } catch (const shardmm::InputError& e) {
      return input_error(e.headline(), e.context());
    } catch (const std::exception& e) {
      std::cerr << "shardmm: internal error: " << e.what() << " (please report it with the command line)\n";
      return 1;
    }
  }
  return input_error("no command given; the commands are " + command_names(commands) + " (see 'shardmm --help')");
}
