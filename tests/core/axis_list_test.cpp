// AxisList: the inline list of mesh axes behaves as the std::vector<int> it replaced, and a
// list or mesh past kMaxMeshAxes is refused with InputError, not overrun.
#include "shardmm/core/axis_list.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "input_error.h"

namespace shardmm {
namespace {

std::vector<int> as_vector(const AxisList& axes) { return {axes.begin(), axes.end()}; }

// Random edits applied to an AxisList and to a std::vector<int> side by side agree.
TEST(AxisList, EditsAgreeWithAVector) {
  std::mt19937 rng(7);
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int trial = 0; trial < 2000; ++trial) {
    AxisList list;
    std::vector<int> reference;
    for (int step = 0; step < 12; ++step) {
      const int axis = pick(kMaxMeshAxes);
      const int where = reference.empty() ? 0 : pick(static_cast<int>(reference.size()) + 1);
      switch (reference.size() == static_cast<std::size_t>(kMaxMeshAxes) ? 3 : pick(5)) {
        case 0:
          list.push_back(axis);
          reference.push_back(axis);
          break;
        case 1:
          list.insert(list.begin() + where, axis);
          reference.insert(reference.begin() + where, axis);
          break;
        case 2: {
          const std::vector<int> more{axis, (axis + 1) % kMaxMeshAxes};
          if (reference.size() + more.size() > static_cast<std::size_t>(kMaxMeshAxes)) break;
          list.insert(list.begin() + where, more.begin(), more.end());
          reference.insert(reference.begin() + where, more.begin(), more.end());
          break;
        }
        case 3:
          if (!reference.empty()) {
            const int at = pick(static_cast<int>(reference.size()));
            list.erase(list.begin() + at);
            reference.erase(reference.begin() + at);
          }
          break;
        default:
          if (!reference.empty()) {
            list.pop_back();
            reference.pop_back();
          }
      }
      ASSERT_EQ(as_vector(list), reference);
      ASSERT_EQ(list.size(), reference.size());
      ASSERT_EQ(list.empty(), reference.empty());
    }
  }
}

TEST(AxisList, ComparesAsItsAxesInOrder) {
  const std::vector<AxisList> lists{{}, {0}, {0, 1}, {0, 2}, {1}, {1, 0}, {2, 1, 0}};
  for (const AxisList& a : lists) {
    for (const AxisList& b : lists) {
      EXPECT_EQ(a == b, as_vector(a) == as_vector(b));
      EXPECT_EQ(a < b, as_vector(a) < as_vector(b));
    }
  }
  std::map<AxisList, int> keyed{{{1, 0}, 1}, {{0, 1}, 2}};
  EXPECT_EQ(keyed.begin()->second, 2);
  // Axes past a list's end do not take part: a list shortened and one built short are equal.
  AxisList shortened{3, 4, 5};
  shortened.pop_back();
  EXPECT_EQ(shortened, (AxisList{3, 4}));
}

TEST(AxisList, HoldsEveryAxisOfTheLargestMesh) {
  std::vector<MeshAxis> axes;
  for (int i = 0; i < kMaxMeshAxes; ++i) axes.push_back({"a" + std::to_string(i), 1});
  const Mesh mesh(axes);
  const AxisList all = mesh.all_axes();
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kMaxMeshAxes));
  for (int i = 0; i < kMaxMeshAxes; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
}

TEST(AxisList, RefusesMoreAxesThanAMeshHas) {
  AxisList full(static_cast<std::size_t>(kMaxMeshAxes), 0);
  EXPECT_EQ(testing::input_error([&] { full.push_back(1); }),
            "more than 16 mesh axes in one list; a mesh has at most that many and an axis appears once in a list");
  EXPECT_EQ(full.size(), static_cast<std::size_t>(kMaxMeshAxes));
  EXPECT_THROW(AxisList(static_cast<std::size_t>(kMaxMeshAxes) + 1, 0), InputError);
  std::vector<MeshAxis> axes;
  for (int i = 0; i <= kMaxMeshAxes; ++i) axes.push_back({"a" + std::to_string(i), 1});
  EXPECT_EQ(testing::input_error([&] { Mesh{axes}; }),
            "the mesh has 17 axes; a mesh has at most 16 (axes of size 1 included)");
}

TEST(AxisList, KeepsABadIndexAsGivenOrRefusesIt) {
  const AxisList negative{-1};
  EXPECT_EQ(negative[0], -1);  // reported as -1 by whoever checks it against a mesh
  EXPECT_EQ(testing::input_error([] { AxisList{1000}; }),
            "mesh axis index 1000 is not an axis of any mesh; a mesh has at most 16 axes, numbered from 0");
}

// A spec naming one axis again, more times than a list has room for, is told the rule it
// breaks, as a spec naming it twice is; never an overrun.
TEST(AxisList, SpecRepeatingAnAxisPastTheCapacityNamesTheRepeat) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  std::string many = "A[I_{";
  for (int i = 0; i < 40; ++i) many += std::string(i ? "," : "") + "X";
  many += "}]";
  for (const std::string& text : {many, "A[I_" + std::string(40, 'X') + "]", std::string("A[I_{X,X}]")}) {
    EXPECT_NE(testing::input_error([&] { parse_spec(text, mesh); }).find("mesh axis 'X' appears twice in dimension I"),
              std::string::npos)
        << text;
  }
}

}  // namespace
}  // namespace shardmm
