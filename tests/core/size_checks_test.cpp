// The checks every caller makes of the sizes a user gave (check_dims_used,
// check_tensor_bytes), called from the library: their messages name the field, "dims",
// which the CLI spells as its flag (cli_errors.txt has the flag's spelling).
#include <gtest/gtest.h>

#include "input_error.h"
#include "shardmm/core/error.h"
#include "shardmm/core/spec.h"

namespace shardmm {
namespace {

std::string dashed(std::string_view f) { return "--" + std::string(f); }

// The InputError `f` throws, as the CLI would spell its fields.
template <class F>
std::string as_flags(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.headline(dashed);
  }
  return "no InputError";
}

TEST(SizeChecks, ASizeNoTensorNamesIsRefusedNamingTheField) {
  const Mesh mesh = Mesh::parse("X=2");
  const Spec a = parse_spec("A[I_X, J]", mesh), b = parse_spec("B[J, K]", mesh);
  check_dims_used(parse_dims("I=8,J=4,K=2"), {&a, &b});
  const auto call = [&] { check_dims_used(parse_dims("I=8,J=4,Q=2"), {&a, &b}); };
  EXPECT_EQ(testing::input_error(call),
            "dims gives a size for 'Q', which no tensor names (the dimensions are I, J, K); every size must belong "
            "to a dimension");
  EXPECT_EQ(as_flags(call).rfind("--dims gives a size for 'Q'", 0), 0u);
}

TEST(SizeChecks, ATensorOfMoreBytesThanACountHoldsIsRefusedNamingTheField) {
  const Mesh mesh = Mesh::parse("X=2");
  const Spec a = parse_spec("A[I_X, J]", mesh);
  check_tensor_bytes(a, parse_dims("I=1048576,J=1048576"), DType::f64);
  const auto call = [&] { check_tensor_bytes(a, parse_dims("I=3037000499,J=3037000499"), DType::bf16); };
  EXPECT_EQ(testing::input_error(call),
            "tensor A has more bytes than a signed 64-bit count holds (2^63 - 1): I=3037000499 x J=3037000499 "
            "elements of 2 B (bf16); give smaller dims");
  EXPECT_EQ(testing::input_error([&] { check_tensor_bytes(a, parse_dims("I=4"), DType::f32); }),
            "dimension 'J' of A has no size; add J=<size> to dims");
  EXPECT_EQ(as_flags([&] { check_tensor_bytes(a, parse_dims("I=4"), DType::f32); }),
            "dimension 'J' of A has no size; add J=<size> to --dims");
}

}  // namespace
}  // namespace shardmm
