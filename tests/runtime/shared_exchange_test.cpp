// The mpi backend's shared-memory exchange (src/runtime/mpi/shared_exchange.h), run by threads
// over plain memory: every byte arrives where it is expected, over many rounds and many
// exchanges in a row, and a sender that sends another count than its reader expects is caught.
#include "runtime/mpi/shared_exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace shardmm::detail {
namespace {

struct Aborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `bytes[e][w][r]`: what w sends r in exchange e. Member w's bytes for r are a pattern of (e, w,
// r, index), so a piece landing in another place or exchange shows.
using Plan = std::vector<std::vector<std::vector<std::int64_t>>>;

char pattern(std::size_t e, std::size_t w, std::size_t r, std::int64_t i) {
  return static_cast<char>((e * 131 + w * 31 + r * 7 + static_cast<std::size_t>(i) * 13) & 0xff);
}

// n members' segments in plain memory, 64-byte aligned and cleared.
struct Segments {
  Segments(std::size_t n, std::size_t part)
      : memory(n, std::vector<char>(SharedExchange::segment_bytes(n, part) + 64)) {
    for (auto& m : memory) {
      char* aligned = m.data() + (64 - reinterpret_cast<std::uintptr_t>(m.data()) % 64) % 64;
      SharedExchange::clear(aligned, n);
      at.push_back(aligned);
    }
  }
  std::vector<std::vector<char>> memory;
  std::vector<char*> at;
};

// Which shares a writer sends elsewhere: elsewhere(e, w, r) for w's share for r in exchange e.
using Elsewhere = std::function<bool(std::size_t, std::size_t, std::size_t)>;

// Runs the plan on n threads. A reader that catches a mismatch records it and makes every other
// member give up at its next idle pass. Returns the mismatches seen, as "reader<-writer".
std::vector<std::string> run(const Plan& plan, std::size_t n, std::size_t part, const Plan* expected = nullptr,
                             ExchangeCopy copy = ExchangeCopy::learn, const Elsewhere& elsewhere = nullptr) {
  Segments memory(n, part);
  const std::vector<char*>& segments = memory.at;
  std::atomic<bool> abort{false};
  std::vector<std::string> mismatches(n);
  std::vector<std::thread> members;
  for (std::size_t me = 0; me < n; ++me) {
    members.emplace_back([&, me] {
      SharedExchange ex(segments, me, part, copy);
      try {
        for (std::size_t e = 0; e < plan.size(); ++e) {
          const Plan& recv_plan = expected ? *expected : plan;
          std::vector<std::vector<char>> send(n), recv(n);
          std::vector<SharedExchange::Share> shares(n);
          for (std::size_t p = 0; p < n; ++p) {
            const std::int64_t out = plan[e][me][p];
            for (std::int64_t i = 0; i < out; ++i) send[p].push_back(pattern(e, me, p, i));
            recv[p].assign(static_cast<std::size_t>(recv_plan[e][p][me]), 0);
            shares[p] = {send[p].data(), out, recv[p].data(), recv_plan[e][p][me],
                         p != me && elsewhere && elsewhere(e, me, p)};
          }
          ex.exchange(
              shares,
              [&] {
                if (abort) throw Aborted("peer gave up");
                std::this_thread::yield();
              },
              [&](std::size_t from) {
                mismatches[me] = std::to_string(me) + "<-" + std::to_string(from);
                abort = true;
                throw Aborted("mismatch");
              });
          for (std::size_t p = 0; p < n; ++p) {
            const std::int64_t in = recv_plan[e][p][me];
            const bool away = p != me && elsewhere && elsewhere(e, p, me);
            ASSERT_EQ(ex.arrives_elsewhere(p), away) << "exchange " << e << ", member " << me << " from " << p;
            if (away) {  // only its size came: nothing was written into the receive
              ASSERT_EQ(std::count(recv[p].begin(), recv[p].end(), 0), in) << "exchange " << e;
              continue;
            }
            for (std::int64_t i = 0; i < in; ++i) {
              ASSERT_EQ(recv[p][static_cast<std::size_t>(i)], pattern(e, p, me, i))
                  << "exchange " << e << ", member " << me << " from " << p << ", byte " << i;
            }
          }
        }
      } catch (const Aborted&) {
      }
    });
  }
  for (auto& t : members) t.join();
  std::vector<std::string> seen;
  for (auto& m : mismatches) {
    if (!m.empty()) seen.push_back(m);
  }
  return seen;
}

Plan random_plan(std::mt19937& rng, std::size_t n, std::size_t exchanges, std::int64_t most) {
  std::uniform_int_distribution<std::int64_t> bytes(0, most);
  std::bernoulli_distribution empty(0.2);
  Plan plan(exchanges, std::vector<std::vector<std::int64_t>>(n, std::vector<std::int64_t>(n)));
  for (auto& e : plan) {
    for (auto& w : e) {
      for (auto& b : w) b = empty(rng) ? 0 : bytes(rng);
    }
  }
  return plan;
}

TEST(SharedExchange, RandomSharesArriveOverManyRounds) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t n = 1 + trial % 6;
    const std::size_t part = std::size_t{64} << (trial % 4);  // 64 B to 512 B: many rounds each
    const Plan plan = random_plan(rng, n, 8, 3000);
    EXPECT_TRUE(run(plan, n, part).empty()) << "trial " << trial;
  }
}

// The same with every writer copying by streaming stores, and by memcpy.
TEST(SharedExchange, RandomSharesArriveWithEitherCopy) {
  std::mt19937 rng(8);
  for (const ExchangeCopy copy : {ExchangeCopy::streaming, ExchangeCopy::cached}) {
    for (int trial = 0; trial < 24; ++trial) {
      const std::size_t n = 2 + trial % 4;
      const std::size_t part = std::size_t{64} << (trial % 4);
      const Plan plan = random_plan(rng, n, 6, 3000);
      EXPECT_TRUE(run(plan, n, part, nullptr, copy).empty()) << "trial " << trial;
    }
  }
}

// streaming_copy copies exactly, from and to any alignment, any length.
TEST(SharedExchange, StreamingCopyIsACopy) {
  std::mt19937 rng(9);
  std::vector<char> from(5000), to(5100);
  for (auto& c : from) c = static_cast<char>(rng());
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t in = rng() % 64, out = rng() % 64, bytes = rng() % 4000;
    std::fill(to.begin(), to.end(), 0x5a);
    streaming_copy(to.data() + out, from.data() + in, bytes);
    EXPECT_TRUE(std::equal(from.begin() + in, from.begin() + in + bytes, to.begin() + out)) << trial;
    EXPECT_TRUE(std::all_of(to.begin(), to.begin() + out, [](char c) { return c == 0x5a; })) << trial;
    EXPECT_TRUE(std::all_of(to.begin() + out + bytes, to.end(), [](char c) { return c == 0x5a; })) << trial;
  }
}

// Learning: small exchanges copy with memcpy; the first two large ones try memcpy, then
// streaming stores, and the later ones take the faster (timed) or, now and then, the other.
TEST(SharedExchange, LearningTriesBothCopiesOnLargeExchanges) {
  const std::size_t n = 2, part = 1 << 16;
  Segments memory(n, part);
  const std::vector<char*>& segments = memory.at;
  std::vector<std::vector<bool>> chose(n);
  std::vector<std::thread> members;
  for (std::size_t me = 0; me < n; ++me) {
    members.emplace_back([&, me] {
      SharedExchange ex(segments, me, part);
      for (const std::int64_t bytes : {1000, 200000, 200000, 200000}) {  // sent and received: 2x
        std::vector<char> send(static_cast<std::size_t>(bytes), static_cast<char>(me)), recv(send.size());
        std::vector<SharedExchange::Share> shares(n);
        shares[1 - me] = {send.data(), bytes, recv.data(), bytes};
        ex.exchange(
            shares, [] { std::this_thread::yield(); }, [](std::size_t) { throw std::logic_error("mismatch"); });
        EXPECT_EQ(recv.back(), static_cast<char>(1 - me));
        chose[me].push_back(ex.streaming());
      }
    });
  }
  for (auto& t : members) t.join();
  for (std::size_t me = 0; me < n; ++me) {
    EXPECT_FALSE(chose[me][0]);  // 2000 bytes
    EXPECT_FALSE(chose[me][1]);
    EXPECT_TRUE(chose[me][2]);
  }
}

// Shares sent elsewhere, mixed at random with those the window carries: each reader is told
// which came elsewhere, and gets the others whole.
TEST(SharedExchange, SharesSentElsewhereAreToldAndTheRestArrive) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = 2 + trial % 4;
    const Plan plan = random_plan(rng, n, 6, 2000);
    const std::uint32_t salt = static_cast<std::uint32_t>(rng());
    const Elsewhere away = [salt](std::size_t e, std::size_t w, std::size_t r) {
      return ((e * 7 + w * 3 + r + salt) % 3) == 0;
    };
    EXPECT_TRUE(run(plan, n, 128, nullptr, ExchangeCopy::learn, away).empty()) << "trial " << trial;
  }
}

// A share sent elsewhere whose size differs from what its reader expects is a mismatch too.
TEST(SharedExchange, SharesSentElsewhereOfAnotherSizeAreMismatches) {
  const std::size_t n = 3;
  Plan plan(1, std::vector<std::vector<std::int64_t>>(n, std::vector<std::int64_t>(n, 500)));
  const Elsewhere away = [](std::size_t, std::size_t w, std::size_t r) { return w == 2 && r == 1; };
  for (std::int64_t sent : {499, 501, 0}) {
    Plan sends = plan;
    sends[0][2][1] = sent;
    EXPECT_EQ(run(sends, n, 128, &plan, ExchangeCopy::learn, away), std::vector<std::string>{"1<-2"})
        << sent << " bytes sent";
  }
}

TEST(SharedExchange, EmptyExchangesStillMeet) {
  const std::size_t n = 4;
  Plan plan(5, std::vector<std::vector<std::int64_t>>(n, std::vector<std::int64_t>(n, 0)));
  plan[2][1][3] = 1000;  // one exchange between empty ones, one pair only
  EXPECT_TRUE(run(plan, n, 128).empty());
}

TEST(SharedExchange, ShortAndLongSendsAreMismatches) {
  const std::size_t n = 3;
  Plan plan(1, std::vector<std::vector<std::int64_t>>(n, std::vector<std::int64_t>(n, 500)));
  for (std::int64_t sent : {499, 501, 0, 5000}) {
    Plan sends = plan;
    sends[0][2][1] = sent;  // member 2 sends member 1 another count than 1 expects
    EXPECT_EQ(run(sends, n, 128, &plan), std::vector<std::string>{"1<-2"}) << sent << " bytes sent";
  }
}

}  // namespace
}  // namespace shardmm::detail
