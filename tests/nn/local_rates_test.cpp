// nn::measure_local_rates: a positive rate for every function the tape can record a local step
// of, in every pass it runs in (autodiff::local_functions(), which the tape enforces: a new
// function is listed there or refused, so that it cannot go unmeasured).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "shardmm/autodiff/tape.h"
#include "shardmm/core/error.h"
#include "shardmm/nn/local_rates.h"
#include "shardmm/plan/cost.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm {
namespace {

std::vector<std::string> every_key() {
  std::vector<std::string> keys;
  for (const autodiff::LocalFunction& f : autodiff::local_functions()) {
    if (f.forward) keys.push_back(local_rate_key(f.name, false));
    if (f.backward) keys.push_back(local_rate_key(f.name, true));
  }
  return keys;
}

TEST(LocalRates, EveryFunctionInEveryPassHasAPositiveRate) {
  nn::LocalRateOptions small;
  small.block_bytes = 64 * 1024 * 8;  // 64 rows of 1024 in f64: the test's runtime, not the cache's size
  small.repeats = 1;
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(to_string(dtype));
    const std::map<std::string, double> rates = nn::measure_local_rates(dtype, small);
    for (const std::string& key : every_key()) {
      ASSERT_TRUE(rates.contains(key)) << key;
      EXPECT_GT(rates.at(key), 0) << key;
      EXPECT_LT(rates.at(key), 1e-3) << key;  // seconds per element: a unit slip would show
    }
    EXPECT_EQ(rates.size(), every_key().size());  // nothing measured that no step can name
  }
  EXPECT_THROW(nn::measure_local_rates(DType::bf16, small), UsageError);
  small.block_bytes = 1024;
  EXPECT_THROW(nn::measure_local_rates(DType::f32, small), UsageError);
}

// A function no one listed would go unmeasured, its steps costed by their traffic alone.
TEST(LocalRates, TheTapeRefusesAnUnlistedFunction) {
  run_threads(Mesh::parse("X=1"), [](Communicator& comm) {
    autodiff::Tape tape(comm, {DType::f32, builtin_profile("h100")});
    const autodiff::Var x = tape.input("x[I]", {{"I", 4}}, [](const Index&, std::int64_t) { return 1.0; });
    const auto unlisted = [&] {
      autodiff::data_from(x, tape.spec("y[I]"), {4}, [](const DistTensor&, DistTensor&) {}, "frobnicate");
    };
    EXPECT_THAT(unlisted, ::testing::ThrowsMessage<std::logic_error>(
                              ::testing::HasSubstr("'frobnicate' is not in autodiff::local_functions()")));
  });
}

}  // namespace
}  // namespace shardmm
