// Mesh: parsing, row-major device ids, groups along axes.
#include "shardmm/core/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "shardmm/core/error.h"

namespace shardmm {
namespace {

TEST(Mesh, ParsesAxesInDeclaredOrder) {
  const Mesh m = Mesh::parse("X=4,Y=2");
  ASSERT_EQ(m.rank(), 2);
  EXPECT_EQ(m.axis(0), (MeshAxis{"X", 4}));
  EXPECT_EQ(m.axis(1), (MeshAxis{"Y", 2}));
  EXPECT_EQ(m.device_count(), 8);
  EXPECT_EQ(m.to_string(), "X=4,Y=2");
  EXPECT_EQ(Mesh::parse(" X = 4 ,\tY=2 "), m);
  EXPECT_EQ(Mesh::parse(m.to_string()), m);
}

TEST(Mesh, MultiLetterAxisNames) {
  const Mesh m = Mesh::parse("dp=2,tp=4,pp2=3");
  EXPECT_EQ(m.device_count(), 24);
  EXPECT_EQ(m.find("tp"), 1);
  EXPECT_EQ(m.find("pp2"), 2);
  EXPECT_EQ(m.find("t"), std::nullopt);
  EXPECT_FALSE(m.single_char_names());
  EXPECT_EQ(m.axis_names({0, 1}), "dp,tp");
  EXPECT_EQ(m.axis_names({2}), "pp2");
  const Mesh s = Mesh::parse("X=2,Y=2,Z=2");
  EXPECT_TRUE(s.single_char_names());
  EXPECT_EQ(s.axis_names({2, 0}), "ZX");
  EXPECT_EQ(s.axis_names({}), "");
}

// Device id = x * |Y| + y, as jax.make_mesh lays devices out (the seeds' 4x2 picture).
TEST(Mesh, DeviceIdsAreRowMajorFirstAxisMajor) {
  const Mesh m = Mesh::parse("X=4,Y=2");
  EXPECT_EQ(m.coord(5, 0), 2);
  EXPECT_EQ(m.coord(5, 1), 1);
  EXPECT_EQ(m.coords(5), (std::vector<std::int64_t>{2, 1}));
  EXPECT_EQ(m.device({2, 1}), 5);
  EXPECT_EQ(m.stride(0), 2);
  EXPECT_EQ(m.stride(1), 1);
  for (std::int64_t x = 0; x < 4; ++x) {
    for (std::int64_t y = 0; y < 2; ++y) {
      const std::int64_t d = x * 2 + y;
      EXPECT_EQ(m.device({x, y}), d);
      EXPECT_EQ(m.coords(d), (std::vector<std::int64_t>{x, y}));
    }
  }
  const Mesh three = Mesh::parse("a=2,b=3,c=4");
  EXPECT_EQ(three.coords(23), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(three.device({1, 0, 2}), 14);  // 1*12 + 0*4 + 2
}

// The whole mesh as one group: every axis, major to minor, spanning every device.
TEST(Mesh, AllAxesSpanTheWholeMesh) {
  const Mesh three = Mesh::parse("a=2,b=3,c=4");
  EXPECT_EQ(three.all_axes(), (AxisList{0, 1, 2}));
  EXPECT_EQ(three.group_size(three.all_axes()), 24);
  EXPECT_EQ(Mesh::parse("X=1").all_axes(), (AxisList{0}));
}

TEST(Mesh, GroupsAlongAxes) {
  const Mesh m = Mesh::parse("X=4,Y=2");
  // Device 5 = (2, 1).
  EXPECT_EQ(m.group_size({0}), 4);
  EXPECT_EQ(m.group_size({}), 1);
  EXPECT_EQ(m.group_size({0, 1}), 8);
  EXPECT_EQ(m.group_rank(5, {0}), 2);
  EXPECT_EQ(m.group_members(5, {0}), (std::vector<std::int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(m.group_rank(5, {1}), 1);
  EXPECT_EQ(m.group_members(5, {1}), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(m.group_rank(5, {0, 1}), 5);
  EXPECT_EQ(m.group_members(5, {0, 1}), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // The group's order is the list's: Y major, then X.
  EXPECT_EQ(m.group_rank(5, {1, 0}), 1 * 4 + 2);
  EXPECT_EQ(m.group_members(5, {1, 0}), (std::vector<std::int64_t>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(m.group_rank(5, {}), 0);
  EXPECT_EQ(m.group_members(5, {}), (std::vector<std::int64_t>{5}));
}

TEST(Mesh, GroupMembersAgreeWithGroupRankOnRandomMeshes) {
  std::mt19937 rng(20261129);
  for (int iter = 0; iter < 300; ++iter) {
    const int rank = 1 + static_cast<int>(rng() % 4);
    std::vector<MeshAxis> axes;
    for (int i = 0; i < rank; ++i)
      axes.push_back({std::string(1, static_cast<char>('A' + i)), 1 + static_cast<std::int64_t>(rng() % 4)});
    const Mesh m(axes);
    AxisList group;
    for (int i = 0; i < rank; ++i) {
      if (rng() % 2) group.push_back(i);
    }
    std::shuffle(group.begin(), group.end(), rng);
    SCOPED_TRACE(m.to_string() + " group " + m.axis_names(group));
    for (std::int64_t d = 0; d < m.device_count(); ++d) {
      const auto members = m.group_members(d, group);
      ASSERT_EQ(static_cast<std::int64_t>(members.size()), m.group_size(group));
      ASSERT_EQ(members[static_cast<std::size_t>(m.group_rank(d, group))], d);
      for (std::size_t r = 0; r < members.size(); ++r) {
        EXPECT_EQ(m.group_rank(members[r], group), static_cast<std::int64_t>(r));
        for (int a = 0; a < rank; ++a) {
          if (std::find(group.begin(), group.end(), a) == group.end()) {
            EXPECT_EQ(m.coord(members[r], a), m.coord(d, a));
          }
        }
      }
      EXPECT_EQ(std::set<std::int64_t>(members.begin(), members.end()).size(), members.size());
    }
  }
}

TEST(Mesh, ConstructorValidates) {
  EXPECT_THROW(Mesh(std::vector<MeshAxis>{}), InputError);
  EXPECT_THROW(Mesh({{"X", 0}}), InputError);
  EXPECT_THROW(Mesh({{"X", -2}}), InputError);
  EXPECT_THROW(Mesh({{"1X", 2}}), InputError);
  EXPECT_THROW(Mesh({{"", 2}}), InputError);
  EXPECT_THROW(Mesh({{"X", 2}, {"X", 3}}), InputError);
  EXPECT_THROW(Mesh({{"X", std::int64_t{1} << 32}, {"Y", std::int64_t{1} << 32}}), InputError);
  EXPECT_NO_THROW(Mesh({{"X", 1}}));
}

TEST(Mesh, ParseRejectsBadText) {
  for (const char* bad : {"", " ", "X", "X=", "X=0", "X=-1", "=4", "X=4,", ",X=4", "X=4,,Y=2", "4=X", "X=2,X=2",
                          "X=4;Y=2", "X=99999999999999999999", "X=4294967296,Y=4294967296", "X=1e3", "X=+4"}) {
    EXPECT_THROW(Mesh::parse(bad), InputError) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace shardmm
