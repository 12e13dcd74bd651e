// .npy arrays: what numpy writes is read, what shardmm writes numpy reads (the bytes numpy
// itself writes for the same array), and every malformed file is one InputError.
#include <gtest/gtest.h>

#include "repo_files.h"
#include "shardmm/core/error.h"
#include "shardmm/core/npy.h"

namespace shardmm {
namespace {

TEST(Npy, ReadsWhatNumpyWrote) {
  // examples/programs/tp_ffn/a.npy: numpy.save of the Scaling Book's [A_0 | A_1].
  const NpyArray a = parse_npy(testing::read_repo_file("examples/programs/tp_ffn/a.npy"), "a.npy");
  EXPECT_EQ(a.descr, "'<f8'");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(a.values, (std::vector<double>{1, 0, -1, 2, 1, 1, 0, 0}));
}

TEST(Npy, WritesWhatNumpyWrites) {
  // numpy.save(f, numpy.array([[2., -1.]])) byte for byte: the same header and padding.
  EXPECT_EQ(format_npy({1, 2}, {2, -1}), testing::read_repo_file("examples/programs/tp_ffn/x.npy"));
  for (const std::vector<std::int64_t>& shape : {std::vector<std::int64_t>{}, {3}, {2, 0, 3}, {1, 2, 3, 4}}) {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    std::vector<double> values(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * static_cast<double>(i) - 3;
    const std::string bytes = format_npy(shape, values);
    EXPECT_EQ(bytes.find('\n') % 64, 63u) << "the payload starts on a 64-byte boundary";
    const NpyArray back = parse_npy(bytes, "t");
    EXPECT_EQ(back.shape, shape);
    EXPECT_EQ(back.values, values);
  }
}

TEST(Npy, MalformedFilesAreOneInputError) {
  const std::string good = format_npy({2}, {1, 2});
  std::string big_endian = good, fortran = good, complex = good;
  big_endian.replace(big_endian.find("<f8"), 3, ">f8");
  fortran.replace(fortran.find("False"), 5, "True ");
  complex.replace(complex.find("<f8"), 3, "<c8");
  const std::pair<std::string, std::string> cases[] = {
      {"", "it does not start with the .npy magic string (\\x93NUMPY)"},
      {"PK\x03\x04 not an npy", "it does not start with the .npy magic string (\\x93NUMPY)"},
      {good.substr(0, 40), "it is truncated inside its header"},
      {good.substr(0, good.size() - 3), "its payload has 13 bytes where its shape and type need 16 (truncated)"},
      {good + "xx", "its payload has 18 bytes where its shape and type need 16"},
      {big_endian, "its element type '>f8' is not read (float64, float32, int64, int32 or bool, little-endian)"},
      {complex, "its element type '<c8' is not read (float64, float32, int64, int32 or bool, little-endian)"},
      {fortran, "it is in Fortran order; save it in C order (numpy.ascontiguousarray)"},
  };
  for (const auto& [bytes, why] : cases) {
    SCOPED_TRACE(why);
    try {
      parse_npy(bytes, "--input x 'x.npy'");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.headline(), "--input x 'x.npy': not a .npy array shardmm reads: " + why);
    }
  }
}

}  // namespace
}  // namespace shardmm
