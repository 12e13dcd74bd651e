// The program text: parsing, printing, unrolling, and every rule bind() checks, with the
// exact FILE:LINE:COL each mistake must produce.
#include <gtest/gtest.h>

#include "repo_files.h"
#include "shardmm/core/error.h"
#include "shardmm/program/program.h"

namespace shardmm::program {
namespace {

std::vector<std::string> names(const Graph& g, const std::vector<int>& idx) {
  std::vector<std::string> out;
  for (int i : idx) out.push_back(g.tensors[static_cast<std::size_t>(i)].name);
  return out;
}

TEST(Program, TheIssuesMlpParsesAndBinds) {
  const Program p = parse_program(testing::read_repo_file("examples/programs/mlp.prog"), "mlp.prog");
  const Graph g = bind(p, {});
  EXPECT_EQ(g.mesh.to_string(), "X=4");
  EXPECT_EQ(g.dims.at("F"), 16384);
  const Tensor& u = g.tensors[static_cast<std::size_t>(g.find("u"))];
  EXPECT_EQ(u.letters, (std::vector<std::string>{"B", "T", "F"}));
  EXPECT_EQ(u.shape, (Shape{8, 1024, 16384}));
  EXPECT_FALSE(u.pinned);
  const Tensor& w = g.tensors[static_cast<std::size_t>(g.find("w_in"))];
  ASSERT_TRUE(w.pinned);
  EXPECT_EQ(format_spec(*w.pinned, g.mesh), "w_in[D, F_X]");
  EXPECT_EQ(names(g, g.params()), (std::vector<std::string>{"w_in", "w_out"}));
  EXPECT_EQ(names(g, g.leaves()), (std::vector<std::string>{"x", "w_in", "w_out", "g"}));
  // The loss's nested product is a temporary; the program's outputs are what nothing reads.
  ASSERT_GE(g.loss, 0);
  const GraphOp& loss = g.ops[static_cast<std::size_t>(g.tensors[static_cast<std::size_t>(g.loss)].producer)];
  EXPECT_EQ(loss.op.function, "sum");
  const Tensor& product = g.tensors[static_cast<std::size_t>(loss.operands[0])];
  EXPECT_TRUE(product.temporary);
  EXPECT_EQ(product.letters, (std::vector<std::string>{"B", "T", "D"}));
  EXPECT_TRUE(g.outputs().empty());
  EXPECT_EQ(g.ops.size(), 7u);
}

TEST(Program, PrintingIsCanonicalAndParsesBack) {
  for (const char* file : {"examples/programs/mlp.prog", "examples/programs/gpt.prog", "examples/programs/gpt96.prog",
                           "examples/programs/attention.prog", "examples/programs/block.prog",
                           "examples/programs/tp_ffn.prog", "examples/programs/moe.prog"}) {
    const Program p = parse_program(testing::read_repo_file(file), file);
    const std::string once = format_program(p);
    EXPECT_EQ(format_program(parse_program(once)), once) << file;
  }
  const Program fsdp = parse_program(
      "mesh X=2\ndims D=4, F=4\nparam w[D, F]  regathered  :  w[D_X, F]\n"
      "input x[D]\ny[F] = x @ w\n");
  EXPECT_EQ(format_program(fsdp),
            "mesh X=2\ndims D=4,F=4\nparam w[D, F] regathered : w[D_X, F]\ninput x[D]\ny[F] = x @ w\n");
  EXPECT_TRUE(bind(fsdp, {}).tensors[0].regathered);
  const std::string text = "mesh X=2\ndims I=4, J=4\ninput a[I, J]\nb[I, J] = a - (a - a) * scale(a, -0.5)\n";
  const std::string once = format_program(parse_program(text));
  EXPECT_EQ(once, "mesh X=2\ndims I=4,J=4\ninput a[I, J]\nb[I, J] = a - (a - a) * scale(a, -0.5)\n");
}

TEST(Program, MoeRoutesWithANewCapacityLetterAndNoGradient) {
  const Graph g = bind(parse_program(testing::read_repo_file("examples/programs/moe.prog"), "moe.prog"), {});
  const Tensor& d = g.tensors[static_cast<std::size_t>(g.find("d"))];
  EXPECT_EQ(d.letters, (std::vector<std::string>{"B", "T", "E", "C"}));
  EXPECT_EQ(d.shape, (Shape{8, 1024, 8, 320}));
  const Op& route = g.ops[static_cast<std::size_t>(d.producer)].op;
  EXPECT_EQ(route.kind, OpKind::route);
  EXPECT_EQ(route.over, "E");
  EXPECT_EQ(route.from, (std::vector<std::string>{"T"}));
  EXPECT_EQ(route.top, 2);
  // The dispatch is data; what it meets with differentiable values is differentiated.
  EXPECT_FALSE(d.differentiable);
  EXPECT_TRUE(g.tensors[static_cast<std::size_t>(g.find("xe"))].differentiable);
  EXPECT_TRUE(g.tensors[static_cast<std::size_t>(g.find("probs"))].differentiable);
  const Graph only =
      bind(parse_program("mesh X=2\ndims T=4, E=3, C=2\ninput p[T, E]\nd[T, E, C] = route(p, over=E, tokens=T, top=1)\n"
                         "s[T, E, C] = scale(d, 2)\n"),
           {});
  EXPECT_FALSE(only.tensors[static_cast<std::size_t>(only.find("s"))].differentiable);
}

TEST(Program, RepeatUnrollsAndCarriesRebindingValues) {
  const Graph g = bind(parse_program(testing::read_repo_file("examples/programs/gpt.prog"), "gpt.prog"), {});
  // Two layers: each param twice, named by iteration.
  EXPECT_GE(g.find("wq.0"), 0);
  EXPECT_GE(g.find("wq.1"), 0);
  EXPECT_LT(g.find("wq.2"), 0);
  EXPECT_EQ(names(g, g.params()).size(), 12u);
  // The final norm reads the second layer's last x.
  const Tensor& out = g.tensors[static_cast<std::size_t>(g.find("out"))];
  const GraphOp& norm = g.ops[static_cast<std::size_t>(out.producer)];
  const Tensor& x = g.tensors[static_cast<std::size_t>(norm.operands[0])];
  EXPECT_EQ(x.source_name, "x");
  EXPECT_EQ(x.name, "x.1'");  // the second layer's second residual: a rebinding in one iteration
  // The second layer's first norm reads the first layer's last x.
  const Tensor& h1 = g.tensors[static_cast<std::size_t>(g.find("h.1"))];
  const Tensor& x0 = g.tensors[static_cast<std::size_t>(g.ops[static_cast<std::size_t>(h1.producer)].operands[0])];
  EXPECT_EQ(x0.name, "x.0'");
  EXPECT_GT(g.tensors[static_cast<std::size_t>(g.find("x.0"))].producer,
            g.tensors[static_cast<std::size_t>(g.find("att.0"))].producer);
}

TEST(Program, OverridesReplaceTheFilesMeshDimsAndPins) {
  const Program p = parse_program(testing::read_repo_file("examples/programs/mlp.prog"), "mlp.prog");
  BindOptions o;
  o.mesh = Mesh::parse("X=2,Y=2");
  o.dims = DimSizes{{"B", 5}, {"T", 3}, {"D", 6}, {"F", 10}};
  o.specs["x"] = "x[B_Y, T, D]";
  o.specs["w_in"] = "[D, F_{XY}]";
  const Graph g = bind(p, o);
  EXPECT_EQ(g.mesh.device_count(), 4);
  EXPECT_EQ(g.tensors[static_cast<std::size_t>(g.find("u"))].shape, (Shape{5, 3, 10}));
  EXPECT_EQ(format_spec(*g.tensors[static_cast<std::size_t>(g.find("x"))].pinned, g.mesh), "x[B_Y, T, D]");
  EXPECT_EQ(format_spec(*g.tensors[static_cast<std::size_t>(g.find("w_in"))].pinned, g.mesh), "w_in[D, F_XY]");
  o.specs = {{"nope", "[B]"}};
  try {
    bind(p, o);
    FAIL() << "an override naming no tensor was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "spec for 'nope' in spec: the program has no tensor 'nope'");
  }
}

// Each bad program with the exact message it must produce (headline only).
struct BadProgram {
  std::string text;
  std::string message;
};

TEST(Program, BadProgramsNameFileLineAndColumn) {
  const std::string head = "mesh X=2\ndims I=4, J=6, K=8\n";
  const BadProgram cases[] = {
      {"input a[I, J]\nb[I, J] = gelux(a)\n",
       "t.prog:4:11: unknown op 'gelux'; the ops are relu, gelu, silu, tanh, exp, sum, mean, max, softmax, layer_norm, "
       "rms_norm, transpose, split, merge, rename, causal_mask, scale, route, and a @ b, a + b, a - b, a * b"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=Q, tokens=I, top=1)\n",
       "t.prog:4:14: route: experts' letter 'Q' is not a letter of its operand [I, J]"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, tokens=T, top=1)\n",
       "t.prog:4:14: route: tokens' letter 'T' is not a letter of its operand [I, J]"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, tokens=J, top=1)\n",
       "t.prog:4:14: route needs different letters for the experts (over=) and the tokens (tokens=)"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, tokens=I, top=0)\n",
       "t.prog:4:45: route's top (the experts each token goes to) is a whole number >= 1, got 0"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, tokens=I, top=1.5)\n",
       "t.prog:4:45: route's top (the experts each token goes to) is a whole number >= 1, got 1.5"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, tokens=I, top=7)\n",
       "t.prog:4:14: route: top=7 but there are 6 experts ('J'); a token goes to 1 <= top <= J experts"},
      {"input a[I, J]\nb[I, J, K] = route(a, J, tokens=I, top=1)\n",
       "t.prog:4:23: expected 'over=' here: route(p, over=E, tokens=T, top=2)"},
      {"input a[I, J]\nb[I, J, K] = route(a, over=J, top=1)\n",
       "t.prog:4:31: expected 'tokens=' here: route(p, over=E, tokens=T, top=2)"},
      {"input a[I, J]\nb[I, J] = route(a, over=J, tokens=I, top=1)\n",
       "t.prog:4:11: route gives its operand's letters [I, J] then a new capacity letter (each expert's slots), but "
       "the line declares [I, J]"},
      {"input a[I, J]\nb[K, I, J] = route(a, over=J, tokens=I, top=1)\n",
       "t.prog:4:14: route gives its operand's letters [I, J] then a new capacity letter (each expert's slots), but "
       "the line declares [K, I, J]"},
      {"input a[I, J]\nb[I, J, K] = relu(route(a, over=J, tokens=I, top=1))\n",
       "t.prog:4:19: route inside an expression has no capacity letter; give it a line of its own "
       "(d[B, T, E, C] = route(p, over=E, tokens=T, top=2))"},
      {"input a[I, J]\nb[I, K] = relu(a)\n", "t.prog:4:11: relu gives [I, J] but the line declares [I, K]"},
      {"input a[I, J]\nb[J, I] = relu(a)\n",
       "t.prog:4:11: relu gives [I, J] but the line declares [J, I]; reorder letters with transpose(...) on a line of "
       "its own"},
      {"input a[I, J]\nb[I, J] = relu(c)\n", "t.prog:4:16: 'c' is not defined before this line"},
      // Nested 65 deep (the fuzzer's 1,593 bytes of parentheses overflowed the stack), and 257 ops.
      {"input a[I, J]\nb[I, J] = " + std::string(65, '(') + "a" + std::string(65, ')') + "\n",
       "t.prog:4:75: an expression nests at most 64 deep (parentheses and op calls)"},
      {"input a[I, J]\nb[I, J] = exp(" + std::string(64, '(') + "a" + std::string(64, ')') + ")\n",
       "t.prog:4:78: an expression nests at most 64 deep (parentheses and op calls)"},
      {[] {
         std::string sum = "input a[I, J]\nb[I, J] = a";
         for (int i = 0; i < 257; ++i) sum += " + a";
         return sum + "\n";
       }(),
       "t.prog:4:11: a statement holds at most 256 ops (split it into statements)"},
      {"input a[I, J]\ninput b[I, J]\nc[I, J] = relu(a)\n",
       "t.prog:4:7: input 'b' is never used; remove it or use it in an op"},
      {"input a[I, Q]\nb[I, Q] = relu(a)\n",
       "t.prog:3:7: dimension 'Q' has no size; add it to the dims line (dims Q=...) or give it in dims"},
      {"input a[I, J] : a[I_X, J_X]\nb[I, J] = relu(a)\n",
       "t.prog:3:17: bad spec '[I_X, J_X]': mesh axis 'X' shards two dimensions (I and J); a mesh axis can shard only "
       "one dimension; did you mean [I_X, J]?"},
      {"input a[I, J] : a[J, I]\nb[I, J] = relu(a)\n",
       "t.prog:3:17: spec 'a[J, I]' of 'a': its letters [J, I] are not the tensor's [I, J] in order"},
      {"input a[I, J] : c[I_X, J]\nb[I, J] = relu(a)\n",
       "t.prog:3:17: spec 'c[I_X, J]' of 'a': it names tensor 'c'; write a[...] or [...]"},
      {"input a[I, J] : a I_X, J\nb[I, J] = relu(a)\n",
       "t.prog:3:17: spec 'a I_X, J' of 'a': expected the tensor's letters in brackets, e.g. a[I, J]"},
      {"input a[I, J]\nb[I, J] = relu(a)\nb[I, J] = relu(b)\n",
       "t.prog:5:1: 'b' is defined twice (first at line 4); a tensor is defined once, except a value a repeat block "
       "carries to its next iteration"},
      {"input a[I, J]\nrepeat 0 {\nb[I, J] = relu(a)\n}\n",
       "t.prog:4:8: repeat takes a whole count of at least 1 (and at most 1000000), e.g. repeat 32 {"},
      {"input a[I, J]\nrepeat 2 {\nb[I, J] = relu(a)\n",
       "t.prog:4:1: this repeat block is never closed; end it with '}' on a line of its own"},
      {"input a[I, J]\n}\n", "t.prog:4:1: '}' closes no repeat block"},
      {"input a[I, J]\ninput c[K]\nb[I] = a @ c\n",
       "t.prog:5:8: einsum: letter 'J' of [I, J] is in neither the other operand nor the output; sum it out first "
       "(sum(x, over=J))"},
      {"input a[I, J]\nb[I] = (a @ a) * a\n",
       "t.prog:4:9: an einsum inside an expression has no named output letters; give 'a @ a' a line of its own "
       "(NAME[...] = a @ b)"},
      {"input a[I, J]\nloss a\n",
       "t.prog:4:6: the loss is sum(...) or mean(...) of a tensor over all its letters, e.g. loss sum(out * g)"},
      {"input a[I, J]\nb[I, J] = softmax(a)\n",
       "t.prog:4:20: softmax needs the letter it normalizes over, e.g. softmax(x, over=D)"},
      {"input a[I, J]\nb[I, J] = softmax(a, over=K)\n",
       "t.prog:4:11: softmax: letter 'K' is not a letter of its operand [I, J]"},
      {"input a[I, J]\nb[I, J, K] = a\n",
       "t.prog:4:14: a line that only names 'a' copies nothing; use 'a' where it is read"},
      {"input a[I, I]\n", "t.prog:3:12: dimension 'I' is named twice; a tensor names each dimension once"},
      {"input relu[I]\n", "t.prog:3:7: 'relu' is an op; name the tensor otherwise"},
      {"input a[I, J]\nb[I, K, J] = split(a, J -> K)\n",
       "t.prog:4:14: split takes one letter into two or more: split(x, D -> H A)"},
      {"input a[I, J]\nb[I, J, K] = split(a, J -> J K)\n",
       "t.prog:4:14: split: 'J' has size 6 but the parts multiply to 48"},
      {"input a[I, J]\nb[I, J] = relu(a) junk\n", "t.prog:4:19: unexpected 'j' after the expression"},
      {"param a[I, J] kept\nb[I, J] = relu(a)\n",
       "t.prog:3:15: after a param's letters: 'regathered' (FSDP: its gathered copy is dropped after the forward pass "
       "and gathered again for backward) or ':' and its pinned spec"},
      {"input a[I, J] regathered\nb[I, J] = relu(a)\n",
       "t.prog:3:15: unexpected 'r'; a pinned spec follows ':', e.g. : w[D, F_X]"},
      {"input a[I, J]\nb[I, J] = relu(a)\nfoo bar\n",
       "t.prog:5:1: unknown statement 'foo'; a line is mesh, dims, input, param, loss, repeat N {, } or NAME[...] = "
       "..."},
      {"input a[I, J]\nb[I, J] = relu(a)\nloss sum(b)\nloss sum(b)\n", "t.prog:6:1: a second loss; a program has one"},
      {"input a[I, J]\nb[I, J] = rename(a, J -> K)\n",
       "t.prog:4:11: rename: 'J' has size 6 but 'K' 8; a renamed letter keeps its size"},
      {"input a[I, J]\nb[J, I] = transpose(a) : b[J_X, I_X]\n",
       "t.prog:4:26: bad spec '[J_X, I_X]': mesh axis 'X' shards two dimensions (J and I); a mesh axis can shard only "
       "one dimension; did you mean [J_X, I]?"},
  };
  for (const BadProgram& c : cases) {
    const std::string text = head + c.text;
    SCOPED_TRACE(text);
    try {
      bind(parse_program(text, "t.prog"), {});
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.headline(), c.message);
      EXPECT_FALSE(e.context().empty()) << "no caret line";
    }
  }
}

TEST(Program, BinaryJunkAndUnusedDimsAreRefused) {
  try {
    parse_program(std::string("mesh X=2\n\x7f"
                              "ELF\x02\x01\x01",
                              13),
                  "bin");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "bin:2:1: byte \\x7f is a control character; a program is a text file (docs/programs.md)");
  }
  try {
    parse_program("mesh X=2\n\xff\xfe", "bin");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "bin:2:1: byte \\xff is not UTF-8 text; a program is a text file (docs/programs.md)");
  }
  try {
    bind(parse_program("mesh X=2\ndims I=4, Z=3\ninput a[I]\nb[I] = relu(a)\n", "p"), {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "p:2:6: dimension 'Z' is given a size but no tensor has it (a typo?)");
  }
  try {
    bind(parse_program("input a[I]\nb[I] = relu(a)\n", "p"), {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "p: the program has no mesh: add a line like 'mesh X=4' or give the mesh");
  }
}

TEST(Program, RepeatCountsThatUnrollTooFarFailFast) {
  const std::string text = "mesh X=2\ndims I=4\ninput a[I]\nrepeat 1000000 {\nrepeat 1000000 {\na[I] = relu(a)\n}\n}\n";
  try {
    bind(parse_program(text, "p"), {});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(), "p:4:1: the program unrolls to more than 1000000 ops; check the repeat counts");
  }
}

}  // namespace
}  // namespace shardmm::program
