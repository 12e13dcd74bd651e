// The shardmm command, run as a user runs it (fork + exec of the built binary, with a
// timeout): every command's text and JSON, checked against the library's own results and
// against closed-form figures; exit codes; one clear error line for bad input.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"
#include "test_paths.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Result {
  int status = -1;  // exit code; -1 when killed or not exited
  std::string out, err;
};

// Runs the shardmm binary with `args`; kills it after `timeout_s`. With `address_space`, the
// process runs under that RLIMIT_AS (as `ulimit -v` sets it).
Result run(const std::vector<std::string>& args, int timeout_s = 120, std::optional<rlim_t> address_space = {}) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) {
    ADD_FAILURE() << "pipe failed";
    return {};
  }
  std::string path = shardmm::testing::cli_path();  // before the fork: the child only runs it
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (address_space) {
      const rlimit limit{*address_space, *address_space};
      if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(126);
    }
    std::vector<char*> argv;
    argv.push_back(path.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Result r;
  std::array<pollfd, 2> fds{{{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}}};
  std::array<std::string*, 2> sinks{&r.out, &r.err};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      ADD_FAILURE() << "shardmm timed out";
      break;
    }
    if (poll(fds.data(), fds.size(), static_cast<int>(left.count())) < 0) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// The text's words, one space apart: explanations wrap, so compare them as words.
std::string words(const std::string& text) {
  std::string flat;
  std::istringstream in(text);
  for (std::string word; in >> word;) flat += (flat.empty() ? "" : " ") + word;
  return flat;
}

json parse_stdout(const Result& r) {
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  return json::parse(r.out);
}

// Bad input: exit 2, nothing on stdout, one headline "shardmm: error: ..." containing
// `needle`, then only the caret context (two indented lines) when there is one.
void expect_input_error(const std::vector<std::string>& args, const std::string& needle) {
  SCOPED_TRACE(::testing::PrintToString(args));
  const Result r = run(args);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  const std::vector<std::string> err = lines(r.err);
  ASSERT_FALSE(err.empty());
  EXPECT_THAT(err[0], StartsWith("shardmm: error: "));
  EXPECT_THAT(err[0], HasSubstr(needle));
  EXPECT_THAT(r.err, Not(HasSubstr("internal error")));
  EXPECT_TRUE(err.size() == 1 || err.size() == 3) << r.err;
  if (err.size() == 3) {
    EXPECT_THAT(err[1], StartsWith("  "));
    EXPECT_THAT(err[2], StartsWith("  "));
    EXPECT_NE(err[2].find('^'), std::string::npos);
  }
}

const std::string kDims = "I=8192,J=4096,K=16384";

PlanOptions v5e() { return PlanOptions{DType::bf16, builtin_profile("tpu-v5e"), std::nullopt}; }

MatmulPlanning library_plan(const std::string& expr, const std::string& mesh_text, const std::string& dims,
                            const PlanOptions& options) {
  const Mesh mesh = Mesh::parse(mesh_text);
  return plan_matmul(mesh, parse_contraction(expr, mesh), parse_dims(dims), options);
}

// The JSON plan must be the library's plan, field by field.
void expect_same_plan(const json& j, const Plan& p, const Mesh& mesh) {
  EXPECT_EQ(j["description"], p.description);
  EXPECT_EQ(j["output"], format_spec(p.output, mesh));
  EXPECT_DOUBLE_EQ(j["comm_time_s"].get<double>(), p.comm_time_s);
  EXPECT_DOUBLE_EQ(j["compute_time_s"].get<double>(), p.compute_time_s);
  EXPECT_DOUBLE_EQ(j["total_time_s"].get<double>(), p.total_time_s);
  EXPECT_DOUBLE_EQ(j["overlapped_time_s"].get<double>(), p.overlapped_time_s);
  EXPECT_EQ(j["peak_bytes_per_device"].get<std::int64_t>(), p.peak_bytes_per_device);
  EXPECT_EQ(j["fits_memory"].get<bool>(), p.fits_memory);
  ASSERT_EQ(j["steps"].size(), p.steps.size());
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const json& js = j["steps"][i];
    const Step& s = p.steps[i];
    EXPECT_EQ(js["op"], to_string(s.op));
    std::vector<std::string> axes;
    for (int a : s.axes) axes.push_back(mesh.axis(a).name);
    EXPECT_EQ(js["axes"].get<std::vector<std::string>>(), axes);
    EXPECT_EQ(js["tensor"], s.tensor);
    EXPECT_EQ(js["from"], format_spec(s.from, mesh));
    EXPECT_EQ(js["to"], format_spec(s.to, mesh));
    EXPECT_EQ(js["bytes_sent"].get<std::int64_t>(), s.bytes_sent);
    EXPECT_EQ(js["bytes_received"].get<std::int64_t>(), s.bytes_received);
    EXPECT_EQ(js["bytes_per_device"].get<std::int64_t>(), std::max(s.bytes_sent, s.bytes_received));
    EXPECT_DOUBLE_EQ(js["flops"].get<double>(), s.flops);
    EXPECT_DOUBLE_EQ(js["time_s"].get<double>(), s.time_s);
    if (multiplies(s.op)) {
      EXPECT_EQ(js["from_b"], format_spec(s.from_b, mesh));
    } else {
      EXPECT_TRUE(js["from_b"].is_null());
    }
    if (is_collective_matmul(s.op)) {
      const json& ring = js["ring"];
      EXPECT_EQ(ring["operand"],
                s.op == OpKind::all_gather_einsum ? json(s.ring_operand == 0 ? "a" : "b") : json(nullptr));
      EXPECT_EQ(ring["bidirectional"].get<bool>(), s.bidirectional);
      EXPECT_EQ(ring["contracted"].get<bool>(), gathers_contracted(s));
      EXPECT_EQ(ring["steps"].get<int>(), s.ring_steps);
      EXPECT_DOUBLE_EQ(ring["comm_time_s"].get<double>(), s.comm_time_s);
      EXPECT_DOUBLE_EQ(ring["compute_time_s"].get<double>(), s.compute_time_s);
      // `dim` names the ring's dimension: in the gathered operand, or in the output.
      const Spec& ringed = s.op == OpKind::einsum_reduce_scatter ? s.to : s.ring_operand == 1 ? s.from_b : s.from;
      EXPECT_EQ(js["dim"], ringed.dims.at(static_cast<std::size_t>(s.dim)).name);
    } else {
      EXPECT_TRUE(js["ring"].is_null());
    }
  }
}

// ---------------------------------------------------------------- top level

TEST(Cli, VersionAndHelp) {
  const Result v = run({"--version"});
  EXPECT_EQ(v.status, 0);
  EXPECT_THAT(v.out, StartsWith("shardmm "));

  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"check", "--help"}, {"plan", "--help"}, {"reshard", "--help"}, {"demo", "--help"}}) {
    SCOPED_TRACE(args.front());
    const Result r = run(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    // The notation in two lines, examples, where the docs are.
    EXPECT_THAT(r.out, HasSubstr("Notation: A[I_X, J_Y] shards I over mesh axis X"));
    EXPECT_THAT(r.out, HasSubstr("{U_X} marks partial sums"));
    EXPECT_THAT(r.out, HasSubstr("Examples:\n  shardmm "));
    EXPECT_THAT(r.out, HasSubstr("docs/cli.md"));
    // Every flag (other than --help/--version) comes with an example.
    for (const std::string& line : lines(r.out)) {
      if (line.rfind("  --", 0) == 0 && line.find("--version") == std::string::npos) {
        EXPECT_THAT(line, HasSubstr("e.g. --")) << line;
      }
    }
  }
}

// Every "$ shardmm ..." example in a help text that runs under mpirun gives the flags it needs
// there: bench matmul refuses ranks bound to one core each, Open MPI's default for two.
TEST(Cli, HelpRunsMatmulBenchUnderMpirunUnbound) {
  const Result r = run({"bench", "matmul", "--help"});
  ASSERT_EQ(r.status, 0);
  int examples = 0;
  for (const std::string& line : lines(r.out)) {
    if (line.find("mpirun ") == std::string::npos || line.find("shardmm bench matmul") == std::string::npos) continue;
    ++examples;
    EXPECT_THAT(line, HasSubstr("mpirun --bind-to none ")) << line;
  }
  EXPECT_EQ(examples, 1) << r.out;
}

// ---------------------------------------------------------------- check

TEST(CliCheck, CanonicalForm) {
  const Result r = run({"check", "A[IX, JY]", "--mesh", "X=4,Y=2"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, StartsWith("valid: A[I_X, J_Y]\n"));
  EXPECT_THAT(r.out, HasSubstr("8 devices"));

  const json j = parse_stdout(run({"check", "A[I_{XY}, J]{U_Z}", "--mesh", "X=2,Y=2,Z=2", "--json"}));
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["spec"], "A[I_XY, J]{U_Z}");
  EXPECT_EQ(j["mesh"], (json{{"X", 2}, {"Y", 2}, {"Z", 2}}));
  EXPECT_EQ(j["unreduced"], json::array({"Z"}));
  EXPECT_EQ(j["dimensions"][0]["axes"], json::array({"X", "Y"}));
  EXPECT_EQ(j["dimensions"][0]["blocks"], 4);
  EXPECT_TRUE(j["shards"].is_null());
}

// The nested uneven split of core/geometry.h, by hand: 10 over X=3 is 4,3,3; each piece
// over Y=2 is 2,2 | 2,1 | 2,1.
TEST(CliCheck, NestedUnevenBlocksAndBytes) {
  const json j =
      parse_stdout(run({"check", "A[I_XY, J]", "--mesh", "X=3,Y=2", "--dims", "I=10,J=4", "--dtype", "f32", "--json"}));
  const std::vector<std::pair<int, int>> rows{{0, 2}, {2, 4}, {4, 6}, {6, 7}, {7, 9}, {9, 10}};
  ASSERT_EQ(j["shards"].size(), 6u);
  for (std::size_t d = 0; d < 6; ++d) {
    const json& s = j["shards"][d];
    EXPECT_EQ(s["device"], d);
    EXPECT_EQ(s["coords"], (json{{"X", d / 2}, {"Y", d % 2}}));
    EXPECT_EQ(s["block"], json::array({json::array({rows[d].first, rows[d].second}), json::array({0, 4})}));
    const int extent = rows[d].second - rows[d].first;
    EXPECT_EQ(s["local_shape"], json::array({extent, 4}));
    EXPECT_EQ(s["bytes"], extent * 4 * 4);  // f32
  }
  EXPECT_EQ(j["global_shape"], json::array({10, 4}));
  EXPECT_EQ(j["global_bytes"], 10 * 4 * 4);
  EXPECT_EQ(j["max_bytes_per_device"], 2 * 4 * 4);

  const Result text = run({"check", "A[I_XY, J]", "--mesh", "X=3,Y=2", "--dims", "I=10,J=4"});
  EXPECT_EQ(text.status, 0);
  EXPECT_THAT(text.out, HasSubstr("I[6:7) J[0:4)"));
  EXPECT_THAT(text.out, HasSubstr("[1, 4]"));
  EXPECT_THAT(text.out, HasSubstr("8 B"));  // 1 x 4 bf16
}

TEST(CliCheck, ManyDevicesAreSummarized) {
  const Result r = run({"check", "A[I_X, J_Y]", "--mesh", "X=64,Y=128", "--dims", "I=8192,J=4096"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("[128, 32]"));  // 8192/64, 4096/128
  EXPECT_THAT(r.out, HasSubstr("8192"));       // devices with that shape
  EXPECT_LT(lines(r.out).size(), 30u);
  // JSON lists each device up to 4,096 of them; beyond, only the distinct local shapes.
  const json small =
      parse_stdout(run({"check", "A[I_X, J_Y]", "--mesh", "X=64,Y=64", "--dims", "I=100,J=64", "--json"}));
  EXPECT_EQ(small["shards"].size(), 4096u);
  const json big =
      parse_stdout(run({"check", "A[I_X, J_Y]", "--mesh", "X=64,Y=128", "--dims", "I=100,J=4096", "--json"}));
  EXPECT_TRUE(big["shards"].is_null());
  // I=100 over 64: 36 blocks of 2 rows and 28 of 1; J=4096 over 128: 32 columns each.
  EXPECT_EQ(big["local_shapes"], (json{{{"local_shape", {1, 32}}, {"devices", 28 * 128}, {"bytes", 1 * 32 * 2}},
                                       {{"local_shape", {2, 32}}, {"devices", 36 * 128}, {"bytes", 2 * 32 * 2}}}));
}

// ---------------------------------------------------------------- plan

// The seeds' case 3: a single all_reduce after the einsum.
TEST(CliPlan, Case3JsonIsTheLibrarysPlan) {
  const std::string expr = "A[I, J_X] @ B[J_X, K] -> C[I, K]";
  const json j = parse_stdout(run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--json"}));
  const Mesh mesh = Mesh::parse("X=4");
  const MatmulPlanning m = library_plan(expr, "X=4", kDims, v5e());

  EXPECT_EQ(j["expr"], expr);
  EXPECT_EQ(j["mesh"], (json{{"X", 4}}));
  EXPECT_EQ(j["dims"], (json{{"I", 8192}, {"J", 4096}, {"K", 16384}}));
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["hardware"], "tpu-v5e");
  EXPECT_TRUE(j["mem_limit_bytes"].is_null());
  EXPECT_EQ(j["roles"], (json{{"I", "free"}, {"J", "contracted"}, {"K", "free"}}));
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["axis"], "X");
  EXPECT_EQ(j["cases"][0]["case"], 3);
  EXPECT_EQ(j["cases"][0]["reason"], m.cases[0].reason);

  ASSERT_EQ(j["candidates"].size(), m.candidates.size());
  ASSERT_EQ(j["chosen"], m.chosen);
  for (std::size_t i = 0; i < m.candidates.size(); ++i) expect_same_plan(j["candidates"][i], m.candidates[i], mesh);

  const json& chosen = j["candidates"][j["chosen"].get<std::size_t>()];
  ASSERT_EQ(chosen["steps"].size(), 2u);
  EXPECT_EQ(chosen["steps"][0]["op"], "einsum");
  EXPECT_EQ(chosen["steps"][0]["to"], "C[I, K]{U_X}");
  EXPECT_EQ(chosen["steps"][1]["op"], "all_reduce");
  EXPECT_EQ(chosen["steps"][1]["axes"], json::array({"X"}));
  // all_reduce = reduce_scatter + all_gather: each device sends 2 (n-1)/n of C (bf16).
  EXPECT_EQ(chosen["steps"][1]["bytes_sent"], 2 * 3 * (8192LL * 16384 / 4) * 2);
  // Local FLOPs: 2 I J K / 4.
  EXPECT_DOUBLE_EQ(chosen["steps"][0]["flops"].get<double>(), 2.0 * 8192 * 4096 * 16384 / 4);
  EXPECT_EQ(chosen["output"], "C[I, K]");
}

// The keys of the first table after the line of docs/json-schema.md that starts with
// `heading`, in order ("| `a`, `b` |" names two).
std::vector<std::string> documented_keys(const std::string& heading) {
  std::ifstream in(shardmm::testing::repo_dir() + "/docs/json-schema.md");
  EXPECT_TRUE(in);
  std::vector<std::string> keys;
  bool found = false;
  for (std::string line; std::getline(in, line);) {
    if (!found) {
      found = line.rfind(heading, 0) == 0;
      continue;
    }
    if (line.rfind("| `", 0) == 0) {
      const std::string cell = line.substr(2, line.find(" |", 2) - 2);
      for (std::size_t at = cell.find('`'); at != std::string::npos; at = cell.find('`', cell.find('`', at + 1) + 1)) {
        keys.push_back(cell.substr(at + 1, cell.find('`', at + 1) - at - 1));
      }
    } else if (!keys.empty()) {
      break;
    }
  }
  EXPECT_TRUE(found) << heading;
  return keys;
}

// The keys in the order the command wrote them (json sorts them).
using ordered = nlohmann::ordered_json;

std::vector<std::string> keys_of(const ordered& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

// Every document has the keys json-schema.md lists, in its order (null where one does not
// apply): a step's `ring` last, as it was added; reshard the plan's keys but roles, cases and
// every_output_layout (its output is always given).
TEST(CliJson, KeysAreTheDocumentedOnesInTheirOrder) {
  const auto document = [](const std::vector<std::string>& args) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return ordered::parse(r.out);
  };
  const ordered plan =
      document({"plan", "A[I_X, J] @ B[J, K_X] -> C[I_X, K]", "--mesh", "X=4", "--dims", kDims, "--json"});
  EXPECT_EQ(keys_of(plan), documented_keys("## `shardmm plan --json`"));
  const ordered& chosen = plan["candidates"][plan["chosen"].get<std::size_t>()];
  EXPECT_EQ(keys_of(chosen), documented_keys("**candidate**"));
  EXPECT_EQ(keys_of(chosen["steps"][0]), documented_keys("**step**"));
  EXPECT_FALSE(chosen["steps"][0]["ring"].is_null()) << "a collective matmul's step";
  const ordered reshard =
      document({"reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=4", "--dims", "I=8,J=4", "--json"});
  std::vector<std::string> expected = documented_keys("## `shardmm plan --json`");
  std::erase_if(expected, [](const std::string& k) {
    return k == "roles" || k == "cases" || k == "near_tie" || k == "every_output_layout";
  });
  EXPECT_EQ(keys_of(reshard), expected);
  EXPECT_EQ(reshard["tie_margin"], 0);
  const std::vector<std::string> model{"model", "mlp",    "--strategy",      "tp",    "--mesh",
                                       "X=2",   "--dims", "B=2,T=2,D=4,F=4", "--json"};
  std::vector<std::string> with_run = model;
  with_run.insert(with_run.end(), {"--run", "--dtype", "f64"});
  for (const auto& args : {model, with_run}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const ordered doc = document(args);
    EXPECT_EQ(keys_of(doc), documented_keys("## `shardmm model --json`"));
    EXPECT_EQ(doc["run"].is_null(), args == model);
    for (const ordered& c : doc["collectives"]) {
      EXPECT_EQ(keys_of(c), (std::vector<std::string>{"phase", "op", "axes", "predicted", "measured"}));
      EXPECT_EQ(c["measured"].is_null(), args == model);
    }
  }
}

TEST(CliPlan, Case3Text) {
  const Result r = run({"plan", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=4", "--dims", kDims});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("expr      A[I, J_X] @ B[J_X, K] -> C[I, K]"));
  EXPECT_THAT(r.out, HasSubstr("mesh      X=4 (4 devices)"));
  EXPECT_THAT(r.out, HasSubstr("hardware  tpu-v5e (built-in, the default"));
  EXPECT_THAT(r.out, HasSubstr("dtype     bf16 (2 B per element; the default"));
  EXPECT_THAT(r.out, HasSubstr("J    contracted"));
  EXPECT_THAT(r.out, HasSubstr("X  case 3"));
  EXPECT_THAT(r.out, HasSubstr("Chosen plan (candidate 1 of 2, the cheapest): local einsum, then all_reduce C over X"));
  EXPECT_THAT(r.out, HasSubstr("all_reduce  X     C       C[I, K]{U_X} -> C[I, K]"));
  EXPECT_THAT(r.out, HasSubstr("384 MiB"));    // 402653184 B sent per device
  EXPECT_THAT(r.out, HasSubstr("275 GFLOP"));  // 2 I J K / 4
  EXPECT_THAT(r.out, HasSubstr("communication-bound"));
  EXPECT_THAT(r.out, HasSubstr("with perfect overlap"));
  EXPECT_THAT(r.out, HasSubstr("peak "));
  EXPECT_THAT(r.out, HasSubstr("Alternatives (1"));
}

// The Scaling Book's rule, per step: the same all_reduce is latency-bound at a few hundred
// bytes per device and bandwidth-bound at hundreds of megabytes, in the text and the JSON.
TEST(CliPlan, EachStepSaysWhetherLatencyOrBandwidthBoundsIt) {
  const std::vector<std::string> base = {"plan", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=4", "--dims"};
  for (const auto& [dims, einsum, all_reduce] :
       {std::tuple{std::string("I=8,J=512,K=8"), "memory", "latency"}, std::tuple{kDims, "compute", "bandwidth"}}) {
    std::vector<std::string> args = base;
    args.push_back(dims);
    const Result text = run(args);
    EXPECT_THAT(text.out, HasSubstr("time  bound")) << dims;
    EXPECT_THAT(text.out, HasSubstr(std::string("  ") + all_reduce + "\n")) << dims;
    EXPECT_THAT(text.out, HasSubstr("bound: what sets the time"));
    args.push_back("--json");
    const json doc = parse_stdout(run(args));
    const json& steps = doc["candidates"][doc["chosen"].get<std::size_t>()]["steps"];
    ASSERT_EQ(steps.size(), 2u) << dims;
    EXPECT_EQ(steps[0]["bound"], einsum) << dims;
    EXPECT_EQ(steps[1]["op"], "all_reduce");
    EXPECT_EQ(steps[1]["bound"], all_reduce) << dims;
  }
}

// The seeds' four cases, per axis, as the library judges them and as the seeds state them.
TEST(CliPlan, FourCases) {
  struct Case {
    std::string expr, mesh;
    std::vector<int> cases;
  };
  const std::vector<Case> all{
      {"A[I_X, J] @ B[J, K_Y] -> C[I_X, K_Y]", "X=4,Y=2", {1, 1}},
      {"A[I, J_X] @ B[J, K] -> C[I, K]", "X=4", {2}},
      {"A[I, J_X] @ B[J_X, K] -> C[I, K]", "X=4", {3}},
      {"A[I_X, J] @ B[J, K_X]", "X=4", {4}},
  };
  for (const Case& c : all) {
    SCOPED_TRACE(c.expr);
    const json j = parse_stdout(run({"plan", c.expr, "--mesh", c.mesh, "--dims", kDims, "--json"}));
    const MatmulPlanning m = library_plan(c.expr, c.mesh, kDims, v5e());
    ASSERT_EQ(j["cases"].size(), c.cases.size());
    for (std::size_t i = 0; i < c.cases.size(); ++i) {
      EXPECT_EQ(j["cases"][i]["case"], c.cases[i]);
      EXPECT_EQ(j["cases"][i]["case"], m.cases[i].case_number);
    }
    ASSERT_EQ(j["candidates"].size(), m.candidates.size());
    EXPECT_EQ(j["chosen"], m.chosen);
    const Mesh mesh = Mesh::parse(c.mesh);
    expect_same_plan(j["candidates"][j["chosen"].get<std::size_t>()], m.candidates[static_cast<std::size_t>(m.chosen)],
                     mesh);
  }
  // Case 1: the chosen plan is the local einsum alone, moving nothing.
  const json one = parse_stdout(run({"plan", all[0].expr, "--mesh", all[0].mesh, "--dims", kDims, "--json"}));
  const json& steps = one["candidates"][one["chosen"].get<std::size_t>()]["steps"];
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0]["op"], "einsum");
  EXPECT_EQ(steps[0]["bytes_per_device"], 0);
}

// 1-D pdgemm: B's contracted J gathered round a ring, each panel added into C; the JSON says
// which rings do that (`ring.contracted`) and the text says where the products go.
TEST(CliPlan, RingOverAContractedDimension) {
  const std::string expr = "A[I_X, J] @ B[J_X, K] -> C[I_X, K]";
  const Mesh mesh = Mesh::parse("X=4");
  const json j = parse_stdout(
      run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--hw", "tpu-v5e", "--dtype", "bf16", "--all", "--json"}));
  const MatmulPlanning m = library_plan(expr, "X=4", kDims, v5e());
  ASSERT_EQ(j["candidates"].size(), m.candidates.size());
  int contracted = 0;
  for (std::size_t i = 0; i < m.candidates.size(); ++i) {
    expect_same_plan(j["candidates"][i], m.candidates[i], mesh);
    for (const json& step : j["candidates"][i]["steps"]) {
      contracted += !step["ring"].is_null() && step["ring"]["contracted"].get<bool>();
    }
  }
  EXPECT_EQ(contracted, 2) << "one way and both ways round";
  const std::string text =
      run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--hw", "tpu-v5e", "--dtype", "bf16", "--all"}).out;
  EXPECT_THAT(words(text),
              HasSubstr("multiplying each block by A's matching block of J and adding the product into all of C"))
      << text;
}

// A ring over a free dimension fills the part of C that dimension indexes: gathering A's
// I-blocks fills I-rows of C, gathering B's K-blocks fills K-columns (not "rows" for both).
TEST(CliPlan, RingOverAFreeDimensionNamesTheRowsOrColumnsItFills) {
  const std::string text = run({"plan", "A[I_X, J] @ B[J, K_X] -> C[I_X, K]", "--mesh", "X=4", "--dims", kDims, "--hw",
                                "tpu-v5e", "--dtype", "bf16", "--all"})
                               .out;
  const std::string flat = words(text);
  EXPECT_THAT(flat, HasSubstr("all_gather B's X-blocks of K round a bidirectional ring of 3 steps, multiplying each "
                              "block into the K-columns of C it covers"))
      << text;
  EXPECT_THAT(flat, HasSubstr("all_gather A's X-blocks of I round a bidirectional ring of 3 steps, multiplying each "
                              "block into the I-rows of C it covers"))
      << text;
  EXPECT_THAT(flat, Not(HasSubstr("its rows of"))) << text;
}

TEST(CliPlan, OtherHardwareAndDtype) {
  const std::string expr = "A[I, J_X] @ B[J_X, K] -> C[I, K]";
  const json j =
      parse_stdout(run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--hw", "h100", "--dtype", "f32", "--json"}));
  EXPECT_EQ(j["hardware"], "h100");
  EXPECT_EQ(j["dtype"], "f32");
  const MatmulPlanning m =
      library_plan(expr, "X=4", kDims, PlanOptions{DType::f32, builtin_profile("h100"), std::nullopt});
  ASSERT_EQ(j["candidates"].size(), m.candidates.size());
  for (std::size_t i = 0; i < m.candidates.size(); ++i) {
    expect_same_plan(j["candidates"][i], m.candidates[i], Mesh::parse("X=4"));
  }

  // A profile file: the same numbers as a built-in, under another name.
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "shardmm_cli_test_profile.json";
  {
    std::ofstream out(file);
    out << R"({"name": "my-chip", "peak_flops": {"bf16": 1e14}, "hbm_bandwidth": 1e12,
              "link_bandwidth": 1e11, "bidirectional": true, "hop_latency_s": 1e-6, "topology": "torus"})";
  }
  const Result text = run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--hw", file.string()});
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("hardware  my-chip (from " + file.string() + ")"));
  EXPECT_THAT(text.out, HasSubstr("peak 100 TFLOP/s bf16; HBM 1.00 TB/s; links 100 GB/s each way"));
  std::filesystem::remove(file);
}

TEST(CliPlan, MemoryLimit) {
  // Case 3 onto a sharded C: the bidirectional ring is the cheapest but holds four running sums
  // per way round; the one-way ring is a little slower (beyond the near-tie margin) and smaller.
  const std::string expr = "A[I, J_X] @ B[J_X, K] -> C[I_X, K]";
  const std::string kDims = "I=8192,J=16384,K=4096";
  const MatmulPlanning free = library_plan(expr, "X=4", kDims, v5e());
  ASSERT_GE(free.candidates.size(), 2u);
  std::int64_t smallest = free.candidates[0].peak_bytes_per_device;
  for (const Plan& p : free.candidates) smallest = std::min(smallest, p.peak_bytes_per_device);

  // A limit just under the cheapest plan's peak: the CLI picks what the library picks.
  const std::int64_t limit = free.candidates[0].peak_bytes_per_device - 1;
  PlanOptions limited = v5e();
  limited.mem_limit_bytes = limit;
  const MatmulPlanning m = library_plan(expr, "X=4", kDims, limited);
  ASSERT_GE(m.chosen, 1);
  const json j = parse_stdout(
      run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--mem-limit", std::to_string(limit), "--json"}));
  EXPECT_EQ(j["mem_limit_bytes"], limit);
  EXPECT_EQ(j["chosen"], m.chosen);
  EXPECT_FALSE(j["candidates"][0]["fits_memory"].get<bool>());
  for (std::size_t i = 0; i < m.candidates.size(); ++i) {
    EXPECT_EQ(j["candidates"][i]["fits_memory"], m.candidates[i].fits_memory);
  }
  const Result text = run({"plan", expr, "--mesh", "X=4", "--dims", kDims, "--mem-limit", std::to_string(limit)});
  EXPECT_THAT(text.out, HasSubstr("Chosen plan (candidate " + std::to_string(m.chosen + 1) + " of " +
                                  std::to_string(m.candidates.size()) + ", the cheapest within the memory limit)"));
  EXPECT_THAT(text.out, HasSubstr("[over the memory limit]"));

  // Nothing fits: exit 2, one line naming the smallest peak and the limit.
  const std::string too_small = std::to_string(smallest - 1);
  for (bool as_json : {false, true}) {
    std::vector<std::string> args{"plan", expr, "--mesh", "X=4", "--dims", kDims, "--mem-limit", too_small};
    if (as_json) args.push_back("--json");
    const Result r = run(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(lines(r.err).size(), 1u) << r.err;
    EXPECT_THAT(r.err, StartsWith("shardmm: error: no plan fits --mem-limit"));
    EXPECT_THAT(r.err, HasSubstr("(" + too_small + " B)"));
    EXPECT_THAT(r.err, HasSubstr("(" + std::to_string(smallest) + " B)"));
  }
}

// Issue 29, item 7: a run was refused under a limit its plan's printed peak fit (the executor
// holds every step's buffers, staging and ring buffers for the whole run). The peak is now
// what the executor holds: the run fits a limit of exactly the peak, and one byte less is
// refused naming that figure. The cheapest plan, a ring and an exchange where offered.
TEST(CliRun, APlanRunsUnderALimitOfItsPeakAndIsRefusedOneByteBelow) {
  const std::vector<std::array<std::string, 3>> cases{
      {"A[I_X, J] @ B[J, K_X]", "X=2", "I=64,J=64,K=64"},
      {"A[I_X, J] @ B[J, K_X] -> C[I_X, K]", "X=4", "I=64,J=96,K=64"},
      {"A[I, J_X] @ B[J_X, K]", "X=4", "I=64,J=64,K=64"},
      {"A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_Y, K_X]", "X=2,Y=2", "I=64,J=32,K=48"},
  };
  int rings = 0, exchanges = 0;
  for (const auto& [expr, mesh, dims] : cases) {
    const std::vector<std::string> planning{expr, "--mesh", mesh, "--dims", dims, "--dtype", "f32", "--hw", "h100"};
    std::vector<std::string> args{"plan"};
    args.insert(args.end(), planning.begin(), planning.end());
    args.push_back("--json");
    const json plan = parse_stdout(run(args));
    std::vector<std::size_t> picked{plan["chosen"].get<std::size_t>()};
    for (const std::string op : {"all_gather_einsum", "einsum_reduce_scatter", "exchange"}) {
      for (std::size_t i = 0; i < plan["candidates"].size(); ++i) {
        const json& steps = plan["candidates"][i]["steps"];
        if (std::any_of(steps.begin(), steps.end(), [&](const json& s) { return s["op"] == op; })) {
          picked.push_back(i);
          (op == "exchange" ? exchanges : rings) += 1;
          break;
        }
      }
    }
    for (std::size_t i : picked) {
      const std::int64_t peak = plan["candidates"][i]["peak_bytes_per_device"].get<std::int64_t>();
      SCOPED_TRACE(expr + " on " + mesh + ", candidate " + std::to_string(i + 1) + ", peak " + std::to_string(peak));
      for (const std::int64_t limit : {peak, peak - 1}) {
        std::vector<std::string> run_args{"run"};
        run_args.insert(run_args.end(), planning.begin(), planning.end());
        run_args.insert(run_args.end(), {"--candidate", std::to_string(i + 1), "--mem-limit", std::to_string(limit),
                                         "--repeat", "1", "--warmup", "0"});
        const Result r = run(run_args);
        if (limit == peak) {
          EXPECT_EQ(r.status, 0) << r.err;
          EXPECT_THAT(r.out, HasSubstr("verified"));
        } else {
          EXPECT_EQ(r.status, 2) << r.out;
          EXPECT_THAT(r.err, HasSubstr("(" + std::to_string(peak) + " B)"));
          EXPECT_EQ(lines(r.err).size(), 1u) << r.err;
        }
      }
    }
  }
  EXPECT_GT(rings, 0);
  EXPECT_GT(exchanges, 0);
}

TEST(CliPlan, MemoryLimitForms) {
  const std::vector<std::pair<std::string, std::int64_t>> forms{
      {"16GiB", 16LL << 30},  {"512MiB", 512LL << 20}, {"1e9", 1000000000}, {"1.5GB", 1500000000}, {"2 KiB", 2048},
      {"3TB", 3000000000000}, {"1TiB", 1LL << 40},     {"300B", 300},       {"7KB", 7000},         {"2MB", 2000000},
  };
  for (const auto& [text, bytes] : forms) {
    SCOPED_TRACE(text);
    const Result r =
        run({"reshard", "A[I_X]", "A[I]", "--mesh", "X=2", "--dims", "I=4", "--mem-limit", text, "--json"});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["mem_limit_bytes"], bytes);
  }
}

TEST(CliPlan, AllAndShow) {
  const std::string expr = "A[I_X, J] @ B[J, K_X]";
  const MatmulPlanning m = library_plan(expr, "X=4", "I=8,J=4,K=16", v5e());
  const Result r = run({"plan", expr, "--mesh", "X=4", "--dims", "I=8,J=4,K=16", "--all", "--show"});
  EXPECT_EQ(r.status, 0) << r.err;
  for (std::size_t i = 0; i < m.candidates.size(); ++i) {
    if (static_cast<int>(i) == m.chosen) continue;
    EXPECT_THAT(r.out, HasSubstr("Candidate " + std::to_string(i + 1) + " of " + std::to_string(m.candidates.size()) +
                                 ": " + m.candidates[i].description));
  }
  // Each device's block: A's I over X is 2 rows per device.
  EXPECT_THAT(r.out, HasSubstr("X=0  0 I[0:2) J[0:4)"));
  EXPECT_THAT(r.out, HasSubstr("X=3  3 I[6:8) J[0:4)"));
  EXPECT_THAT(r.out, HasSubstr("X=2  2 J[0:4) K[8:12)"));
}

TEST(CliPlan, ShowOnThreeAxesAndManyDevices) {
  const Result r = run({"reshard", "A[I_X, J_Y]", "A[I_Z, J]", "--mesh", "X=2,Y=2,Z=2", "--dims", "I=8,J=4", "--show"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Z=0:"));
  EXPECT_THAT(r.out, HasSubstr("Z=1:"));
  // Device 7 = (x 1, y 1, z 1): before I[4:8) J[2:4), after I[4:8) J[0:4).
  EXPECT_THAT(r.out, HasSubstr("7 I[4:8) J[2:4)"));
  EXPECT_THAT(r.out, HasSubstr("7 I[4:8) J[0:4)"));

  const Result big =
      run({"reshard", "A[I_X, J_Y]", "A[I_XY, J]", "--mesh", "X=8,Y=8", "--dims", "I=8192,J=4096", "--show"});
  EXPECT_EQ(big.status, 0) << big.err;
  EXPECT_THAT(big.out, HasSubstr("64 devices: too many to draw"));
  EXPECT_THAT(big.out, HasSubstr("I: 64 blocks over XY"));
}

// ---------------------------------------------------------------- reshard

TEST(CliReshard, AllToAll) {
  const json j =
      parse_stdout(run({"reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=4", "--dims", "I=8192,J=4096", "--json"}));
  EXPECT_EQ(j["expr"], "A[I, J_X] -> A[I_X, J]");
  EXPECT_FALSE(j.contains("cases"));
  const Mesh mesh = Mesh::parse("X=4");
  const Plan p = plan_reshard(mesh, parse_spec("A[I, J_X]", mesh), parse_spec("A[I_X, J]", mesh), {8192, 4096}, v5e());
  ASSERT_EQ(j["candidates"].size(), 1u);
  EXPECT_EQ(j["chosen"], 0);
  expect_same_plan(j["candidates"][0], p, mesh);
  const json& step = j["candidates"][0]["steps"][0];
  EXPECT_EQ(step["op"], "all_to_all");
  EXPECT_EQ(step["dim"], "J");
  EXPECT_EQ(step["dst_dim"], "I");
  // A device keeps the quarter of its block it still owns and sends the other three.
  EXPECT_EQ(step["bytes_sent"], 3 * 2048 * 1024 * 2);

  const Result text = run({"reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=4", "--dims", "I=8192,J=4096"});
  EXPECT_EQ(text.status, 0);
  EXPECT_THAT(text.out, HasSubstr("Plan: all_to_all over X"));
  EXPECT_THAT(text.out, HasSubstr("12.0 MiB"));
  EXPECT_THAT(text.out, HasSubstr("µs"));
}

// A step over axes of one device moves nothing, and the explanation says so instead of
// describing a gather.
TEST(CliReshard, OneDeviceAxisOnlyRenames) {
  const Result text = run({"reshard", "A[I_X, J_Y]", "A[I, J_Y]", "--mesh", "X=1,Y=2", "--dims", "I=64,J=64"});
  EXPECT_EQ(text.status, 0);
  EXPECT_THAT(text.out, HasSubstr("X spans one device, so nothing moves or changes: A[I_X, J_Y] and A[I, J_Y]"));
  EXPECT_THAT(text.out, HasSubstr("same data, renamed"));
  EXPECT_THAT(text.out, Not(HasSubstr("onto every device")));
}

// ---------------------------------------------------------------- demo

TEST(CliDemo, ExplainsTheFourCases) {
  const Result r = run({"demo"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* s : {"1. Case 1:", "2. Case 2:", "3. Case 3:", "4. Case 4:", "情形一", "情形二", "情形三", "情形四",
                        "Megatron column", "Megatron row", "AllToAll", "X  case 1", "X  case 2", "X  case 3",
                        "X  case 4", "then all_reduce C over X", "Plan: all_to_all over X",
                        "$ shardmm plan 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=8192,J=4096,K=16384"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
}

// The demo names its source, the Scaling Book, and never "the seeds" (a word for this
// project's notes that a user has never seen); each rule's one-line form reads "in short".
TEST(CliDemo, NamesTheScalingBook) {
  const Result r = run({"demo"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("shardmm demo: the Scaling Book's four cases of a sharded matmul"));
  EXPECT_THAT(r.out, HasSubstr("\n   in short: 情形一"));
  std::string lower = r.out + run({"demo", "--help"}).out;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  EXPECT_THAT(lower, Not(HasSubstr("seed")));
}

// ---------------------------------------------------------------- bad input

TEST(CliErrors, OneLineAndExit2) {
  const std::string expr = "A[I, J_X] @ B[J_X, K]";
  const std::vector<std::string> ok{"--mesh", "X=4", "--dims", "I=8,J=4,K=2"};
  const auto plan = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"plan", expr};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = plan(ok);
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::filesystem::path bad_json = std::filesystem::temp_directory_path() / "shardmm_cli_test_bad.json";
  const std::filesystem::path no_key = std::filesystem::temp_directory_path() / "shardmm_cli_test_nokey.json";
  std::ofstream(bad_json) << "{\"name\": \"x\",\n \"peak_flops\": {bf16: 1}}";
  std::ofstream(no_key) << R"({"name": "x", "peak_flops": {"bf16": 1e14}})";

  expect_input_error({}, "no command given");
  expect_input_error({"frobnicate"}, "unknown command 'frobnicate'");
  expect_input_error({"plan"}, "EXPR is required");
  expect_input_error(plan({"--dims", "I=8,J=4,K=2"}), "--mesh is required");
  expect_input_error(plan({"--mesh", "X=4"}), "--dims is required");
  expect_input_error(with({"--bogus"}), "--bogus");
  expect_input_error({"check"}, "SPEC is required");
  expect_input_error({"reshard", "A[I]", "--mesh", "X=2", "--dims", "I=4"}, "DST is required");
  expect_input_error({"demo", "--bogus"}, "--bogus");
  expect_input_error(plan({"--mesh", "X=0", "--dims", "I=8,J=4,K=2"}), "bad mesh 'X=0'");
  expect_input_error(plan({"--mesh", "X4", "--dims", "I=8,J=4,K=2"}), "has no '='");
  expect_input_error(plan({"--mesh", "X=4,X=2", "--dims", "I=8,J=4,K=2"}), "declared twice");
  expect_input_error(plan({"--mesh", "X=4", "--dims", "I=8,J=x,K=2"}), "bad dims 'I=8,J=x,K=2'");
  expect_input_error(plan({"--mesh", "X=4", "--dims", ""}), "empty --dims");
  expect_input_error(plan({"--mesh", "X=4096,Y=4097", "--dims", "I=8,J=4,K=2"}), "up to 16777216 devices");
  expect_input_error(plan({"--mesh", "X=4", "--dims", "I=3037000499,J=3037000499,K=2"}),
                     "tensor A has more bytes than a signed 64-bit count holds");
  expect_input_error(plan({"--mesh", "X=4", "--dims", "I=8,J=4"}), "'K' of B has no size");
  expect_input_error(plan({"--mesh", "X=4", "--dims", "I=8,J=4,K=2,L=3"}), "'L'");
  expect_input_error(with({"--dtype", "f8"}), "unknown dtype 'f8'");
  expect_input_error(with({"--dtype", "f16"}), "no peak FLOP/s for f16");
  expect_input_error(with({"--hw", "tpu-v9"}), "unknown hardware profile 'tpu-v9'");
  expect_input_error(with({"--hw", bad_json.string()}), "malformed JSON");
  expect_input_error(with({"--hw", no_key.string()}), "missing key");
  expect_input_error(with({"--mem-limit", "16Gx"}), "unknown unit 'Gx'");
  expect_input_error(with({"--mem-limit", "0"}), "at least 1 byte");
  expect_input_error(with({"--mem-limit", "-1GiB"}), "must be positive");
  expect_input_error(with({"--mem-limit", "GiB"}), "no number");
  expect_input_error(with({"--mem-limit", "1e99"}), "64-bit");
  expect_input_error(with({"--mem-limit", "1MiB", "--mem-limit", "2MiB"}), "--mem-limit");
  expect_input_error({"plan", "A[I_X, J_X] @ B[J_X, K]", "--mesh", "X=4", "--dims", "I=8,J=4,K=2"},
                     "a mesh axis can shard only one dimension");
  expect_input_error({"plan", "A[I, J_Q] @ B[J, K]", "--mesh", "X=4", "--dims", "I=8,J=4,K=2"},
                     "unknown mesh axis 'Q'");
  expect_input_error({"plan", "A[I, J] B[J, K]", "--mesh", "X=4", "--dims", "I=8,J=4,K=2"}, "no '@'");
  expect_input_error({"check", "A[I_X", "--mesh", "X=4"}, "never closed");
  expect_input_error({"reshard", "A[I, J_X]", "A[J, I]", "--mesh", "X=4", "--dims", "I=8,J=4"}, "cannot reshard");
  // --json changes nothing about errors: stdout stays empty.
  expect_input_error({"plan", expr, "--mesh", "X=0", "--dims", "I=8,J=4,K=2", "--json"}, "bad mesh");
  expect_input_error({"check", "A[I_X, J_X]", "--mesh", "X=4", "--json"}, "a mesh axis can shard only one dimension");

  std::filesystem::remove(bad_json);
  std::filesystem::remove(no_key);
}

TEST(CliErrors, CaretUnderTheCulprit) {
  const Result r =
      run({"plan", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=4", "--dims", "I=8,J=4,K=2", "--mem-limit", "16Gx"});
  const std::vector<std::string> err = lines(r.err);
  ASSERT_EQ(err.size(), 3u) << r.err;
  EXPECT_EQ(err[1], "  16Gx");
  EXPECT_EQ(err[2], "    ^^");
}

}  // namespace
}  // namespace shardmm

namespace shardmm {
namespace {

TEST(CliRun, VerifiesAndReportsTheTrace) {
  const Result r = run({"run", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]", "--mesh", "X=4", "--dims", "I=37,J=64,K=9",
                        "--repeat", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["verified"], true);
  EXPECT_EQ(doc["backend"], "threads");
  EXPECT_EQ(doc["ranks"], 4);
  EXPECT_EQ(doc["repeat_times_s"].size(), 3u);
  EXPECT_GT(doc["measured_time_s"].get<double>(), 0);
  EXPECT_LE(doc["max_abs_error"].get<double>(), doc["tolerance"].get<double>());
  // The executed plan's collectives, as the trace counts them, agree with the plan's steps.
  const json& plan = doc["candidates"][doc["executed"].get<std::size_t>()];
  std::map<std::string, std::pair<int, std::int64_t>> expected;
  for (const json& s : plan["steps"]) {
    EXPECT_TRUE(s.contains("measured_time_s"));
    EXPECT_EQ(s["measured_bytes_sent"], s["bytes_sent"]);
    if (s["op"] != "einsum" && s["op"] != "slice" && s["op"] != "to_partial") {
      expected[s["op"]].first++;
      expected[s["op"]].second += s["bytes_sent"].get<std::int64_t>();
    }
  }
  ASSERT_EQ(doc["trace"].size(), expected.size());
  for (const auto& [op, c] : expected) {
    EXPECT_EQ(doc["trace"][op]["count"], c.first) << op;
    EXPECT_EQ(doc["trace"][op]["bytes"], c.second) << op;
  }
}

// The verdict compares like with like: the largest absolute error against the absolute
// rule an element must meet (T + r x |expected|), the relative error apart, never the
// relative error against the absolute tolerance. JSON gives both parts of the rule.
// Under an address-space limit (ulimit -v) a mapping that fails inside OpenBLAS hangs it, and
// one that fails during verification lost its cause: the run is refused before it starts,
// with the figures. (Not under the sanitizers, whose runtimes map terabytes of shadow.)
TEST(CliRun, AnAddressSpaceLimitIsCheckedBeforeTheRun) {
  const std::vector<std::string> args = {"run",           "A[I, J_X] @ B[J_X, K] -> C[I, K]",
                                         "--mesh",        "X=2",
                                         "--dims",        "I=8192,J=256,K=8192",
                                         "--repeat",      "1",
                                         "--warmup",      "0",
                                         "--warmup-time", "0"};
  for (const rlim_t kib : {800000, 1000000, 1600000}) {
    SCOPED_TRACE("ulimit -v " + std::to_string(kib));
    const Result r = run(args, 60, kib * 1024);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("shardmm: error: the run maps 2.98 GiB in this process (2 ranks x (544 MiB + 200 MiB "
                                 "for BLAS's work buffer and the rank's stack) + 1.53 GiB to verify on device 0), but "
                                 "its address-space limit (ulimit -v) leaves "));
  }
  // With room, it runs and verifies.
  const Result r = run({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=64,J=64,K=64"}, 60,
                       rlim_t{1600000} * 1024);
  EXPECT_EQ(r.status, 0) << r.err;
}

// A watchdog that runs out (here set far too short for 8 ranks on 2 cores) ends the run on the
// threads backend as on mpi: exit 2 and the ranks that never came, not an internal error.
TEST(CliRun, AWatchdogTimeoutIsExitTwoNamingTheRanks) {
  const Result r = run({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=8", "--dims", "I=512,J=2048,K=512",
                        "--repeat", "3", "--warmup-time", "0", "--watchdog", "0.001"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("shardmm: error: collective timeout in group over X of device 0: rank "));
  EXPECT_THAT(r.err, HasSubstr("never arrived (watchdog 0.001 s;"));
  EXPECT_THAT(r.err, Not(HasSubstr("internal error")));
  const Result bad = run({"run", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8", "--watchdog", "0"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "shardmm: error: --watchdog 0: must be a positive number of seconds, e.g. --watchdog 30\n");
}

TEST(CliRun, VerificationStatesTheRuleItApplied) {
  const std::vector<std::string> args{"run",      "A[I, J_X] @ B[J_X, K] -> C[I_X, K]",
                                      "--mesh",   "X=4",
                                      "--dims",   "I=37,J=64,K=9",
                                      "--repeat", "1",
                                      "--dtype",  "f64"};
  const Result text = run(args);
  ASSERT_EQ(text.status, 0) << text.err;
  std::vector<std::string> with_json = args;
  with_json.push_back("--json");
  const Result r = run(with_json);
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  const double eps = std::ldexp(1.0, -53);
  EXPECT_DOUBLE_EQ(doc["rel_tolerance"].get<double>(), eps);
  EXPECT_GT(doc["tolerance"].get<double>(), 0);
  std::string verdict;
  for (const std::string& line : lines(text.out)) {
    if (line.rfind("  verified: ", 0) == 0) verdict = line;
  }
  EXPECT_THAT(verdict, ::testing::MatchesRegex("  verified: max abs error [0-9.e+-]+ \\(an element passes when its "
                                               "abs error <= [0-9.e+-]+ \\+ 1\\.11e-16 x \\|expected\\|\\); "
                                               "max rel error [0-9.e+-]+"))
      << text.out;
}

// Without a profile calibrated here, run predicts for the fallback hardware (h100) and says so:
// no measured/predicted ratio between two machines, and how to get this one's profile.
TEST(CliRun, AnotherMachinesPredictionIsNotComparedWithThisOnesRun) {
  const std::vector<std::string> args{
      "run", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2", "--dims", "I=8,J=8,K=8", "--repeat", "1", "--warmup-time", "0"};
  const Result text = run(args);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("predicted on h100  measured\n"));
  EXPECT_THAT(text.out, Not(HasSubstr("measured  measured/predicted")));  // the ratio column
  EXPECT_THAT(text.out, Not(HasSubstr("; measured/predicted")));          // the total's ratio
  EXPECT_THAT(text.out, HasSubstr("h100 is another machine's, so no measured/predicted here: `shardmm calibrate "
                                  "--quick` measures this one in seconds"));
  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  const Result as_json = run(json_args);
  ASSERT_EQ(as_json.status, 0) << as_json.err;
  const json doc = json::parse(as_json.out);
  EXPECT_FALSE(doc["predicted_for_this_machine"].get<bool>());
  EXPECT_TRUE(doc["measured_over_predicted"].is_null());
  for (const json& step : doc["candidates"][doc["executed"].get<std::size_t>()]["steps"]) {
    EXPECT_TRUE(step["measured_over_predicted"].is_null());
    EXPECT_GT(step["measured_time_s"].get<double>(), 0);
  }
}

// With more ranks than the machine has cores the ranks take turns, and the report says so
// (a collective's step time then includes a woken rank's wait for a core); with no more ranks
// than cores it says nothing.
TEST(CliRun, SaysWhenTheRanksTakeTurnsOnTheCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto run_on = [](int ranks, bool as_json) {
    std::vector<std::string> args{
        "run", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=" + std::to_string(ranks), "--dims", "I=8,J=8,K=8", "--repeat",
        "1",   "--warmup-time",         "0"};
    if (as_json) args.push_back("--json");
    return run(args);
  };
  const Result turns = run_on(cores + 1, false), turns_json = run_on(cores + 1, true);
  ASSERT_EQ(turns.status, 0) << turns.err;
  ASSERT_EQ(turns_json.status, 0) << turns_json.err;
  EXPECT_THAT(turns.out, HasSubstr("  shared    " + std::to_string(cores + 1) + " ranks take turns on this machine's " +
                                   std::to_string(cores) + " cores"));
  const json doc = json::parse(turns_json.out);
  EXPECT_EQ(doc["ranks_on_machine"], cores + 1);
  EXPECT_EQ(doc["cores"], cores);
  if (cores >= 2) {
    const Result own = run_on(2, false);
    ASSERT_EQ(own.status, 0) << own.err;
    EXPECT_THAT(own.out, HasSubstr("  total     measured"));
    EXPECT_THAT(own.out, Not(HasSubstr("take turns")));
  }
}

// Progress in a log (stderr is not a terminal here): the first line of each phase, then at
// most one a second. A tiny run warms up for 0.2 s, thousands of runs, in one line.
TEST(CliRun, ProgressInALogIsALineAPhaseNotARunAtATime) {
  const Result r = run({"run", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=4,J=4,K=4", "--repeat",
                        "20", "--warmup-time", "0.2"});
  ASSERT_EQ(r.status, 0) << r.err;
  int warmups = 0, repeats = 0;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    warmups += line.rfind("shardmm: warm-up", 0) == 0;
    repeats += line.rfind("shardmm: repeat", 0) == 0;
  }
  EXPECT_EQ(warmups, 1) << r.err;
  EXPECT_EQ(repeats, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("shardmm: repeat 1 of 20"));
  // The one warm-up line says the timed warm-up follows (it may run thousands of times).
  EXPECT_THAT(r.err, HasSubstr("shardmm: warm-up 1 of 1, then more until 0.2 s"));
  EXPECT_THAT(r.err, HasSubstr("shardmm: verifying"));
}

TEST(CliRun, EveryCandidateRunsAndTheTextNamesTheVerdict) {
  const std::vector<std::string> base{
      "run", "A[I_X, J] @ B[J, K_X]", "--mesh", "X=2,Y=2", "--dims", "I=6,J=5,K=7", "--dtype", "f64", "--repeat", "1"};
  const Result plan = run({"plan", "A[I_X, J] @ B[J, K_X]", "--mesh", "X=2,Y=2", "--dims", "I=6,J=5,K=7", "--dtype",
                           "f64", "--hw", "h100", "--json"});
  ASSERT_EQ(plan.status, 0) << plan.err;
  const std::size_t n = json::parse(plan.out)["candidates"].size();
  ASSERT_GE(n, 2u);
  for (std::size_t k = 1; k <= n; ++k) {
    std::vector<std::string> args = base;
    args.insert(args.end(), {"--candidate", std::to_string(k)});
    const Result r = run(args);
    EXPECT_EQ(r.status, 0) << "candidate " << k << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("verified: max abs error"));
    EXPECT_THAT(r.out, HasSubstr("Communication"));
  }
}

TEST(CliRun, ReshardRunChecksEveryElement) {
  const Result r = run({"reshard", "A[I, J_X]{U_Y}", "A[I_XY, J]", "--mesh", "X=2,Y=2", "--dims", "I=9,J=5", "--dtype",
                        "f64", "--run", "--repeat", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("verified"));
  EXPECT_THAT(r.out, Not(HasSubstr("NOT VERIFIED")));
}

TEST(CliRun, BadExecutionInputs) {
  const std::vector<std::string> ok{"run", "A[I, J_X] @ B[J_X, K]", "--mesh", "X=2", "--dims", "I=4,J=4,K=4"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = ok;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_input_error(with({"--backend", "nccl"}), "unknown backend 'nccl'");
  expect_input_error(with({"--dtype", "bf16"}), "execution computes in f32 or f64");
  expect_input_error(with({"--repeat", "0"}), "at least one timed run");
  expect_input_error(with({"--warmup", "-1"}), "must be 0 or more");
  expect_input_error(with({"--warmup-time", "-0.5"}), "--warmup-time -0.5: must be 0 to 60 seconds");
  expect_input_error(with({"--warmup-time", "61"}), "must be 0 to 60 seconds");
  expect_input_error(with({"--candidate", "99"}), "numbered 1 to");
  expect_input_error(with({"--repeat", "x"}), "--repeat");
  expect_input_error({"reshard", "A[I, J_X]", "A[I_X, J]", "--mesh", "X=2", "--dims", "I=4,J=4", "--run"},
                     "execution computes in f32 or f64");
}

// ---------------------------------------------------------------- --split

// --split chunk places blocks as torch.chunk (DTensor's Shard): 10 over X=4 is 3,3,3,1, and
// nested over X=3 then Y=2, 10 is 4,4,2 and each piece 2,2 | 2,2 | 1,1. Without the flag,
// numpy.array_split: 3,3,2,2.
TEST(CliSplit, CheckPlacesChunkBlocks) {
  const auto rows = [](const json& doc) {
    std::vector<std::pair<int, int>> out;
    for (const json& s : doc["shards"]) out.emplace_back(s["block"][0][0].get<int>(), s["block"][0][1].get<int>());
    return out;
  };
  using Rows = std::vector<std::pair<int, int>>;
  const json chunk =
      parse_stdout(run({"check", "A[I_X, J]", "--mesh", "X=4", "--split", "chunk", "--dims", "I=10,J=2", "--json"}));
  EXPECT_EQ(chunk["split"], "chunk");
  EXPECT_EQ(rows(chunk), (Rows{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  const json array = parse_stdout(run({"check", "A[I_X, J]", "--mesh", "X=4", "--dims", "I=10,J=2", "--json"}));
  EXPECT_EQ(array["split"], "array");
  EXPECT_EQ(rows(array), (Rows{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  const json nested = parse_stdout(
      run({"check", "A[I_XY, J]", "--mesh", "X=3,Y=2", "--split", "chunk", "--dims", "I=10,J=2", "--json"}));
  EXPECT_EQ(rows(nested), (Rows{{0, 2}, {2, 4}, {4, 6}, {6, 8}, {8, 9}, {9, 10}}));
  const Result text = run({"check", "A[I_X, J]", "--mesh", "X=4", "--split", "chunk", "--dims", "I=5,J=2"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("X=4 (4 devices; --split chunk)"));
  EXPECT_THAT(text.out, HasSubstr("I[5:5) J[0:2)"));  // 5 over 4: 2,2,1,0
}

// The planner costs chunk's blocks: gathering I=5 over X=4 sends device 3, which holds
// nothing under chunk (2,2,1,0), all 5 rows; under array_split (2,1,1,1) at most 4.
TEST(CliSplit, PlanCostsTheRulesBlocks) {
  const auto received = [](const std::string& split) {
    const json j = parse_stdout(run({"reshard", "A[I_X, J]", "A[I, J]", "--mesh", "X=4", "--split", split, "--dims",
                                     "I=5,J=1", "--dtype", "f32", "--json"}));
    EXPECT_EQ(j["split"], split);
    return j["candidates"][0]["steps"][0]["bytes_received"].get<std::int64_t>();
  };
  EXPECT_EQ(received("chunk"), 5 * 4);
  EXPECT_EQ(received("array"), 4 * 4);
}

// Executed and verified against the dense reference under chunk, with empty blocks.
TEST(CliSplit, RunAndReshardVerifyUnderChunk) {
  const Result r = run({"run", "A[I_X, J] @ B[J, K_Y] -> C[I_XY, K]", "--mesh", "X=3,Y=2", "--split", "chunk", "--dims",
                        "I=10,J=7,K=4", "--repeat", "1", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["verified"], true);
  EXPECT_EQ(doc["split"], "chunk");
  const Result text = run(
      {"run", "A[I_X, J] @ B[J, K]", "--mesh", "X=4", "--split", "chunk", "--dims", "I=5,J=3,K=2", "--repeat", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("verified"));
  EXPECT_THAT(text.out, HasSubstr("--split chunk"));
  const Result reshard = run({"reshard", "A[I_XY, J]", "A[I, J_YX]", "--mesh", "X=3,Y=2", "--split", "chunk", "--dims",
                              "I=10,J=7", "--dtype", "f64", "--run", "--repeat", "1"});
  ASSERT_EQ(reshard.status, 0) << reshard.err;
  EXPECT_THAT(reshard.out, HasSubstr("verified"));
  EXPECT_THAT(reshard.out, Not(HasSubstr("NOT VERIFIED")));
}

TEST(CliSplit, AnUnknownRuleIsOneLineAndExit2) {
  const std::string want = "unknown split rule 'bogus'; the rules are array (numpy.array_split";
  expect_input_error({"run", "A[I_X, J] @ B[J, K]", "--mesh", "X=4", "--dims", "I=5,J=3,K=2", "--split", "bogus"},
                     want);
  expect_input_error({"check", "A[I_X]", "--mesh", "X=4", "--split", "bogus"}, want);
  expect_input_error({"plan", "A[I_X, J] @ B[J, K]", "--mesh", "X=4", "--dims", "I=5,J=3,K=2", "--split", "bogus"},
                     want);
  expect_input_error({"reshard", "A[I_X]", "A[I]", "--mesh", "X=4", "--dims", "I=5", "--split", "bogus"}, want);
  expect_input_error(
      {"model", "mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--split", "bogus"}, want);
}

TEST(CliBench, CollectivesTableAndJson) {
  const Result r = run({"bench", "collectives", "--mesh", "X=2", "--sizes", "4KiB,64KiB", "--trials", "2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["group_size"], 2);
  std::map<std::string, int> per_op;
  for (const json& row : doc["rows"]) {
    per_op[row["op"]]++;
    EXPECT_GT(row["time_s"].get<double>(), 0);
    EXPECT_LE(row["min_time_s"].get<double>(), row["time_s"].get<double>());
    EXPECT_GE(row["max_time_s"].get<double>(), row["time_s"].get<double>());
    const double algbw = row["algbw_bytes_per_s"], busbw = row["busbw_bytes_per_s"];
    const double size = row["size_bytes"];
    EXPECT_NEAR(algbw, size / row["time_s"].get<double>(), algbw * 1e-9);
    // nccl-tests' factors at n = 2: (n-1)/n = 0.5, all_reduce 2(n-1)/n = 1.
    if (row["op"] == "all_reduce") {
      EXPECT_NEAR(busbw, algbw, algbw * 1e-9);
    }
    if (row["op"] == "all_gather" || row["op"] == "reduce_scatter" || row["op"] == "all_to_all") {
      EXPECT_NEAR(busbw, algbw / 2, algbw * 1e-9);
    }
  }
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "memcpy", "y += x"}) {
    EXPECT_EQ(per_op[op], 2) << op;
  }
  const Result text = run({"bench", "collectives", "--mesh", "X=2", "--sizes", "8KiB", "--trials", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("busbw / reference"));
  // Progress goes to stderr, a line a measurement: four collectives and two references.
  EXPECT_THAT(text.err, HasSubstr("shardmm: bench 1 of 6: all_gather 8.00 KiB\n"));
  EXPECT_THAT(text.err, HasSubstr("shardmm: bench 6 of 6: y += x 8.00 KiB\n"));
  EXPECT_THAT(text.out, HasSubstr("min - max"));
  expect_input_error({"bench", "collectives", "--mesh", "X=2", "--sizes", "64MiB:1KiB"}, "needs LO <= HI");
  expect_input_error({"bench", "collectives", "--mesh", "X=2", "--axes", "Q"}, "unknown mesh axis 'Q'");
  expect_input_error({"bench"}, "'shardmm bench' needs a subcommand: collectives");
}

// bench matmul: every candidate's figures are the planner's, the FLOPs and the reference
// GEMM's shape are the closed forms, and the ratios are what the times make them.
TEST(CliBench, MatmulAllCandidatesJson) {
  const std::string expr = "A[I_X, J] @ B[J_X, K] -> C[I_X, K]";
  const Result r = run({"bench", "matmul", expr, "--mesh", "X=2", "--dims", "K=24", "--sizes", "16,40", "--all",
                        "--repeat", "3", "--dtype", "f64", "--hw", "h100", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["ranks"], 2);
  EXPECT_EQ(doc["dtype"], "f64");
  EXPECT_EQ(doc["repeat"], 3);
  ASSERT_EQ(doc["points"].size(), 2u);
  const Mesh mesh = Mesh::parse("X=2");
  const Contraction c = parse_contraction(expr, mesh);
  int within = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const json& p = doc["points"][i];
    const std::int64_t n = i == 0 ? 16 : 40;
    EXPECT_EQ(p["dims"], json({{"I", n}, {"J", n}, {"K", 24}}));
    EXPECT_DOUBLE_EQ(p["flops"].get<double>(), 2.0 * n * n * 24);
    EXPECT_EQ(p["gemm"]["m"], n);   // I: A's free dimension
    EXPECT_EQ(p["gemm"]["n"], 24);  // K: B's free dimension
    EXPECT_EQ(p["gemm"]["k"], n);   // J: contracted
    PlanOptions options;
    options.dtype = DType::f64;
    options.hw = builtin_profile("h100");
    const MatmulPlanning planning = plan_matmul(mesh, c, {{"I", n}, {"J", n}, {"K", 24}}, options);
    EXPECT_EQ(p["chosen"], planning.chosen);
    ASSERT_EQ(p["runs"].size(), planning.candidates.size());
    double fastest = 1e300;
    int fastest_index = -1;
    for (std::size_t k = 0; k < planning.candidates.size(); ++k) {
      const json& run = p["runs"][k];
      const Plan& plan = planning.candidates[k];
      EXPECT_EQ(run["candidate"], k);
      EXPECT_EQ(run["description"], plan.description);
      EXPECT_EQ(run["chosen"], static_cast<int>(k) == planning.chosen);
      EXPECT_DOUBLE_EQ(run["predicted_time_s"].get<double>(), plan.total_time_s);
      EXPECT_DOUBLE_EQ(run["predicted_comm_s"].get<double>(), plan.comm_time_s);
      EXPECT_TRUE(run["verified"].get<bool>());
      const double t = run["measured_time_s"];
      ASSERT_GT(t, 0);
      EXPECT_NEAR(run["vs_gemm"].get<double>(), p["gemm"]["time_s"].get<double>() / t,
                  1e-9 * run["vs_gemm"].get<double>());
      EXPECT_NEAR(run["flop_rate"].get<double>(), p["flops"].get<double>() / t, 1e-9 * run["flop_rate"].get<double>());
      EXPECT_NEAR(run["measured_over_predicted"].get<double>(), t / plan.total_time_s,
                  1e-9 * run["measured_over_predicted"].get<double>());
      if (t < fastest) fastest = t, fastest_index = static_cast<int>(k);
    }
    EXPECT_EQ(p["fastest"], fastest_index);
    // Judged on the runoff where another candidate was fastest, on the screening runs where not.
    double chosen_time = p["runs"][planning.chosen]["measured_time_s"];
    ASSERT_EQ(p.contains("runoff"), fastest_index != planning.chosen);
    if (p.contains("runoff")) {
      EXPECT_EQ(p["runoff"]["candidate"], fastest_index);
      chosen_time = p["runoff"]["chosen_time_s"];
      fastest = p["runoff"]["candidate_time_s"];
      ASSERT_GT(fastest, 0);
    }
    EXPECT_EQ(p["chosen_within_5pct"], chosen_time <= 1.05 * fastest);
    within += chosen_time <= 1.05 * fastest;
  }
  EXPECT_EQ(doc["choice"], json({{"points", 2}, {"chosen_within_5pct", within}}));
}

// A profile that costs every collective but all_gather at a second picks gathering both operands
// of a dot product over a long J (2 MiB each) over summing its one element: the runoff of the two
// finds the chosen one far slower and the point is not within 5%. (The reference GEMM's
// m x n x k stays at OpenBLAS's single-thread limit, 2^18: ThreadSanitizer cannot see the
// synchronization of OpenBLAS's own threads.)
// An h100 profile calibrated on threads X=2 whose collectives over 2 ranks cost alpha(op) plus
// beta a byte at any size, with no GEMM rates.
HardwareProfile calibrated_profile(const std::string& name, const std::function<double(OpKind)>& alpha, double beta) {
  HardwareProfile hw = builtin_profile("h100");
  hw.name = name;
  Calibration cal;
  cal.backend = "threads";
  cal.mesh = "X=2";
  cal.copy_bandwidth = cal.add_bandwidth = 1e10;
  for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
    cal.collectives.push_back({op, 2, alpha(op), beta, 1, std::int64_t{1} << 40, 0});
  }
  hw.calibration = cal;
  return hw;
}

// J is long enough (16 MiB of f64 per operand) that gathering both loses by several times the
// few milliseconds a rank can wait for a core when the machine is busy.
TEST(CliBench, MatmulRunoffJudgesAChoiceAnotherCandidateBeat) {
  const HardwareProfile hw = calibrated_profile(
      "gathers-are-free", [](OpKind op) { return op == OpKind::all_gather ? 0.0 : 1.0; }, 0.0);
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "shardmm_cli_test_runoff.json";
  std::ofstream(file) << profile_to_json(hw);
  const Result r =
      run({"bench", "matmul", "A[I, J_X] @ B[J_X, K] -> C[I, K]", "--mesh", "X=2", "--dims", "I=1,K=1", "--sizes",
           "2097152", "--all", "--repeat", "3", "--rounds", "2", "--dtype", "f64", "--hw", file.string(), "--json"});
  std::filesystem::remove(file);
  ASSERT_EQ(r.status, 0) << r.err;
  const json p = json::parse(r.out)["points"][0];
  ASSERT_EQ(p["runs"].size(), 2u);
  const int chosen = p["chosen"], other = 1 - chosen;
  EXPECT_THAT(p["runs"][chosen]["description"].get<std::string>(), HasSubstr("all_gather"));
  EXPECT_EQ(p["fastest"], other);
  ASSERT_TRUE(p.contains("runoff"));
  const json& runoff = p["runoff"];
  EXPECT_EQ(runoff["candidate"], other);
  const double mine = runoff["chosen_time_s"], theirs = runoff["candidate_time_s"];
  EXPECT_GT(mine, 1.05 * theirs);
  EXPECT_NEAR(runoff["chosen_over_candidate"].get<double>(), mine / theirs, 1e-9 * mine / theirs);
  EXPECT_FALSE(p["chosen_within_5pct"].get<bool>());
  EXPECT_THAT(r.err, HasSubstr("runoff, candidate"));  // its progress
}

// With a profile calibrated on the same backend and mesh, each point times the calibration's
// largest GEMM again and reports it against the profile's rate; a profile from another mesh is
// no yardstick (a rank's rate depends on how many ranks share the cores).
TEST(CliBench, MatmulSpeedCheckAgainstTheCalibration) {
  HardwareProfile hw = calibrated_profile(
      "tiny-calibration", [](OpKind) { return 1e-6; }, 1e-10);
  // The largest of the two f64 shapes is the yardstick; the f32 one is another dtype's.
  hw.calibration->gemm = {{DType::f64, "small", 16, 16, 16, 1.0, 2e9},
                          {DType::f64, "square", 48, 40, 32, 5.0, 1e9},
                          {DType::f32, "square", 64, 64, 64, 5.0, 3e9}};
  const auto bench = [&](const std::string& mesh, bool as_json) {
    hw.calibration->mesh = mesh;
    const std::filesystem::path file = std::filesystem::temp_directory_path() / "shardmm_cli_test_speed.json";
    std::ofstream(file) << profile_to_json(hw);
    std::vector<std::string> args{"bench",    "matmul",   "A[I_X, J] @ B[J_X, K]",
                                  "--mesh",   "X=2",      "--sizes",
                                  "8,16",     "--repeat", "1",
                                  "--rounds", "2",        "--dtype",
                                  "f64",      "--hw",     file.string()};
    if (as_json) args.push_back("--json");
    const Result r = run(args);
    std::filesystem::remove(file);
    return r;
  };
  const Result same = bench("X=2", true);
  ASSERT_EQ(same.status, 0) << same.err;
  const json doc = json::parse(same.out);
  ASSERT_EQ(doc["points"].size(), 2u);
  for (const json& p : doc["points"]) {
    const json& sc = p["speed_check"];
    ASSERT_TRUE(sc.is_object()) << p.dump();
    EXPECT_EQ(sc["m"], 48);
    EXPECT_EQ(sc["n"], 40);
    EXPECT_EQ(sc["k"], 32);
    EXPECT_EQ(sc["profile_flop_rate"], 1e9);
    const double rate = sc["flop_rate"];
    EXPECT_GT(rate, 0);
    EXPECT_NEAR(sc["now_over_profile"].get<double>(), rate / 1e9, 1e-12 * rate / 1e9);
  }
  EXPECT_THAT(same.err, HasSubstr("speed check: the calibration's 48x40x32 GEMM on every rank, round 2 of 2"));
  const Result text = bench("X=2", false);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("speed now / at calibration: I=8, J=8, K=8 "));
  EXPECT_THAT(text.out, HasSubstr("the calibration's 48x40x32 GEMM again on every rank at once"));
  const Result other = bench("X=4", true);
  ASSERT_EQ(other.status, 0) << other.err;
  const json other_doc = json::parse(other.out);
  for (const json& p : other_doc["points"]) EXPECT_TRUE(p["speed_check"].is_null());
  EXPECT_THAT(other.err, Not(HasSubstr("speed check")));
}

TEST(CliBench, MatmulChosenPlanText) {
  // A batch dimension goes into the reference GEMM's m: B=3 x I=8 rows.
  const Result r = run({"bench", "matmul", "A[B_X, I, J] @ W[B_X, J, K] -> C[B_X, I, K]", "--mesh", "X=2", "--dims",
                        "B=3,I=8", "--sizes", "20", "--repeat", "1", "--warmup", "0", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  ASSERT_EQ(doc["points"].size(), 1u);
  const json& p = doc["points"][0];
  EXPECT_EQ(
      p["gemm"],
      json({{"m", 24}, {"n", 20}, {"k", 20}, {"time_s", p["gemm"]["time_s"]}, {"flop_rate", p["gemm"]["flop_rate"]}}));
  ASSERT_EQ(p["runs"].size(), 1u);  // the chosen plan alone
  EXPECT_EQ(p["runs"][0]["candidate"], p["chosen"]);
  EXPECT_FALSE(doc.contains("choice"));
  const Result text =
      run({"bench", "matmul", "A[I_X, J] @ B[J, K]", "--mesh", "X=2", "--sizes", "8,16", "--all", "--repeat", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("reference: one OpenBLAS GEMM of the same FLOPs with"));
  EXPECT_THAT(text.out, HasSubstr("(chosen"));
  EXPECT_THAT(text.out, HasSubstr("chosen plan within 5% of the fastest measured candidate at"));
  EXPECT_THAT(text.out, Not(HasSubstr("NO")));
  EXPECT_THAT(text.err, HasSubstr("shardmm: bench N=8: one GEMM"));  // progress goes to stderr
}

}  // namespace
}  // namespace shardmm
