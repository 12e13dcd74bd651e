// No input crashes the parsers: random and mutated text into parse_spec, parse_contraction,
// Mesh::parse and parse_dims may only raise InputError. Whatever parses must also print
// canonically and parse back to itself.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/error.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {
namespace {

std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

class Fuzzer {
 public:
  explicit Fuzzer(unsigned seed) : rng_(seed) {}

  // A fresh string over the notation's alphabet (and some bytes that are not).
  std::string random_text() {
    static const std::vector<std::string> pieces{"[",
                                                 "]",
                                                 "{",
                                                 "}",
                                                 "_",
                                                 ",",
                                                 "@",
                                                 "->",
                                                 "-",
                                                 ">",
                                                 "=",
                                                 " ",
                                                 "\t",
                                                 "\n",
                                                 "U",
                                                 "U_",
                                                 "X",
                                                 "Y",
                                                 "Z",
                                                 "dp",
                                                 "tp",
                                                 "a",
                                                 "ab",
                                                 "b",
                                                 "ba",
                                                 "I",
                                                 "J",
                                                 "K",
                                                 "2",
                                                 "0",
                                                 "9",
                                                 "99999999999999999999",
                                                 "4294967296",
                                                 "A",
                                                 "B",
                                                 "C",
                                                 std::string(1, '\0'),
                                                 "\x01",
                                                 "\x7f",
                                                 "\xC3\xA9",
                                                 "\xFF",
                                                 "\xC3",
                                                 "\xE2\x82",
                                                 "-1",
                                                 "+",
                                                 ";",
                                                 ".",
                                                 "'",
                                                 "\\"};
    std::string s;
    const int n = pick(0, 24);
    for (int i = 0; i < n; ++i) s += pieces[static_cast<std::size_t>(pick(0, static_cast<int>(pieces.size()) - 1))];
    return s;
  }

  // A few random edits of `seed`: byte insertions, deletions, replacements, duplicated or
  // swapped stretches.
  std::string mutate(std::string s) {
    const int edits = pick(1, 3);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = s.empty() ? 0 : static_cast<std::size_t>(pick(0, static_cast<int>(s.size()) - 1));
      switch (pick(0, 4)) {
        case 0:
          s.insert(at, 1, static_cast<char>(pick(0, 255)));
          break;
        case 1:
          if (!s.empty()) s.erase(at, static_cast<std::size_t>(pick(1, 3)));
          break;
        case 2:
          if (!s.empty()) s[at] = "[]{}_,@-> =XYIJU0\x01\xC3"[pick(0, 18)];
          break;
        case 3:
          s.insert(at, s.substr(at, static_cast<std::size_t>(pick(1, 6))));
          break;
        case 4: {
          const std::size_t other = s.empty() ? 0 : static_cast<std::size_t>(pick(0, static_cast<int>(s.size()) - 1));
          if (!s.empty()) std::swap(s[at], s[other]);
          break;
        }
      }
    }
    return s;
  }

  std::string text(const std::vector<std::string>& seeds) {
    return pick(0, 3) == 0 ? random_text()
                           : mutate(seeds[static_cast<std::size_t>(pick(0, static_cast<int>(seeds.size()) - 1))]);
  }

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

 private:
  std::mt19937 rng_;
};

// Runs `f`; any exception but InputError fails the test with the input shown.
template <class F>
bool survives(const std::string& what, const std::string& input, F f) {
  try {
    f();
    return true;
  } catch (const InputError& e) {
    EXPECT_FALSE(e.headline().empty()) << what << " '" << shown(input) << "'";
    EXPECT_EQ(e.headline().find('\n'), std::string::npos) << what << " '" << shown(input) << "'";
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " '" << shown(input) << "' threw a non-InputError: " << e.what();
  } catch (...) {
    ADD_FAILURE() << what << " '" << shown(input) << "' threw a non-exception";
  }
  return false;
}

const std::vector<Mesh>& meshes() {
  static const std::vector<Mesh> m{Mesh::parse("X=2,Y=2"), Mesh::parse("X=4"), Mesh::parse("dp=2,tp=4"),
                                   Mesh::parse("a=2,ab=2,b=2,ba=2"), Mesh::parse("X=2,Y=1,Z=3")};
  return m;
}

TEST(Fuzz, Specs) {
  Fuzzer f(1);
  const std::vector<std::string> seeds{"A[I_X, J_Y]", "A[I_{XY}, J]",    "C[I, K]{U_X}",
                                       "A[IX, JY]",   "A[I_{dp,tp}, J]", "C[I]{U_{dp,tp}}",
                                       "A[I_aba]",    "[I_X]",           "W2[F_X, D]{UY}"};
  int parsed = 0;
  for (int i = 0; i < 50000; ++i) {
    const std::string s = f.text(seeds);
    const Mesh& m = meshes()[static_cast<std::size_t>(i) % meshes().size()];
    Spec spec;
    if (!survives("parse_spec", s, [&] { spec = parse_spec(s, m); })) continue;
    ++parsed;
    const std::string canonical = format_spec(spec, m);
    ASSERT_NO_THROW(validate_spec(spec, m)) << shown(s);
    ASSERT_EQ(parse_spec(canonical, m), spec) << shown(s) << " -> " << canonical;
    ASSERT_EQ(format_spec(parse_spec(canonical, m), m), canonical) << shown(s);
    survives("global_shape", s, [&] { global_shape(spec, parse_dims("I=3,J=4,K=5")); });
  }
  EXPECT_GT(parsed, 500);  // the mutations keep many inputs legal, so printing gets tested too
}

TEST(Fuzz, Contractions) {
  Fuzzer f(2);
  const std::vector<std::string> seeds{"A[I, J_X] @ B[J_X, K] -> C[I, K]{U_X}", "A[I_X, J] @ B[J, K_Y]",
                                       "[B_X, I, J] @ [B_X, J, K] -> [B_X, I, K]", "A[I,J]@B[J,K]->C[I,K]"};
  int parsed = 0;
  for (int i = 0; i < 50000; ++i) {
    const std::string s = f.text(seeds);
    const Mesh& m = meshes()[static_cast<std::size_t>(i) % meshes().size()];
    Contraction c;
    if (!survives("parse_contraction", s, [&] { c = parse_contraction(s, m); })) continue;
    ++parsed;
    const std::string canonical = format_contraction(c, m);
    const Contraction back = parse_contraction(canonical, m);
    ASSERT_EQ(back.a, c.a) << shown(s);
    ASSERT_EQ(back.b, c.b) << shown(s);
    ASSERT_EQ(back.out, c.out) << shown(s);
    ASSERT_EQ(back.out_dims, c.out_dims) << shown(s);
  }
  EXPECT_GT(parsed, 500);
}

TEST(Fuzz, MeshesAndDims) {
  Fuzzer f(3);
  const std::vector<std::string> mesh_seeds{"X=4,Y=2", "dp=2, tp=4", "a=2,ab=2,b=2,ba=2", "X=1"};
  const std::vector<std::string> dims_seeds{"I=8192,J=4096", "K2=7, B=1", "I=9223372036854775807"};
  int meshes_parsed = 0, dims_parsed = 0;
  for (int i = 0; i < 50000; ++i) {
    const std::string s = f.text(mesh_seeds);
    Mesh m;
    if (survives("Mesh::parse", s, [&] { m = Mesh::parse(s); })) {
      ++meshes_parsed;
      ASSERT_GE(m.device_count(), 1) << shown(s);
      ASSERT_EQ(Mesh::parse(m.to_string()), m) << shown(s);
    }
    const std::string d = f.text(dims_seeds);
    DimSizes sizes;
    if (survives("parse_dims", d, [&] { sizes = parse_dims(d); })) {
      ++dims_parsed;
      for (const auto& [name, size] : sizes) ASSERT_GE(size, 1) << shown(d) << " " << name;
    }
  }
  EXPECT_GT(meshes_parsed, 300);
  EXPECT_GT(dims_parsed, 300);
}

}  // namespace
}  // namespace shardmm
