// causal_mask (causal_mask.h): values and gradients against the closed form on two thread
// ranks with the rows split, and the misuse it refuses. (The causal attention layers are
// checked against the dense reference in tests/nn.)
#include "shardmm/autodiff/causal_mask.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::autodiff {
namespace {

using ::testing::HasSubstr;

double at(const DistTensor& t, std::int64_t i) { return t.buffer().as<double>()[i]; }

TEST(CausalMaskTest, MasksAboveTheDiagonalAndZeroesTheirGradient) {
  // y = causal_mask(2 x) over x[T_X, S] (T=3 split 2/1); loss = <y, g>, g = 1 on and below
  // the diagonal: y = 2x there and -inf above; dx = 2 there and 0 above.
  std::mutex lock;
  run_threads(Mesh::parse("X=2"), [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    const Var x = tape.input(
        "x[T_X, S]", {{"T", 3}, {"S", 3}},
        [](const Index& i, std::int64_t) { return static_cast<double>(i[0] * 3 + i[1]); }, true);
    const Var y = causal_mask(scale(x, 2.0), "T", "S");
    const Var g = tape.input("g[T_X, S]", {{"T", 3}, {"S", 3}},
                             [](const Index& i, std::int64_t) { return i[1] <= i[0] ? 1.0 : 0.0; });
    tape.backward(sum(mul(softmax(y), g)));  // softmax: the masked entries get weight 0
    const DistTensor& v = y.value();
    const DistTensor& dx = tape.grad(x);
    std::lock_guard<std::mutex> hold(lock);
    for (std::int64_t r = 0; r < v.local_shape()[0]; ++r) {
      const std::int64_t row = v.box()[0].offset + r;
      for (std::int64_t c = 0; c < 3; ++c) {
        if (c <= row) {
          EXPECT_EQ(at(v, r * 3 + c), 2.0 * static_cast<double>(row * 3 + c));
        } else {
          EXPECT_TRUE(std::isinf(at(v, r * 3 + c)) && at(v, r * 3 + c) < 0);
          EXPECT_EQ(at(dx, r * 3 + c), 0.0);
        }
      }
    }
  });
}

TEST(CausalMaskTest, MisuseIsAnInputError) {
  Tape tape(Mesh::parse("X=2"), {DType::f32});
  const Var a = tape.input("a[I, J_X]", {{"I", 4}, {"J", 6}}, nullptr);
  const Var b = tape.input("b[J_X, K]", {{"J", 6}, {"K", 2}}, nullptr);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.headline();
    }
    return std::string("no error");
  };
  EXPECT_THAT(message([&] { causal_mask(a, "I", "Q"); }), HasSubstr("lacks dimension 'Q'"));
  EXPECT_THAT(message([&] { causal_mask(einsum(a, b, {"I", "K"}), "I", "K"); }), HasSubstr("reduce it first"));
}

}  // namespace
}  // namespace shardmm::autodiff
