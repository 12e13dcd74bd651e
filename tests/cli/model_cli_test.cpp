// `shardmm model`, in-process (cli::run_cli): the seeds' claims read from its JSON, the
// predicted bytes against closed forms, --run verified with measured = predicted, and one
// clear exit-2 line for each kind of bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_in_process.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using Result = testing::CliResult;

Result model(std::vector<std::string> args) {
  args.insert(args.begin(), "model");
  return testing::run_cli_in_process(std::move(args));
}

// The arguments of `layer --strategy strategy` followed by `rest`.
std::vector<std::string> with(const char* layer, const char* strategy, const std::vector<std::string>& rest) {
  std::vector<std::string> args = {layer, "--strategy", strategy};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

json model_json(std::vector<std::string> args) {
  args.push_back("--json");
  const Result r = model(args);
  EXPECT_EQ(r.status, 0) << r.err;
  return json::parse(r.out);
}

// Sum of count or bytes over the rows of one phase (and op, when given).
std::int64_t total(const json& doc, const std::string& key, const std::string& phase = "", const std::string& op = "",
                   const char* side = "predicted") {
  std::int64_t n = 0;
  for (const json& row : doc["collectives"]) {
    if ((phase.empty() || row["phase"] == phase) && (op.empty() || row["op"] == op))
      n += row[side][key].get<std::int64_t>();
  }
  return n;
}

TEST(ModelCliTest, MegatronMlpMovesTwoAllReducesOfItsActivation) {
  const json doc = model_json({"mlp", "--strategy", "tp", "--mesh", "X=4", "--dims", "B=2,T=8,D=16,F=64"});
  EXPECT_EQ(total(doc, "count", "forward", "all_reduce"), 1);
  EXPECT_EQ(total(doc, "count", "backward", "all_reduce"), 1);
  EXPECT_EQ(total(doc, "count"), 2);
  // all_reduce of V = B*T*D f32 over N = 4 devices: each sends 2 (N - 1) / N V.
  const std::int64_t v = 2 * 8 * 16 * 4;
  EXPECT_EQ(total(doc, "bytes", "forward", "all_reduce"), 2 * 3 * v / 4);
  // Parameters per device: W_in [16, 16] and W_out [16, 16] in f32.
  EXPECT_EQ(doc["memory"]["parameter_bytes"], 2 * 16 * 16 * 4);
  EXPECT_EQ(doc["tensors"][1]["spec"], "W_in[D, F_X]");
  EXPECT_EQ(doc["strategy_axes"]["tp"], "X");
}

TEST(ModelCliTest, DecoderBlockFourAllReducesTrainingTwoInference) {
  const std::vector<std::string> args = {"block",  "--strategy",           "tp", "--mesh", "X=2",
                                         "--dims", "B=2,T=8,D=16,F=32,H=4"};
  EXPECT_EQ(total(model_json(args), "count", "", "all_reduce"), 4);
  std::vector<std::string> infer = args;
  infer.push_back("--infer");
  const json doc = model_json(infer);
  EXPECT_EQ(total(doc, "count", "forward", "all_reduce"), 2);
  EXPECT_EQ(total(doc, "count"), 2);
  EXPECT_EQ(doc["train"], false);
  EXPECT_EQ(doc["memory"]["activation_bytes"], 0);
}

TEST(ModelCliTest, SequenceParallelSameBytesAsTensorParallel) {
  const std::vector<std::string> rest = {"--mesh", "X=4", "--dims", "B=2,T=16,D=16,F=32,H=4"};
  const json a = model_json(with("block", "tp", rest)), b = model_json(with("block", "sp", rest));
  EXPECT_EQ(total(b, "count", "", "all_reduce"), 0);
  EXPECT_EQ(total(b, "count", "", "all_gather"), 4);
  EXPECT_EQ(total(b, "count", "", "reduce_scatter"), 4);
  EXPECT_EQ(total(a, "bytes"), total(b, "bytes"));
  EXPECT_LT(b["memory"]["activation_bytes"].get<std::int64_t>(), a["memory"]["activation_bytes"].get<std::int64_t>());
}

TEST(ModelCliTest, FsdpIsOneAndAHalfTimesDataParallel) {
  const std::vector<std::string> rest = {"--mesh", "X=8", "--dims", "B=8,T=4,D=64,F=256"};
  const json a = model_json(with("mlp", "dp", rest)), b = model_json(with("mlp", "fsdp", rest));
  EXPECT_EQ(2 * total(b, "bytes"), 3 * total(a, "bytes"));
  // DP's all_reduce of V = 2 * 64 * 256 f32 weights: 2 (N - 1) / N V per device.
  EXPECT_EQ(total(a, "bytes"), 2 * 7 * (2 * 64 * 256 * 4) / 8);
  EXPECT_EQ(b["memory"]["parameter_bytes"].get<std::int64_t>() * 8, a["memory"]["parameter_bytes"].get<std::int64_t>());
}

TEST(ModelCliTest, MoeDispatchAndCombineAreAllToAll) {
  const json doc = model_json({"moe", "--strategy", "ep", "--mesh", "X=4", "--dims", "B=8,T=16,D=16,F=32,E=8,K=2"});
  EXPECT_EQ(total(doc, "count", "forward", "all_to_all"), 2);
  EXPECT_EQ(total(doc, "count", "backward", "all_to_all"), 2);
  EXPECT_EQ(total(doc, "count", "forward"), 2);  // nothing else forward
}

TEST(ModelCliTest, RunVerifiesAndMeasuresWhatWasPredicted) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"block", "--strategy", "dp+sp", "--mesh", "X=2,Y=2", "--dims", "B=3,T=5,D=8,F=12,H=2", "--causal"},
           {"moe", "--strategy", "ep", "--mesh", "X=3", "--dims", "B=4,T=6,D=4,F=8,E=5,K=2", "--dtype", "f64",
            "--capacity-factor", "0.8", "--activation", "silu"},
           {"attention", "--strategy", "fsdp", "--mesh", "X=2", "--dims", "B=3,T=4,D=8,H=2", "--infer"}}) {
    std::vector<std::string> run = args;
    run.push_back("--run");
    const json doc = model_json(run);
    EXPECT_EQ(doc["run"]["verified"], true) << doc["run"]["detail"];
    EXPECT_EQ(total(doc, "count", "", "", "measured"), total(doc, "count"));
    EXPECT_EQ(total(doc, "bytes", "", "", "measured"), total(doc, "bytes"));
    const Result text = model(run);
    EXPECT_EQ(text.status, 0);
    EXPECT_THAT(text.out, HasSubstr("verified against the dense f64 step of the layer's program"));
  }
}

// Each layer is a program: `shardmm program` of the text --print-program prints predicts the
// same collectives, bytes, memory and time as `shardmm model`.
TEST(ModelCliTest, ThePrintedProgramPredictsWhatTheModelPredicts) {
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("shardmm_model_cli_" + std::to_string(::getpid()) + ".prog");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"block", "--strategy", "dp+sp", "--mesh", "X=2,Y=2", "--dims", "B=3,T=5,D=8,F=12,H=2", "--causal"},
           {"moe", "--strategy", "ep", "--mesh", "X=4", "--dims", "B=8,T=16,D=16,F=32,E=8,K=2", "--capacity-factor",
            "2"},
           {"mlp", "--strategy", "fsdp", "--mesh", "X=8", "--dims", "B=8,T=4,D=64,F=256", "--activation", "relu"},
           {"attention", "--strategy", "tp", "--mesh", "X=4", "--dims", "B=8,T=1024,D=4096,H=32", "--infer"}}) {
    std::vector<std::string> print = args;
    print.push_back("--print-program");
    const Result text = model(print);
    ASSERT_EQ(text.status, 0) << text.err;
    EXPECT_THAT(text.out, StartsWith("# shardmm model " + args[0] + " --strategy " + args[2]));
    std::ofstream(file) << text.out;
    const bool infer = args.back() == "--infer";
    const Result r = testing::run_cli_in_process(
        {"program", file.string(), "--json", "--dtype", "f32", "--hw", "h100", infer ? "--infer" : "--train"});
    ASSERT_EQ(r.status, 0) << r.err;
    const json want = model_json(args), got = json::parse(r.out);
    EXPECT_EQ(total(want, "count"), [&] {
      std::int64_t n = 0;
      for (const json& row : got["collectives"]) n += row["count"].get<std::int64_t>();
      return n;
    }()) << args[0];
    for (const json& row : got["collectives"]) {
      const std::string phase = row["phase"], op = row["op"];
      EXPECT_EQ(total(want, "count", phase, op), row["count"].get<std::int64_t>())
          << args[0] << " " << phase << " " << op;
      EXPECT_EQ(total(want, "bytes", phase, op), row["bytes"].get<std::int64_t>())
          << args[0] << " " << phase << " " << op;
    }
    EXPECT_EQ(want["memory"]["parameter_bytes"], got["memory"]["param_bytes"]) << args[0];
    EXPECT_EQ(want["memory"]["activation_bytes"], got["memory"]["activation_bytes"]) << args[0];
    EXPECT_DOUBLE_EQ(want["predicted_time_s"]["total"].get<double>(),
                     got["predicted_time_s"]["serialized"].get<double>())
        << args[0];
  }
  fs::remove(file);
}

TEST(ModelCliTest, TextReportNamesTensorsCollectivesMemoryAndTime) {
  const Result r = model({"block", "--strategy", "sp", "--mesh", "X=4", "--dims", "B=8,T=1024,D=4096,F=16384,H=32"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("X       X[B, T_X, D]"));
  EXPECT_THAT(r.out, HasSubstr("forward   reduce_scatter over X      2"));
  EXPECT_THAT(r.out, HasSubstr("activations"));
  EXPECT_THAT(r.out, HasSubstr("Predicted time on h100"));
}

TEST(ModelCliTest, HelpExplainsEveryStrategy) {
  const Result r = model({"--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* s : {"  tp ", "  sp ", "  dp ", "  fsdp ", "  ep "}) EXPECT_THAT(r.out, HasSubstr(s));
}

TEST(ModelCliTest, BadInputIsOneLineAndExitTwo) {
  struct Bad {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Bad> cases = {
      {{"conv", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=1"}, "unknown layer 'conv'"},
      {{"mlp", "--strategy", "zp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4"}, "unknown strategy 'zp'"},
      {{"mlp", "--strategy", "ep", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4"}, "layer mlp does not take"},
      {{"mlp", "--strategy", "dp+tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4"}, "needs a mesh of 2 axes"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4"}, "needs F (MLP hidden width)"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4,Q=2"}, "names Q, which layer mlp"},
      {{"attention", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=5,H=2"}, "H=2 does not divide D=5"},
      {{"moe", "--strategy", "ep", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4,E=2,K=3"}, "K=3 exceeds E=2"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--causal"}, "--causal applies to"},
      {{"attention", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,H=2", "--activation", "relu"},
       "has no MLP"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--activation", "tanh"},
       "activation 'tanh' is not one of relu, gelu, silu"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--capacity-factor", "2"},
       "--capacity-factor applies to the moe layer"},
      {{"moe", "--strategy", "ep", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4,E=2", "--capacity-factor", "0"},
       "must be a positive number"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--train", "--infer"},
       "--train and --infer exclude each other"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--backend", "mpi"},
       "add --run or drop --backend"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--run", "--dtype", "bf16"},
       "--run computes in f32 or f64"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--run", "--backend", "nccl"}, "nccl"},
      {{"mlp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4"}, "--strategy"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=2", "--dims", "B=2,T=2,D=4,F=4", "--print-program", "--run"},
       "--print-program prints the layer's program and nothing else; drop --run"},
      {{"mlp", "--strategy", "tp", "--mesh", "X=8", "--dims", "B=8,T=2048,D=4096,F=16384", "--run"},
       "give smaller --dims with --run"},
  };
  for (const Bad& b : cases) {
    const Result r = model(b.args);
    EXPECT_EQ(r.status, 2) << b.message;
    EXPECT_THAT(r.err, StartsWith("shardmm: error: ")) << b.message;
    EXPECT_THAT(r.err, HasSubstr(b.message));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace shardmm
