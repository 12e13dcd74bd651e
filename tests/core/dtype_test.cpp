// DType: names and sizes, from core alone (the plan layer is not needed for them).
#include "shardmm/core/dtype.h"

#include <gtest/gtest.h>

#include "input_error.h"

namespace shardmm {
namespace {

TEST(DType, NamesRoundTripAndSizesAreTheElementBytes) {
  for (DType d : {DType::bf16, DType::f16, DType::f32, DType::f64}) EXPECT_EQ(parse_dtype(to_string(d)), d);
  EXPECT_EQ(dtype_bytes(DType::bf16), 2);
  EXPECT_EQ(dtype_bytes(DType::f16), 2);
  EXPECT_EQ(dtype_bytes(DType::f32), 4);
  EXPECT_EQ(dtype_bytes(DType::f64), 8);
}

TEST(DType, UnknownNameIsAnInputErrorListingTheNames) {
  EXPECT_EQ(testing::input_error([] { parse_dtype("fp32"); }),
            "unknown dtype 'fp32'; expected one of bf16, f16, f32, f64");
}

}  // namespace
}  // namespace shardmm
