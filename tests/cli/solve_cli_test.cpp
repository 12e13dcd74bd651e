// `shardmm solve`, in-process (cli::run_cli): the report and its JSON agree, --emit's file is
// a program `shardmm program` costs the same, --run verifies the answer, and every kind of
// bad input is one exit-2 message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli_in_process.h"
#include "test_paths.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Result = testing::CliResult;
namespace fs = std::filesystem;

const std::string kRoot = shardmm::testing::repo_dir();
std::string example(const std::string& name) { return kRoot + "/examples/programs/" + name; }

Result cli(std::vector<std::string> args) { return testing::run_cli_in_process(std::move(args)); }

TEST(SolveCli, FindsMegatronAndSaysItIsOptimal) {
  const Result r = cli({"solve", example("mlp_free.prog"), "--explain"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Solved by dynamic programming in "));
  EXPECT_THAT(r.out, HasSubstr(" (its problem built in "));
  EXPECT_THAT(r.out, HasSubstr(": optimal."));
  EXPECT_THAT(r.out, HasSubstr("w_in[D, F_X]"));
  EXPECT_THAT(r.out, HasSubstr("w_out[F_X, D]"));
  EXPECT_THAT(r.out, HasSubstr("Each choice's runner-up"));
  const json doc = json::parse(cli({"solve", example("mlp_free.prog"), "--json"}).out);
  EXPECT_EQ(doc["status"], "optimal");
  // The build (207 ops recorded) and the dynamic program, timed apart.
  EXPECT_GT(doc["build_seconds"].get<double>(), 0);
  EXPECT_GT(doc["solve_seconds"].get<double>(), 0);
  EXPECT_EQ(doc["top"][0]["specs"]["w_in"], "w_in[D, F_X]");
  EXPECT_DOUBLE_EQ(doc["objective_s"].get<double>(), doc["predicted"]["time_s"].get<double>());
  // No named strategy is faster than the optimum.
  for (const json& s : doc["named_strategies"]) {
    if (s["status"] == "optimal") {
      EXPECT_GE(s["time_s"].get<double>(), doc["objective_s"].get<double>() * (1 - 1e-12));
    }
  }
}

// A named strategy that finds nothing says why: a pin its roles contradict, a leaf none of whose
// specs they allow, or the memory limit; the JSON's why_not is the same phrase, null for one found.
TEST(SolveCli, NamedStrategiesThatFindNothingSayWhy) {
  const Result pinned = cli({"solve", example("mlp_free.prog"), "--pin", "x=x[B, T_X, D]"});
  ASSERT_EQ(pinned.status, 0) << pinned.err;
  EXPECT_THAT(pinned.out, HasSubstr("dp(X)           -        -  contradicts x's pin x[B, T_X, D] (dp on X)\n"));
  EXPECT_THAT(pinned.out, HasSubstr("tp(X)           -        -  contradicts x's pin x[B, T_X, D] (tp on X)\n"));
  // B=4 cannot be split eight ways (nor T=1): only tp applies.
  const json small = json::parse(
      cli({"solve", example("mlp_free.prog"), "--mesh", "X=8", "--dims", "B=4,T=1,D=64,F=64", "--json"}).out);
  for (const json& s : small["named_strategies"]) {
    if (s["name"] == "tp(X)") {
      EXPECT_EQ(s["status"], "optimal");
      EXPECT_TRUE(s["why_not"].is_null());
      EXPECT_GT(s["time_s"].get<double>(), 0);
      EXPECT_GT(s["memory_bytes"].get<std::int64_t>(), 0);
    } else {
      EXPECT_EQ(s["status"], "infeasible") << s["name"];
      EXPECT_EQ(s["why_not"], "fits no spec of x[B, T, D] (shape [4, 1, 64])") << s["name"];
      // Nothing found: no figures (zeros would read as a free step).
      EXPECT_TRUE(s["time_s"].is_null()) << s["name"];
      EXPECT_TRUE(s["memory_bytes"].is_null()) << s["name"];
      EXPECT_TRUE(s["lower_bound_s"].is_null()) << s["name"];
      EXPECT_TRUE(s["specs"].empty()) << s["name"];
    }
  }
  // dp and tp keep every weight whole (800 and 864 MiB at these sizes).
  const Result limited = cli({"solve", example("mlp_free.prog"), "--mem-limit", "700MiB"});
  ASSERT_EQ(limited.status, 0) << limited.err;
  EXPECT_THAT(limited.out, HasSubstr("dp(X)           -        -  nothing fits the memory limit\n"));
  EXPECT_THAT(limited.out, HasSubstr("tp(X)           -        -  nothing fits the memory limit\n"));
}

TEST(SolveCli, EmitWritesAProgramThatCostsTheSame) {
  const fs::path file = fs::temp_directory_path() / ("shardmm_solved_" + std::to_string(::getpid()) + ".prog");
  // At these sizes a replicated step is fastest and needs 5.5 MiB: the limit binds.
  const Result r = cli({"solve", example("mlp_free.prog"), "--dims", "B=8,T=64,D=256,F=1024", "--mem-limit", "4MiB",
                        "--emit", file.string(), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json solved = json::parse(r.out);
  EXPECT_EQ(solved["method"], "integer program (CBC)");
  const Result p = cli({"program", file.string(), "--json"});
  ASSERT_EQ(p.status, 0) << p.err;
  const json program = json::parse(p.out);
  EXPECT_DOUBLE_EQ(program["predicted_time_s"]["serialized"].get<double>(),
                   solved["predicted"]["time_s"].get<double>());
  EXPECT_EQ(program["memory"]["total_bytes"], solved["predicted"]["memory"]["total_bytes"]);
  EXPECT_LE(program["memory"]["total_bytes"].get<std::int64_t>(), 4LL << 20);
  fs::remove(file);
}

// Three axes: a neighbourhood search, said so in the text and the JSON with the compute bound
// (the only one proven); its emitted program costs what it found.
TEST(SolveCli, SearchesThreeAxesByNeighbourhoods) {
  const fs::path dir = fs::temp_directory_path();
  const fs::path program = dir / ("shardmm_search_" + std::to_string(::getpid()) + ".prog");
  const fs::path file = dir / ("shardmm_searched_" + std::to_string(::getpid()) + ".prog");
  // A two-matmul MLP of two-letter tensors: its search takes a second (mlp_free's three-letter
  // activations multiply the specs, and its search took ten times as long).
  std::ofstream(program) << "input x[B, D]\nparam w_in[D, F]\nparam w_out[F, D]\nu[B, F] = x @ w_in\n"
                            "a[B, F] = gelu(u)\ny[B, D] = a @ w_out\nloss sum(y * y)\n";
  // Forced (the whole space might be built within a quarter of a time limit on a fast machine),
  // and with time enough to converge under a sanitizer.
  const std::vector<std::string> args = {
      "solve",    program.string(), "--mesh",       "a=2,b=2,c=2", "--dims", "B=64,D=256,F=1024",
      "--search", "neighbourhoods", "--time-limit", "600"};
  const Result text = cli(args);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("Searched (--search neighbourhoods) from the best named strategy by neighbourhoods"));
  EXPECT_THAT(text.out, HasSubstr("Solved by neighbourhood search in "));
  EXPECT_THAT(text.out, HasSubstr(" (its problems built in "));
  // Replicated on every axis (this size is too small to gain from splitting it), 8 times the
  // bound: the gap as a ratio, not "within 87.5%", which reads as close.
  EXPECT_THAT(text.out, HasSubstr(": no change of one or two axes' places improves it: a local optimum, "));
  EXPECT_THAT(text.out,
              ContainsRegex(" [0-9.]+ times the proven bound [0-9.]+ [^ ]+ \\(a gap of [0-9.]+%; every device "
                            "computing an even share, nothing communicated\\)\\.\n"));
  // Where the gap is small (a batch large enough that computing dominates), a percentage.
  std::vector<std::string> large_batch = args;
  large_batch[5] = "B=65536,D=1024,F=4096";
  const Result close = cli(large_batch);
  ASSERT_EQ(close.status, 0) << close.err;
  EXPECT_THAT(close.out, ContainsRegex(": a local optimum, within [0-9.]+% of the proven bound [0-9.]+ [^ ]+ \\(every "
                                       "device computing an even share, nothing communicated\\)\\.\n"));
  std::vector<std::string> with_json = args;
  for (const char* a : {"--json", "--top", "2", "--emit"}) with_json.push_back(a);
  with_json.push_back(file.string());
  const Result r = cli(with_json);
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["status"], "local");
  EXPECT_EQ(doc["method"], "neighbourhood search");
  // The compute bound: above nothing, below the answer.
  EXPECT_GT(doc["lower_bound_s"].get<double>(), 0);
  EXPECT_LE(doc["lower_bound_s"].get<double>(), doc["objective_s"].get<double>());
  for (const json& t : doc["top"]) {
    EXPECT_EQ(t["status"], "local");
    EXPECT_EQ(t["lower_bound_s"], doc["lower_bound_s"]);
  }
  EXPECT_EQ(doc["search"]["converged_axes"], 2);
  // Every neighbourhood's build, within the search's time.
  EXPECT_GT(doc["build_seconds"].get<double>(), 0);
  EXPECT_LE(doc["build_seconds"].get<double>(), doc["search"]["seconds"].get<double>());
  EXPECT_GT(doc["search"]["neighbourhoods"].get<int>(), 3);
  EXPECT_DOUBLE_EQ(doc["objective_s"].get<double>(), doc["predicted"]["time_s"].get<double>());
  for (const json& s : doc["named_strategies"]) {
    if (!s["specs"].empty()) {
      EXPECT_GE(s["time_s"].get<double>(), doc["objective_s"].get<double>() * (1 - 1e-12)) << s["name"];
    }
  }
  const Result p = cli({"program", file.string(), "--json"});
  ASSERT_EQ(p.status, 0) << p.err;
  EXPECT_DOUBLE_EQ(json::parse(p.out)["predicted_time_s"]["serialized"].get<double>(),
                   doc["predicted"]["time_s"].get<double>());
  fs::remove(file);
  fs::remove(program);
}

TEST(SolveCli, RunVerifiesTheAnswer) {
  const Result r = cli({"solve", example("mlp_free.prog"), "--mesh", "X=2", "--dims", "B=2,T=4,D=8,F=16", "--run",
                        "--pin", "w_in=w_in[D, F_X]", "--optimizer", "adam", "--hw", "h100"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Run (threads, 2 ranks): verified"));
  EXPECT_THAT(r.out, HasSubstr("w_in[D, F_X]  pinned"));
  // Measured here, predicted for a GPU: the output says the two are not alike.
  EXPECT_THAT(r.out, HasSubstr("(predicted on the built-in h100 profile, not this machine"));
}

// Every example of `solve --help` runs as written from the repository root.
TEST(SolveCli, HelpExamplesRun) {
  const Result help = cli({"solve", "--help"});
  ASSERT_EQ(help.status, 0);
  std::istringstream lines(help.out);
  int ran = 0;
  const fs::path cwd = fs::current_path();
  fs::current_path(kRoot);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  shardmm solve ", 0) != 0) continue;
    std::vector<std::string> args;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w == "shardmm") continue;
      if (const auto q = w.find('\''); q != std::string::npos) {  // --pin x='x[B_X, T, D]': one word
        std::string rest;
        while (std::count(w.begin(), w.end(), '\'') < 2 && words >> rest) w += " " + rest;
        w.erase(std::remove(w.begin(), w.end(), '\''), w.end());
      }
      args.push_back(w);
    }
    SCOPED_TRACE(line);
    const Result r = cli(args);
    EXPECT_EQ(r.status, 0) << r.err;
    ++ran;
  }
  fs::current_path(cwd);
  EXPECT_GE(ran, 4);
}

TEST(SolveCli, BadInputIsOneMessageAndExitTwo) {
  const std::string mlp = example("mlp_free.prog");
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"/nonexistent/x.prog"}, "program /nonexistent/x.prog"},
      {{mlp, "--mem-limit", "lots"}, "--mem-limit"},
      {{mlp, "--mem-limit", "1MiB"}, "no sharding of the program fits in --mem-limit 1 MiB per device"},
      {{mlp, "--pin", "w_in"}, "--pin 'w_in': expected NAME=SPEC"},
      {{mlp, "--pin", "w=[D]"}, "spec for 'w' in --pin: the program has no tensor 'w'"},
      {{mlp, "--pin", "w_in=w_in[D_Y, F]"}, "unknown mesh axis 'Y'"},
      {{mlp, "--pin", "w_in=w_in[D_X, F_X]"}, "(in --pin for 'w_in')"},
      {{mlp, "--pin", "w_in=w_in[F, D]"}, "are not the tensor's [D, F] in order (in --pin)"},
      {{mlp, "--top", "0"}, "--top"},
      {{mlp, "--time-limit", "-1"}, "--time-limit -1: the search's time limit"},
      // Three axes: searched by neighbourhoods, none of which is solved in a millisecond.
      {{mlp, "--mesh", "X=2,Y=2,Z=2", "--time-limit", "0.001"},
       "solve: no sharding found within --time-limit 0.001 s; give more time, pin some tensors or use fewer mesh axes"},
      {{mlp, "--search", "greedy"}, "--search 'greedy': searches auto"},
      // --search whole on three axes: the whole space, refused when it cannot be built in time.
      {{mlp, "--mesh", "X=2,Y=2,Z=2", "--search", "whole", "--time-limit", "1"},
       "solve: the search is too large for --time-limit 1 s"},
      {{mlp, "--train", "--infer"}, "--train and --infer exclude each other"},
      {{mlp, "--optimizer", "lion"}, "unknown optimizer 'lion'"},
      {{mlp, "--run", "--dtype", "bf16"}, "--run computes in f32 or f64, not bf16"},
      {{mlp, "--hw", "tpu-v5e", "--dtype", "f64"}, "profile 'tpu-v5e' has no peak FLOP/s for f64"},
      {{mlp, "--run"}, "give smaller --dims with --run"},
      {{mlp, "--emit", "/nonexistent/dir/x.prog"}, "--emit '/nonexistent/dir/x.prog'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(::testing::PrintToString(args));
    std::vector<std::string> full = args;
    full.insert(full.begin(), "solve");
    const Result r = cli(full);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_THAT(r.err, StartsWith("shardmm: error: "));
    EXPECT_THAT(r.err, HasSubstr(message));
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace shardmm
