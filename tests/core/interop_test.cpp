// The PartitionSpec and placements converters: fixed examples, and every valid spec of the
// golden file through both forms and back.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/core/interop.h"
#include "shardmm/core/spec.h"
#include "test_paths.h"

namespace shardmm {
namespace {

std::vector<std::string> letters_of(const Spec& s) {
  std::vector<std::string> out;
  for (const DimSpec& d : s.dims) out.push_back(d.name);
  return out;
}

std::string letters_text(const Spec& s) {
  std::string out = s.tensor + "[";
  for (std::size_t i = 0; i < s.dims.size(); ++i) out += (i ? ", " : "") + s.dims[i].name;
  return out + "]";
}

TEST(Interop, PrintsTheBooksExamples) {
  const Mesh mesh = Mesh::parse("X=4,Y=2");
  const auto ps = [&](const char* text) { return to_partition_spec(parse_spec(text, mesh), mesh); };
  const auto pl = [&](const char* text) { return to_placements(parse_spec(text, mesh), mesh); };
  EXPECT_EQ(ps("A[I_X, J]"), "P('X', None)");
  EXPECT_EQ(ps("A[I_X, J_Y]"), "P('X', 'Y')");
  EXPECT_EQ(ps("A[I_XY, J]"), "P(('X', 'Y'), None)");
  EXPECT_EQ(ps("A[I_YX, J]"), "P(('Y', 'X'), None)");
  EXPECT_EQ(ps("A[I, J]"), "P(None, None)");
  EXPECT_EQ(ps("C[I, K]{U_YX}"), "P(None, None, unreduced={'X', 'Y'})");
  EXPECT_EQ(pl("A[I_X, J]"), "[Shard(0), Replicate()]");
  EXPECT_EQ(pl("A[I, J_X]"), "[Shard(1), Replicate()]");
  EXPECT_EQ(pl("A[I_XY, J]"), "[Shard(0), Shard(0)]");
  EXPECT_EQ(pl("C[I, K_Y]{U_X}"), "[Partial(), Shard(1)]");
  EXPECT_EQ(pl("A[I, J]"), "[Replicate(), Replicate()]");
}

TEST(Interop, ReadsBothForms) {
  const Mesh mesh = Mesh::parse("X=4,Y=2");
  const auto canon = [&](const Spec& s) { return format_spec(s, mesh); };
  EXPECT_EQ(canon(from_partition_spec("P('X', None)", {"I", "J"}, mesh)), "[I_X, J]");
  EXPECT_EQ(canon(from_partition_spec("P()", {"I", "J"}, mesh)), "[I, J]");
  EXPECT_EQ(canon(from_partition_spec("P(\"Y\")", {"I", "J"}, mesh)), "[I_Y, J]");
  EXPECT_EQ(canon(from_partition_spec("PartitionSpec(None, ('Y', 'X'),)", {"I", "J"}, mesh)), "[I, J_YX]");
  EXPECT_EQ(canon(from_partition_spec("P(('X',), None, unreduced={'Y'})", {"I", "J"}, mesh)), "[I_X, J]{U_Y}");
  EXPECT_EQ(canon(from_placements("[Shard(dim=1), Partial('sum')]", {"I", "J"}, mesh)), "[I, J_X]{U_Y}");
  EXPECT_EQ(canon(from_placements("(Shard(-1), Shard(1))", {"I", "J"}, mesh)), "[I, J_XY]");
  EXPECT_EQ(canon(parse_spec("A[I, J] = P('X', None)", mesh)), "A[I_X, J]");
  EXPECT_EQ(canon(parse_spec("B[J, K] = [Replicate(), Shard(0)]", mesh)), "B[J_Y, K]");
}

TEST(Interop, RefusesBadFormsWithOneLine) {
  const Mesh mesh = Mesh::parse("X=4,Y=2");
  const auto headline = [&](auto convert) {
    try {
      convert();
    } catch (const InputError& e) {
      return e.headline();
    }
    return std::string("no error");
  };
  EXPECT_EQ(headline([&] {
              from_partition_spec("P('X', None)", {"X", "J"}, mesh);
            }),
            "dimension letter 'X' is also a mesh axis of X=4,Y=2; name dimensions apart from mesh axes (I, J, K, ...)");
  EXPECT_EQ(headline([&] { from_partition_spec("P('Z')", {"I"}, mesh); }),
            "bad PartitionSpec 'P('Z')': unknown mesh axis 'Z'; the mesh X=4,Y=2 has axes X, Y");
  EXPECT_EQ(headline([&] { from_placements("[Shard(0)]", {"I"}, mesh); }),
            "bad placements '[Shard(0)]': placements are one per mesh axis, in mesh order, and the mesh X=4,Y=2 has 2 "
            "axes; got 1");
  EXPECT_EQ(headline([&] { to_placements(parse_spec("A[I_YX]", mesh), mesh); }),
            "A[I_YX] has no DTensor placements form: I_YX splits I over Y first; DTensor nests one dimension's Shard "
            "placements in mesh order, so only I_XY has a placements form");
}

// Every valid spec of the golden file (not the contractions or sizes) through both forms.
TEST(Interop, EveryGoldenSpecRoundTrips) {
  std::ifstream in(shardmm::testing::tests_dir() + "/golden/valid_specs.txt");
  ASSERT_TRUE(in.good());
  int specs = 0, without_placements = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    const std::string input = line.substr(t1 + 1, t2 - t1 - 1), canonical = line.substr(t2 + 1);
    if (input.find('@') != std::string::npos || input.find("--dims") != std::string::npos) continue;
    SCOPED_TRACE(line);
    const Mesh mesh = Mesh::parse(line.substr(0, t1));
    const Spec spec = parse_spec(canonical, mesh);
    ++specs;
    const std::string ps = to_partition_spec(spec, mesh);
    EXPECT_EQ(from_partition_spec(ps, letters_of(spec), mesh), spec) << ps;
    const Spec embedded = parse_spec(letters_text(spec) + " = " + ps, mesh);
    EXPECT_EQ(format_spec(embedded, mesh), canonical);
    const bool nested_in_mesh_order = std::all_of(spec.dims.begin(), spec.dims.end(), [](const DimSpec& d) {
      return std::is_sorted(d.axes.begin(), d.axes.end());
    });
    EXPECT_EQ(placements_problem(spec, mesh).empty(), nested_in_mesh_order);
    if (!nested_in_mesh_order) {
      ++without_placements;
      EXPECT_THROW(to_placements(spec, mesh), InputError);
      continue;
    }
    const std::string pl = to_placements(spec, mesh);
    EXPECT_EQ(from_placements(pl, letters_of(spec), mesh), spec) << pl;
    EXPECT_EQ(format_spec(parse_spec(letters_text(spec) + " = " + pl, mesh), mesh), canonical);
  }
  EXPECT_GE(specs, 40);
  EXPECT_GE(without_placements, 3);  // I_YX, I_{XY,X}, I_{tp,dp}...
}

}  // namespace
}  // namespace shardmm
