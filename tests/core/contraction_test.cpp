// Contractions: letter roles, the implied output, printing, errors.
#include "shardmm/core/contraction.h"

#include <gtest/gtest.h>

#include "shardmm/core/error.h"

namespace shardmm {
namespace {

TEST(Contraction, HeaderExample) {
  const Mesh m = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", m);
  EXPECT_EQ(c.role("J"), DimRole::contracted);
  EXPECT_EQ(c.role("I"), DimRole::free_a);
  EXPECT_EQ(c.role("K"), DimRole::free_b);
  ASSERT_TRUE(c.out.has_value());
  EXPECT_EQ(*c.out, parse_spec("C[I, K]", m));
  EXPECT_EQ(c.out_tensor, "C");
  EXPECT_EQ(c.out_dims, (std::vector<std::string>{"I", "K"}));
  EXPECT_EQ(c.contracted(), (std::vector<std::string>{"J"}));
  EXPECT_EQ(c.all_dims(), (std::vector<std::string>{"I", "J", "K"}));
  EXPECT_EQ(c.a, parse_spec("A[I, J_X]", m));
  EXPECT_EQ(c.b, parse_spec("B[J_X, K]", m));
}

TEST(Contraction, BatchAndSeveralContractedDimensions) {
  const Mesh m = Mesh::parse("X=2,Y=2");
  const Contraction c = parse_contraction("Q[B_X, H, T, D] @ K[B_X, S, D, H] -> S[B_X, H, T, S]", m);
  EXPECT_EQ(c.role("B"), DimRole::batch);
  EXPECT_EQ(c.role("H"), DimRole::batch);
  EXPECT_EQ(c.role("D"), DimRole::contracted);
  EXPECT_EQ(c.role("T"), DimRole::free_a);
  EXPECT_EQ(c.role("S"), DimRole::free_b);
  EXPECT_EQ(c.out_tensor, "S");
  const Contraction two = parse_contraction("A[I, J, L] @ B[L, K, J]", m);
  EXPECT_EQ(two.contracted(), (std::vector<std::string>{"J", "L"}));  // in A's order
  EXPECT_EQ(two.all_dims(), (std::vector<std::string>{"I", "J", "L", "K"}));
  EXPECT_EQ(std::string(to_string(DimRole::batch)), "batch");
  EXPECT_EQ(std::string(to_string(DimRole::contracted)), "contracted");
  EXPECT_EQ(std::string(to_string(DimRole::free_a)), "free");
}

// Without an output: A's non-contracted letters in A's order, then B's free letters.
TEST(Contraction, ImpliedOutput) {
  const Mesh m = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I_X, J] @ B[J, K_X]", m);
  EXPECT_FALSE(c.out.has_value());
  EXPECT_EQ(c.out_tensor, "C");
  EXPECT_EQ(c.out_dims, (std::vector<std::string>{"I", "K"}));
  // A letter in both inputs and no written output is contracted, so no batch letters
  // appear without an output.
  const Contraction d = parse_contraction("A[K, B, J] @ B[J, B, N]", m);
  EXPECT_EQ(d.out_dims, (std::vector<std::string>{"K", "N"}));
  EXPECT_EQ(d.role("B"), DimRole::contracted);
}

TEST(Contraction, DefaultNamesAndPrinting) {
  const Mesh m = Mesh::parse("X=2");
  const Contraction c = parse_contraction("[I,J_X]@[J_X,K]->[I,K]{UX}", m);
  EXPECT_EQ(c.a.tensor, "A");
  EXPECT_EQ(c.b.tensor, "B");
  EXPECT_EQ(c.out_tensor, "C");
  EXPECT_EQ(format_contraction(c, m), "A[I, J_X] @ B[J_X, K] -> C[I, K]{U_X}");
  EXPECT_EQ(format_contraction(parse_contraction("X[B, D] @ W[D, F_X]", m), m), "X[B, D] @ W[D, F_X]");
  // Printing round-trips.
  for (const char* text : {"A[I_X, J] @ B[J, K] -> C[I_X, K]", "A[I, J]{U_X} @ B[J, K] -> C[I, K]{U_X}",
                           "Y[B, F_X] @ W2[F_X, D] -> Z[B, D]"}) {
    const Contraction p = parse_contraction(text, m);
    EXPECT_EQ(format_contraction(p, m), text);
    const Contraction q = parse_contraction(format_contraction(p, m), m);
    EXPECT_EQ(q.a, p.a);
    EXPECT_EQ(q.b, p.b);
    EXPECT_EQ(q.out, p.out);
  }
}

TEST(Contraction, Errors) {
  const Mesh m = Mesh::parse("X=4");
  for (const char* bad : {
           "A[I, J] B[J, K]",                  // no '@'
           "A[I, J] @ B[J, K] @ D[K, L]",      // three operands
           "A[I, J] @ B[J, K] -> C[I, L]",     // output letter from nowhere
           "A[I, J, L] @ B[J, K] -> C[I, K]",  // L only in A, not in the output
           "A[I, J] @ B[J, K, L] -> C[I, K]",  // L only in B
           "@ B[J, K]",
           "A[I, J] @",
           "A[I, J] @ B[J, K] ->",
           "A[I_X, J_X] @ B[J, K]",                 // a bad operand
           "A[I, J_X] @ B[J, K_X] -> C[I_X, K_X]",  // a bad output
           "A[I, J] @ B[J, K] -> C[I, K, I]",
       }) {
    EXPECT_THROW(parse_contraction(bad, m), InputError) << bad;
  }
}

// An error inside an operand points into the whole expression.
TEST(Contraction, OperandErrorsQuoteTheExpression) {
  const Mesh m = Mesh::parse("X=4");
  try {
    parse_contraction("A[I, J] @ B[J_Y, K]", m);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.context(), "  A[I, J] @ B[J_Y, K]\n                ^");
  }
}

}  // namespace
}  // namespace shardmm
