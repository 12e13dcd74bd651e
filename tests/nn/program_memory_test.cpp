// The memory timeline of a step (autodiff::MemoryPoint, docs/programs.md "Memory over the
// step") worked by hand on a two-op program, f64 on two devices: device 0's x [2, 4] replicated
// (64 B), w [4, 3] of [4, 6] (96 B), h and a [2, 3] of [2, 6] (48 B each), the loss 8 B.
#include <gtest/gtest.h>

#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"

namespace shardmm {
namespace {

using autodiff::Phase;

constexpr const char* kProgram = R"(mesh X=2
dims B=2, D=4, F=6
input x[B, D]
param w[D, F] : w[D, F_X]
h[B, F] = x @ w
a[B, F] = relu(h)
loss sum(a)
)";

nn::ProgramMemory memory(bool train, nn::Optimizer optimizer = nn::Optimizer::sgd) {
  const program::Graph g = program::bind(program::parse_program(kProgram, "two_ops.prog"), {});
  nn::ProgramOptions o;
  o.dtype = DType::f64;
  o.train = train;
  o.optimizer = optimizer;
  return nn::predict_program(g, o).memory;
}

struct Want {
  Phase phase;
  int op;
  std::int64_t gradients, activations, transient;
};

void expect_timeline(const nn::ProgramMemory& m, const std::vector<Want>& want, std::int64_t optimizer_state) {
  ASSERT_EQ(m.timeline.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const nn::ProgramMemoryPoint& p = m.timeline[i];
    SCOPED_TRACE("point " + std::to_string(i) + " (" + autodiff::to_string(p.phase) + ", " + p.tensor + ")");
    EXPECT_EQ(p.phase, want[i].phase);
    EXPECT_EQ(p.op, want[i].op);
    EXPECT_EQ(p.params, 96);
    EXPECT_EQ(p.inputs, 64);
    EXPECT_EQ(p.optimizer_state, optimizer_state);
    EXPECT_EQ(p.gradients, want[i].gradients);
    EXPECT_EQ(p.activations, want[i].activations);
    EXPECT_EQ(p.transient, want[i].transient);
  }
}

// Training: relu keeps h for its backward until backward has run h's op (the einsum); the
// loss, read by nobody, lives only inside its op. Backward: the loss's seed and da, then dh
// beside da, then the einsum's: dh, dx (partial over X) and dw, its largest step dw's einsum
// (96 B). w's gradient arrives in w's spec; x's is all-reduced into x's (a 64 B buffer). The
// update holds both leaf gradients.
TEST(ProgramMemory, ATrainingStepsTimelineByHand) {
  const nn::ProgramMemory m = memory(true);
  expect_timeline(m,
                  {{Phase::forward, 0, 0, 48, 0},
                   {Phase::forward, 1, 0, 96, 0},
                   {Phase::forward, 2, 0, 96, 8},
                   {Phase::backward, 2, 56, 48, 0},
                   {Phase::backward, 1, 96, 48, 0},
                   {Phase::backward, 0, 208, 48, 96},
                   {Phase::backward, -1, 160, 0, 0},
                   {Phase::backward, -1, 160, 0, 64},
                   {Phase::update, -1, 160, 0, 0}},
                  0);
  EXPECT_EQ(m.peak_point, 5u);
  EXPECT_EQ(m.peak(), 96 + 64 + 208 + 48 + 96);
  EXPECT_EQ(m.timeline[6].tensor, "w");  // the leaves' reductions, the later leaf first
  EXPECT_EQ(m.timeline[7].tensor, "x");
  // Adam's moments: twice the params at every point.
  const nn::ProgramMemory adam = memory(true, nn::Optimizer::adam);
  ASSERT_EQ(adam.timeline.size(), m.timeline.size());
  for (std::size_t i = 0; i < m.timeline.size(); ++i)
    EXPECT_EQ(adam.timeline[i].total(), m.timeline[i].total() + 2 * 96);
}

// Inference: nothing is kept for backward; h dies after relu reads it.
TEST(ProgramMemory, InferenceFreesEachValueAfterItsLastReader) {
  expect_timeline(memory(false),
                  {{Phase::forward, 0, 0, 48, 0}, {Phase::forward, 1, 0, 96, 0}, {Phase::forward, 2, 0, 48, 8}}, 0);
}

}  // namespace
}  // namespace shardmm
