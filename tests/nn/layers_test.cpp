// Each parallel layer's program (nn::model_program) stepped on real thread ranks against its
// dense f64 step, and the seeds' claims read off the step's own trace (and the symbolic
// prediction of it).
#include <gtest/gtest.h>

#include <mutex>

#include "shardmm/core/error.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/nn/model.h"
#include "shardmm/nn/program.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::nn {
namespace {

using autodiff::Phase;

struct Case {
  const char* layer;
  const char* strategy;
  const char* mesh;
  const char* dims;
  bool causal = false;
  bool train = true;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.layer << " --strategy " << c.strategy << " --mesh " << c.mesh << " --dims " << c.dims
      << (c.causal ? " --causal" : "") << (c.train ? "" : " --infer");
}

ModelConfig config(const Case& c) {
  ModelConfig m = make_model_config(c.layer, c.strategy, Mesh::parse(c.mesh), parse_dims(c.dims));
  m.causal = c.causal;
  m.train = c.train;
  m.capacity_factor = 1.0;
  return m;
}

ProgramOptions options(const ModelConfig& m, DType dtype) {
  ProgramOptions o;
  o.dtype = dtype;
  o.train = m.train;
  o.seed = 7;
  return o;
}

ProgramPrediction predict(const ModelConfig& m) { return predict_program(model_program(m), options(m, DType::f64)); }

// Runs the step on threads; returns device 0's record.
ProgramRun run(const ModelConfig& m, DType dtype = DType::f64) {
  const program::Graph g = model_program(m);
  ProgramRun mine;
  std::mutex lock;
  run_threads(m.mesh, [&](Communicator& comm) {
    ProgramRun s = run_program(comm, g, options(m, dtype));
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> g(lock);
      mine = std::move(s);
    }
  });
  return mine;
}

// count and bytes of one collective in one phase (0 when absent).
CollectiveTally find(const std::vector<CollectiveTally>& t, Phase phase, OpKind op) {
  for (const CollectiveTally& x : t) {
    if (x.phase == phase && x.op == op) return x;
  }
  return {phase, op, {}, 0, 0, 0};
}

int total_count(const std::vector<CollectiveTally>& t) {
  int n = 0;
  for (const CollectiveTally& x : t) n += x.count;
  return n;
}

std::int64_t total_bytes(const std::vector<CollectiveTally>& t) {
  std::int64_t n = 0;
  for (const CollectiveTally& x : t) n += x.bytes;
  return n;
}

class LayerStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(LayerStepTest, MatchesTheDenseStepAndItsPrediction) {
  const ModelConfig m = config(GetParam());
  const ProgramRun s = run(m);
  EXPECT_TRUE(s.verification.verified) << s.verification.detail;
  EXPECT_GT(s.verification.tolerance, 0.0);
  // The symbolic tape records the same collectives, with the bytes the ranks moved.
  const ProgramPrediction p = predict(m);
  const auto predicted = tally_collectives(p.events), measured = tally_collectives(s.events, &s.max_bytes_sent);
  ASSERT_EQ(predicted.size(), measured.size());
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    EXPECT_EQ(predicted[i].op, measured[i].op);
    EXPECT_EQ(predicted[i].count, measured[i].count) << to_string(predicted[i].op);
    EXPECT_EQ(predicted[i].bytes, measured[i].bytes) << to_string(predicted[i].op);
  }
  EXPECT_EQ(p.memory.activations, s.memory.activations);
  EXPECT_EQ(p.memory.total(), s.memory.total());
}

INSTANTIATE_TEST_SUITE_P(
    Layers, LayerStepTest,
    ::testing::Values(
        Case{"mlp", "tp", "X=2", "B=2,T=3,D=4,F=6"}, Case{"mlp", "tp", "X=3", "B=2,T=3,D=4,F=7"},
        Case{"mlp", "sp", "X=2", "B=2,T=5,D=4,F=6"}, Case{"mlp", "dp", "X=2", "B=3,T=2,D=4,F=6"},
        Case{"mlp", "fsdp", "X=2", "B=3,T=2,D=4,F=5"}, Case{"mlp", "dp+tp", "X=2,Y=2", "B=3,T=2,D=4,F=6"},
        Case{"attention", "tp", "X=2", "B=2,T=4,D=6,H=3"}, Case{"attention", "tp", "X=2", "B=2,T=4,D=6,H=3", true},
        Case{"attention", "sp", "X=2", "B=1,T=3,D=4,H=2", true}, Case{"attention", "fsdp", "X=2", "B=3,T=2,D=4,H=2"},
        Case{"block", "tp", "X=2", "B=2,T=3,D=6,F=5,H=3", true},
        Case{"block", "tp", "X=2", "B=2,T=3,D=6,F=5,H=3", true, false},
        Case{"block", "sp", "X=2", "B=2,T=3,D=6,F=5,H=2"}, Case{"block", "dp", "X=2", "B=3,T=2,D=4,F=3,H=2"},
        Case{"block", "fsdp", "X=2", "B=2,T=2,D=4,F=3,H=2"},
        Case{"block", "dp+sp", "X=2,Y=2", "B=2,T=3,D=4,F=6,H=2", true},
        Case{"moe", "ep", "X=2", "B=3,T=4,D=4,F=5,E=3,K=2"}, Case{"moe", "ep", "X=3", "B=3,T=5,D=4,F=3,E=4"},
        Case{"moe", "dp", "X=2", "B=3,T=4,D=4,F=5,E=3,K=2"}));

TEST(LayerClaimsTest, MegatronMlpHasOneAllReduceEachWay) {
  const ProgramRun s = run(config({"mlp", "tp", "X=2", "B=2,T=3,D=4,F=6"}));
  const auto t = tally_collectives(s.events, &s.max_bytes_sent);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_reduce).count, 1);
  EXPECT_EQ(find(t, Phase::backward, OpKind::all_reduce).count, 1);
  EXPECT_EQ(total_count(t), 2);
  // Y and dX are [B, T, D] in f64: 2 * (N - 1) / N of 192 bytes each way.
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_reduce).bytes, 192);
}

TEST(LayerClaimsTest, DecoderBlockHasFourAllReducesInTrainingAndTwoInInference) {
  const auto train = tally_collectives(run(config({"block", "tp", "X=2", "B=2,T=3,D=4,F=6,H=2"})).events);
  EXPECT_EQ(find(train, Phase::forward, OpKind::all_reduce).count, 2);
  EXPECT_EQ(find(train, Phase::backward, OpKind::all_reduce).count, 2);
  EXPECT_EQ(total_count(train), 4);
  const auto infer = tally_collectives(run(config({"block", "tp", "X=2", "B=2,T=3,D=4,F=6,H=2", false, false})).events);
  EXPECT_EQ(find(infer, Phase::forward, OpKind::all_reduce).count, 2);
  EXPECT_EQ(total_count(infer), 2);
}

TEST(LayerClaimsTest, SequenceParallelSplitsEachAllReduceIntoEqualBytesAndShardsLayerNorms) {
  const int n = 4;
  const ModelConfig tp = config({"block", "tp", "X=4", "B=2,T=8,D=8,F=8,H=4"});
  const ModelConfig sp = config({"block", "sp", "X=4", "B=2,T=8,D=8,F=8,H=4"});
  const ProgramRun a = run(tp), b = run(sp);
  ASSERT_TRUE(b.verification.verified) << b.verification.detail;
  const auto ta = tally_collectives(a.events, &a.max_bytes_sent), tb = tally_collectives(b.events, &b.max_bytes_sent);
  for (Phase phase : {Phase::forward, Phase::backward}) {
    const int reduces = find(ta, phase, OpKind::all_reduce).count;
    EXPECT_EQ(reduces, 2);
    EXPECT_EQ(find(tb, phase, OpKind::all_reduce).count, 0);
    EXPECT_EQ(find(tb, phase, OpKind::all_gather).count, reduces);
    EXPECT_EQ(find(tb, phase, OpKind::reduce_scatter).count, reduces);
    EXPECT_EQ(find(tb, phase, OpKind::all_gather).bytes + find(tb, phase, OpKind::reduce_scatter).bytes,
              find(ta, phase, OpKind::all_reduce).bytes);
  }
  // What the residual stream keeps for backward is on T/N rows under sp: the residual sum r
  // (the second norm's input) and the output Y (which the loss's backward reads), [B, T, D]
  // each, and the norms' statistics (2 per row each). The tensor-parallel region's
  // activations are whole under both, so the difference is exactly (1 - 1/N) of the
  // stream's share. (The first norm's input is the layer's input X, counted with the inputs.)
  const std::int64_t rows = 2 * 8, row_bytes = 8 * 8;
  const std::int64_t residual = rows * row_bytes, stats = 2 * (2 * rows * 8);
  EXPECT_EQ(a.memory.activations - b.memory.activations, (2 * residual + stats) - (2 * residual + stats) / n);
  // The inputs X and G are [B, T_X, D] under sp.
  EXPECT_EQ(a.memory.inputs - b.memory.inputs, 2 * (residual - residual / n));
}

// The MLP alone has no layer norm outside the tensor-parallel region: sp keeps what tp keeps
// inside it (W_in's output before and after the activation, split by F), its gathered input
// (tp reads its replicated input X itself, counted with the inputs) and 1/N of the output Y
// that the loss's backward reads.
TEST(LayerClaimsTest, SequenceParallelKeepsWhatTensorParallelKeepsForAnMlp) {
  const int n = 4;
  const ProgramRun tp = run(config({"mlp", "tp", "X=4", "B=2,T=8,D=8,F=16"}));
  const ProgramRun sp = run(config({"mlp", "sp", "X=4", "B=2,T=8,D=8,F=16"}));
  ASSERT_TRUE(sp.verification.verified) << sp.verification.detail;
  const std::int64_t f64 = 8, x = 2 * 8 * 8 * f64, h = 2 * 8 * (16 / n) * f64;
  EXPECT_EQ(tp.memory.activations, 2 * h + x) << "W_in's output before and after the activation, and Y";
  EXPECT_EQ(sp.memory.activations, x + 2 * h + x / n) << "the gathered X, the same two, and Y's shard";
  EXPECT_EQ(tp.memory.inputs, 2 * x);
  EXPECT_EQ(sp.memory.inputs, 2 * x / n);
}

TEST(LayerClaimsTest, FsdpMovesOneAndAHalfTimesDataParallel) {
  const ProgramRun dp_run = run(config({"mlp", "dp", "X=4", "B=4,T=2,D=8,F=16"}));
  const ProgramRun fsdp_run = run(config({"mlp", "fsdp", "X=4", "B=4,T=2,D=8,F=16"}));
  const auto dp = tally_collectives(dp_run.events), fsdp = tally_collectives(fsdp_run.events);
  EXPECT_EQ(4 * fsdp_run.memory.params, dp_run.memory.params);
  // DP: one all_reduce per weight gradient (2V); FSDP: all_gather forward and backward, reduce_scatter (3V).
  EXPECT_EQ(find(dp, Phase::backward, OpKind::all_reduce).count, 2);
  EXPECT_EQ(total_count(dp), 2);
  EXPECT_EQ(find(fsdp, Phase::forward, OpKind::all_gather).count, 2);
  EXPECT_EQ(find(fsdp, Phase::backward, OpKind::all_gather).count, 2);
  EXPECT_EQ(find(fsdp, Phase::backward, OpKind::reduce_scatter).count, 2);
  EXPECT_EQ(total_count(fsdp), 6);
  EXPECT_EQ(2 * total_bytes(fsdp), 3 * total_bytes(dp));
}

TEST(LayerClaimsTest, MoeDispatchAndCombineAreAllToAll) {
  const ProgramRun s = run(config({"moe", "ep", "X=2", "B=4,T=4,D=4,F=5,E=4,K=2"}));
  ASSERT_TRUE(s.verification.verified) << s.verification.detail;
  const auto t = tally_collectives(s.events, &s.max_bytes_sent);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_to_all).count, 2);
  EXPECT_EQ(find(t, Phase::backward, OpKind::all_to_all).count, 2);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_reduce).count, 0);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_gather).count, 0);
}

TEST(LayerClaimsTest, F32StepVerifiesWithinItsTolerance) {
  const ProgramRun s = run(config({"block", "sp", "X=2", "B=2,T=3,D=6,F=5,H=2"}), DType::f32);
  EXPECT_TRUE(s.verification.verified) << s.verification.detail;
  EXPECT_GT(s.verification.max_abs_error, 0.0);
}

}  // namespace
}  // namespace shardmm::nn
