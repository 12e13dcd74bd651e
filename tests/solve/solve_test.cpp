// The program solver: its factors add up to what `shardmm program` predicts for the same
// specs, its three solvers agree, and its answer is the Scaling Book's where the book says.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "repo_files.h"
#include "shardmm/solve/solve.h"

namespace shardmm::solve {
namespace {

program::Graph graph(const std::string& text, program::BindOptions options = {}) {
  return program::bind(program::parse_program(text, "test.prog"), options);
}

nn::ProgramOptions bf16(bool train = true) {
  nn::ProgramOptions o;
  o.dtype = DType::bf16;
  o.train = train;
  return o;
}

double predicted_time(const nn::ProgramPrediction& p) {
  double s = 0;
  for (const autodiff::TapeEvent& e : p.events) s += e.step.time_s;
  return s;
}

const char* kMlp = R"(
mesh   X=2
dims   B=4, T=8, D=16, F=32
input  x[B, T, D]
param  w_in[D, F]
param  w_out[F, D]
input  g[B, T, D]
h[B, T, D]   = layer_norm(x, over=D)
u[B, T, F]   = h @ w_in
a[B, T, F]   = gelu(u)
y[B, T, D]   = a @ w_out
out[B, T, D] = x + y
loss sum(out * g)
)";

// Each tensor read once: the program's cost is the sum of its ops' costs.
const char* kChain = R"(
mesh   X=2, Y=2
dims   B=4, T=8, D=16, F=32
input  x[B, T, D]
param  w_in[D, F]
param  w_out[F, D]
h[B, T, D]   = layer_norm(x, over=D)
u[B, T, F]   = h @ w_in
a[B, T, F]   = gelu(u)
y[B, T, D]   = a @ w_out
loss sum(y)
)";

TEST(Choices, RandomAssignmentsCostWhatTheProgramPredicts) {
  const program::Graph g = graph(kChain);
  for (bool train : {true, false}) {
    const nn::ProgramOptions o = bf16(train);
    const ProgramChoices c = build_choices(g, o);
    std::mt19937 rng(7);
    int checked = 0;
    for (int trial = 0; trial < 200 && checked < 40; ++trial) {
      // Random choices; the consequences (every other tensor's spec) by the dynamic program.
      ChoiceProblem fixed = c.problem;
      for (std::size_t v = 0; v < c.values.size(); ++v) {
        if (!c.chosen[v]) continue;
        const int value = std::uniform_int_distribution<int>(0, c.problem.domain[v] - 1)(rng);
        for (Factor& f : fixed.factors) {
          const auto at = std::find(f.vars.begin(), f.vars.end(), static_cast<int>(v));
          if (at == f.vars.end()) continue;
          std::erase_if(f.entries, [&](const FactorEntry& x) { return x.values[static_cast<std::size_t>(at - f.vars.begin())] != value; });
        }
      }
      const std::optional<SolveOutcome> one = solve_elimination(fixed);
      ASSERT_TRUE(one.has_value());
      if (one->best.empty()) continue;
      const Assignment& a = one->best;
      const Evaluation e = evaluate(c.problem, a);
      ASSERT_TRUE(e.allowed);
      ++checked;
      const nn::ProgramPrediction p = nn::predict_program(pinned_graph(g, specs_of(c, a)), o);
      EXPECT_NEAR(e.time, predicted_time(p), 1e-9 * predicted_time(p) + 1e-15) << "train " << train << " trial " << trial;
      EXPECT_EQ(e.memory, p.memory.total()) << "train " << train << " trial " << trial;
    }
    EXPECT_GE(checked, 20);
  }
}

}  // namespace
}  // namespace shardmm::solve
