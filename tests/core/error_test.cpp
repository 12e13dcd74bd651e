// InputError: fields named in a headline, plain by default and respelled by a front end.
#include "shardmm/core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace shardmm {
namespace {

std::string dashed(std::string_view f) { return "--" + std::string(f); }

TEST(InputError, FieldsArePlainInWhatAndRespelledOnRequest) {
  const InputError e("empty " + field("dims") + "; or give smaller " + field("dims") + " and a " + field("mesh"));
  EXPECT_STREQ(e.what(), "empty dims; or give smaller dims and a mesh");
  EXPECT_EQ(e.headline(), "empty dims; or give smaller dims and a mesh");
  EXPECT_EQ(e.headline(dashed), "empty --dims; or give smaller --dims and a --mesh");
}

TEST(InputError, ContextAndEscapesAreUnchangedByFields) {
  const InputError e("bad '\x01' in " + field("dims"), "I=\x01", 2);
  EXPECT_EQ(e.headline(dashed), "bad '\\x01' in --dims");
  EXPECT_EQ(e.context(), "  I=?\n    ^");
  EXPECT_EQ(std::string(e.what()), "bad '\\x01' in dims\n  I=?\n    ^");
}

TEST(InputError, AnUnclosedMarkIsText) {
  const InputError e(std::string("odd \x1e") + " text");
  EXPECT_EQ(e.headline(dashed), "odd \\x1E text");
}

TEST(UsageError, IsALogicErrorNotAnInputError) {
  const UsageError e("gemm: negative size");
  const std::logic_error& base = e;
  EXPECT_STREQ(base.what(), "gemm: negative size");
  EXPECT_EQ(dynamic_cast<const InputError*>(&base), nullptr);
}

}  // namespace
}  // namespace shardmm
