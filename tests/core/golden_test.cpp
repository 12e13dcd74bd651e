// Golden files: every valid spec's canonical form and every invalid input's exact message.
//
// Each line of tests/golden/{valid,invalid}_specs.txt is MESH<TAB>INPUT<TAB>EXPECTED ('#'
// starts a comment line). INPUT is read as:
//   "--dims SIZES"        parse_dims(SIZES)
//   "SPEC --dims SIZES"   global_shape(parse_spec(SPEC), parse_dims(SIZES))
//   anything with '@'     parse_contraction
//   anything else         parse_spec
// after the mesh is parsed (a bad MESH is the error under test). In INPUT, \xNN stands for
// the byte NN; in EXPECTED, \n stands for a newline.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include "shardmm/core/contraction.h"
#include "shardmm/core/error.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "test_paths.h"

namespace shardmm {
namespace {

struct Case {
  int line;
  std::string mesh, input, expected;
};

std::string decode_input(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\\x") == 0 && i + 3 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 2])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 3]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string decode_expected(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\\n") == 0) {
      out += '\n';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<Case> read_cases(const std::string& name) {
  const std::string path = shardmm::testing::tests_dir() + "/golden/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<Case> cases;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t t1 = line.find('\t'), t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos) {
      ADD_FAILURE() << path << ":" << n << ": expected MESH<TAB>INPUT<TAB>EXPECTED";
      continue;
    }
    cases.push_back(
        {n, line.substr(0, t1), decode_input(line.substr(t1 + 1, t2 - t1 - 1)), decode_expected(line.substr(t2 + 1))});
  }
  return cases;
}

std::string show_shape(const std::vector<std::int64_t>& shape) {
  std::string out;
  for (std::int64_t n : shape) {
    if (!out.empty()) out += ',';
    out += std::to_string(n);
  }
  return out;
}

// The canonical text of the parsed input (see the file comment for the kinds of input).
std::string run(const Case& c) {
  const Mesh mesh = Mesh::parse(c.mesh);
  const std::string& in = c.input;
  if (in.rfind("--dims ", 0) == 0) {
    std::string out;
    for (const auto& [name, size] : parse_dims(in.substr(7)))
      out += (out.empty() ? "" : ",") + name + "=" + std::to_string(size);
    return out;
  }
  if (const std::size_t at = in.find(" --dims "); at != std::string::npos) {
    return show_shape(global_shape(parse_spec(in.substr(0, at), mesh), parse_dims(in.substr(at + 8))));
  }
  if (in.find('@') != std::string::npos) return format_contraction(parse_contraction(in, mesh), mesh);
  return format_spec(parse_spec(in, mesh), mesh);
}

TEST(Golden, ValidSpecsPrintCanonically) {
  const auto cases = read_cases("valid_specs.txt");
  EXPECT_GE(cases.size(), 30u);
  for (const Case& c : cases) {
    SCOPED_TRACE("valid_specs.txt:" + std::to_string(c.line) + ": " + c.input);
    std::string got;
    try {
      got = run(c);
    } catch (const InputError& e) {
      ADD_FAILURE() << "unexpected error:\n" << e.what();
      continue;
    }
    EXPECT_EQ(got, c.expected);
    // The canonical form is a fixed point.
    if (c.input.find("--dims") == std::string::npos) {
      EXPECT_EQ(run({c.line, c.mesh, c.expected, ""}), c.expected);
    }
  }
}

TEST(Golden, InvalidSpecsGiveTheirExactMessage) {
  const auto cases = read_cases("invalid_specs.txt");
  EXPECT_GE(cases.size(), 40u);
  for (const Case& c : cases) {
    SCOPED_TRACE("invalid_specs.txt:" + std::to_string(c.line) + ": " + c.input);
    try {
      const std::string got = run(c);
      ADD_FAILURE() << "no error; got " << got;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), c.expected) << "actual message:\n" << e.what();
      // The first line is the headline; the rest, if any, quotes the text with a caret.
      const std::string what = e.what();
      EXPECT_EQ(what.substr(0, what.find('\n')), e.headline());
      EXPECT_EQ(e.headline().find('\n'), std::string::npos);
      if (!e.context().empty()) {
        EXPECT_EQ(what, e.headline() + "\n" + e.context());
      }
    }
  }
}

}  // namespace
}  // namespace shardmm
