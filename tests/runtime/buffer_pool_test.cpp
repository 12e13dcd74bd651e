// The caching pool behind Buffers (tensor.h: BufferPoolStats): a freed block serves the next
// Buffer of its size (or of up to half of it), it is kept until the run ends, and a block is
// made only where none kept serves: the blocks of a size never outnumber the most in use at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "random_cases.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// The bytes the process has in the pool's blocks: in use (spare included) and kept.
std::int64_t held() {
  const BufferPoolStats s = buffer_pool_stats();
  return s.live_bytes + s.spare_bytes + s.kept_bytes;
}

TEST(BufferPool, AFreedBlockServesTheNextBufferOfItsSizeAndReleaseGivesItBack) {
  release_buffer_pool();
  const BufferPoolStats start = buffer_pool_stats();
  const void* first = nullptr;
  {
    Buffer b(kMiB / 4, DType::f32);
    first = b.data();
    std::memset(b.data(), 0x5a, static_cast<std::size_t>(b.bytes()));
    EXPECT_EQ(buffer_pool_stats().live_bytes, start.live_bytes + kMiB);
  }
  EXPECT_EQ(buffer_pool_stats().kept_bytes, kMiB);
  {
    Buffer again(kMiB / 8, DType::f64);  // the same bytes in another dtype
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(buffer_pool_stats().kept_bytes, 0);
    EXPECT_EQ(buffer_pool_stats().reused_bytes, kMiB);
  }
  release_buffer_pool();
  const BufferPoolStats end = buffer_pool_stats();
  EXPECT_EQ(end.kept_bytes, 0);
  EXPECT_EQ(end.live_bytes, start.live_bytes);
  EXPECT_EQ(end.peak_bytes, end.live_bytes);
  EXPECT_EQ(end.reused_bytes, 0);
}

// A miss keeps what is kept, past the peak of live bytes: the next request of the kept size
// (the smaller one of the step that comes next) finds it. Letting it go to stay within the peak,
// each step made it again.
TEST(BufferPool, AMissKeepsTheBlocksKept) {
  release_buffer_pool();
  const std::int64_t live = buffer_pool_stats().live_bytes;
  std::optional<Buffer> small(std::in_place, kMiB / 4, DType::f32);
  const void* small_data = small->data();
  small.reset();
  EXPECT_EQ(buffer_pool_stats().kept_bytes, kMiB);
  const Buffer large(kMiB / 2, DType::f32);  // 2 MiB: the kept 1 MiB does not serve it
  const BufferPoolStats s = buffer_pool_stats();
  EXPECT_EQ(s.kept_bytes, kMiB);
  EXPECT_EQ(s.peak_bytes, live + 2 * kMiB);
  const Buffer small_again(kMiB / 4, DType::f32);
  EXPECT_EQ(small_again.data(), small_data);
}

// Of the kept blocks of a size, a thread takes back the latest it freed itself, else the latest.
TEST(BufferPool, AThreadTakesBackTheLatestBlockItFreed) {
  release_buffer_pool();
  std::optional<Buffer> older(std::in_place, kMiB / 4, DType::f32), mine(std::in_place, kMiB / 4, DType::f32);
  std::optional<Buffer> theirs(std::in_place, kMiB / 4, DType::f32);
  const void* older_data = older->data();
  const void* mine_data = mine->data();
  const void* theirs_data = theirs->data();
  older.reset();
  mine.reset();
  std::thread([&] { theirs.reset(); }).join();  // freed last, by another thread
  const Buffer first(kMiB / 4, DType::f32);
  EXPECT_EQ(first.data(), mine_data);
  const Buffer second(kMiB / 4, DType::f32);
  EXPECT_EQ(second.data(), older_data);
  const Buffer third(kMiB / 4, DType::f32);
  EXPECT_EQ(third.data(), theirs_data);
}

// A kept block serves a request of at least half its size when none of that size is kept: what
// it holds beyond the request is spare, it goes back kept at its own size; a smaller request
// misses.
TEST(BufferPool, AKeptBlockServesARequestOfUpToHalfItsSizeWhole) {
  release_buffer_pool();
  const BufferPoolStats start = buffer_pool_stats();
  std::optional<Buffer> block(std::in_place, kMiB / 4, DType::f32);
  const void* data = block->data();
  block.reset();
  {
    const Buffer half(kMiB / 8, DType::f32);
    EXPECT_EQ(half.data(), data);
    EXPECT_EQ(half.bytes(), kMiB / 2);
    const BufferPoolStats s = buffer_pool_stats();
    EXPECT_EQ(s.live_bytes, start.live_bytes + kMiB / 2);
    EXPECT_EQ(s.spare_bytes, kMiB / 2);
    EXPECT_EQ(s.kept_bytes, 0);
    EXPECT_EQ(s.reused_bytes, kMiB / 2);
  }
  EXPECT_EQ(buffer_pool_stats().kept_bytes, kMiB);
  EXPECT_EQ(buffer_pool_stats().spare_bytes, 0);
  {
    const Buffer again(kMiB / 4, DType::f32);  // the block at its own size again
    EXPECT_EQ(again.data(), data);
  }
  const std::int64_t reused = buffer_pool_stats().reused_bytes;
  {
    const Buffer quarter(kMiB / 16 - 16, DType::f32);  // under half of the kept block: its own
    EXPECT_EQ(buffer_pool_stats().reused_bytes, reused);
    EXPECT_EQ(buffer_pool_stats().kept_bytes, kMiB);
  }
  EXPECT_EQ(buffer_pool_stats().kept_bytes, kMiB + kMiB / 4 - 64);
}

// A program step's mix of sizes, as the executed tape makes it for all_gather then einsum: two
// operands, the gathered operand and the gather's staging, the staging freed before the product.
// From the second step on every block is a kept one (kept by exact size only, the product missed
// and let go of the staging's block, whose next request then missed too: a step faulted 1.5 MiB
// in). The peak stays the first step's, and so do the blocks: the later steps make none.
TEST(BufferPool, StepsWithAChangingMixOfSizesReuseEveryBlock) {
  release_buffer_pool();
  constexpr std::int64_t kHalf = kMiB / 8, kWhole = kMiB / 4;  // f32 elements: 512 KiB, 1 MiB
  BufferPoolStats after_first{};
  std::int64_t held_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    const std::int64_t reused = buffer_pool_stats().reused_bytes;
    {
      const Buffer a(kHalf, DType::f32), b(kHalf, DType::f32), gathered(kWhole, DType::f32);
      std::optional<Buffer> staging(std::in_place, kWhole, DType::f32);
      staging.reset();
      const Buffer product(kHalf, DType::f32);
    }
    if (step == 0) {
      after_first = buffer_pool_stats();
      held_after_first = held();
      continue;
    }
    SCOPED_TRACE(step);
    EXPECT_EQ(buffer_pool_stats().reused_bytes - reused, 7 * kMiB / 2);  // a, b, gathered, staging, product
    EXPECT_EQ(buffer_pool_stats().peak_bytes, after_first.peak_bytes);
    EXPECT_EQ(held(), held_after_first);
  }
}

// Steps whose sizes do not fit under the peak of live bytes in the order they come (two large
// blocks, then many small ones once they are freed): kept within that peak, the large ones went
// to make room for the small ones and every step made both again. From the second step on, none.
TEST(BufferPool, StepsWhoseSizesTakeTurnsMakeNoBlockAfterTheFirst) {
  release_buffer_pool();
  std::int64_t held_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    {
      const Buffer first(kMiB, DType::f32), second(kMiB, DType::f32);  // 4 MiB each
    }
    {
      std::vector<Buffer> small;
      for (int i = 0; i < 12; ++i) small.emplace_back(kMiB / 8, DType::f32);  // 512 KiB each: 6 MiB
    }
    if (step == 0) {
      held_after_first = held();
      continue;
    }
    EXPECT_EQ(held(), held_after_first) << "step " << step;
  }
  EXPECT_GT(held_after_first, buffer_pool_stats().peak_bytes);  // past the peak: 14 MiB against 8
}

// A run sweeping sizes (calibrate's, a benchmark's) keeps no more than twice its peak: a miss
// lets go of the kept blocks of sizes met before, largest first.
TEST(BufferPool, ASweepOfSizesHoldsAtMostTwiceItsPeak) {
  release_buffer_pool();
  const std::int64_t before = held();
  for (int i = 1; i <= 24; ++i) {
    const Buffer b(i * kMiB / 4, DType::f32);  // i MiB, one at a time
    EXPECT_LE(held() - before, 2 * buffer_pool_stats().peak_bytes) << i << " MiB";
  }
  EXPECT_LE(held() - before, 2 * 24 * kMiB);
}

// Random lives of Buffers of a few sizes, small (the heap's, not pooled) and large: after every
// step the pool holds no more than, for each size b asked for, the most Buffers of b/2 to b bytes
// (those a block of b may serve) in use at once, times b; and blocks are reused.
TEST(BufferPool, RandomAllocationsMakeNoMoreBlocksThanTheirSizesUsedAtOnce) {
  release_buffer_pool();
  const std::int64_t before = held();
  testing::Rng rng(71);
  std::vector<Buffer> live;
  std::map<std::int64_t, std::int64_t> most;  // by pooled bytes asked for: the most in range at once
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && testing::uniform(rng, 0, 2) == 0) {
      live.erase(live.begin() + testing::uniform(rng, 0, static_cast<int>(live.size()) - 1));
    } else if (i % 5 == 0) {
      live.emplace_back(100, DType::f32);
    } else {
      live.emplace_back(testing::uniform(rng, 1, 4) * kMiB / 16 + (i % 7 == 0 ? 0 : 64), DType::f32);
      if (live.back().bytes() >= (std::int64_t{64} << 10)) most.emplace(live.back().bytes(), 0);
    }
    std::int64_t bound = 0;
    for (auto& [asked, n] : most) {
      const std::int64_t block = asked;  // a structured binding is not captured before C++20
      const auto in_range = std::count_if(
          live.begin(), live.end(), [&](const Buffer& b) { return 2 * b.bytes() >= block && b.bytes() <= block; });
      n = std::max<std::int64_t>(n, in_range);
      bound += n * block;
    }
    ASSERT_LE(held() - before, bound) << "after step " << i;
  }
  live.clear();
  EXPECT_GT(buffer_pool_stats().kept_bytes, 0);
  EXPECT_GT(buffer_pool_stats().reused_bytes, 0);
}

// run_threads (and run_backend) give back what the run left.
TEST(BufferPool, ARunLeavesNothingKept) {
  run_threads(Mesh::parse("X=2"), [](Communicator&) { Buffer b(kMiB, DType::f32); });
  EXPECT_EQ(buffer_pool_stats().kept_bytes, 0);
}

}  // namespace
}  // namespace shardmm
