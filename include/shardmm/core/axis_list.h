// Mesh axis indices, ordered major to minor where order matters: the axes sharding one
// dimension, a spec's pending sums, a collective's group.
//
// Held inline, without the heap: specs are copied by the million when a program is solved
// (every candidate reshard, every recorded op), and a std::vector per sharded dimension made
// those copies allocate. An axis appears at most once in a list, so a list holds at most as
// many axes as a mesh has (kMaxMeshAxes).
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>

namespace shardmm {

// The most axes a mesh may have (Mesh's constructor refuses more): MaxText's meshes name
// twelve, most of them of size 1.
inline constexpr int kMaxMeshAxes = 16;

// Thrown (as InputError) when a list would hold more than kMaxMeshAxes axes: only an axis
// named again can do that, as in "I_{X,X,...}".
[[noreturn]] void throw_axis_list_full();
// Thrown (as InputError) for an index no mesh has (past a byte's range), given in code.
[[noreturn]] void throw_not_an_axis(int axis);

// One axis's index in its mesh: a byte, which keeps a list (and so a spec's dimension) small.
// Signed, so that a bad index given in code (-1) is reported as given.
using Axis = std::int8_t;

class AxisList {
 public:
  using value_type = Axis;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = Axis&;
  using const_reference = const Axis&;
  using pointer = Axis*;
  using const_pointer = const Axis*;
  using iterator = Axis*;
  using const_iterator = const Axis*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  AxisList() = default;
  AxisList(std::initializer_list<int> axes) : AxisList(axes.begin(), axes.end()) {}
  template <std::input_iterator It>
  AxisList(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<int>(*first));
  }
  // `n` axes, each `value` (filled in by the caller: Mesh::all_axes).
  explicit AxisList(size_type n, int value = 0) {
    if (n > kMaxMeshAxes) throw_axis_list_full();
    if (value != static_cast<Axis>(value)) throw_not_an_axis(value);
    std::fill_n(items_.begin(), n, static_cast<Axis>(value));
    size_ = static_cast<std::uint8_t>(n);
  }

  size_type size() const { return size_; }
  bool empty() const { return size_ == 0; }
  static constexpr size_type max_size() { return kMaxMeshAxes; }

  iterator begin() { return items_.data(); }
  iterator end() { return items_.data() + size_; }
  const_iterator begin() const { return items_.data(); }
  const_iterator end() const { return items_.data() + size_; }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }
  Axis* data() { return items_.data(); }
  const Axis* data() const { return items_.data(); }

  Axis& operator[](size_type i) { return items_[i]; }
  const Axis& operator[](size_type i) const { return items_[i]; }
  Axis& front() { return items_[0]; }
  const Axis& front() const { return items_[0]; }
  Axis& back() { return items_[size_ - 1u]; }
  const Axis& back() const { return items_[size_ - 1u]; }

  void push_back(int axis) {
    if (size_ == kMaxMeshAxes) throw_axis_list_full();
    if (axis != static_cast<Axis>(axis)) throw_not_an_axis(axis);
    items_[size_++] = static_cast<Axis>(axis);
  }
  void emplace_back(int axis) { push_back(axis); }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  void resize(size_type n, int value = 0) {
    if (n > kMaxMeshAxes) throw_axis_list_full();
    if (value != static_cast<Axis>(value)) throw_not_an_axis(value);
    if (n > size_)
      std::fill(items_.begin() + size_, items_.begin() + static_cast<difference_type>(n), static_cast<Axis>(value));
    size_ = static_cast<std::uint8_t>(n);
  }

  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    for (; first != last; ++first) push_back(static_cast<int>(*first));
  }

  iterator insert(const_iterator at, int axis) {
    const auto i = at - begin();
    push_back(axis);
    std::rotate(begin() + i, end() - 1, end());
    return begin() + i;
  }
  template <std::input_iterator It>
  iterator insert(const_iterator at, It first, It last) {
    const auto i = at - begin();
    const auto old_size = static_cast<difference_type>(size_);
    for (; first != last; ++first) push_back(static_cast<int>(*first));
    std::rotate(begin() + i, begin() + old_size, end());
    return begin() + i;
  }
  iterator erase(const_iterator at) { return erase(at, at + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const auto i = first - begin();
    const auto n = last - first;
    std::copy(begin() + i + n, end(), begin() + i);
    size_ = static_cast<std::uint8_t>(size_ - n);
    return begin() + i;
  }

  friend bool operator==(const AxisList& a, const AxisList& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend std::strong_ordering operator<=>(const AxisList& a, const AxisList& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::array<Axis, kMaxMeshAxes> items_{};
  std::uint8_t size_ = 0;
};

}  // namespace shardmm
