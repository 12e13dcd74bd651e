// The program solver: its factors add up to what `shardmm program` predicts for the same
// specs, its three solvers agree, and its answer is the Scaling Book's where the book says.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "repo_files.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/layers.h"
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
      // Random leaves; the rest (einsum results by choice, every other tensor by its op) by
      // the dynamic program.
      ChoiceProblem fixed = c.problem;
      for (std::size_t v = 0; v < c.values.size(); ++v) {
        if (!c.chosen[v] || g.tensors[static_cast<std::size_t>(c.tensor_of_var[v])].role == program::Role::computed) continue;
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


// ---- The three solvers on random problems: the same optimum, the memory limit honoured.

ChoiceProblem random_problem(std::mt19937& rng) {
  ChoiceProblem p;
  const int vars = std::uniform_int_distribution<int>(1, 6)(rng);
  for (int v = 0; v < vars; ++v) p.domain.push_back(std::uniform_int_distribution<int>(1, 4)(rng));
  const int shared = std::uniform_int_distribution<int>(0, 2)(rng);
  for (int s = 0; s < shared; ++s) {
    SharedTerm t;
    t.var = std::uniform_int_distribution<int>(0, vars - 1)(rng);
    for (int d = 0; d < p.domain[static_cast<std::size_t>(t.var)]; ++d) t.bytes.push_back(std::uniform_int_distribution<int>(0, 50)(rng));
    p.shared.push_back(t);
  }
  const int factors = std::uniform_int_distribution<int>(1, 7)(rng);
  for (int k = 0; k < factors; ++k) {
    Factor f;
    const int arity = std::uniform_int_distribution<int>(1, std::min(3, vars))(rng);
    while (static_cast<int>(f.vars.size()) < arity) {
      const int v = std::uniform_int_distribution<int>(0, vars - 1)(rng);
      if (std::find(f.vars.begin(), f.vars.end(), v) == f.vars.end()) f.vars.push_back(v);
    }
    // Every tuple, most of them allowed.
    std::vector<int> t(f.vars.size(), 0);
    while (true) {
      if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.8) {
        FactorEntry e{t, std::uniform_int_distribution<int>(0, 1000)(rng) * 1e-6, std::uniform_int_distribution<int>(0, 100)(rng), {}};
        for (std::size_t s = 0; s < p.shared.size(); ++s) {
          const bool holds = std::find(f.vars.begin(), f.vars.end(), p.shared[s].var) != f.vars.end();
          if (holds && std::uniform_int_distribution<int>(0, 1)(rng)) e.shared.push_back(static_cast<int>(s));
        }
        f.entries.push_back(e);
      }
      std::size_t i = 0;
      while (i < t.size() && ++t[i] == p.domain[static_cast<std::size_t>(f.vars[i])]) t[i++] = 0;
      if (i == t.size()) break;
    }
    p.factors.push_back(f);
  }
  return p;
}

TEST(Solvers, AgreeWithExhaustiveSearchOnRandomProblems) {
  std::mt19937 rng(11);
  int feasible = 0, limited = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ChoiceProblem p = random_problem(rng);
    SolveLimits free;
    const SolveOutcome truth = solve_exhaustive(p, free);
    const std::optional<SolveOutcome> dp = solve_elimination(p);
    ASSERT_TRUE(dp.has_value());
    const SolveOutcome mip = solve_mip(p, free);
    ASSERT_EQ(dp->status, truth.status) << trial;
    ASSERT_EQ(mip.status, truth.status) << trial;
    if (truth.status != SolveStatus::optimal) continue;
    ++feasible;
    EXPECT_NEAR(dp->value.time, truth.value.time, 1e-12) << trial;
    EXPECT_NEAR(mip.value.time, truth.value.time, 1e-9) << trial;
    EXPECT_TRUE(evaluate(p, mip.best).allowed) << trial;

    // A memory limit between the least and the optimum's memory makes it bind (or not).
    SolveLimits tight;
    tight.memory_limit = truth.value.memory - std::uniform_int_distribution<int>(0, 80)(rng);
    const SolveOutcome t = solve_exhaustive(p, tight);
    const SolveOutcome m = solve_mip(p, tight);
    ASSERT_EQ(m.status, t.status) << trial;
    if (t.status == SolveStatus::optimal) {
      ++limited;
      EXPECT_NEAR(m.value.time, t.value.time, 1e-9) << trial;
      EXPECT_LE(m.value.memory, *tight.memory_limit) << trial;
    }

    // The second best distinct assignment.
    SolveLimits second;
    second.excluded = {truth.best};
    const SolveOutcome x = solve_exhaustive(p, second);
    const SolveOutcome y = solve_mip(p, second);
    ASSERT_EQ(y.status, x.status) << trial;
    if (x.status == SolveStatus::optimal) {
      EXPECT_NEAR(y.value.time, x.value.time, 1e-9) << trial;
      EXPECT_NE(y.best, truth.best) << trial;
    }
  }
  EXPECT_GT(feasible, 200);
  EXPECT_GT(limited, 50);
}

// ---- Programs

// A program of the repository with its pins removed.
program::Program free_program(const std::string& file) {
  program::Program p = program::parse_program(testing::read_repo_file(file), file);
  std::function<void(std::vector<program::Item>&)> unpin = [&](std::vector<program::Item>& items) {
    for (program::Item& it : items) {
      if (it.kind == program::Item::Kind::repeat) unpin(it.body);
      it.statement.spec.reset();
    }
  };
  unpin(p.items);
  return p;
}

program::Graph free_graph(const std::string& file, program::BindOptions options = {}) {
  return program::bind(free_program(file), options);
}

program::BindOptions on_mesh(const std::string& mesh) {
  program::BindOptions o;
  o.mesh = Mesh::parse(mesh);
  return o;
}

std::string spec_of(const SolveResult& r, const program::Graph& g, const std::string& name) {
  return format_spec(r.specs[static_cast<std::size_t>(g.find(name))], g.mesh);
}

// The Scaling Book's Megatron MLP: the first weight split along F (column parallel), the
// second along F too (row parallel), one all_reduce forward and its dual backward.
TEST(Solve, FindsMegatronTensorParallelismForTheMlp) {
  const program::Graph g = free_graph("examples/programs/mlp_free.prog");
  SolveOptions o;
  o.program = bf16();
  const SolveResult r = solve_program(g, o);
  EXPECT_EQ(r.outcome.status, SolveStatus::optimal);
  EXPECT_EQ(spec_of(r, g, "w_in"), "w_in[D, F_X]");
  EXPECT_EQ(spec_of(r, g, "w_out"), "w_out[F_X, D]");
  int all_reduces = 0;
  for (const nn::CollectiveTally& t : nn::tally_collectives(r.prediction.events)) {
    if (t.op == OpKind::all_reduce) all_reduces += static_cast<int>(t.count);
  }
  EXPECT_EQ(all_reduces, 2);
  // The program costs the answer as the solver did, and no named strategy beats it.
  EXPECT_NEAR(predicted_time(r.prediction), r.outcome.value.time, 1e-12);
  EXPECT_EQ(r.prediction.memory.total(), r.outcome.value.memory);
  ASSERT_FALSE(r.named.empty());
  for (const NamedStrategy& s : r.named) {
    if (!s.outcome.best.empty()) EXPECT_GE(s.outcome.value.time, r.outcome.value.time - 1e-15) << s.name;
  }
}

// Within less memory than tensor parallelism needs, the activations between the blocks are
// split too (sequence or batch): all_gather before, reduce_scatter after, as the book's
// sequence parallelism does, for the same time.
TEST(Solve, AMemoryLimitThatBindsIsHonouredByTheIntegerProgram) {
  const program::Graph g = free_graph("examples/programs/mlp_free.prog");
  SolveOptions o;
  o.program = bf16();
  const SolveResult free = solve_program(g, o);
  o.memory_limit = free.outcome.value.memory * 3 / 4;
  const SolveResult r = solve_program(g, o);
  EXPECT_EQ(r.outcome.method, "integer program (CBC)");
  EXPECT_EQ(r.outcome.status, SolveStatus::optimal);
  EXPECT_LE(r.prediction.memory.total(), *o.memory_limit);
  EXPECT_GE(r.outcome.value.time, free.outcome.value.time);
  ASSERT_TRUE(r.unconstrained.has_value());
  EXPECT_NEAR(r.unconstrained->value.time, free.outcome.value.time, 1e-15);
  o.memory_limit = 1 << 20;
  EXPECT_THROW(solve_program(g, o), InputError);
}

// The solver's optimum on a whole program equals exhaustive search over the same choices.
TEST(Solve, ProgramOptimumEqualsExhaustiveSearch) {
  program::BindOptions small;
  small.mesh = Mesh::parse("X=2");
  small.dims = DimSizes{{"B", 2}, {"T", 4}, {"D", 8}, {"F", 16}};
  const program::Graph g = free_graph("examples/programs/mlp_free.prog", small);
  const ProgramChoices c = build_choices(g, bf16());
  const SolveOutcome truth = solve_exhaustive(c.problem, {});
  const std::optional<SolveOutcome> dp = solve_elimination(c.problem);
  ASSERT_TRUE(dp.has_value());
  EXPECT_NEAR(dp->value.time, truth.value.time, 1e-15);
  SolveLimits tight;
  tight.memory_limit = truth.value.memory - 1;
  const SolveOutcome t = solve_exhaustive(c.problem, tight);
  const SolveOutcome m = solve_mip(c.problem, tight);
  ASSERT_EQ(m.status, t.status);
  if (t.status == SolveStatus::optimal) EXPECT_NEAR(m.value.time, t.value.time, 1e-15);
}

// --emit's program parses, binds and costs as the solver's answer.
TEST(Solve, PinnedProgramCostsWhatTheSolverFound) {
  for (const char* file : {"examples/programs/mlp_free.prog", "examples/programs/gpt.prog"}) {
    const program::Program p = free_program(file);
    const program::Graph g = program::bind(p, on_mesh("X=2"));
    SolveOptions o;
    o.program = bf16();
    o.named = false;
    const SolveResult r = solve_program(g, o);
    const std::string text = program::format_program(pinned_program(p, g, r.specs));
    const program::Graph again = program::bind(program::parse_program(text, "emitted.prog"), {});
    const nn::ProgramPrediction q = nn::predict_program(again, o.program);
    EXPECT_NEAR(predicted_time(q), predicted_time(r.prediction), 1e-15) << file << "\n" << text;
    EXPECT_EQ(q.memory.total(), r.prediction.memory.total()) << file;
    for (std::size_t t = 0; t < g.tensors.size(); ++t) EXPECT_EQ(q.record.specs[t], r.prediction.record.specs[t]) << file << " " << g.tensors[t].name;
  }
}

// A repeat block is solved once: 2 or 6 layers make the same problem, costs scaled.
TEST(Solve, RepeatBlocksShareTheirChoices) {
  const auto layers = [&](int n) {
    program::Program p = free_program("examples/programs/gpt.prog");
    for (program::Item& item : p.items) {
      if (item.kind == program::Item::Kind::repeat) item.count = n;
    }
    return program::bind(p, on_mesh("X=2"));
  };
  const ProgramChoices two = build_choices(layers(2), bf16());
  const ProgramChoices six = build_choices(layers(6), bf16());
  EXPECT_EQ(two.problem.domain, six.problem.domain);
  EXPECT_EQ(two.evaluations, six.evaluations);
}

}  // namespace
}  // namespace shardmm::solve
