// The Scaling Book's claims about Megatron's layers, read off the example programs'
// symbolic steps: the tensor-parallel MLP's one all_reduce each way, the block's four in
// training and two in inference, and sequence parallelism's same bytes for 1/N of the norm
// activations.
#include <gtest/gtest.h>

#include "repo_files.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/nn/program.h"

namespace shardmm {
namespace {

program::Graph load(const std::string& file, program::BindOptions o = {}) {
  return program::bind(program::parse_program(testing::read_repo_file(file), file), o);
}

// Collectives of a phase as "op over AXES" -> count.
std::map<std::string, int> collectives(const nn::ProgramPrediction& p, autodiff::Phase phase, const Mesh& mesh) {
  std::map<std::string, int> out;
  for (const nn::CollectiveTally& t : nn::tally_collectives(p.events)) {
    const std::string reduce = t.reduce == ReduceOp::max ? "(max)" : "";
    if (t.phase == phase) out[std::string(to_string(t.op)) + reduce + " over " + mesh.axis_names(t.axes)] += t.count;
  }
  return out;
}

std::int64_t collective_bytes(const nn::ProgramPrediction& p) {
  std::int64_t bytes = 0;
  for (const nn::CollectiveTally& t : nn::tally_collectives(p.events)) bytes += t.bytes;
  return bytes;
}

using Counts = std::map<std::string, int>;

// The Scaling Book's GPU in bf16.
nn::ProgramOptions h100() {
  nn::ProgramOptions o;
  o.dtype = DType::bf16;
  o.hw = builtin_profile("h100");
  return o;
}

TEST(ProgramClaims, TensorParallelMlpAllReducesOnceEachWay) {
  const program::Graph g = load("examples/programs/mlp.prog");
  const nn::ProgramPrediction p = nn::predict_program(g, h100());
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 1}}));
  EXPECT_EQ(collectives(p, autodiff::Phase::backward, g.mesh), (Counts{{"all_reduce over X", 1}}));
  // The hidden activations stay split: u and a are [B, T, F_X].
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("a"))], g.mesh), "a[B, T, F_X]");
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("y"))], g.mesh), "y[B, T, D]{U_X}");
}

// Expert parallelism from a program: the experts' weights pinned E-split and the batch split
// on the same axis, the planner sends the tokens to their experts and back by all_to_all
// (B -> E and E -> B), and backward runs the duals; routing itself moves nothing.
TEST(ProgramClaims, ExpertParallelMoeSendsTokensByAllToAllEachWay) {
  const program::Graph g = load("examples/programs/moe.prog");
  const nn::ProgramPrediction p = nn::predict_program(g, h100());
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_to_all over X", 2}}));
  // The router's weight is replicated: its gradient's all_reduce is data parallel's.
  EXPECT_EQ(collectives(p, autodiff::Phase::backward, g.mesh),
            (Counts{{"all_to_all over X", 2}, {"all_reduce over X", 1}}));
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("d"))], g.mesh), "d[B_X, T, E, C]");
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("h"))], g.mesh), "h[B, E_X, C, F]");
  // Each all_to_all moves (N-1)/N of a device's [B/N, E, C, D] buffer.
  const std::int64_t buffer = 2 * 8 * 320 * 1024 * 2;  // bf16
  for (const nn::CollectiveTally& t : nn::tally_collectives(p.events)) {
    if (t.op == OpKind::all_to_all) {
      EXPECT_EQ(t.bytes, t.count * buffer * 3 / 4);
    }
  }
}

// A softmax over a split letter all-reduces its rows' max and their sums: tallied apart.
TEST(ProgramClaims, ASoftmaxOverASplitLetterAllReducesTheMaxAndTheSumApart) {
  const program::Graph g = program::bind(program::parse_program(R"(
mesh X=2
dims T=4, S=8
input s[T, S] : s[T, S_X]
p[T, S] = softmax(s, over=S)
)",
                                                                "softmax.prog"),
                                         {});
  nn::ProgramOptions o = h100();
  o.train = false;
  const nn::ProgramPrediction p = nn::predict_program(g, o);
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh),
            (Counts{{"all_reduce(max) over X", 1}, {"all_reduce over X", 1}}));
}

TEST(ProgramClaims, TensorParallelBlockAllReducesFourTimesInTrainingTwiceInInference) {
  const program::Graph g = load("examples/programs/block.prog");
  nn::ProgramOptions o = h100();
  const nn::ProgramPrediction train = nn::predict_program(g, o);
  EXPECT_EQ(collectives(train, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  EXPECT_EQ(collectives(train, autodiff::Phase::backward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  o.train = false;
  const nn::ProgramPrediction infer = nn::predict_program(g, o);
  EXPECT_EQ(collectives(infer, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  EXPECT_TRUE(collectives(infer, autodiff::Phase::backward, g.mesh).empty());
}

// The MLP with its batch split on X=4, its weights replicated (data parallel) or split on X
// and regathered (FSDP); `regathered` off, FSDP keeps its gathered weights as activations.
std::string fsdp_mlp(const std::string& weights) {
  const bool fsdp = weights != "dp";
  const std::string keep = weights == "fsdp" ? " regathered" : "";
  return "mesh X=4\ndims B=16, T=1024, D=1024, F=4096\ninput x[B, T, D] : x[B_X, T, D]\n"
         "param w_in[D, F]" +
         keep + (fsdp ? " : w_in[D_X, F]" : "") +
         "\n"
         "param w_out[F, D]" +
         keep + (fsdp ? " : w_out[F_X, D]" : "") +
         "\n"
         "input g[B, T, D] : g[B_X, T, D]\nu[B, T, F] = x @ w_in\ny[B, T, D] = gelu(u) @ w_out\nloss sum(y * g)\n";
}

// The Scaling Book: FSDP moves 1.5x data parallelism's bytes (an all_gather of each weight
// forward, again backward, and a reduce_scatter of its gradient, against DP's all_reduce of
// the gradient, which moves two of those) for 1/N of the parameters, their gradients and the
// optimizer's state; regathering keeps no gathered weight for backward.
TEST(ProgramClaims, FsdpMovesOneAndAHalfTimesDataParallelsBytesForAQuarterOfTheParameterMemory) {
  nn::ProgramOptions o = h100();
  o.optimizer = nn::Optimizer::adam;
  const auto predict = [&](const std::string& w) {
    return nn::predict_program(program::bind(program::parse_program(fsdp_mlp(w), w + ".prog"), {}), o);
  };
  const nn::ProgramPrediction dp = predict("dp"), fsdp = predict("fsdp"), kept = predict("fsdp_kept");
  const Mesh mesh = Mesh::parse("X=4");
  EXPECT_EQ(collectives(dp, autodiff::Phase::forward, mesh), Counts{});
  EXPECT_EQ(collectives(dp, autodiff::Phase::backward, mesh), (Counts{{"all_reduce over X", 2}}));
  EXPECT_EQ(collectives(fsdp, autodiff::Phase::forward, mesh), (Counts{{"all_gather over X", 2}}));
  EXPECT_EQ(collectives(fsdp, autodiff::Phase::backward, mesh),
            (Counts{{"all_gather over X", 2}, {"reduce_scatter over X", 2}}));
  EXPECT_EQ(2 * collective_bytes(fsdp), 3 * collective_bytes(dp));
  EXPECT_GT(collective_bytes(dp), 0);
  EXPECT_EQ(4 * fsdp.memory.params, dp.memory.params);
  EXPECT_EQ(4 * fsdp.memory.optimizer_state, dp.memory.optimizer_state);
  // Gradients: the params' (the inputs' are in the inputs' own spec, the same in both).
  EXPECT_EQ(4 * (fsdp.memory.gradients - fsdp.memory.inputs), dp.memory.gradients - dp.memory.inputs);
  EXPECT_EQ(fsdp.memory.activations, dp.memory.activations);
  // Kept: DP's bytes, and a gathered copy of both weights (bf16) held for backward.
  EXPECT_EQ(collective_bytes(kept), collective_bytes(dp));
  EXPECT_EQ(kept.memory.activations - fsdp.memory.activations, 2 * 1024 * 4096 * 2);
}

TEST(ProgramClaims, SequenceParallelMovesTensorParallelsBytesForAQuarterOfTheNormActivations) {
  const program::Graph tp = load("examples/programs/mlp.prog");
  program::BindOptions o;
  o.specs["x"] = "x[B, T_X, D]";
  o.specs["g"] = "g[B, T_X, D]";
  const program::Graph sp = load("examples/programs/mlp.prog", o);
  const nn::ProgramOptions options = h100();
  const nn::ProgramPrediction ptp = nn::predict_program(tp, options), psp = nn::predict_program(sp, options);
  EXPECT_EQ(collectives(psp, autodiff::Phase::forward, sp.mesh),
            (Counts{{"all_gather over X", 1}, {"reduce_scatter over X", 1}}));
  EXPECT_EQ(collectives(psp, autodiff::Phase::backward, sp.mesh),
            (Counts{{"all_gather over X", 1}, {"reduce_scatter over X", 1}}));
  EXPECT_EQ(collective_bytes(psp), collective_bytes(ptp));
  // The norm's output h is what its einsum's backward reads: [B, T_X, D] under sp, 1/4 of tp's.
  EXPECT_EQ(format_spec(psp.record.specs[static_cast<std::size_t>(sp.find("h"))], sp.mesh), "h[B, T_X, D]");
  EXPECT_EQ(format_spec(ptp.record.specs[static_cast<std::size_t>(tp.find("h"))], tp.mesh), "h[B, T, D]");
}

TEST(ProgramClaims, A96LayerStackOn8192DevicesAllReducesTwicePerLayerEachWay) {
  const program::Graph g = load("examples/programs/gpt96.prog");
  EXPECT_EQ(g.mesh.device_count(), 8192);
  const nn::ProgramPrediction p = nn::predict_program(g, h100());
  // Tensor parallel on X: after attention and after the MLP, and their duals for the norms'
  // inputs; data parallel on Y: each of the 6 x 96 weights' gradients summed over Y.
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2 * 96}}));
  EXPECT_EQ(collectives(p, autodiff::Phase::backward, g.mesh),
            (Counts{{"all_reduce over X", 2 * 96}, {"all_reduce over Y", 6 * 96}}));
}

}  // namespace
}  // namespace shardmm
