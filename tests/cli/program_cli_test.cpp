// `shardmm program`, in-process (cli::run_cli): the report and its JSON agree with the
// library, the Scaling Book's hand-worked FFN typed in as .npy files gives its answers,
// and every kind of bad input is one exit-2 message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli_in_process.h"
#include "shardmm/core/npy.h"
#include "test_paths.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Result = testing::CliResult;
namespace fs = std::filesystem;

const std::string kRoot = shardmm::testing::repo_dir();
std::string example(const std::string& name) { return kRoot + "/examples/programs/" + name; }

Result program(std::vector<std::string> args) {
  args.insert(args.begin(), "program");
  return testing::run_cli_in_process(std::move(args));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ProgramCli, TheMlpReportShowsEachOpsCollectivesAndWhy) {
  const Result r = program({example("mlp.prog")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("one training step (forward, backward, sgd) on mesh X=4 (4 devices)"));
  EXPECT_THAT(r.out, HasSubstr("u[B, T, F_X]"));
  // y's partial sums are reduced where the residual needs them, and the line says so.
  EXPECT_THAT(r.out, HasSubstr("reshard y[B, T, D]{U_X} -> y[B, T, D]: add needs matching partial sums"));
  EXPECT_THAT(r.out, HasSubstr("all_reduce over X"));
  const json doc = json::parse(program({example("mlp.prog"), "--json"}).out);
  int all_reduces = 0;
  for (const json& row : doc["collectives"]) {
    EXPECT_EQ(row["op"], "all_reduce");
    all_reduces += row["count"].get<int>();
  }
  EXPECT_EQ(all_reduces, 2);  // one forward, its dual backward
  EXPECT_EQ(doc["tensors"][0]["name"], "x");
}

// The peak the report prints is the JSON timeline's largest point, and --trace draws the
// timeline as a counter track: a sample per point, in order, its series the point's bytes.
TEST(ProgramCli, ThePeakAndTheTraceFollowTheMemoryTimeline) {
  const fs::path dir = fs::temp_directory_path() / ("shardmm_timeline_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path trace = dir / "step.json";
  const Result r = program({example("mlp.prog"), "--optimizer", "adam", "--json", "--trace", trace.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  const json memory = json::parse(r.out)["memory"];
  const json& points = memory["timeline"];
  ASSERT_FALSE(points.empty());
  std::int64_t peak = 0;
  for (const json& p : points) peak = std::max(peak, p["total_bytes"].get<std::int64_t>());
  EXPECT_EQ(memory["peak_bytes"], peak);
  EXPECT_EQ(points[memory["peak_point"].get<std::size_t>()]["total_bytes"], peak);
  EXPECT_EQ(points.back()["phase"], "update");
  const json events = json::parse(slurp(trace))["traceEvents"];
  std::vector<json> samples;
  for (const json& e : events) {
    if (e["ph"] == "C") samples.push_back(e);
  }
  ASSERT_EQ(samples.size(), points.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const json& a = samples[i]["args"];
    std::int64_t total = 0;
    for (const char* k : {"params", "inputs", "gradients", "optimizer_state", "activations", "transient"})
      total += a[k].get<std::int64_t>();
    EXPECT_EQ(total, points[i]["total_bytes"]) << i;
    EXPECT_EQ(a["optimizer_state"], 2 * points[i]["param_bytes"].get<std::int64_t>()) << i;
    if (i > 0) {
      EXPECT_GE(samples[i]["ts"].get<double>(), samples[i - 1]["ts"].get<double>()) << i;
    }
  }
  // The report's peak line names the same point.
  const json& at = points[memory["peak_point"].get<std::size_t>()];
  ASSERT_FALSE(at["line"].is_null());  // the MLP peaks inside an op
  const Result text = program({example("mlp.prog"), "--optimizer", "adam"});
  EXPECT_THAT(text.out, HasSubstr("during line " + std::to_string(at["line"].get<int>()) + " (" +
                                  at["tensor"].get<std::string>() + " = " + at["op"].get<std::string>() + "), " +
                                  at["phase"].get<std::string>()));
  fs::remove_all(dir);
}

// --json's steps carry each op's local work (op "local": its function and the bytes it reads
// and writes), the update's steps (one per param), and each phase's time split into einsums
// and local work; --trace draws the local steps on the compute lane.
TEST(ProgramCli, LocalStepsAndTheUpdateAreInTheJsonAndTheTrace) {
  const fs::path dir = fs::temp_directory_path() / ("shardmm_local_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path trace = dir / "step.json";
  const Result r = program({example("mlp.prog"), "--optimizer", "adam", "--json", "--trace", trace.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  // a = gelu(u): u[B, T, F_X] is 8 x 1024 x 4096 bf16 per device; forward reads u and writes
  // a, backward reads the gradient and u and writes u's.
  const std::int64_t block = std::int64_t{8} * 1024 * 4096 * 2;
  std::vector<json> gelu;
  for (const json& op : doc["ops"]) {
    if (op["result"] != "a") continue;
    for (const json& step : op["steps"]) gelu.push_back(step);
  }
  ASSERT_EQ(gelu.size(), 2u);
  EXPECT_EQ(gelu[0]["phase"], "forward");
  EXPECT_EQ(gelu[1]["phase"], "backward");
  for (const json& step : gelu) {
    EXPECT_EQ(step["op"], "local");
    EXPECT_EQ(step["function"], "gelu");
    EXPECT_EQ(step["bytes"], 0);
    EXPECT_GT(step["time_s"].get<double>(), 0);
  }
  EXPECT_EQ(gelu[0]["memory_bytes"], 2 * block);
  EXPECT_EQ(gelu[1]["memory_bytes"], 3 * block);
  // The elements those bytes hold (bf16: 2 bytes each); a built-in profile has no per-element
  // rate, so the traffic bounds them.
  EXPECT_EQ(gelu[0]["elements"], block);
  EXPECT_EQ(gelu[1]["elements"], 3 * block / 2);
  EXPECT_EQ(gelu[0]["bound"], "memory");
  // Adam reads w, its gradient and its two moments and writes w and the moments: w_in[D, F_X]
  // and w_out[F_X, D] are 4096 x 4096 bf16 per device.
  const json& update = doc["update_steps"];
  ASSERT_EQ(update.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(update[i]["tensor"], i == 0 ? "w_in" : "w_out");
    EXPECT_EQ(update[i]["phase"], "update");
    EXPECT_EQ(update[i]["function"], "adam");
    EXPECT_EQ(update[i]["memory_bytes"], 7 * std::int64_t{4096} * 4096 * 2);
  }
  for (const char* phase : {"forward", "backward", "update"}) {
    const json& t = doc["predicted_time_s"][phase];
    EXPECT_GT(t["local"].get<double>(), 0) << phase;
    EXPECT_DOUBLE_EQ(t["compute"].get<double>(), t["einsum"].get<double>() + t["local"].get<double>()) << phase;
  }
  EXPECT_DOUBLE_EQ(doc["predicted_time_s"]["update"]["local"].get<double>(),
                   update[0]["time_s"].get<double>() + update[1]["time_s"].get<double>());
  int drawn = 0;
  const json events = json::parse(slurp(trace))["traceEvents"];
  for (const json& e : events) {
    if (e["ph"] != "X" || (e["name"] != "gelu a" && e["name"] != "adam w_in")) continue;
    ++drawn;
    EXPECT_EQ(e["cat"], "compute");
    EXPECT_EQ(e["args"]["memory_bytes"], e["name"] == "gelu a" ? gelu[0]["memory_bytes"] : update[0]["memory_bytes"]);
  }
  EXPECT_EQ(drawn, 2);  // gelu's forward (its backward is "gelu da") and w_in's update
  fs::remove_all(dir);
}

// --split chunk reaches the program's mesh, the file's line or --mesh: blocks as torch.chunk
// places them (F=7 over X=3: 3,3,1, not 3,2,2), the run verified against the dense step.
TEST(ProgramCli, SplitChunkPlacesAndVerifies) {
  for (const std::vector<std::string>& mesh : {std::vector<std::string>{}, std::vector<std::string>{"--mesh", "X=3"}}) {
    std::vector<std::string> args{
        example("mlp.prog"), "--dims", "B=2,T=2,D=4,F=7", "--split", "chunk", "--run", "--json"};
    args.insert(args.end(), mesh.begin(), mesh.end());
    const Result r = program(args);
    ASSERT_EQ(r.status, 0) << r.err;
    const json doc = json::parse(r.out);
    EXPECT_EQ(doc["split"], "chunk");
    EXPECT_EQ(doc["run"]["verified"], true);
  }
  EXPECT_THAT(program({example("mlp.prog"), "--split", "chunk"}).out,
              HasSubstr("on mesh X=4 (4 devices; --split chunk)"));
  EXPECT_THAT(program({example("mlp.prog"), "--split", "torch"}).err, HasSubstr("unknown split rule 'torch'"));
}

// Every example of `program --help` (but mpirun's) runs as written from the repository root.
TEST(ProgramCli, HelpExamplesRun) {
  const Result help = program({"--help"});
  ASSERT_EQ(help.status, 0);
  std::vector<std::vector<std::string>> examples;
  std::istringstream lines(help.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  shardmm program ", 0) == 0) {
      examples.emplace_back();
    } else if (line.rfind("      --", 0) != 0 || examples.empty()) {
      continue;  // a continued example's next line starts with its flags
    }
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w == "shardmm" || w == "program") continue;
      // --spec x='x[B, T, D]': the quoted value is one word.
      if (const auto q = w.find('\''); q != std::string::npos) {
        std::string rest;
        while (std::count(w.begin(), w.end(), '\'') < 2 && words >> rest) w += " " + rest;
        w.erase(std::remove(w.begin(), w.end(), '\''), w.end());
      }
      examples.back().push_back(w);
    }
  }
  ASSERT_EQ(examples.size(), 4u) << help.out;
  const fs::path cwd = fs::current_path();
  fs::current_path(kRoot);
  for (const auto& args : examples) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const Result r = program(args);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  fs::current_path(cwd);
}

TEST(ProgramCli, TheScalingBooksHandWorkedFfnGivesItsAnswers) {
  const fs::path out = fs::temp_directory_path() / ("shardmm_program_cli_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string dir = example("tp_ffn/");
  const Result r = program({example("tp_ffn.prog"), "--run", "--input", "x=" + dir + "x.npy", "--input",
                            "a=" + dir + "a.npy", "--input", "b=" + dir + "b.npy", "--save", out.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("verified"));
  EXPECT_EQ(parse_npy(slurp(out / "y.npy"), "y").values, (std::vector<double>{9, 6}));
  EXPECT_EQ(parse_npy(slurp(out / "x.grad.npy"), "x.grad").values, (std::vector<double>{9, 3}));
  fs::remove_all(out);
}

// --rings: FSDP's regathered weights gathered round a ring while each block multiplies; the
// report, its collectives table and the JSON name the ring, and the forward is faster.
TEST(ProgramCli, RingsRunFsdpsGathersUnderTheEinsum) {
  const fs::path file = fs::temp_directory_path() / ("shardmm_rings_" + std::to_string(::getpid()) + ".prog");
  std::ofstream(file) << "mesh X=4\ndims B=8, T=256, D=1024, F=2048\ninput x[B, T, D] : x[B_X, T, D]\n"
                         "param w_in[D, F] regathered : w_in[D_X, F]\n"
                         "param w_out[F, D] regathered : w_out[F_X, D]\ninput g[B, T, D] : g[B_X, T, D]\n"
                         "u[B, T, F] = x @ w_in\ny[B, T, D] = gelu(u) @ w_out\nloss sum(y * g)\n";
  const std::vector<std::string> args = {file.string(), "--hw", "tpu-v5e", "--json"};
  const Result plain = program(args);
  std::vector<std::string> with_rings = args;
  with_rings.push_back("--rings");
  const Result rings = program(with_rings);
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(rings.status, 0) << rings.err;
  const json a = json::parse(plain.out), b = json::parse(rings.out);
  EXPECT_EQ(a["rings"], false);
  EXPECT_EQ(b["rings"], true);
  const auto count = [](const json& doc, const std::string& phase, const std::string& op) {
    for (const json& row : doc["collectives"]) {
      if (row["phase"] == phase && row["op"] == op) return row["count"].get<int>();
    }
    return 0;
  };
  EXPECT_EQ(count(a, "forward", "all_gather"), 2);
  EXPECT_EQ(count(b, "forward", "all_gather"), 0);
  EXPECT_EQ(count(b, "forward", "all_gather_einsum"), 2);
  EXPECT_EQ(count(b, "backward", "all_gather"), count(a, "backward", "all_gather"));
  EXPECT_LT(b["predicted_time_s"]["serialized"].get<double>(), a["predicted_time_s"]["serialized"].get<double>());
  const Result text = program({file.string(), "--hw", "tpu-v5e", "--rings"});
  fs::remove(file);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("forward  all_gather_einsum u over X"));
  EXPECT_THAT(text.out, HasSubstr("forward   all_gather_einsum over X"));
}

TEST(ProgramCli, BadInputIsOneMessageAndExitTwo) {
  const fs::path dir = fs::temp_directory_path() / ("shardmm_program_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "junk.prog", std::ios::binary) << std::string(
      "\x7f"
      "ELF\x02\x01\x01\x00",
      8);
  std::ofstream(dir / "typo.prog") << "mesh X=2\ndims I=4\ninput a[I]\nb[I] = relu(a) @\n";
  std::ofstream(dir / "wrong.npy", std::ios::binary) << format_npy({3}, {1, 2, 3});
  const std::string ffn = example("tp_ffn.prog");
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{(dir / "missing.prog").string()}, "program " + (dir / "missing.prog").string()},
      {{dir.string()}, "is a directory"},
      {{(dir / "junk.prog").string()}, "junk.prog:1:1: byte \\x7f is a control character"},
      {{(dir / "typo.prog").string()}, "typo.prog:4:17: expected a tensor name or an op, found the end of the line"},
      {{ffn, "--spec", "w=[D]"}, "spec for 'w' in --spec: the program has no tensor 'w'"},
      {{ffn, "--spec", "a"}, "--spec 'a': expected NAME=SPEC"},
      {{ffn, "--mesh", "X=2,Y=2", "--spec", "a=a[D_Y, F_Y]"}, "mesh axis 'Y' shards two dimensions"},
      {{ffn, "--optimizer", "lion"}, "unknown optimizer 'lion' in --optimizer; the optimizers are sgd and adam"},
      {{ffn, "--input", "x=" + (dir / "wrong.npy").string()}, "--input works with --run; add --run"},
      {{ffn, "--run", "--input", "x=" + (dir / "wrong.npy").string()},
       "--input x: an array of shape (3) for x[N, D], whose shape is (1, 2)"},
      {{ffn, "--run", "--input", "h=" + (dir / "wrong.npy").string()},
       "--input h: the program has no input or param 'h' (it is computed)"},
      {{ffn, "--run", "--dtype", "bf16"}, "--run computes in f32 or f64, not bf16"},
      {{ffn, "--train", "--infer"}, "--train and --infer exclude each other"},
      {{ffn, "--backend", "mpi"}, "--backend mpi chooses where --run executes the step"},
      {{ffn, "--run", "--save", (dir / "typo.prog").string()}, "not a directory"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const Result r = program(args);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_THAT(r.err, StartsWith("shardmm: error: "));
    EXPECT_THAT(r.err, HasSubstr(message));
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardmm
