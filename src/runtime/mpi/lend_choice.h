// Whether a rank lends the large pieces of a collective to their receivers (each reads its
// piece where the sender keeps it: one pass over the bytes) or copies them through the group's
// shared window (two passes, the sender's and the receiver's, overlapped on their two cores).
//
// Which is faster depends on the machine and on what the program does between calls. A piece
// that was lent has been read into its receiver's cache; when the sender next rewrites it (a
// matmul producing the next input), every line must first be taken back from that cache. On
// the 2-vCPU VMs of docs/benchmarks.md that made lent all_gathers of freshly written inputs
// 1.2-1.9x Open MPI's speed on one (Xeon) and 0.65-0.9x on another (EPYC), where the window
// reached 1.0-1.5x; inputs that stay unchanged between calls (a layer's weights) were 2-3x
// faster lent on both. The cost falls in the caller's code, not in the exchange, so the
// exchange cannot time it; the period between successive calls of the same exchange includes
// it. Hence this learns, per exchange, which choice gives the shorter period.
//
// Free of MPI so that it can be tested with a made-up clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

namespace shardmm::detail {

class LendChoice {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Mode { learn, always, never };

  explicit LendChoice(Mode mode) : mode_(mode) {}

  // At the start of a call of the exchange `op` (its collective and group) moving `bytes` from
  // this rank, some of them lendable: whether this call lends them. Each rank chooses for the
  // pieces it sends; its receivers learn the choice from the window, so ranks need not agree.
  bool lend(const std::string& op, std::int64_t bytes, Clock::time_point now) {
    if (mode_ != Mode::learn) return mode_ == Mode::always;
    if (calls_.size() >= kMaxExchanges && !calls_.count({op, bytes})) calls_.clear();
    Calls& c = calls_[{op, bytes}];
    if (c.count > 0) {
      std::deque<double>& kept = c.periods[c.lent ? 1 : 0];
      kept.push_back(std::chrono::duration<double>(now - c.last).count());
      if (kept.size() > kKeptPeriods) kept.pop_front();
    }
    c.last = now;
    if (c.count % kRun == 0) choose(c);
    ++c.count;
    return c.lent;
  }

  // What the last call of the exchange chose (false if it was never called): for tests.
  bool lent_last(const std::string& op, std::int64_t bytes) const {
    const auto it = calls_.find({op, bytes});
    return it != calls_.end() && it->second.lent;
  }

  // Choices are made for two calls in a row: a program that calls an exchange in bursts (a
  // benchmark's timed loops) has the period after a burst's last call stray, and a choice made
  // for one call only might always fall there.
  static constexpr std::uint64_t kRun = 2;
  // Each choice is first given this many periods (in runs, alternately, lending first).
  static constexpr std::size_t kFirstTries = 4;
  // Then the choice that is not the faster is taken for one run in this many, so that a change
  // (of the machine's state, or of what the program does between calls) is seen. Each time it is
  // found slower again the interval doubles, up to kExploreAtMost runs. Each such run is weighed
  // by its own periods against the other choice's latest, and a switch needs periods that
  // recent: when the preferred choice slows down, the other is measured anew before it is taken.
  static constexpr std::uint64_t kExploreEvery = 8;
  static constexpr std::uint64_t kExploreAtMost = 64;

 private:
  // A choice's periods: the most recent few. Its estimate is their minimum, as the periods that
  // stray are long ones (other work between two calls, a preempted core), not short ones.
  static constexpr std::size_t kKeptPeriods = 5;
  // Exchanges remembered; past this many (a program with ever-new sizes) all are forgotten.
  static constexpr std::size_t kMaxExchanges = 1024;

  struct Calls {
    std::uint64_t count = 0;        // calls so far
    Clock::time_point last;         // the start of the last call
    bool lent = false;              // the current run's choice; a call's period is the next call's start minus its own
    std::deque<double> periods[2];  // by choice: copied through the window, lent
    bool tried = false;             // both choices have had their first tries
    bool fresh = false;             // the choice not preferred was just measured (its periods are the latest)
    bool preferred = false;         // the faster choice, as last estimated
    std::uint64_t explore_every = kExploreEvery;
    std::uint64_t runs_to_explore = kExploreEvery;
  };

  // The choice for the run that starts now.
  static void choose(Calls& c) {
    const std::size_t window = c.periods[0].size(), lent = c.periods[1].size();
    if (!c.tried) {
      if (window < kFirstTries || lent < kFirstTries) {
        c.lent = lent <= window;  // the less tried, lending first
        return;
      }
      c.tried = true;
      c.fresh = true;
    }
    const auto estimate = [](const std::deque<double>& p) { return *std::min_element(p.begin(), p.end()); };
    const bool faster = estimate(c.periods[1]) <= estimate(c.periods[0]);
    if (faster != c.preferred) {
      if (c.fresh) {  // measured just now: switch, and look again soon
        c.preferred = faster;
        c.explore_every = kExploreEvery;
        c.runs_to_explore = kExploreEvery;
      } else {  // the other choice's periods are old (the machine may have changed since): measure it anew first
        c.runs_to_explore = 1;
      }
    }
    c.fresh = false;
    if (--c.runs_to_explore == 0) {
      c.runs_to_explore = c.explore_every;
      c.explore_every = std::min(2 * c.explore_every, kExploreAtMost);
      c.lent = !c.preferred;
      c.periods[c.lent ? 1 : 0].clear();  // weighed by this run's periods alone
      c.fresh = true;
      return;
    }
    c.lent = c.preferred;
  }

  Mode mode_;
  std::map<std::pair<std::string, std::int64_t>, Calls> calls_;
};

}  // namespace shardmm::detail
