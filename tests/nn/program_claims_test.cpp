// The Scaling Book's claims about Megatron's layers, read off the example programs'
// symbolic steps: the tensor-parallel MLP's one all_reduce each way, the block's four in
// training and two in inference, and sequence parallelism's same bytes for 1/N of the norm
// activations.
#include <gtest/gtest.h>

#include "repo_files.h"
#include "shardmm/nn/layers.h"
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

TEST(ProgramClaims, TensorParallelMlpAllReducesOnceEachWay) {
  const program::Graph g = load("examples/programs/mlp.prog");
  const nn::ProgramPrediction p = nn::predict_program(g, {DType::bf16, builtin_profile("h100")});
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
  const nn::ProgramPrediction p = nn::predict_program(g, {DType::bf16, builtin_profile("h100")});
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_to_all over X", 2}}));
  // The router's weight is replicated: its gradient's all_reduce is data parallel's.
  EXPECT_EQ(collectives(p, autodiff::Phase::backward, g.mesh), (Counts{{"all_to_all over X", 2}, {"all_reduce over X", 1}}));
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("d"))], g.mesh), "d[B_X, T, E, C]");
  EXPECT_EQ(format_spec(p.record.specs[static_cast<std::size_t>(g.find("h"))], g.mesh), "h[B, E_X, C, F]");
  // Each all_to_all moves (N-1)/N of a device's [B/N, E, C, D] buffer.
  const std::int64_t buffer = 2 * 8 * 320 * 1024 * 2;  // bf16
  for (const nn::CollectiveTally& t : nn::tally_collectives(p.events)) {
    if (t.op == OpKind::all_to_all) EXPECT_EQ(t.bytes, t.count * buffer * 3 / 4);
  }
}

// A softmax over a split letter all-reduces its rows' max and their sums: tallied apart.
TEST(ProgramClaims, ASoftmaxOverASplitLetterAllReducesTheMaxAndTheSumApart) {
  const program::Graph g = program::bind(program::parse_program(R"(
mesh X=2
dims T=4, S=8
input s[T, S] : s[T, S_X]
p[T, S] = softmax(s, over=S)
)", "softmax.prog"), {});
  nn::ProgramOptions o{DType::bf16, builtin_profile("h100")};
  o.train = false;
  const nn::ProgramPrediction p = nn::predict_program(g, o);
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce(max) over X", 1}, {"all_reduce over X", 1}}));
}

TEST(ProgramClaims, TensorParallelBlockAllReducesFourTimesInTrainingTwiceInInference) {
  const program::Graph g = load("examples/programs/block.prog");
  nn::ProgramOptions o{DType::bf16, builtin_profile("h100")};
  const nn::ProgramPrediction train = nn::predict_program(g, o);
  EXPECT_EQ(collectives(train, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  EXPECT_EQ(collectives(train, autodiff::Phase::backward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  o.train = false;
  const nn::ProgramPrediction infer = nn::predict_program(g, o);
  EXPECT_EQ(collectives(infer, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2}}));
  EXPECT_TRUE(collectives(infer, autodiff::Phase::backward, g.mesh).empty());
}

TEST(ProgramClaims, SequenceParallelMovesTensorParallelsBytesForAQuarterOfTheNormActivations) {
  const program::Graph tp = load("examples/programs/mlp.prog");
  program::BindOptions o;
  o.specs["x"] = "x[B, T_X, D]";
  o.specs["g"] = "g[B, T_X, D]";
  const program::Graph sp = load("examples/programs/mlp.prog", o);
  const nn::ProgramOptions options{DType::bf16, builtin_profile("h100")};
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
  const nn::ProgramPrediction p = nn::predict_program(g, {DType::bf16, builtin_profile("h100")});
  // Tensor parallel on X: after attention and after the MLP, and their duals for the norms'
  // inputs; data parallel on Y: each of the 6 x 96 weights' gradients summed over Y.
  EXPECT_EQ(collectives(p, autodiff::Phase::forward, g.mesh), (Counts{{"all_reduce over X", 2 * 96}}));
  EXPECT_EQ(collectives(p, autodiff::Phase::backward, g.mesh),
            (Counts{{"all_reduce over X", 2 * 96}, {"all_reduce over Y", 6 * 96}}));
}

}  // namespace
}  // namespace shardmm
