// The summation all backends share (src/runtime/ordered_sum.h): every kernel it may pick
// (cached or streamed stores, any output alignment, in place in the first or last source or
// not, read by peers next or not) gives, element by element, the bits of a plain left-to-right
// sum in source order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/ordered_sum.h"

namespace shardmm {
namespace {

// Values of very different magnitudes, so that any other order of additions rounds
// differently somewhere: n_sources rows of `length` values, drawn once per count and source
// count and shared by every kernel variant (drawing them dominated the test's time).
template <class T>
std::vector<std::vector<T>> random_sources(std::size_t n_sources, std::size_t length, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<std::vector<T>> data(n_sources, std::vector<T>(length));
  for (auto& source : data) {
    for (T& x : source) x = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  }
  return data;
}

// Sums count elements of every source, starting at out_offset, with sum_in_order: into a
// separate output, or in place in source in_place_source (of a copy of the sources).
template <class T>
void expect_ordered_sums(DType dtype, std::vector<std::vector<T>> data, std::int64_t count, std::size_t out_offset,
                         int in_place_source, bool peers_read_out) {
  const std::size_t n_sources = data.size();
  std::vector<T> expected(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    T acc = data[0][out_offset + static_cast<std::size_t>(i)];
    for (std::size_t s = 1; s < n_sources; ++s) acc += data[s][out_offset + static_cast<std::size_t>(i)];
    expected[static_cast<std::size_t>(i)] = acc;
  }
  std::vector<const void*> sources;
  for (auto& source : data) sources.push_back(source.data() + out_offset);
  std::vector<T> separate(static_cast<std::size_t>(count) + out_offset + 16);
  const bool in_place = in_place_source >= 0;
  T* out =
      in_place ? data[static_cast<std::size_t>(in_place_source)].data() + out_offset : separate.data() + out_offset;
  detail::sum_in_order(dtype, sources, count, out, peers_read_out);
  // Bits, not values: -0.0 == 0.0 and NaN != NaN would hide a different order of additions.
  const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
  ASSERT_TRUE(count == 0 || std::memcmp(out, expected.data(), bytes) == 0)
      << "count " << count << ", " << n_sources << " sources, output offset " << out_offset
      << (in_place ? ", in place in source " + std::to_string(in_place_source) : std::string())
      << (peers_read_out ? ", read by peers" : "");
}

TEST(OrderedSumTest, EveryKernelGivesTheLeftToRightSumsBits) {
  const std::int64_t threshold_elements = detail::l2_cache_bytes() / 4;
  // Counts below, around and far above the size where the output is streamed, with
  // outputs at every alignment a float or double can have within a 64-byte line.
  for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{63}, std::int64_t{1000},
                             threshold_elements / 3 + 7, threshold_elements + 129}) {
    for (std::size_t n : {1u, 2u, 3u, 5u}) {
      const auto seed = static_cast<std::uint32_t>(count * 131 + n * 17);
      const std::size_t max_offset = 15;
      const auto floats = random_sources<float>(n, static_cast<std::size_t>(count) + max_offset, seed);
      const auto doubles = random_sources<double>(n, static_cast<std::size_t>(count) + max_offset, seed + 1);
      for (std::size_t offset : {0u, 1u, 3u, 7u, 15u}) {
        for (int in_place_source : {-1, 0, static_cast<int>(n) - 1}) {
          for (bool peers_read_out : {false, true}) {
            expect_ordered_sums<float>(DType::f32, floats, count, offset, in_place_source, peers_read_out);
            expect_ordered_sums<double>(DType::f64, doubles, count, offset % 8, in_place_source, peers_read_out);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardmm
