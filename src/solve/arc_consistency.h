// Arc consistency over a choice problem's factors (and over unions of gradient masks, which a
// build enforces before it has made their factors): the values some entry of each factor over
// their variable supports, among the other variables' values kept, and that each union can be
// made of or make. A value dropped here has no place in any assignment the factors allow.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "shardmm/solve/choices.h"

namespace shardmm::solve {

class ArcConsistency {
 public:
  // `domain`: by variable, how many values, each live to begin with.
  explicit ArcConsistency(const std::vector<int>& domain);

  // A factor to keep consistent (held by address: it must outlive this and not change), swept
  // at the next settle().
  void add(const Factor& f);
  // `vars[0]` is the union (bitwise or) of the masks of `vars[1..]`, every variable's value a
  // mask of the same domain (ChoiceProblem's gradient variables).
  void add_union(std::vector<int> vars);
  // Drops the values of `var` that `allowed` does not mark.
  void restrict(int var, const std::vector<char>& allowed);

  // Sweeps what lost values since its last sweep (a factor or union added: once) until nothing
  // more drops. A sweep reads a factor's entries that were alive after its last one: a value
  // dropped once stays dropped, and so does every entry holding it.
  void settle();

  bool live(int var, int value) const {
    return live_[static_cast<std::size_t>(var)][static_cast<std::size_t>(value)] != 0;
  }
  const std::vector<std::vector<char>>& values() const { return live_; }  // by variable and value

 private:
  struct Watched {
    const Factor* factor = nullptr;
    std::vector<std::uint32_t> alive;  // its entries whose values were all live at its last sweep
    bool swept = false;
  };
  void sweep(Watched& w);
  void sweep_union(const std::vector<int>& u);
  void keep_only(int var, const std::vector<char>& supported);

  std::vector<std::vector<char>> live_;
  std::vector<Watched> factors_;
  std::vector<std::vector<int>> unions_;
  std::vector<std::vector<std::size_t>> factors_of_, unions_of_;  // by variable: what constrains it
  std::deque<std::size_t> factor_queue_, union_queue_;            // to sweep again
  std::vector<char> factor_queued_, union_queued_;
};

}  // namespace shardmm::solve
