// The mpi backend's choice between lending a collective's pieces and copying them through the
// shared window (src/runtime/mpi/lend_choice.h), on a made-up clock: each call's choice decides
// how long it is until the next call, as the cost of lending falls in the caller's code.
#include "runtime/mpi/lend_choice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shardmm::detail {
namespace {

using Clock = LendChoice::Clock;

// Calls of one exchange on a made-up clock; `period(lent, call)` is how long the program takes
// to call it again after a call that chose `lent`.
struct Program {
  LendChoice choice{LendChoice::Mode::learn};
  Clock::time_point now{};
  int call = 0;

  // The choices of the next `calls` calls of exchange (op, bytes).
  std::vector<bool> run(int calls, const std::function<double(bool, int)>& period, const std::string& op = "all_gather",
                        std::int64_t bytes = 1 << 20) {
    std::vector<bool> lent;
    for (int i = 0; i < calls; ++i, ++call) {
      lent.push_back(choice.lend(op, bytes, now));
      now += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period(lent.back(), call)));
    }
    return lent;
  }
};

int count(const std::vector<bool>& v, bool value, std::size_t from = 0) {
  int n = 0;
  for (std::size_t i = from; i < v.size(); ++i) n += v[i] == value;
  return n;
}

TEST(LendChoice, FixedModesNeverChange) {
  Clock::time_point now{};
  LendChoice always(LendChoice::Mode::always), never(LendChoice::Mode::never);
  for (int i = 0; i < 50; ++i, now += std::chrono::milliseconds(i)) {
    EXPECT_TRUE(always.lend("all_gather", 1 << 20, now));
    EXPECT_FALSE(never.lend("all_gather", 1 << 20, now));
  }
}

TEST(LendChoice, TriesBothInRunsLendingFirst) {
  Program p;
  const std::vector<bool> first = p.run(2 * LendChoice::kFirstTries, [](bool, int) { return 1e-3; });
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], i / LendChoice::kRun % 2 == 0) << "call " << i;
}

// The calls that took the choice other than `preferred` among `choices`, from `from` on.
int others(const std::vector<bool>& choices, bool preferred, std::size_t from = 0) {
  return count(choices, !preferred, from);
}

// After the first tries, the choice with the shorter period; the other for a run now and
// then, less and less often while it stays slower.
TEST(LendChoice, KeepsToTheShorterPeriodExploringLessAndLess) {
  for (const bool lending_faster : {true, false}) {
    Program p;
    const auto period = [&](bool lent, int) { return lent == lending_faster ? 1.0e-3 : 1.4e-3; };
    p.run(2 * LendChoice::kFirstTries, period);
    const int early = static_cast<int>(LendChoice::kRun * LendChoice::kExploreEvery * 4);
    const std::vector<bool> lent = p.run(early + 2000, period);
    // The first exploration comes after kExploreEvery runs, each one a run long.
    const auto explore_at = std::find(lent.begin(), lent.end(), !lending_faster) - lent.begin();
    EXPECT_EQ(explore_at, static_cast<long>(LendChoice::kRun * (LendChoice::kExploreEvery - 1)));
    const std::vector<bool> explored(lent.begin() + explore_at, lent.begin() + explore_at + LendChoice::kRun + 1);
    EXPECT_EQ(count(explored, !lending_faster), static_cast<int>(LendChoice::kRun));  // one run, then back
    // Later ones one run in kExploreAtMost.
    const int late = others(lent, lending_faster, static_cast<std::size_t>(early + 500));
    constexpr auto kEvery = LendChoice::kRun * LendChoice::kExploreAtMost;
    EXPECT_GE(late, static_cast<int>(LendChoice::kRun * (1500 / kEvery)));
    EXPECT_LE(late, static_cast<int>(LendChoice::kRun * (1500 / kEvery + 1)));
  }
}

// The cost of lending changes (the program starts rewriting the input it lends): the choice
// follows within the interval of explorations, and back again.
TEST(LendChoice, FollowsAChangeOfCosts) {
  Program p;
  bool lending_faster = true;
  const auto period = [&](bool lent, int) { return lent == lending_faster ? 0.5e-3 : 2e-3; };
  const int settle = static_cast<int>(LendChoice::kRun * LendChoice::kExploreAtMost * 2);
  p.run(1000, period);
  EXPECT_TRUE(p.choice.lent_last("all_gather", 1 << 20));
  for (const bool now_faster : {false, true}) {
    lending_faster = now_faster;
    const std::vector<bool> after = p.run(settle + 100, period);
    EXPECT_LE(others(after, now_faster, static_cast<std::size_t>(settle)), static_cast<int>(LendChoice::kRun))
        << "lending faster now: " << now_faster;
  }
}

// The whole machine slows down (every period twice as long): the choice that is not taken
// is weighed by its new periods, not by ones kept from when the machine was faster.
TEST(LendChoice, OldPeriodsOfTheOtherChoiceDoNotMislead) {
  Program p;
  double scale = 1;
  const auto period = [&](bool lent, int) { return scale * (lent ? 1.2e-3 : 1.0e-3); };
  p.run(1000, period);
  scale = 2;
  const std::vector<bool> slower = p.run(2 * static_cast<int>(LendChoice::kRun * LendChoice::kExploreAtMost), period);
  EXPECT_LE(count(slower, true), static_cast<int>(2 * LendChoice::kRun));  // explorations only
}

// Calls interrupted by other work (every fifth period three times as long, whichever the
// choice) do not make the slower choice look faster.
TEST(LendChoice, LongStrayPeriodsDoNotMislead) {
  Program p;
  const auto period = [](bool lent, int call) { return (lent ? 1.2e-3 : 1.0e-3) * (call % 5 == 0 ? 3 : 1); };
  const std::vector<bool> lent = p.run(1000, period);
  EXPECT_LE(count(lent, true, 200), static_cast<int>(800 / LendChoice::kExploreEvery));
}

// Calls in bursts of two, each burst's last period long: choices made a run at a time still
// see each choice's short periods (one made per call would only ever see one choice's).
TEST(LendChoice, BurstsOfTwoCallsDoNotMislead) {
  for (const bool lending_faster : {true, false}) {
    Program p;
    const auto period = [&](bool lent, int call) {
      return (lent == lending_faster ? 1.0e-3 : 1.3e-3) + (call % 2 == 1 ? 5e-3 : 0);
    };
    const std::vector<bool> lent = p.run(1000, period);
    EXPECT_LE(others(lent, lending_faster, 200), static_cast<int>(800 / LendChoice::kExploreEvery))
        << "lending faster: " << lending_faster;
  }
}

// Each exchange (collective and group, bytes) learns its own choice.
TEST(LendChoice, ExchangesLearnApart) {
  Program p;
  std::vector<bool> small, large;
  for (int i = 0; i < 100; ++i) {
    // The exchanges alternate; each one's period is set by its own choice.
    small.push_back(p.run(
        1, [](bool lent, int) { return lent ? 0.2e-3 : 0.8e-3; }, "all_gather", 1 << 20)[0]);
    large.push_back(p.run(
        1, [](bool lent, int) { return lent ? 0.8e-3 : 0.2e-3; }, "all_gather", 16 << 20)[0]);
  }
  EXPECT_GE(count(small, true, 50), 50 - 50 / static_cast<int>(LendChoice::kExploreEvery) - 1);
  EXPECT_GE(count(large, false, 50), 50 - 50 / static_cast<int>(LendChoice::kExploreEvery) - 1);
}

}  // namespace
}  // namespace shardmm::detail
