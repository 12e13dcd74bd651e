// Random programs as text (so the parser and binder are exercised too): random DAGs of every
// program op over random letters and sizes (uneven and empty shards), random pins on leaves
// and computed tensors, on a given mesh. Every program it writes binds.
#pragma once

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "random_cases.h"
#include "shardmm/core/spec.h"

namespace shardmm::testing {

struct RandomProgram {
  std::string text;
  std::vector<std::string> ops;  // the op of each line, for coverage counts
};

class ProgramWriter {
 public:
  ProgramWriter(Rng& rng, const Mesh& mesh) : rng_(rng), mesh_(mesh) {
    // Letters I..M of sizes 1..5; R = P * Q for split and merge; S the size of I for rename.
    for (const char* l : {"I", "J", "K", "M"}) sizes_[l] = uniform(rng, 1, 5);
    sizes_["P"] = uniform(rng, 1, 3);
    sizes_["Q"] = uniform(rng, 2, 3);
    sizes_["R"] = sizes_["P"] * sizes_["Q"];
    sizes_["S"] = sizes_["I"];
    sizes_["C"] = uniform(rng, 1, 4);  // a route's capacity
  }

  RandomProgram write(int ops) {
    const int leaves = uniform(rng_, 2, 3);
    for (int i = 0; i < leaves; ++i) {
      std::vector<std::string> l = pick_letters(uniform(rng_, 1, 3), {"I", "J", "K", "R"});
      // Leaves are p0, x1, ...; the einsums' own params are w<n>.
      const std::string name = (uniform(rng_, 0, 1) ? "p" : "x") + std::to_string(i);
      std::string line = std::string(name[0] == 'p' ? "param " : "input ") + name + bracket(l);
      if (uniform(rng_, 0, 2) > 0) line += " : " + spec_text(name, l, false);
      lines_.push_back(line);
      add(name, l);
      unused_.insert(name);
      leaves_.insert(name);
    }
    for (int k = 0; k < ops || !unused_.empty(); ++k) {
      if (k > ops + 8) break;  // the leaves left unused are consumed below
      op();
    }
    for (const std::string& leaf : std::vector<std::string>(unused_.begin(), unused_.end())) {
      // An elementwise product with the last value keeps every leaf in the program; the last
      // value first sums away letters the leaf lacks while the two have more than 4 together.
      while (joined(last_, leaf).size() > 4) {
        const std::vector<std::string>& l = letters_[last_];
        const std::string over = *std::find_if(l.begin(), l.end(), [&](const std::string& x) {
          return std::find(letters_[leaf].begin(), letters_[leaf].end(), x) == letters_[leaf].end();
        });
        std::vector<std::string> out;
        std::copy_if(l.begin(), l.end(), std::back_inserter(out), [&](const std::string& x) { return x != over; });
        finish(fresh(), out, "sum(" + last_ + ", over=" + over + ")", "sum");
      }
      binary_line("mul", last_, leaf);
    }
    lines_.push_back("loss sum(" + last_ + ")");
    std::ostringstream os;
    os << "mesh " << mesh_.to_string() << "\ndims ";
    std::set<std::string> used;
    for (const auto& [n, l] : letters_) used.insert(l.begin(), l.end());
    bool first = true;
    for (const auto& [l, s] : sizes_) {
      if (!used.count(l)) continue;
      os << (first ? "" : ", ") << l << "=" << s;
      first = false;
    }
    os << "\n";
    for (const std::string& line : lines_) os << line << "\n";
    return {os.str(), kinds_};
  }

 private:
  static std::string bracket(const std::vector<std::string>& l) {
    std::string out;
    for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + l[i];
    return "[" + out + "]";
  }

  std::vector<std::string> pick_letters(int n, std::vector<std::string> pool) {
    std::shuffle(pool.begin(), pool.end(), rng_);
    pool.resize(std::min<std::size_t>(pool.size(), static_cast<std::size_t>(n)));
    return pool;
  }

  std::string spec_text(const std::string& name, const std::vector<std::string>& l, bool allow_unreduced) {
    return format_spec(random_spec(rng_, mesh_, name, l, allow_unreduced), mesh_);
  }

  void add(const std::string& name, const std::vector<std::string>& l) {
    letters_[name] = l;
    names_.push_back(name);
    last_ = name;
  }

  // An operand: a leaf not used yet first, else any value, recent ones more often.
  std::string operand() {
    if (!unused_.empty() && uniform(rng_, 0, 1)) {
      const std::string n = *unused_.begin();
      unused_.erase(unused_.begin());
      return n;
    }
    const int n = static_cast<int>(names_.size());
    const std::string& pick =
        names_[static_cast<std::size_t>(std::max(0, n - 1 - uniform(rng_, 0, std::min(n - 1, 3))))];
    unused_.erase(pick);
    return pick;
  }

  std::string fresh() { return "t" + std::to_string(++count_); }

  void finish(const std::string& name, const std::vector<std::string>& l, const std::string& expr,
              const std::string& kind, bool may_pin = true) {
    std::string line = name + bracket(l) + " = " + expr;
    if (may_pin && !l.empty() && uniform(rng_, 0, 4) == 0) line += " : " + spec_text(name, l, true);
    lines_.push_back(line);
    kinds_.push_back(kind);
    add(name, l);
  }

  // a's letters, then b's that a lacks: what an elementwise op of the two gives.
  std::vector<std::string> joined(const std::string& a, const std::string& b) {
    std::vector<std::string> l = letters_[a];
    for (const std::string& x : letters_[b]) {
      if (std::find(l.begin(), l.end(), x) == l.end()) l.push_back(x);
    }
    return l;
  }

  // Its callers keep a and b within 4 letters together.
  void binary_line(const std::string& f, const std::string& a, const std::string& b) {
    const char* sym = f == "add" ? " + " : f == "sub" ? " - " : " * ";
    finish(fresh(), joined(a, b), a + sym + b, f);
    unused_.erase(a);
    unused_.erase(b);
  }

  void op() {
    const std::string a = operand();
    const std::vector<std::string> la = letters_[a];
    const auto has = [&](const std::string& x) { return std::find(la.begin(), la.end(), x) != la.end(); };
    switch (uniform(rng_, 0, 13)) {
      case 0: {
        const char* f[] = {"relu", "gelu", "silu", "tanh", "exp"};
        const std::string fn = f[uniform(rng_, 0, 4)];
        finish(fresh(), la, fn + "(" + (fn == "exp" ? "scale(" + a + ", 0.5)" : a) + ")", fn);
        return;
      }
      case 1:
        finish(fresh(), la, "scale(" + a + ", -0.75)", "scale");
        return;
      case 2:
      case 3: {
        std::string b = operand();
        if (joined(a, b).size() > 4) {
          if (leaves_.count(b)) unused_.insert(b);  // not used here after all
          b = a;
        }
        const char* f[] = {"add", "sub", "mul"};
        binary_line(f[uniform(rng_, 0, 2)], a, b);
        return;
      }
      case 4:
      case 5: {
        // An einsum with a fresh param: contract a letter of a, keep the others, add a new one.
        if (la.empty()) break;
        const std::string c = la[static_cast<std::size_t>(uniform(rng_, 0, static_cast<int>(la.size()) - 1))];
        std::vector<std::string> free_b;
        for (const char* x : {"I", "J", "K", "M"}) {
          if (!has(x) && free_b.empty() && la.size() < 4 && uniform(rng_, 0, 1)) free_b.push_back(x);
        }
        std::vector<std::string> lw = {c};
        lw.insert(lw.end(), free_b.begin(), free_b.end());
        const std::string w = "w" + std::to_string(++count_);
        std::string decl = "param " + w + bracket(lw);
        if (uniform(rng_, 0, 1)) decl += " : " + spec_text(w, lw, false);
        lines_.push_back(decl);
        letters_[w] = lw;
        std::vector<std::string> out;
        for (const std::string& x : la) {
          if (x != c || uniform(rng_, 0, 3) == 0) out.push_back(x);  // sometimes a batch letter
        }
        out.insert(out.end(), free_b.begin(), free_b.end());
        if (out.empty()) out.push_back(c);
        std::shuffle(out.begin(), out.end(), rng_);
        finish(fresh(), out, a + " @ " + w, "einsum");
        return;
      }
      case 6: {
        if (la.size() < 2) break;
        const std::string over = la[static_cast<std::size_t>(uniform(rng_, 0, static_cast<int>(la.size()) - 1))];
        const char* f[] = {"sum", "mean", "max"};
        const std::string fn = f[uniform(rng_, 0, 2)];
        std::vector<std::string> out;
        for (const std::string& x : la) {
          if (x != over) out.push_back(x);
        }
        finish(fresh(), out, fn + "(" + a + ", over=" + over + ")", fn);
        return;
      }
      case 7:
      case 8: {
        if (la.empty()) break;
        const std::string over = la[static_cast<std::size_t>(uniform(rng_, 0, static_cast<int>(la.size()) - 1))];
        const char* f[] = {"softmax", "layer_norm", "rms_norm"};
        const std::string fn = f[uniform(rng_, 0, 2)];
        finish(fresh(), la, fn + "(" + a + ", over=" + over + ")", fn);
        return;
      }
      case 9: {
        if (la.size() < 2) break;
        std::vector<std::string> out = la;
        std::shuffle(out.begin(), out.end(), rng_);
        finish(fresh(), out, "transpose(" + a + ")", "transpose");
        return;
      }
      case 10: {
        if (has("R") && !has("P") && !has("Q") && la.size() < 4) {
          std::vector<std::string> out;
          for (const std::string& x : la) {
            if (x == "R") {
              out.insert(out.end(), {"P", "Q"});
            } else {
              out.push_back(x);
            }
          }
          finish(fresh(), out, "split(" + a + ", R -> P Q)", "split");
          // Half the time merged straight back (as attention's heads are): a merge otherwise
          // needs a later op to take a value with P Q still side by side, which is rare.
          if (uniform(rng_, 0, 1)) finish(fresh(), la, "merge(" + last_ + ", P Q -> R)", "merge");
          return;
        }
        const auto p = std::find(la.begin(), la.end(), "P");
        if (p != la.end() && p + 1 != la.end() && *(p + 1) == "Q" && !has("R")) {
          std::vector<std::string> out(la.begin(), p);
          out.push_back("R");
          out.insert(out.end(), p + 2, la.end());
          finish(fresh(), out, "merge(" + a + ", P Q -> R)", "merge");
          return;
        }
        break;
      }
      case 11: {
        if (!has("I") || has("S")) break;
        std::vector<std::string> out = la;
        *std::find(out.begin(), out.end(), "I") = "S";
        finish(fresh(), out, "rename(" + a + ", I -> S)", "rename");
        return;
      }
      case 12: {
        // Scores over positions I and S (a times its own copy along S), masked: a mask's
        // -infinity is only defined under the softmax that follows it.
        if (!has("I") || has("S") || la.size() > 3) break;
        std::vector<std::string> scores = la;
        scores.push_back("S");
        const std::string t = fresh();
        finish(t, scores, a + " * rename(" + a + ", I -> S)", "mul");
        finish(fresh(), scores, "softmax(causal_mask(" + t + ", I, S), over=S)", "causal_mask");
        return;
      }
      case 13: {
        // MoE routing by a's values (tokens along one letter, experts along another), the
        // dispatch then gating a itself, so that a's gradient flows past the route.
        if (la.size() < 2 || la.size() > 3 || has("C")) break;
        const std::vector<std::string> two = pick_letters(2, la);
        std::vector<std::string> out = la;
        out.push_back("C");
        const std::string d = fresh();
        finish(d, out,
               "route(" + a + ", over=" + two[0] + ", tokens=" + two[1] +
                   ", top=" + std::to_string(uniform(rng_, 1, static_cast<int>(sizes_[two[0]]))) + ")",
               "route");
        finish(fresh(), out, d + " * " + a, "mul");
        return;
      }
    }
    finish(fresh(), la, "relu(" + a + ")", "relu");
  }

  Rng& rng_;
  Mesh mesh_;
  std::map<std::string, std::int64_t> sizes_;
  std::map<std::string, std::vector<std::string>> letters_;
  std::vector<std::string> names_;
  std::set<std::string> unused_, leaves_;
  std::vector<std::string> lines_, kinds_;
  std::string last_;
  int count_ = 0;
};

}  // namespace shardmm::testing
