// Shard geometry: array_split pieces, nested multi-axis splits, exact tiling.
#include "shardmm/core/geometry.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/spec_testing.h"

namespace shardmm {
namespace {

std::vector<Range> pieces(std::int64_t n, std::int64_t parts) {
  std::vector<Range> out;
  for (std::int64_t i = 0; i < parts; ++i) out.push_back(split_range(n, parts, i));
  return out;
}

TEST(Geometry, ArraySplitPutsTheExtraElementsFirst) {
  EXPECT_EQ(pieces(10, 4), (std::vector<Range>{{0, 3}, {3, 3}, {6, 2}, {8, 2}}));
  EXPECT_EQ(pieces(2, 4), (std::vector<Range>{{0, 1}, {1, 1}, {2, 0}, {2, 0}}));  // empty shards
  EXPECT_EQ(pieces(0, 3), (std::vector<Range>{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_EQ(pieces(8, 4), (std::vector<Range>{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(pieces(7, 1), (std::vector<Range>{{0, 7}}));
  EXPECT_EQ(split_range(Range{100, 10}, 4, 1), (Range{103, 3}));
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
        if (i > 0) ASSERT_LE(ps[i].extent, ps[i - 1].extent);
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
  EXPECT_NE(shard_range(m, 10, xy, m.device({0, 2})), split_range(10, 6, 2));
  // 10 over Y: 4,3,3; each over X: (2,2) (2,1) (2,1).
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 0})), (Range{2, 2}));
  EXPECT_EQ(shard_range(m, 10, yx, m.device({1, 2})), (Range{9, 1}));
  // Divisible sizes: the nested split is the flat split in group-rank order.
  for (const AxisList& axes : {xy, yx}) {
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      EXPECT_EQ(shard_range(m, 12, axes, d), split_range(12, 6, m.group_rank(d, axes)));
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

// For random specs and shapes (including dimensions smaller than their axis products):
// devices that differ only on replica axes (the ones sharding no dimension) hold the same
// box, and within one replica the boxes tile the global tensor exactly.
TEST(Geometry, ShardBoxesTileTheTensorExactly) {
  testing::Rng rng(12345);
  const std::vector<std::string> names{"I", "J", "K"};
  for (int iter = 0; iter < 400; ++iter) {
    const Mesh m = testing::random_named_mesh(rng, 3, 4);
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
      for (int a = 0; a < m.rank(); ++a) (shards[static_cast<std::size_t>(a)] ? position : replica).push_back(m.coord(dev, a));
      const auto box = shard_box(m, s, shape, dev);
      ASSERT_EQ(box.size(), shape.size());
      auto [it, fresh] = box_of.emplace(position, box);
      if (!fresh) ASSERT_EQ(it->second, box) << "device " << dev;
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

}  // namespace
}  // namespace shardmm
