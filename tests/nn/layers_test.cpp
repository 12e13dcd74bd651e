// Each parallel layer's training step on real thread ranks against the dense step, and the
// seeds' claims read off the step's own trace (and the symbolic prediction of it).
#include "shardmm/nn/layers.h"

#include <gtest/gtest.h>

#include <mutex>

#include "shardmm/core/error.h"

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
  m.attention.causal = c.causal;
  m.train = c.train;
  m.capacity_factor = 1.0;
  return m;
}

// Runs the step on threads; returns device 0's record.
LayerStep run(const ModelConfig& m, DType dtype = DType::f64) {
  LayerStep mine;
  std::mutex lock;
  run_threads(m.mesh, [&](Communicator& comm) {
    LayerStep s = run_layer_step(comm, m, {dtype, 0.1, 7, builtin_profile("h100")});
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
  const LayerStep s = run(m);
  EXPECT_TRUE(s.verification.verified) << s.verification.detail;
  EXPECT_GT(s.verification.tolerance, 0.0);
  // The symbolic tape records the same collectives, with the bytes the ranks moved.
  const LayerPrediction p = predict_layer(m, DType::f64, builtin_profile("h100"));
  const auto predicted = tally_collectives(p.events), measured = tally_collectives(s.events, &s.max_bytes_sent);
  ASSERT_EQ(predicted.size(), measured.size());
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    EXPECT_EQ(predicted[i].op, measured[i].op);
    EXPECT_EQ(predicted[i].count, measured[i].count) << to_string(predicted[i].op);
    EXPECT_EQ(predicted[i].bytes, measured[i].bytes) << to_string(predicted[i].op);
  }
  EXPECT_EQ(p.memory.activations, s.memory.activations);
  EXPECT_EQ(p.memory.leaves, s.memory.leaves);
}

INSTANTIATE_TEST_SUITE_P(
    Layers, LayerStepTest,
    ::testing::Values(Case{"mlp", "tp", "X=2", "B=2,T=3,D=4,F=6"}, Case{"mlp", "tp", "X=3", "B=2,T=3,D=4,F=7"},
                      Case{"mlp", "sp", "X=2", "B=2,T=5,D=4,F=6"}, Case{"mlp", "dp", "X=2", "B=3,T=2,D=4,F=6"},
                      Case{"mlp", "fsdp", "X=2", "B=3,T=2,D=4,F=5"}, Case{"mlp", "dp+tp", "X=2,Y=2", "B=3,T=2,D=4,F=6"},
                      Case{"attention", "tp", "X=2", "B=2,T=4,D=6,H=3"},
                      Case{"attention", "tp", "X=2", "B=2,T=4,D=6,H=3", true},
                      Case{"attention", "sp", "X=2", "B=1,T=3,D=4,H=2", true},
                      Case{"attention", "fsdp", "X=2", "B=3,T=2,D=4,H=2"},
                      Case{"block", "tp", "X=2", "B=2,T=3,D=6,F=5,H=3", true},
                      Case{"block", "tp", "X=2", "B=2,T=3,D=6,F=5,H=3", true, false},
                      Case{"block", "sp", "X=2", "B=2,T=3,D=6,F=5,H=2"}, Case{"block", "dp", "X=2", "B=3,T=2,D=4,F=3,H=2"},
                      Case{"block", "fsdp", "X=2", "B=2,T=2,D=4,F=3,H=2"},
                      Case{"block", "dp+sp", "X=2,Y=2", "B=2,T=3,D=4,F=6,H=2", true},
                      Case{"moe", "ep", "X=2", "B=3,T=4,D=4,F=5,E=3,K=2"}, Case{"moe", "ep", "X=3", "B=3,T=5,D=4,F=3,E=4"},
                      Case{"moe", "dp", "X=2", "B=3,T=4,D=4,F=5,E=3,K=2"}));

TEST(LayerClaimsTest, MegatronMlpHasOneAllReduceEachWay) {
  const LayerStep s = run(config({"mlp", "tp", "X=2", "B=2,T=3,D=4,F=6"}));
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
  const LayerStep a = run(tp), b = run(sp);
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
  // What the layer norms keep for backward is on T/N rows under sp: their inputs (the
  // layer's input X and the residual sum a, [B, T, D] each) and their statistics (2 per row
  // each). The tensor-parallel region's activations are whole under both, so the difference
  // is exactly (1 - 1/N) of the layer norms' share.
  const std::int64_t rows = 2 * 8, row_bytes = 8 * 8;
  const std::int64_t residual = rows * row_bytes, stats = 2 * (2 * rows * 8);
  EXPECT_EQ(a.memory.activations - b.memory.activations, (2 * residual + stats) - (2 * residual + stats) / n);
  // The loss's seed G is a [B, T_X, D] leaf under sp.
  EXPECT_EQ(a.memory.leaves - b.memory.leaves, residual - residual / n);
}

// The MLP alone has no layer norm outside the tensor-parallel region: sp keeps what tp keeps,
// its gathered input in place of tp's replicated one (both counted as the layer's input).
TEST(LayerClaimsTest, SequenceParallelKeepsWhatTensorParallelKeepsForAnMlp) {
  const int n = 4;
  const LayerStep tp = run(config({"mlp", "tp", "X=4", "B=2,T=8,D=8,F=16"}));
  const LayerStep sp = run(config({"mlp", "sp", "X=4", "B=2,T=8,D=8,F=16"}));
  ASSERT_TRUE(sp.verification.verified) << sp.verification.detail;
  const std::int64_t f64 = 8, x = 2 * 8 * 8 * f64, h = 2 * 8 * (16 / n) * f64;
  EXPECT_EQ(tp.memory.activations, x + 2 * h) << "X, and W_in's output before and after the activation";
  EXPECT_EQ(sp.memory.activations, tp.memory.activations);
}

TEST(LayerClaimsTest, FsdpMovesOneAndAHalfTimesDataParallel) {
  const auto dp = tally_collectives(run(config({"mlp", "dp", "X=4", "B=4,T=2,D=8,F=16"})).events);
  const auto fsdp = tally_collectives(run(config({"mlp", "fsdp", "X=4", "B=4,T=2,D=8,F=16"})).events);
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
  const LayerStep s = run(config({"moe", "ep", "X=2", "B=4,T=4,D=4,F=5,E=4,K=2"}));
  ASSERT_TRUE(s.verification.verified) << s.verification.detail;
  const auto t = tally_collectives(s.events, &s.max_bytes_sent);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_to_all).count, 2);
  EXPECT_EQ(find(t, Phase::backward, OpKind::all_to_all).count, 2);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_reduce).count, 0);
  EXPECT_EQ(find(t, Phase::forward, OpKind::all_gather).count, 0);
}

TEST(LayerClaimsTest, F32StepVerifiesWithinItsTolerance) {
  const LayerStep s = run(config({"block", "sp", "X=2", "B=2,T=3,D=6,F=5,H=2"}), DType::f32);
  EXPECT_TRUE(s.verification.verified) << s.verification.detail;
  EXPECT_GT(s.verification.max_abs_error, 0.0);
}

}  // namespace
}  // namespace shardmm::nn
