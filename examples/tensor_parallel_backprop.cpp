// Gradients of a sharded program: seed 003's two-rank FFN run for real, then the same MLP
// at model size on a symbolic tape to predict its communication.
// Build: part of the project (target example_tensor_parallel_backprop).
//
//   build/examples/example_tensor_parallel_backprop
#include <iostream>
#include <vector>

#include "shardmm/autodiff/tape.h"

namespace {

using namespace shardmm;
using namespace shardmm::autodiff;

DistTensor::Generator dense(std::vector<double> values, std::int64_t columns) {
  return [values = std::move(values), columns](const Index& i, std::int64_t) {
    return values[static_cast<std::size_t>(i[0] * columns + i[1])];
  };
}

std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(static_cast<long long>(v[i]));
  return s + "]";
}

void print_collectives(const Tape& tape) {
  for (const TapeEvent& e : tape.events()) {
    if (!is_collective(e.step.op)) continue;
    std::cout << "  " << to_string(e.phase) << " " << to_string(e.step.op) << " over "
              << tape.mesh().axis_names(e.step.axes) << ": " << format_spec(e.step.from, tape.mesh()) << " -> "
              << format_spec(e.step.to, tape.mesh()) << ", " << e.step.bytes_sent << " bytes sent per device\n";
  }
}

}  // namespace

int main() {
  // x = [2, -1]; A = [A0 | A1] column parallel, B = [B0; B1] row parallel; loss = sum(y).
  const Mesh mesh = Mesh::parse("X=2");
  std::vector<double> y, dx;
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    Var x = tape.input("x[N, D]", {{"N", 1}, {"D", 2}}, dense({2, -1}, 2), true);
    Var a = tape.input("A[D, F_X]", {{"D", 2}, {"F", 4}}, dense({1, 0, -1, 2, 1, 1, 0, 0}, 4), true);
    Var b = tape.input("B[F_X, E]", {{"F", 4}, {"E", 2}}, dense({1, 2, 0, 1, 1, 0, 2, 1}, 2), true);
    Var out = all_reduce(einsum(relu(einsum(x, a, {"N", "F"})), b, {"N", "E"}), tape.axes("X"));
    // gather_global returns the logical tensor on device 0 only.
    std::vector<double> y_global = gather_global(comm, out.value());
    tape.backward(sum(out));
    std::vector<double> dx_global = gather_global(comm, tape.grad(x));
    if (comm.rank() == 0) {
      y = std::move(y_global);
      dx = std::move(dx_global);
      std::cout << "seed 003 on 2 ranks:\n";
      print_collectives(tape);
    }
  });
  std::cout << "output " << list(y) << ", input gradient " << list(dx) << "\n";

  // The same MLP at model size, bf16 on 8 devices: nothing is allocated.
  Tape plan(Mesh::parse("X=8"), {DType::bf16, builtin_profile("h100")});
  const DimSizes sizes{{"B", 4096}, {"D", 8192}, {"F", 32768}};
  const auto none = [](const Index&, std::int64_t) { return 0.0; };
  Var x = plan.input("x[B, D]", sizes, none, true);
  Var w1 = plan.input("W1[D, F_X]", sizes, none, true);
  Var w2 = plan.input("W2[F_X, D]", sizes, none, true);
  plan.backward(mean(all_reduce(einsum(gelu(einsum(x, w1, {"B", "F"})), w2, {"B", "D"}), plan.axes("X"))));
  double seconds = 0;
  for (const TapeEvent& e : plan.events()) seconds += e.step.time_s;
  std::cout << "Megatron MLP B=4096 D=8192 F=32768 on X=8 (bf16, h100), predicted:\n";
  print_collectives(plan);
  std::cout << "  " << plan.memory().activations << " activation bytes per device; " << seconds << " s serialized\n";
  return y == std::vector<double>{9, 6} && dx == std::vector<double>{9, 3} ? 0 : 1;
}
