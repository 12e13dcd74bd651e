#include "cli/cli.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <ostream>
#include <sstream>

#include "cli/commands.h"
#include "shardmm/core/error.h"
#include "shardmm/runtime/errors.h"
#include "shardmm/runtime/runner.h"

// The build passes the project's version (src/CMakeLists.txt).
#ifndef SHARDMM_VERSION
#define SHARDMM_VERSION "unknown"
#endif

namespace shardmm::cli {
namespace {

// Under mpirun every rank parses the same flags and fails alike: only rank 0 says so.
bool quiet_rank() { return process_rank("mpi") != 0; }

// The library names the input a message is about by its field ("dims", "warmup_time"); the
// command says which flag gives it.
std::string flag_of(std::string_view field) {
  std::string flag = "--" + std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

int input_error(std::ostream& err, const std::string& headline, const std::string& context = "") {
  if (quiet_rank()) return 2;
  // One write per message: under mpirun another process's lines cannot land inside it.
  err << "shardmm: error: " + headline + "\n" + (context.empty() ? "" : context + "\n") << std::flush;
  return 2;
}

// How this process was started, for the ranks of an mpirun job to compare: its arguments and
// its SHARDMM_ environment, an item a line.
std::string launch_fingerprint(int argc, char** argv) {
  std::string out;
  for (int i = 1; i < argc; ++i) out += "argument " + std::string(argv[i]) + "\n";
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    if (std::string_view(*e).starts_with("SHARDMM_")) env.emplace_back("environment " + std::string(*e));
  }
  std::sort(env.begin(), env.end());
  for (const std::string& e : env) out += e + "\n";
  return out;
}

// Seconds a rank waits for the others at the launch agreement (they parse the same flags)
// and, having failed before its first run, for those that may be waiting at that run's start.
constexpr double kLaunchTimeoutS = 60;
constexpr double kFailureReportTimeoutS = 10;

// A rank that failed with `headline`, under mpirun or not. Under mpirun the ranks share what they
// found (runner.h): rank 0 prints the one message they stop with; a rank whose peers never
// came prints its own, naming itself.
int rank_failure(std::ostream& err, const std::string& headline, const std::string& context,
                 const std::optional<std::string>& agreed) {
  if (!agreed) {
    err << "shardmm: error: rank " + std::to_string(process_rank("mpi")) + ": " + headline + "\n" << std::flush;
    return 2;
  }
  if (agreed->empty() || *agreed == headline) return input_error(err, headline, context);
  return input_error(err, *agreed);
}

std::string command_names(const std::vector<Command>& commands) {
  std::vector<std::string> names;
  for (const Command& c : commands) names.push_back(c.app->get_name());
  return join(names, ", ");
}

// The command as typed so far, for messages: "shardmm", "shardmm bench collectives".
std::string command_path(const CLI::App& app) {
  return app.get_parent() ? command_path(*app.get_parent()) + " " + app.get_name() : "shardmm";
}

// The last (sub)command the parser entered: where a flag error belongs.
const CLI::App& deepest_parsed(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return deepest_parsed(*sub);
  return app;
}

std::string help_hint(const CLI::App& app) { return " (see '" + command_path(app) + " --help')"; }

bool is_option(const std::string& arg) { return arg.size() > 1 && arg[0] == '-'; }

// The first of `extras` in command-line order (CLI11 lists them in its own order).
std::string first_in_argv(const std::vector<std::string>& extras, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::find(extras.begin(), extras.end(), argv[i]) != extras.end()) return argv[i];
  }
  return extras.empty() ? "" : extras.front();
}

// Edits (insert, delete, replace, swap two neighbours) that turn `a` into `b`: --shwo is
// one from --show.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// "unknown option '--mesj'" plus "; did you mean --mesh?" when one of `app`'s options is
// within a third of the typed name's length in edits (one edit at least), the nearest first.
// `where` follows the name (" for 'shardmm plan'", or the rule at the top level).
std::string unknown_option(const std::string& arg, const CLI::App& app, const std::string& where) {
  const std::string typed = arg.substr(0, arg.find('='));
  const std::string bare = typed.substr(std::min(typed.find_first_not_of('-'), typed.size()));
  std::string nearest;
  std::size_t best = std::max<std::size_t>(1, bare.size() / 3) + 1;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      const std::size_t d = edit_distance(bare, name);
      if (d < best) {
        best = d;
        nearest = "--" + name;
      }
    }
  }
  return "unknown option '" + typed + "'" + where + (nearest.empty() ? "" : "; did you mean " + nearest + "?");
}

// Leftover arguments belong to the innermost command that has some.
const CLI::App& leftovers_owner(const CLI::App& app) {
  const CLI::App* owner = &app;
  while (owner->remaining().empty() && owner->get_parent()) owner = owner->get_parent();
  return *owner;
}

std::string subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  return join(names, ", ");
}

// CLI11's messages, reworded the way shardmm's own are: the offending text, then the rule.
// CLI11 2.1's message formats are matched where its exceptions carry no fields.
std::string explain(const CLI::ParseError& e, const CLI::App& root, int argc, char** argv) {
  const CLI::App& app = deepest_parsed(root);
  const std::string what = e.what();
  const std::string hint = help_hint(app);
  const std::string command = "'" + command_path(app) + "'";
  // An option before the command is left over at the top; whatever else went wrong follows from it.
  if (&app != &root) {
    const std::string early = first_in_argv(root.remaining(), argc, argv);
    if (is_option(early)) {
      const std::string name = early.substr(0, early.find('='));
      return "'" + name + "' comes before the command; options follow their command, e.g. " + command_path(app) +
             " ... " + name + " ..." + hint;
    }
  }
  // An unknown option first, whatever else went wrong: a mistyped --mesh leaves --mesh missing.
  const CLI::App& owner = leftovers_owner(app);
  const std::string extra = first_in_argv(owner.remaining(), argc, argv);
  if (is_option(extra)) return unknown_option(extra, owner, " for '" + command_path(owner) + "'") + help_hint(owner);
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    return "unexpected argument '" + extra + "': '" + command_path(owner) +
           "' takes no more arguments (quote an argument that has spaces, e.g. 'A[I, J_X]')" + help_hint(owner);
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) && !app.get_subcommands({}).empty() &&
      app.get_subcommands().empty()) {
    // A command that needs a subcommand (bench): either none came, or an unknown one.
    for (const std::string& extra : app.remaining()) {
      if (!is_option(extra)) {
        return "unknown subcommand '" + extra + "' for " + command + "; its subcommands are " + subcommand_names(app) +
               hint;
      }
    }
    return command + " needs a subcommand: " + subcommand_names(app) + hint;
  }
  // "NAME: ..." (ArgumentMismatch), "Could not convert: NAME = VALUE" (ConversionError).
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    const std::string name = what.substr(0, what.find(':'));
    if (what.find(" missing") != std::string::npos) return name + " needs a value" + hint;
    if (what.find("At Most") != std::string::npos) return name + " is given more than once; give it once" + hint;
  }
  const std::string convert = "Could not convert: ";
  if (dynamic_cast<const CLI::ConversionError*>(&e) && what.rfind(convert, 0) == 0) {
    const std::size_t eq = what.find(" = ", convert.size());
    const std::string name = what.substr(convert.size(), eq - convert.size());
    const std::string value = eq == std::string::npos ? "" : what.substr(eq + 3);
    const CLI::Option* option = app.get_option_no_throw(name);
    if (option && option->get_expected_max() == 0) {
      return name + " is a flag: give it alone, or as " + name + "=true or " + name + "=false, not " + name + "=" +
             value + hint;
    }
    const std::size_t sign = !value.empty() && value[0] == '-';
    const bool digits = value.size() > sign && value.find_first_not_of("0123456789", sign) == std::string::npos;
    if (option && option->get_type_name() == "INT") {
      return name + " '" + value + "' " +
             (digits ? "is out of range for a whole number (-2147483648 to 2147483647)" : "is not a whole number") +
             hint;
    }
    return name + " '" + value + "' is not a valid value" + hint;
  }
  return what + hint;
}

}  // namespace

int run_cli(int argc, char** argv, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "shardmm: sharded tensors on a named device mesh, in the JAX Scaling Book's notation.\n"
      "Says which of the four sharded-matmul cases a contraction is, which collectives it needs\n"
      "and what they cost on given hardware.",
      "shardmm"};
  app.set_version_flag("--version", std::string("shardmm ") + SHARDMM_VERSION);
  app.require_subcommand(1);
  app.footer(std::string(kNotationHint) +
             "\n\nExamples:\n"
             "  shardmm check 'A[I_X, J_Y]' --mesh X=4,Y=2 --dims I=8192,J=4096\n"
             "  shardmm plan 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=8192,J=4096,K=16384\n"
             "  shardmm reshard 'A[I, J_X]' 'A[I_X, J]' --mesh X=4 --dims I=8192,J=4096\n"
             "  shardmm model block --strategy sp --mesh X=4 --dims B=8,T=1024,D=4096,F=16384,H=32\n"
             "  shardmm demo\n"
             "Run 'shardmm COMMAND --help' for a command's flags.\n" +
             kDocsHint);

  const std::vector<Command> commands = {
      add_check_command(app),   add_plan_command(app),      add_reshard_command(app), add_run_command(app),
      add_bench_command(app),   add_calibrate_command(app), add_demo_command(app),    add_model_command(app),
      add_program_command(app), add_solve_command(app),
  };

  const std::string fingerprint = launch_fingerprint(argc, argv);
  const auto parse_failure = [&](const std::string& headline) {
    return rank_failure(err, headline, "", agree_at_launch(headline, fingerprint, kLaunchTimeoutS));
  };
  try {
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      for (const Command& c : commands) known = known || c.app->get_name() == argv[1];
      if (!known) {
        return parse_failure("unknown command '" + std::string(argv[1]) + "'; the commands are " +
                             command_names(commands) + " (see 'shardmm --help')");
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e, out, err);  // --help, --version: printed on `out`, exit 0
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty()) {
      const std::vector<std::string> extras = app.remaining();
      const std::string extra = first_in_argv(extras, argc, argv);
      if (is_option(extra)) {
        return parse_failure(unknown_option(extra, app, "; shardmm takes a command first: " + command_names(commands)) +
                             " (see 'shardmm --help')");
      }
      return parse_failure("no command given; the commands are " + command_names(commands) + " (see 'shardmm --help')");
    }
    return parse_failure(explain(e, app, argc, argv));
  } catch (const CLI::ParseError& e) {
    return parse_failure(explain(e, app, argc, argv));
  }

  if (const std::optional<std::string> agreed = agree_at_launch("", fingerprint, kLaunchTimeoutS); !agreed) {
    return input_error(err, "the ranks of this mpirun job did not all start within " +
                                std::to_string(static_cast<int>(kLaunchTimeoutS)) + " s");
  } else if (!agreed->empty()) {
    return input_error(err, *agreed);
  }

  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    // The output is buffered so that a command that fails prints nothing on `out`.
    std::ostringstream buffer;
    try {
      const int status = c.run(buffer);
      out << buffer.str() << std::flush;
      if (!out) {
        return input_error(err,
                           "cannot write the output: standard output refused it (a full disk or a closed "
                           "file); nothing else went wrong");
      }
      return status;
    } catch (const InputError& e) {
      const std::string headline = e.headline(flag_of);
      return rank_failure(err, headline, e.context(), report_failure_before_run(headline, kFailureReportTimeoutS));
    } catch (const CollectiveError& e) {
      // Ranks that stopped agreeing or never arrived (a stopped process, a watchdog set too
      // short): exit 2 with the backend's message, as the mpi backend's abort ends such a run.
      err << "shardmm: error: " + std::string(e.what()) + "\n" << std::flush;
      return 2;
    } catch (const std::exception& e) {
      err << "shardmm: internal error: " + std::string(e.what()) + " (please report it with the command line)\n"
          << std::flush;
      return 1;
    }
  }
  return input_error(err, "no command given; the commands are " + command_names(commands) + " (see 'shardmm --help')");
}

}  // namespace shardmm::cli
