// The mpi backend's point-to-point messages through shared memory (src/runtime/mpi/
// shared_messages.h), run by threads of one process: each thread is a rank with its own
// SharedMessages, and blocks are mapped through /proc/self's descriptors as a peer process maps
// them. Every byte arrives, matched per sender and tag in order; lent data is read where it lies
// and its send completes only when the receiver lets go; a rank forwards what it was lent
// without copying; a receive of the wrong size is caught.
#include "runtime/mpi/shared_messages.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace shardmm::detail {
namespace {

// Shareable memory freed when the test is done with it.
struct Block {
  explicit Block(std::size_t bytes) : data(static_cast<char*>(allocate_shareable(bytes))) {}
  ~Block() { free_shareable(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  char* data;
};

// n ranks' mailboxes in plain memory of this process, zeroed, and each rank's SharedMessages.
struct Ranks {
  explicit Ranks(int n)
      : memory(static_cast<std::size_t>(n) * SharedMessages::mailbox_bytes(static_cast<std::size_t>(n)) + 64, 0) {
    std::vector<char*> boxes;
    char* base = memory.data() + (64 - reinterpret_cast<std::uintptr_t>(memory.data()) % 64) % 64;
    for (int r = 0; r < n; ++r) {
      boxes.push_back(base + static_cast<std::size_t>(r) * SharedMessages::mailbox_bytes(static_cast<std::size_t>(n)));
    }
    for (int r = 0; r < n; ++r) {
      at.push_back(
          std::make_unique<SharedMessages>(r, boxes, std::vector<pid_t>(static_cast<std::size_t>(n), getpid())));
    }
  }
  SharedMessages& operator[](int r) { return *at[static_cast<std::size_t>(r)]; }
  std::vector<char> memory;
  std::vector<std::unique_ptr<SharedMessages>> at;
};

void idle() { std::this_thread::yield(); }

template <class Done>
void spin(SharedMessages& m, Done&& done) {
  while (!done()) {
    if (!m.progress()) idle();
  }
}

char pattern(int from, int to, std::size_t message, std::size_t i) {
  return static_cast<char>((from * 131 + to * 31 + static_cast<int>(message) * 7 + static_cast<int>(i) * 13) & 0xff);
}

struct Message {
  int from, to, tag;
  std::size_t bytes;
  bool lend, shareable;  // lent where the sender's data lies in a shareable block
};

// Random messages among 4 ranks, more per pair than a ring holds, of sizes from empty to several
// blocks, some lent: every receive gets its own message's bytes, lent ones in place.
TEST(SharedMessages, RandomMessagesArriveInOrderPerSenderAndTag) {
  constexpr int n = 4;
  std::mt19937 rng(7);
  std::vector<Message> messages;
  for (int k = 0; k < 1600; ++k) {
    const int from = static_cast<int>(rng() % n);
    const int to = static_cast<int>((static_cast<unsigned>(from) + 1 + rng() % (n - 1)) % n);
    const unsigned kind = rng() % 4;
    const std::size_t bytes = kind == 0 ? 0 : kind == 1 ? 1 + rng() % 300 : 1000 + rng() % 150000;
    messages.push_back({from, to, static_cast<int>(rng() % 3), bytes, rng() % 2 == 0, rng() % 2 == 0});
  }
  Ranks ranks(n);
  std::vector<std::unique_ptr<Block>> shared(messages.size());
  std::vector<std::vector<char>> heap(messages.size()), landed(messages.size());
  std::int64_t expect_lent = 0;
  for (std::size_t k = 0; k < messages.size(); ++k) {
    const Message& m = messages[k];
    char* data = nullptr;
    if (m.shareable && m.bytes > 0) {
      shared[k] = std::make_unique<Block>(m.bytes);
      data = shared[k]->data;
      expect_lent += m.lend ? 1 : 0;
    } else {
      heap[k].resize(m.bytes);
      data = heap[k].data();
    }
    for (std::size_t i = 0; i < m.bytes; ++i) data[i] = pattern(m.from, m.to, k, i);
    landed[k].assign(m.bytes, 0);
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int me = 0; me < n; ++me) {
    threads.emplace_back([&, me] {
      SharedMessages& box = ranks[me];
      // Receives first, then the sends. The receives go in by tag, highest first (so not in the
      // order of the sends), and per sender and tag in the order of the sends, which is what
      // they must match.
      std::vector<std::size_t> mine;
      for (std::size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].to == me) mine.push_back(k);
      }
      std::stable_sort(mine.begin(), mine.end(),
                       [&](std::size_t l, std::size_t r) { return messages[l].tag > messages[r].tag; });
      std::vector<std::pair<std::size_t, std::shared_ptr<SharedMessages::Receive>>> receives;
      for (std::size_t k : mine) {
        const Message& m = messages[k];
        receives.emplace_back(k, box.receive(landed[k].data(), m.bytes, m.from, m.tag, m.lend));
      }
      std::vector<SharedMessages::Ticket> tickets;
      for (std::size_t k = 0; k < messages.size(); ++k) {
        const Message& m = messages[k];
        if (m.from != me) continue;
        const char* data = shared[k] ? shared[k]->data : heap[k].data();
        if (auto t = box.send(data, m.bytes, m.to, m.tag, m.lend, [&] {
              box.progress();
              idle();
            }))
          tickets.push_back(*t);
      }
      std::size_t checked = 0;
      std::vector<bool> done(receives.size(), false);
      spin(box, [&] {
        for (std::size_t i = 0; i < receives.size(); ++i) {
          auto& [k, r] = receives[i];
          if (done[i] || !r->arrived) continue;
          done[i] = true;
          ++checked;
          const Message& m = messages[k];
          bool ok = !r->mismatched && (m.bytes == 0 || r->at != nullptr);
          for (std::size_t b = 0; ok && b < m.bytes; ++b) ok = r->at[b] == pattern(m.from, m.to, k, b);
          // Lent and shareable: read where the sender wrote it, not copied into the landing buffer.
          if (m.bytes > 0 && m.lend && m.shareable) ok = ok && r->at != landed[k].data();
          if (!m.lend) ok = ok && r->at == landed[k].data();
          if (!ok) ++wrong;
          box.release(*r);
        }
        return checked == receives.size();
      });
      spin(box, [&] {
        for (const auto& t : tickets) {
          if (!box.acknowledged(t)) return false;
        }
        return box.sends_read();
      });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  std::int64_t lent = 0, copied = 0;
  for (int r = 0; r < n; ++r) {
    lent += ranks[r].lent_sends();
    copied += ranks[r].copied_sends();
  }
  EXPECT_EQ(lent, expect_lent);
  EXPECT_EQ(lent + copied, static_cast<std::int64_t>(messages.size()));
}

// A lent send completes only once its receiver lets go; until then the receiver reads the
// sender's own bytes, so a write by the sender shows through (what a real program must not do,
// and what proves nothing was copied).
TEST(SharedMessages, LentSendCompletesWhenTheReceiverLetsGo) {
  Ranks ranks(2);
  Block block(1 << 17);
  std::memset(block.data, 1, 1 << 17);
  const auto ticket = ranks[0].send(block.data, 1 << 17, 1, 5, true, idle);
  ASSERT_TRUE(ticket.has_value());
  std::vector<char> landing(1 << 17, 0);
  auto r = ranks[1].receive(landing.data(), 1 << 17, 0, 5, true);
  spin(ranks[1], [&] { return r->arrived; });
  EXPECT_FALSE(ranks[0].acknowledged(*ticket));
  block.data[100] = 9;
  EXPECT_EQ(r->at[100], 9);
  EXPECT_EQ(landing[100], 0);
  ranks[1].release(*r);
  EXPECT_TRUE(ranks[0].acknowledged(*ticket));
}

// A ring: rank 0 lends a block to 1, 1 forwards what it was lent to 2 and 2 back to 0 — no
// copy anywhere, 2 and 0 reading rank 0's block (0 in its own memory).
TEST(SharedMessages, ForwardedLentDataStaysWhereItLies) {
  Ranks ranks(3);
  constexpr std::size_t bytes = 1 << 16;
  Block block(bytes);
  for (std::size_t i = 0; i < bytes; ++i) block.data[i] = static_cast<char>(i * 7);
  std::vector<char> landing(bytes);
  const auto t01 = ranks[0].send(block.data, bytes, 1, 0, true, idle);
  auto r1 = ranks[1].receive(landing.data(), bytes, 0, 0, true);
  spin(ranks[1], [&] { return r1->arrived; });
  const auto t12 = ranks[1].send(r1->at, bytes, 2, 0, true, idle);
  auto r2 = ranks[2].receive(landing.data(), bytes, 1, 0, true);
  spin(ranks[2], [&] { return r2->arrived; });
  const auto t20 = ranks[2].send(r2->at, bytes, 0, 0, true, idle);
  auto r0 = ranks[0].receive(landing.data(), bytes, 2, 0, true);
  spin(ranks[0], [&] { return r0->arrived; });
  ASSERT_TRUE(t01 && t12 && t20);
  EXPECT_EQ(r0->at, block.data);  // back home: rank 0's own block, not a mapping of it
  EXPECT_EQ(std::memcmp(r2->at, block.data, bytes), 0);
  EXPECT_EQ(ranks[0].copied_sends() + ranks[1].copied_sends() + ranks[2].copied_sends(), 0);
  ranks[0].release(*r0);
  ranks[1].release(*r1);
  ranks[2].release(*r2);
  EXPECT_TRUE(ranks[0].acknowledged(*t01));
  EXPECT_TRUE(ranks[1].acknowledged(*t12));
  EXPECT_TRUE(ranks[2].acknowledged(*t20));
}

// A block freed (Buffers not shareable: nothing is kept) and a new one made under the same
// descriptor: the receiver, which mapped the
// old one, maps the new one (the serial tells them apart) and reads the new bytes.
TEST(SharedMessages, AReusedDescriptorIsMappedAfresh) {
  Ranks ranks(2);
  std::vector<char> landing(1 << 16);
  for (char value : {'a', 'b', 'c'}) {
    Block block(1 << 16);
    std::memset(block.data, value, 1 << 16);
    const auto t = ranks[0].send(block.data, 1 << 16, 1, 0, true, idle);
    auto r = ranks[1].receive(landing.data(), 1 << 16, 0, 0, true);
    spin(ranks[1], [&] { return r->arrived; });
    EXPECT_EQ(r->at[0], value);
    EXPECT_EQ(r->at[(1 << 16) - 1], value);
    ranks[1].release(*r);
    ASSERT_TRUE(t && ranks[0].acknowledged(*t));
  }
}

// While Buffers are shareable a freed block is kept and handed out again for a request of its
// size class, under the same name: the peer reads the new bytes through the mapping it has.
TEST(SharedMessages, AKeptBlockIsLentAgainUnderItsName) {
  set_buffers_shareable(true);
  Ranks ranks(2);
  std::vector<char> landing(100000);
  std::optional<BlockPlace> first;
  for (char value : {'d', 'e'}) {
    Block block(100000 - value);  // the same size class both times
    std::memset(block.data, value, 100000 - value);
    const std::optional<BlockPlace> place = find_shareable(block.data, 1);
    ASSERT_TRUE(place.has_value());
    if (first) {
      EXPECT_EQ(place->block.fd, first->block.fd);
      EXPECT_EQ(place->block.serial, first->block.serial);
    }
    first = place;
    const auto t = ranks[0].send(block.data, 100000 - value, 1, 0, true, idle);
    auto r = ranks[1].receive(landing.data(), 100000 - value, 0, 0, true);
    spin(ranks[1], [&] { return r->arrived; });
    EXPECT_EQ(r->at[0], value);
    EXPECT_EQ(r->at[100000 - value - 1], value);
    ranks[1].release(*r);
    ASSERT_TRUE(t && ranks[0].acknowledged(*t));
  }
  set_buffers_shareable(false);
}

// A step's blocks, all freed, serve the next step of the same sizes in the same order: none is
// made anew (its pages faulted in again). Kept only by a count (32) below the step's, the
// blocks freed first were gone by the time the next step asked for them again.
TEST(SharedMessages, EveryFreedBlockServesTheNextStep) {
  set_buffers_shareable(true);
  std::vector<std::size_t> sizes;
  // 200 blocks, 131 MiB: far past 32, within the 256 MiB kept.
  for (int i = 0; i < 200; ++i) sizes.push_back((std::size_t{64} << 10) * static_cast<std::size_t>(1 + i % 20));
  const auto step = [&] {
    std::set<std::pair<std::int32_t, std::uint64_t>> names;
    std::vector<void*> blocks;
    for (std::size_t bytes : sizes) {
      blocks.push_back(allocate_shareable(bytes));
      const std::optional<BlockPlace> place = find_shareable(blocks.back(), bytes);
      if (place) names.insert({place->block.fd, place->block.serial});
    }
    for (void* b : blocks) EXPECT_TRUE(free_shareable(b));
    return names;
  };
  const auto first = step();
  ASSERT_EQ(first.size(), sizes.size());
  EXPECT_EQ(step(), first);
  set_buffers_shareable(false);
}

// A copied send is complete at once, but its copy stays until the receiver has read it: a rank
// that ends its run waits for that (the copy's block would otherwise go with the sender).
TEST(SharedMessages, ACopyStaysUntilItIsRead) {
  Ranks ranks(2);
  std::vector<char> data(1000, 'z'), into(1000, 0);
  EXPECT_FALSE(ranks[0].send(data.data(), 1000, 1, 0, true, idle).has_value());  // heap data: copied
  std::fill(data.begin(), data.end(), 'w');  // the send is complete: its buffer is the caller's again
  EXPECT_FALSE(ranks[0].sends_read());
  auto r = ranks[1].receive(into.data(), 1000, 0, 0, false);
  spin(ranks[1], [&] { return r->arrived; });
  EXPECT_EQ(into[999], 'z');
  EXPECT_TRUE(ranks[0].sends_read());
}

// Blocks hold a descriptor each: past half of the process's limit allocate_shareable says no
// (the caller takes heap memory), and the program can still open files.
TEST(SharedMessages, BlocksLeaveHalfTheDescriptorsFree) {
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit low = was;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) {
    void* b = allocate_shareable(1 << 16);
    if (!b) break;
    blocks.push_back(b);
  }
  EXPECT_EQ(blocks.size(), 32u);
  const int fd = open("/dev/null", O_RDONLY);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  for (void* b : blocks) EXPECT_TRUE(free_shareable(b));
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
}

// Peers' blocks stay mapped for the next message only up to a limit, the least recently used
// going first, and never one that a lent receive still reads.
TEST(SharedMessages, UnreadMappingsAreKeptUpToALimit) {
  constexpr std::size_t bytes = 1 << 16;
  std::vector<char> mailboxes(2 * SharedMessages::mailbox_bytes(2) + 64, 0);
  char* base = mailboxes.data() + (64 - reinterpret_cast<std::uintptr_t>(mailboxes.data()) % 64) % 64;
  const std::vector<char*> boxes = {base, base + SharedMessages::mailbox_bytes(2)};
  const std::vector<pid_t> pids(2, getpid());
  SharedMessages sender(0, boxes, pids), receiver(1, boxes, pids, 2 * bytes);
  std::vector<std::unique_ptr<Block>> blocks;
  std::vector<std::shared_ptr<SharedMessages::Receive>> held;
  std::vector<char> landing(bytes);
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(std::make_unique<Block>(bytes));
    std::memset(blocks.back()->data, 'a' + i, bytes);
    sender.send(blocks.back()->data, bytes, 1, 0, true, idle);
    held.push_back(receiver.receive(landing.data(), bytes, 0, 0, true));
    spin(receiver, [&] { return held.back()->arrived; });
    EXPECT_EQ(held.back()->at[bytes - 1], 'a' + i);
  }
  // Four blocks read at once: all stay mapped, over the limit.
  EXPECT_EQ(receiver.mapped_bytes(), 4 * bytes);
  for (auto& r : held) receiver.release(*r);
  EXPECT_EQ(receiver.mapped_bytes(), 2 * bytes);
  // The two kept are the last used: a message from the last block reads it without a new mapping.
  sender.send(blocks[3]->data, bytes, 1, 0, true, idle);
  auto again = receiver.receive(landing.data(), bytes, 0, 0, true);
  spin(receiver, [&] { return again->arrived; });
  EXPECT_EQ(again->at, held[3]->at);
  receiver.release(*again);
  EXPECT_TRUE(sender.sends_read());
}

// A receive of another size than the message sent is flagged (and the message consumed), and
// the next message of the pair still arrives.
TEST(SharedMessages, AReceiveOfTheWrongSizeIsCaught) {
  Ranks ranks(2);
  std::vector<char> data(100, 'x'), into(200, 0);
  ranks[0].send(data.data(), 100, 1, 3, false, idle);
  ranks[0].send(data.data(), 50, 1, 3, false, idle);
  auto wrong = ranks[1].receive(into.data(), 200, 0, 3, false);
  auto right = ranks[1].receive(into.data(), 50, 0, 3, false);
  spin(ranks[1], [&] { return wrong->arrived && right->arrived; });
  EXPECT_TRUE(wrong->mismatched);
  EXPECT_FALSE(right->mismatched);
  EXPECT_EQ(into[49], 'x');
  EXPECT_EQ(into[50], 0);
}

// A receive withdrawn before anything arrived matches nothing: the next receive of that tag
// takes the message.
TEST(SharedMessages, AWithdrawnReceiveMatchesNothing) {
  Ranks ranks(2);
  std::vector<char> data(10, 'y'), first(10, 0), second(10, 0);
  auto withdrawn = ranks[1].receive(first.data(), 10, 0, 1, false);
  ranks[1].release(*withdrawn);
  auto taken = ranks[1].receive(second.data(), 10, 0, 1, false);
  ranks[0].send(data.data(), 10, 1, 1, false, idle);
  spin(ranks[1], [&] { return taken->arrived; });
  EXPECT_FALSE(withdrawn->arrived);
  EXPECT_EQ(second[9], 'y');
  EXPECT_EQ(first[9], 0);
}

}  // namespace
}  // namespace shardmm::detail
