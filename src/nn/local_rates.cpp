// Local functions' per-element rates, timed where they run: each program op on a one-device
// tape (forward, backward, the update), as `shardmm program --run` runs it.
#include "shardmm/nn/local_rates.h"

#include <string>
#include <utility>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"
#include "shardmm/plan/cost.h"
#include "shardmm/program/program.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::nn {

namespace {

// The columns of every block; its rows make up the block's elements.
constexpr std::int64_t kColumns = 1024;

// One program per function (the loss's sum, the update and gradient sums come along), over
// blocks of `rows` x kColumns elements. route's block is its dispatch tensor: 8 experts of 64
// slots per token.
struct Measured {
  std::string program;
  Optimizer optimizer = Optimizer::sgd;
};

std::vector<Measured> programs(std::int64_t rows) {
  const std::string r = std::to_string(rows), c = std::to_string(kColumns);
  const std::string header = "mesh X=1\ndims R=" + r + ", C=" + c;
  const std::string x = header + "\nparam x[R, C]\n";
  // A broadcast operand: add's and sub's backward only works where it sums the gradient
  // over the letters an operand lacks.
  const std::string xb = x + "param b[C]\n";
  std::vector<Measured> out;
  for (const char* f : {"relu", "gelu", "silu", "tanh", "exp"}) {
    out.push_back({x + "y[R, C] = " + f + "(x)\nloss sum(y)\n"});
  }
  for (const char* f : {"softmax", "layer_norm", "rms_norm"}) {
    out.push_back({x + "y[R, C] = " + f + "(x, over=C)\nloss sum(y)\n"});
  }
  for (const char* f : {"sum", "mean", "max"}) out.push_back({x + "y[R] = " + f + "(x, over=C)\nloss sum(y)\n"});
  for (const char* f : {"+", "-", "*"}) out.push_back({xb + "y[R, C] = x " + f + " b\nloss sum(y)\n"});
  out.push_back({x + "y[R, C] = x * x\nloss sum(y)\n"});  // two contributions to dx: accumulate
  out.push_back({x + "y[R, C] = causal_mask(x, R, C)\nloss sum(y)\n"});
  out.push_back({x + "y[C, R] = transpose(x)\nloss sum(y)\n"});
  out.push_back({header + ", K=" + c + "\nparam x[R, C]\ny[R, K] = rename(x, C -> K)\nloss sum(y)\n"});
  out.push_back({header + ", H=32, A=" + std::to_string(kColumns / 32) +
                 "\nparam x[R, C]\ns[R, H, A] = split(x, C -> H A)\ny[R, C] = merge(s, H A -> C)\nloss sum(y)\n"});
  out.push_back({x + "y[R, C] = scale(x, 0.5)\nloss mean(y)\n", Optimizer::adam});
  out.push_back({"mesh X=1\ndims T=" + std::to_string(rows * kColumns / (8 * 64)) +
                 ", E=8, Q=64\ninput p[T, E]\nd[T, E, Q] = route(p, over=E, tokens=T, top=2)\n"});
  return out;
}

// Each local step's measured seconds and elements, by local_rate_key, added into `into`.
void collect(const std::vector<autodiff::TapeEvent>& events, std::map<std::string, std::pair<double, double>>& into) {
  for (const autodiff::TapeEvent& e : events) {
    if (e.step.op != OpKind::local || !e.executed || e.step.elements == 0) continue;
    auto& [seconds, elements] = into[local_rate_key(e.step.function, e.step.backward)];
    seconds += e.measured.end_s - e.measured.start_s;
    elements += static_cast<double>(e.step.elements);
  }
}

}  // namespace

std::map<std::string, double> measure_local_rates(DType dtype, const LocalRateOptions& options) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw UsageError(std::string("measure_local_rates: kernels run in f32 or f64, not ") + to_string(dtype));
  }
  const std::int64_t rows = options.block_bytes / dtype_bytes(dtype) / kColumns;
  if (rows < 8 || options.repeats < 1) {
    throw UsageError("measure_local_rates: blocks of 8 rows of " + std::to_string(kColumns) +
                     " elements at least, and one repeat");
  }
  std::vector<program::Graph> graphs;
  const std::vector<Measured> measured = programs(rows);
  for (const Measured& m : measured) graphs.push_back(program::bind(program::parse_program(m.program), {}));
  std::map<std::string, std::vector<double>> rates;
  run_threads(Mesh::parse("X=1"), [&](Communicator& comm) {
    const auto pass = [&](std::size_t i) {
      std::map<std::string, std::pair<double, double>> totals;
      ProgramOptions o;
      o.dtype = dtype;
      o.optimizer = measured[i].optimizer;
      autodiff::Tape tape(comm, {dtype, o.hw});
      execute_program_step(tape, graphs[i], o);
      collect(tape.events(), totals);
      return totals;
    };
    // swiglu is the tape's alone (no program op): gate and up, forward and backward.
    const auto swiglu = [&] {
      std::map<std::string, std::pair<double, double>> totals;
      autodiff::Tape tape(comm, {dtype, builtin_profile("h100")});
      const DimSizes sizes{{"R", rows}, {"C", kColumns}};
      const auto value = [](const Index& i, std::int64_t) { return 0.01 * static_cast<double>(i[1] % 200) - 1.0; };
      const autodiff::Var gate = tape.input("g[R, C]", sizes, value, true);
      const autodiff::Var up = tape.input("u[R, C]", sizes, value, true);
      tape.backward(autodiff::sum(autodiff::swiglu(gate, up)));
      collect(tape.events(), totals);
      return totals;
    };
    pass(0);  // the warm-up: the allocator learns to keep blocks of this size
    for (int k = 0; k < options.repeats; ++k) {
      std::map<std::string, std::pair<double, double>> totals;
      const auto add = [&](const std::map<std::string, std::pair<double, double>>& part) {
        for (const auto& [key, t] : part) {
          totals[key].first += t.first;
          totals[key].second += t.second;
        }
      };
      for (std::size_t i = 0; i < graphs.size(); ++i) add(pass(i));
      add(swiglu());
      for (const auto& [key, t] : totals) rates[key].push_back(t.first / t.second);
    }
  });
  std::map<std::string, double> out;
  for (const auto& [key, samples] : rates) out[key] = median(samples);
  return out;
}

}  // namespace shardmm::nn
