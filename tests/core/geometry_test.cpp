// Shard geometry: array_split and torch.chunk pieces, nested multi-axis splits, exact tiling.
#include "shardmm/core/geometry.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/spec_testing.h"
#include "shardmm/core/error.h"

namespace shardmm {
namespace {

std::vector<Range> pieces(std::int64_t n, std::int64_t parts, SplitRule rule = SplitRule::array) {
  std::vector<Range> out;
  for (std::int64_t i = 0; i < parts; ++i) out.push_back(split_range(n, parts, i, rule));
  return out;
}

constexpr SplitRule kRules[] = {SplitRule::array, SplitRule::chunk};

TEST(Geometry, ArraySplitPutsTheExtraElementsFirst) {
  EXPECT_EQ(pieces(10, 4), (std::vector<Range>{{0, 3}, {3, 3}, {6, 2}, {8, 2}}));
  EXPECT_EQ(pieces(2, 4), (std::vector<Range>{{0, 1}, {1, 1}, {2, 0}, {2, 0}}));  // empty shards
  EXPECT_EQ(pieces(0, 3), (std::vector<Range>{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_EQ(pieces(8, 4), (std::vector<Range>{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(pieces(7, 1), (std::vector<Range>{{0, 7}}));
  EXPECT_EQ(split_range(Range{100, 10}, 4, 1, SplitRule::array), (Range{103, 3}));
}

// torch.chunk: pieces of ceil(n/p), the last ones short or empty.
TEST(Geometry, ChunkSplitFillsTheFirstPiecesWhole) {
  const SplitRule chunk = SplitRule::chunk;
  EXPECT_EQ(pieces(10, 4, chunk), (std::vector<Range>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  EXPECT_EQ(pieces(5, 4, chunk), (std::vector<Range>{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
  EXPECT_EQ(pieces(2, 4, chunk), (std::vector<Range>{{0, 1}, {1, 1}, {2, 0}, {2, 0}}));
  EXPECT_EQ(pieces(0, 3, chunk), (std::vector<Range>{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_EQ(pieces(8, 4, chunk), (std::vector<Range>{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(pieces(7, 1, chunk), (std::vector<Range>{{0, 7}}));
  EXPECT_EQ(pieces(9, 6, chunk), (std::vector<Range>{{0, 2}, {2, 2}, {4, 2}, {6, 2}, {8, 1}, {9, 0}}));
  EXPECT_EQ(split_range(Range{100, 10}, 4, 3, chunk), (Range{109, 1}));
}

// Both rules: pieces are contiguous, cover [0, n), none larger than the first, none after a
// smaller one larger; split_index finds every element's piece.
TEST(Geometry, SplitRulesTileAndInvert) {
  for (SplitRule rule : kRules) {
    for (std::int64_t n = 0; n <= 40; ++n) {
      for (std::int64_t p = 1; p <= 12; ++p) {
        const auto ps = pieces(n, p, rule);
        std::int64_t at = 0;
        for (std::size_t i = 0; i < ps.size(); ++i) {
          ASSERT_EQ(ps[i].offset, at) << to_string(rule) << " " << n << " over " << p;
          if (i > 0) {
            ASSERT_LE(ps[i].extent, ps[i - 1].extent);
          }
          if (rule == SplitRule::chunk) {
            ASSERT_LE(ps[i].extent, (n + p - 1) / p);
          }
          for (std::int64_t e = ps[i].offset; e < ps[i].end(); ++e) {
            ASSERT_EQ(split_index(n, p, e, rule), static_cast<std::int64_t>(i)) << to_string(rule) << " " << n;
          }
          at = ps[i].end();
        }
        ASSERT_EQ(at, n);
      }
    }
  }
}

TEST(Geometry, SplitRuleNames) {
  EXPECT_EQ(parse_split_rule("array"), SplitRule::array);
  EXPECT_EQ(parse_split_rule("chunk"), SplitRule::chunk);
  EXPECT_EQ(to_string(SplitRule::chunk), "chunk");
  try {
    parse_split_rule("torch");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown split rule 'torch'; the rules are array (numpy.array_split: 10 over 4 is 3,3,2,2) and chunk "
                 "(torch.chunk, DTensor's Shard: 10 over 4 is 3,3,3,1)");
  }
}

// The rule travels with the mesh: the text round trips without it, equality sees it.
TEST(Geometry, MeshCarriesItsSplitRule) {
  const Mesh array = Mesh::parse("X=4"), chunk = Mesh::parse("X=4", SplitRule::chunk);
  EXPECT_EQ(array.split_rule(), SplitRule::array);
  EXPECT_EQ(chunk.split_rule(), SplitRule::chunk);
  EXPECT_EQ(chunk.to_string(), "X=4");
  EXPECT_FALSE(array == chunk);
  EXPECT_EQ(Mesh(chunk.axes(), SplitRule::chunk), chunk);
  const Spec a = parse_spec("A[I_X, J]", chunk);
  EXPECT_EQ(shard_box(chunk, a, {10, 5}, 3), (std::vector<Range>{{9, 1}, {0, 5}}));
  EXPECT_EQ(shard_box(array, a, {10, 5}, 3), (std::vector<Range>{{8, 2}, {0, 5}}));
  EXPECT_EQ(local_shape(chunk, a, {5, 5}, 3), (std::vector<std::int64_t>{0, 5}));
  EXPECT_EQ(max_local_elements(chunk, a, {10, 5}), 15);
}

// numpy.array_split: pieces are contiguous, cover [0, n), and differ in size by at most one,
// larger ones first.
TEST(Geometry, ArraySplitProperties) {
  for (std::int64_t n = 0; n <= 40; ++n) {
    for (std::int64_t p = 1; p <= 12; ++p) {
      const auto ps = pieces(n, p);
      std::int64_t at = 0;
      for (std::size_t i = 0; i < ps.size(); ++i) {
        ASSERT_EQ(ps[i].offset, at) << n << " over " << p;
        ASSERT_TRUE(ps[i].extent == n / p || ps[i].extent == n / p + 1);
        if (i > 0) {
          ASSERT_LE(ps[i].extent, ps[i - 1].extent);
        }
        at = ps[i].end();
      }
      ASSERT_EQ(at, n);
    }
  }
}

TEST(Geometry, HeaderExample) {
  const Mesh m = Mesh::parse("X=4");
  const Spec a = parse_spec("A[I_X, J]", m);
  EXPECT_EQ(shard_box(m, a, {10, 5}, 3), (std::vector<Range>{{8, 2}, {0, 5}}));
  EXPECT_EQ(local_shape(m, a, {10, 5}, 0), (std::vector<std::int64_t>{3, 5}));
  EXPECT_EQ(local_elements(m, a, {10, 5}, 2), 10);
  EXPECT_EQ(max_local_elements(m, a, {10, 5}), 15);
}

// I_{XY}: array_split over X, then each piece over Y (geometry.h).
TEST(Geometry, NestedMultiAxisSplit) {
  const Mesh m = Mesh::parse("X=2,Y=3");
  const AxisList xy{0, 1}, yx{1, 0};
  // 10 over X: [0,5) [5,10); each 5 over Y: 2,2,1.
  const std::map<std::pair<std::int64_t, std::int64_t>, Range> want_xy{
      {{0, 0}, {0, 2}}, {{0, 1}, {2, 2}}, {{0, 2}, {4, 1}}, {{1, 0}, {5, 2}}, {{1, 1}, {7, 2}}, {{1, 2}, {9, 1}}};
  for (const auto& [xy_coord, range] : want_xy) {
    EXPECT_EQ(shard_range(m, 10, xy, m.device({xy_coord.first, xy_coord.second})), range);
  }
  // A flat split of 10 into 6 would give 2,2,2,2,1,1: the nested one differs.
  EXPECT_NE(shard_range(m, 10, xy, m.device({0, 2})), split_range(10, 6, 2, SplitRule::array));
  // 10 over Y: 4,3,3; each over X: (2,2) (2,1) (2,1).
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 0})), (Range{2, 2}));
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 2})), (Range{9, 1}));
  // Divisible sizes: the nested split is the flat split in group-rank order.
  for (const AxisList& axes : {xy, yx}) {
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      EXPECT_EQ(shard_range(m, 12, axes, d), split_range(12, 6, m.group_rank(d, axes), SplitRule::array));
    }
  }
}

// I_{XY} under chunk: chunk over X, then each piece over Y, as DTensor nests [Shard(0),
// Shard(0)] (each placement chunks the local piece the previous one left).
TEST(Geometry, NestedChunkSplit) {
  const Mesh m = Mesh::parse("X=2,Y=3", SplitRule::chunk);
  const AxisList xy{0, 1}, yx{1, 0};
  // 10 over X: [0,5) [5,10); each 5 over Y: chunks of 2: 2,2,1.
  // 9 over X: [0,5) [5,9); 5 over Y: 2,2,1; 4 over Y: 2,2,0.
  const std::map<std::pair<std::int64_t, std::int64_t>, std::pair<Range, Range>> want_xy{
      {{0, 0}, {{0, 2}, {0, 2}}}, {{0, 1}, {{2, 2}, {2, 2}}}, {{0, 2}, {{4, 1}, {4, 1}}},
      {{1, 0}, {{5, 2}, {5, 2}}}, {{1, 1}, {{7, 2}, {7, 2}}}, {{1, 2}, {{9, 1}, {9, 0}}}};
  for (const auto& [c, ranges] : want_xy) {
    EXPECT_EQ(shard_range(m, 10, xy, m.device({c.first, c.second})), ranges.first);
    EXPECT_EQ(shard_range(m, 9, xy, m.device({c.first, c.second})), ranges.second);
  }
  // A flat chunk of 9 into 6 would give 2,2,2,2,1,0: the nested one differs.
  EXPECT_NE(shard_range(m, 9, xy, m.device({1, 0})), split_range(9, 6, 3, SplitRule::chunk));
  // 10 over Y: 4,4,2; each over X: (2,2) (2,2) (1,1).
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 1})), (Range{6, 2}));
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 2})), (Range{9, 1}));
  for (const AxisList& axes : {xy, yx}) {
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      EXPECT_EQ(shard_range(m, 12, axes, d), split_range(12, 6, m.group_rank(d, axes), SplitRule::array));
    }
  }
}

// The seeds' memory example: mesh X=2,Y=2, bf16[1024, 4096].
TEST(Geometry, SeedsMemoryExample) {
  const Mesh m = Mesh::parse("X=2,Y=2");
  const std::vector<std::int64_t> shape{1024, 4096};
  const auto each = [&](const char* spec) {
    const Spec s = parse_spec(spec, m);
    std::vector<std::int64_t> first = local_shape(m, s, shape, 0);
    for (std::int64_t d = 1; d < m.device_count(); ++d) EXPECT_EQ(local_shape(m, s, shape, d), first) << spec;
    return first;
  };
  EXPECT_EQ(each("A[I, J]"), (std::vector<std::int64_t>{1024, 4096}));
  EXPECT_EQ(each("A[I_X, J]"), (std::vector<std::int64_t>{512, 4096}));
  EXPECT_EQ(each("A[I_X, J_Y]"), (std::vector<std::int64_t>{512, 2048}));
  EXPECT_EQ(each("A[I_XY, J]"), (std::vector<std::int64_t>{256, 4096}));
  // Total bytes over the 4 devices: 32 MiB, 16 MiB, 8 MiB, 8 MiB (bf16 = 2 bytes).
  const auto total = [&](const char* spec) {
    std::int64_t n = 0;
    for (std::int64_t d = 0; d < m.device_count(); ++d) n += local_elements(m, parse_spec(spec, m), shape, d) * 2;
    return n;
  };
  EXPECT_EQ(total("A[I, J]"), 32 << 20);
  EXPECT_EQ(total("A[I_X, J]"), 16 << 20);
  EXPECT_EQ(total("A[I_X, J_Y]"), 8 << 20);
  EXPECT_EQ(total("A[I_XY, J]"), 8 << 20);
}

TEST(Geometry, OverlapElements) {
  EXPECT_EQ(overlap_elements({{0, 4}, {0, 4}}, {{2, 4}, {1, 2}}), 2 * 2);
  EXPECT_EQ(overlap_elements({{0, 4}}, {{4, 4}}), 0);
  EXPECT_EQ(overlap_elements({{0, 4}, {0, 0}}, {{0, 4}, {0, 4}}), 0);
  EXPECT_EQ(overlap_elements({}, {}), 1);  // a scalar
  EXPECT_EQ(overlap_extent({0, 4}, {2, 4}), 2);
  EXPECT_EQ(overlap_extent({2, 4}, {0, 4}), 2);
  EXPECT_EQ(overlap_extent({0, 4}, {4, 4}), 0);  // touching
  EXPECT_EQ(overlap_extent({0, 4}, {9, 1}), 0);  // apart
  EXPECT_EQ(overlap_extent({1, 2}, {0, 8}), 2);  // within
}

// For random specs and shapes (including dimensions smaller than their axis products), under
// each split rule: devices that differ only on replica axes (the ones sharding no dimension)
// hold the same box, and within one replica the boxes tile the global tensor exactly.
class ShardBoxes : public ::testing::TestWithParam<SplitRule> {};

TEST_P(ShardBoxes, TileTheTensorExactly) {
  testing::Rng rng(GetParam() == SplitRule::array ? 12345 : 54321);
  const std::vector<std::string> names{"I", "J", "K"};
  for (int iter = 0; iter < 200; ++iter) {
    const Mesh m(testing::random_named_mesh(rng, 3, 4).axes(), GetParam());
    const std::vector<std::string> dims(names.begin(), names.begin() + testing::uniform(rng, 1, 3));
    const Spec s = testing::random_spec(rng, m, "A", dims, true);
    std::vector<std::int64_t> shape;
    std::int64_t elements = 1;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      shape.push_back(testing::uniform(rng, 1, 9));
      elements *= shape.back();
    }
    SCOPED_TRACE(m.to_string() + " " + format_spec(s, m));
    std::vector<bool> shards(static_cast<std::size_t>(m.rank()), false);
    for (const DimSpec& d : s.dims) {
      for (int a : d.axes) shards[static_cast<std::size_t>(a)] = true;
    }
    // Replica key: the coordinates on the non-sharding axes.
    std::map<std::vector<std::int64_t>, std::vector<int>> coverage;
    std::map<std::vector<std::int64_t>, std::vector<Range>> box_of;  // by sharding coordinates
    std::int64_t max_elems = 0;
    for (std::int64_t dev = 0; dev < m.device_count(); ++dev) {
      std::vector<std::int64_t> replica, position;
      for (int a = 0; a < m.rank(); ++a)
        (shards[static_cast<std::size_t>(a)] ? position : replica).push_back(m.coord(dev, a));
      const auto box = shard_box(m, s, shape, dev);
      ASSERT_EQ(box.size(), shape.size());
      auto [it, fresh] = box_of.emplace(position, box);
      if (!fresh) {
        ASSERT_EQ(it->second, box) << "device " << dev;
      }
      std::int64_t n = 1;
      for (std::size_t d = 0; d < box.size(); ++d) {
        ASSERT_GE(box[d].extent, 0);
        ASSERT_GE(box[d].offset, 0);
        ASSERT_LE(box[d].end(), shape[d]);
        n *= box[d].extent;
      }
      ASSERT_EQ(local_elements(m, s, shape, dev), n);
      ASSERT_EQ(local_shape(m, s, shape, dev).size(), shape.size());
      max_elems = std::max(max_elems, n);
      auto& cover = coverage[replica];
      cover.resize(static_cast<std::size_t>(elements), 0);
      // Mark every element of the box (row-major index).
      std::vector<std::int64_t> idx(shape.size());
      for (std::size_t d = 0; d < shape.size(); ++d) idx[d] = box[d].offset;
      if (n == 0) continue;
      while (true) {
        std::int64_t flat = 0;
        for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
        ++cover[static_cast<std::size_t>(flat)];
        std::size_t d = shape.size();
        while (d > 0 && ++idx[d - 1] == box[d - 1].end()) {
          idx[d - 1] = box[d - 1].offset;
          --d;
        }
        if (d == 0) break;
      }
    }
    for (const auto& [replica, cover] : coverage) {
      for (std::size_t e = 0; e < cover.size(); ++e) ASSERT_EQ(cover[e], 1) << "element " << e;
    }
    EXPECT_EQ(max_local_elements(m, s, shape), max_elems);
  }
}

INSTANTIATE_TEST_SUITE_P(BothRules, ShardBoxes, ::testing::ValuesIn(kRules),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace shardmm
