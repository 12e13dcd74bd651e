// Specs: the seeds' notation, canonical printing, the rules, dimension sizes.
#include "shardmm/core/spec.h"

#include <gtest/gtest.h>

#include <random>

#include "core/spec_testing.h"
#include "shardmm/core/error.h"

namespace shardmm {
namespace {

using testing::random_named_mesh;
using testing::random_spec;

Spec make(std::string tensor, std::vector<DimSpec> dims, AxisList unreduced = {}) {
  return Spec{std::move(tensor), std::move(dims), std::move(unreduced)};
}

// The message of the InputError that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Spec, SeedsForms) {
  const Mesh m = Mesh::parse("X=2,Y=2");
  const int X = 0, Y = 1;
  EXPECT_EQ(parse_spec("A[I, J]", m), make("A", {{"I", {}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[I_X, J]", m), make("A", {{"I", {X}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[I_X, J_Y]", m), make("A", {{"I", {X}}, {"J", {Y}}}));
  EXPECT_EQ(parse_spec("A[I_{XY}, J]", m), make("A", {{"I", {X, Y}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[I_XY, J]", m), make("A", {{"I", {X, Y}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[IXY, J]", m), make("A", {{"I", {X, Y}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[IX, JY]", m), make("A", {{"I", {X}}, {"J", {Y}}}));
  EXPECT_EQ(parse_spec("A[I_YX, J]", m), make("A", {{"I", {Y, X}}, {"J", {}}}));  // order is kept
  EXPECT_EQ(parse_spec("C[I, K]{U_X}", m), make("C", {{"I", {}}, {"K", {}}}, {X}));
  EXPECT_EQ(parse_spec("C[I, K]{U_XY}", m), make("C", {{"I", {}}, {"K", {}}}, {X, Y}));
  EXPECT_EQ(parse_spec("C[I, K]{UX}", m), make("C", {{"I", {}}, {"K", {}}}, {X}));
  EXPECT_EQ(parse_spec("C[I, K]{U_YX}", m), make("C", {{"I", {}}, {"K", {}}}, {X, Y}));  // a set
  EXPECT_EQ(parse_spec("[I_X, J]", m).tensor, "");
  EXPECT_EQ(parse_spec("W2[F_X, D]", m).tensor, "W2");
}

TEST(Spec, MultiLetterAxes) {
  const Mesh m = Mesh::parse("dp=2,tp=4");
  const Spec both = make("A", {{"I", {0, 1}}, {"J", {}}});
  EXPECT_EQ(parse_spec("A[I_{dp,tp}, J]", m), both);
  EXPECT_EQ(parse_spec("A[I_dptp, J]", m), both);
  EXPECT_EQ(parse_spec("A[I_{ dp , tp }, J]", m), both);
  EXPECT_EQ(parse_spec("A[I_tpdp, J]", m), make("A", {{"I", {1, 0}}, {"J", {}}}));
  EXPECT_EQ(parse_spec("A[Idp, Jtp]", m), make("A", {{"I", {0}}, {"J", {1}}}));
  EXPECT_EQ(format_spec(both, m), "A[I_{dp,tp}, J]");
  EXPECT_EQ(format_spec(make("A", {{"I", {1}}, {"J", {0}}}), m), "A[I_tp, J_dp]");
  EXPECT_EQ(format_spec(make("C", {{"I", {}}}, {0, 1}), m), "C[I]{U_{dp,tp}}");
  EXPECT_EQ(format_spec(make("C", {{"I", {}}}, {1}), m), "C[I]{U_tp}");
}

// With axes a, ab, b, ba the run "aba" reads as a,b,a or a,ba or ab,a: a,b,a names a twice,
// which no spec may (a mesh axis shards one dimension, once), so the parser must refuse to
// guess between the two legal readings, and name those.
TEST(Spec, AmbiguousAxisRunIsAnError) {
  const Mesh m = Mesh::parse("a=2,ab=2,b=2,ba=2");
  const std::string msg = error_of([&] { parse_spec("A[I_aba]", m); });
  EXPECT_NE(msg.find("more than one way"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I_{a,ba} or I_{ab,a}"), std::string::npos) << msg;
  EXPECT_EQ(parse_spec("A[I_{a,ba}]", m), make("A", {{"I", {0, 3}}}));
  EXPECT_EQ(parse_spec("A[I_{ab,a}]", m), make("A", {{"I", {1, 0}}}));
  // An exact axis name is that axis, not a split.
  EXPECT_EQ(parse_spec("A[I_ab]", m), make("A", {{"I", {1}}}));
  EXPECT_EQ(parse_spec("A[I_ba]", m), make("A", {{"I", {3}}}));
}

// A run with one legal reading among illegal ones is that reading: on X, Y, XY the run XYX
// reads as X,Y,X (X twice) or XY,X. A run whose every reading repeats an axis is refused
// for the repeat, not as ambiguous.
TEST(Spec, AnAxisRunWithOneLegalReadingIsThatReading) {
  const Mesh m = Mesh::parse("X=2,Y=2,XY=2");
  EXPECT_EQ(parse_spec("A[I_XYX]", m), make("A", {{"I", {2, 0}}}));
  EXPECT_EQ(parse_spec("C[I]{U_XYX}", m), make("C", {{"I", {}}}, {0, 2}));
  const std::string msg = error_of([&] { parse_spec("A[I_XYXY]", m); });
  EXPECT_NE(msg.find("(X,Y,XY or XY,X,Y)"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { parse_spec("A[I_XYXYX]", m); }).find("appears twice"), std::string::npos);
  // Axes a, aa, ..., a^16 (a mesh's most) read a run of 137 a's in exponentially many ways,
  // none of them legal (distinct lengths sum to 136 at most): the search stops at its budget
  // and says so.
  std::string axes, run;
  for (int k = 1; k <= kMaxMeshAxes; ++k)
    axes += (axes.empty() ? "" : ",") + std::string(static_cast<std::size_t>(k), 'a') + "=1";
  run.assign(137, 'a');
  EXPECT_NE(error_of([&] { parse_spec("A[I_" + run + "]", Mesh::parse(axes)); }).find("too many ways to search"),
            std::string::npos);
}

TEST(Spec, CanonicalPrinting) {
  const Mesh m = Mesh::parse("X=2,Y=2");
  for (const auto& [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"A[I_X, J_Y]", "A[I_X, J_Y]"},
           {"A[I_{XY}, J]", "A[I_XY, J]"},
           {"A[IX, JY]", "A[I_X, J_Y]"},
           {"A[I_{X,Y}]", "A[I_XY]"},
           {"A[I_{X}]", "A[I_X]"},
           {"  A [ I_X ,J ]  {  U_Y }  ", "A[I_X, J]{U_Y}"},
           {"C[I, K]{U_{Y,X}}", "C[I, K]{U_XY}"},
           {"C[I,K]{UX}", "C[I, K]{U_X}"},
           {"[I]", "[I]"},
       }) {
    const Spec s = parse_spec(in, m);
    EXPECT_EQ(format_spec(s, m), out) << in;
    EXPECT_EQ(parse_spec(out, m), s) << in;
    EXPECT_EQ(parse_spec(out, m).tensor, s.tensor) << in;
  }
}

// parse(format(s)) == s for random legal specs, and format(parse(t)) is a fixed point.
TEST(Spec, RoundTripsRandomSpecs) {
  testing::Rng rng(7);
  const std::vector<std::string> names{"I", "J", "K2", "B"};
  for (int iter = 0; iter < 3000; ++iter) {
    const Mesh m = random_named_mesh(rng, 4, 4);
    std::vector<std::string> dims(names.begin(), names.begin() + testing::uniform(rng, 1, 4));
    const Spec s = random_spec(rng, m, iter % 5 ? "T" + std::to_string(iter % 7) : "", dims, true);
    const std::string text = format_spec(s, m);
    SCOPED_TRACE(m.to_string() + " " + text);
    ASSERT_NO_THROW(validate_spec(s, m));
    const Spec back = parse_spec(text, m);
    ASSERT_EQ(back, s);
    EXPECT_EQ(back.tensor, s.tensor);
    EXPECT_EQ(format_spec(back, m), text);
    // Multi-character names are always braced when several share a dimension.
    if (!m.single_char_names()) {
      for (const DimSpec& d : s.dims) {
        if (d.axes.size() > 1) {
          EXPECT_NE(text.find(d.name + "_{"), std::string::npos);
        }
      }
    }
  }
}

TEST(Spec, Accessors) {
  const Mesh m = Mesh::parse("X=2,Y=2,Z=2");
  const Spec s = parse_spec("A[I_ZX, J]{U_Y}", m);
  EXPECT_EQ(s.rank(), 2);
  EXPECT_EQ(s.find_dim("J"), 1);
  EXPECT_EQ(s.find_dim("K"), -1);
  EXPECT_EQ(s.dim_of_axis(0), 0);
  EXPECT_EQ(s.dim_of_axis(2), 0);
  EXPECT_EQ(s.dim_of_axis(1), -1);
  EXPECT_TRUE(s.is_unreduced(1));
  EXPECT_FALSE(s.is_unreduced(0));
  EXPECT_TRUE(s.uses(0) && s.uses(1) && s.uses(2));
  EXPECT_FALSE(parse_spec("A[I, J]", m).uses(0));
  // The tensor name is a label, not part of the layout.
  EXPECT_EQ(parse_spec("A[I_X]", m), parse_spec("B[I_X]", m));
  EXPECT_FALSE(parse_spec("A[I_X]", m) == parse_spec("A[I_Y]", m));
  EXPECT_FALSE(parse_spec("A[I_XY]", m) == parse_spec("A[I_YX]", m));
}

TEST(Spec, TheRules) {
  const Mesh m = Mesh::parse("X=2,Y=2");
  // A mesh axis can shard only one dimension.
  const std::string two = error_of([&] { parse_spec("A[I_X, J_X]", m); });
  EXPECT_NE(two.find("a mesh axis can shard only one dimension"), std::string::npos) << two;
  EXPECT_NE(two.find("did you mean A[I_X, J_Y] or A[I_XY, J]?"), std::string::npos) << two;
  EXPECT_THROW(parse_spec("A[IX, JX]", m), InputError);
  EXPECT_THROW(parse_spec("A[I_XX]", m), InputError);
  EXPECT_THROW(parse_spec("A[I_X]{U_X}", m), InputError);
  EXPECT_THROW(parse_spec("A[I_Z]", m), InputError);
  EXPECT_THROW(parse_spec("A[I, I]", m), InputError);
  EXPECT_THROW(parse_spec("A[I]{U_XX}", m), InputError);
  // The same rules for specs built in code.
  EXPECT_THROW(validate_spec(make("A", {{"I", {0}}, {"J", {0}}}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {0, 0}}}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {0}}}, {0}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {}}, {"I", {}}}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {2}}}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {-1}}}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {}}}, {1, 0}), m), InputError);  // not in mesh order
  EXPECT_THROW(validate_spec(make("A", {{"I", {}}}, {1, 1}), m), InputError);
  EXPECT_THROW(validate_spec(make("A", {{"I", {}}}, {5}), m), InputError);
  EXPECT_NO_THROW(validate_spec(make("A", {{"I", {1, 0}}, {"J", {}}}), m));
  EXPECT_NO_THROW(validate_spec(make("A", {{"I", {}}}, {0, 1}), m));
}

// A suggestion is only made when it is itself legal.
TEST(Spec, SuggestionsAreLegal) {
  const Mesh m = Mesh::parse("X=2,Y=2,Z=2");
  const std::string msg = error_of([&] { parse_spec("B[J_{XY}, K_YZ]{U_Z}", m); });
  EXPECT_NE(msg.find("mesh axis 'Y' shards two dimensions"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
  const std::string ok = error_of([&] { parse_spec("B[J_{XY}, K_YZ]", m); });
  EXPECT_NE(ok.find("did you mean B[J_XY, K_Z]?"), std::string::npos) << ok;
}

TEST(Spec, ParseDims) {
  EXPECT_EQ(parse_dims("I=8192,J=4096"), (DimSizes{{"I", 8192}, {"J", 4096}}));
  EXPECT_EQ(parse_dims(" I = 1 , K2=9223372036854775807 "), (DimSizes{{"I", 1}, {"K2", 9223372036854775807}}));
  for (const char* bad : {"", "I", "I=", "I=0", "I=-1", "I=9223372036854775808", "=3", "IJ=3", "2=3", "I=3,I=4", "I=3,",
                          "I=3,,J=2", "I=1.5", "I=0x10"}) {
    EXPECT_THROW(parse_dims(bad), InputError) << bad;
  }
}

TEST(Spec, GlobalShape) {
  const Mesh m = Mesh::parse("X=4");
  const Spec s = parse_spec("A[I_X, J]", m);
  EXPECT_EQ(global_shape(s, parse_dims("J=5,I=10,K=3")), (std::vector<std::int64_t>{10, 5}));
  EXPECT_THROW(global_shape(s, parse_dims("I=10")), InputError);
  // 2^32 * 2^31 - fits; 2^32 * 2^32 does not.
  EXPECT_NO_THROW(global_shape(s, parse_dims("I=4294967296,J=2147483647")));
  EXPECT_THROW(global_shape(s, parse_dims("I=4294967296,J=4294967296")), InputError);
  EXPECT_THROW(global_shape(parse_spec("A[I, J, K]", m), parse_dims("I=2097152,J=2097152,K=2097152")), InputError);
}

}  // namespace
}  // namespace shardmm
