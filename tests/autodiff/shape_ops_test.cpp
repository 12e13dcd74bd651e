// The ops by letter (shape_ops.h): broadcasting arithmetic, transpose, split and merge, and
// tanh and exp, worked by hand on small meshes (uneven and empty shards included): their
// layouts, what they refuse, the layout of the gradients they send back, and gradients
// against finite differences, one device and the symbolic tape (testing::check_program).
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <cmath>

#include "autodiff_programs.h"
#include "autodiff_testing.h"
#include "input_error.h"
#include "shardmm/autodiff/shape_ops.h"

namespace shardmm {
namespace {

using namespace autodiff;
using ::testing::HasSubstr;
using testing::Instr;
using testing::Kind;
using testing::leaf;
using testing::Program;

// The specs of the program's values on a symbolic tape (leaves first, then each op's).
std::vector<std::string> specs_of(const Program& p) {
  Tape tape(p.mesh, {DType::f64});
  std::vector<std::string> out;
  for (const Var& v : testing::replay(tape, p)) out.push_back(format_spec(v.spec(), p.mesh));
  return out;
}

// Device 0's collectives of one phase, each as "op(axes) from-spec".
std::vector<std::string> collectives(const Mesh& mesh, const std::vector<TapeEvent>& events, Phase phase) {
  std::vector<std::string> out;
  for (const TapeEvent& e : events) {
    if (e.phase != phase || !is_collective(e.step.op)) continue;
    Spec from = e.step.from;
    from.tensor.clear();
    out.push_back(std::string(to_string(e.step.op)) + "(" + mesh.axis_names(e.step.axes) + ") " +
                  format_spec(from, mesh));
  }
  return out;
}

using Strings = std::vector<std::string>;

Instr op(Kind kind, std::vector<int> args, Strings dims = {}) { return Instr{kind, std::move(args), std::move(dims)}; }

TEST(ShapeOps, ABiasBroadcastOverAShardedLetterGetsAPartialGradient) {
  struct Case {
    const char* mesh;
    const char* x;
    const char* bias;
    const char* out;
    const char* dbias;  // the bias's gradient where it meets its leaf
  };
  // B = 3: uneven on X=2, one row each on X=3, an empty shard on X=4.
  for (const Case& c : {Case{"X=2", "x[B_X, D]", "b[D]", "[B_X, D]", "[D]{U_X}"},
                        Case{"X=3", "x[B_X, D]", "b[D]", "[B_X, D]", "[D]{U_X}"},
                        Case{"X=4", "x[B_X, D]", "b[D]", "[B_X, D]", "[D]{U_X}"},
                        Case{"X=2,Y=2", "x[B_X, D_Y]", "b[D_Y]", "[B_X, D_Y]", "[D_Y]{U_X}"}}) {
    SCOPED_TRACE(c.mesh);
    const Mesh mesh = Mesh::parse(c.mesh);
    Program p{mesh, {leaf(mesh, c.x, {3, 5}, 1), leaf(mesh, c.bias, {5}, 2), leaf(mesh, c.x, {3, 5}, 3)}, {}, ""};
    p.ops = {op(Kind::binary_add, {0, 1}, {"B", "D"}), op(Kind::mul, {3, 2}), op(Kind::sum, {4})};
    EXPECT_EQ(specs_of(p)[3], std::string("x+b") + c.out);
    const testing::Executed run = testing::check_program(p);
    // The sum over B is partial on each rank: one all_reduce, of the bias's gradient only.
    EXPECT_EQ(collectives(mesh, run.events[0], Phase::forward), Strings{});
    EXPECT_EQ(collectives(mesh, run.events[0], Phase::backward), Strings{std::string("all_reduce(X) ") + c.dbias});
  }
}

TEST(ShapeOps, ALetterBothOperandsHaveIsShardedAlike) {
  const Mesh mesh = Mesh::parse("X=2");
  Tape tape(mesh, {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var x = tape.input("x[B, D_X]", {{"B", 3}, {"D", 5}}, zeros);
  Var bias = tape.input("b[D]", {{"D", 5}}, zeros);
  EXPECT_EQ(testing::input_error([&] {
              binary(x, bias, BinaryOp::add, {"B", "D"});
            }),
            "add of x[B, D_X] and b[D]: letter 'D' must be sharded alike in both operands (X vs replicated); "
            "reshard or slice one first");
  // Sliced alike, the bias's gradient sums over B on each rank and is gathered at its leaf
  // (slice's dual); where Y splits B, the sum is partial over Y too.
  struct Case {
    const char* mesh;
    const char* x;
    std::int64_t d;
    Strings backward;
  };
  for (const Case& c :
       {Case{"X=2", "x[B, D_X]", 5, {"all_gather(X) [D_X]"}}, Case{"X=3", "x[B, D_X]", 5, {"all_gather(X) [D_X]"}},
        Case{"X=4", "x[B, D_X]", 3, {"all_gather(X) [D_X]"}},  // D = 3: device 3 holds none
        Case{"X=2,Y=2", "x[B_Y, D_X]", 5, {"all_reduce(Y) [D_X]{U_Y}", "all_gather(X) [D_X]"}}}) {
    SCOPED_TRACE(c.mesh);
    const Mesh m = Mesh::parse(c.mesh);
    Program p{m, {leaf(m, c.x, {3, c.d}, 1), leaf(m, "b[D]", {c.d}, 2), leaf(m, c.x, {3, c.d}, 3)}, {}, ""};
    Instr slice{Kind::slice, {1}, {}, {}, "D", "", {0}};
    p.ops = {slice, op(Kind::binary_add, {0, 3}, {"B", "D"}), op(Kind::mul, {4, 2}), op(Kind::sum, {5})};
    const testing::Executed run = testing::check_program(p);
    EXPECT_EQ(collectives(m, run.events[0], Phase::backward), c.backward);
  }
}

TEST(ShapeOps, BroadcastMulByHand) {
  // z = x[B_X, D] * y[D], loss = sum(z): dy = column sums of x, dx = y on every row. Exact
  // in f32 too; on X=4, device 3 holds no row.
  const std::vector<double> xs = {1, 2, 3, 4, 5, 6}, ys = {10, 100};
  for (const auto& c : {std::pair{"X=2", DType::f64}, std::pair{"X=4", DType::f64}, std::pair{"X=2", DType::f32}}) {
    // Named copies: the lambda below captures them (clang 14 captures no structured binding).
    const char* m = c.first;
    const DType dtype = c.second;
    SCOPED_TRACE(std::string(m) + " " + to_string(dtype));
    const Mesh mesh = Mesh::parse(m);
    const std::int64_t bytes = dtype_bytes(dtype);
    testing::Collected out(mesh);
    std::vector<std::int64_t> saved(static_cast<std::size_t>(mesh.device_count()));
    run_threads(mesh, [&](Communicator& comm) {
      Tape tape(comm, {dtype});
      Var x = tape.input("x[B_X, D]", {{"B", 3}, {"D", 2}}, testing::from_dense(xs, {3, 2}), true);
      Var y = tape.input("y[D]", {{"D", 2}}, testing::from_dense(ys, {2}), true);
      Var z = binary(x, y, BinaryOp::mul, {"B", "D"});
      EXPECT_EQ(format_spec(z.spec(), mesh), "x*y[B_X, D]");
      // Each operand's gradient reads the other operand.
      saved[static_cast<std::size_t>(comm.rank())] = tape.bytes_saved_for_backward(x);
      EXPECT_EQ(tape.bytes_saved_for_backward(y), 2 * bytes);
      out.put("z", z.value());
      tape.backward(sum(z));
      out.put("dx", tape.grad(x));
      out.put("dy", tape.grad(y));
    });
    EXPECT_EQ(out.global("z"), (std::vector<double>{10, 200, 30, 400, 50, 600}));
    EXPECT_EQ(out.global("dx"), (std::vector<double>{10, 100, 10, 100, 10, 100}));
    EXPECT_EQ(out.global("dy"), (std::vector<double>{9, 12}));
    // The shards' bytes: rows 2, 1 on X=2; 1, 1, 1, 0 on X=4.
    EXPECT_EQ(saved, mesh.device_count() == 2 ? (std::vector<std::int64_t>{4 * bytes, 2 * bytes})
                                              : (std::vector<std::int64_t>{2 * bytes, 2 * bytes, 2 * bytes, 0}));
  }
}

// A value without a gradient (data: a route's dispatch) that a mul keeps for its weight's
// gradient stays kept when an activation reads it too (which keeps nothing of it).
TEST(ShapeOps, AValueAMulKeepsStaysKeptWhenAnActivationReadsItAfter) {
  Tape tape(Mesh::parse("X=2"), {DType::f64});
  Var d = tape.input("d[B, D]", {{"B", 4}, {"D", 2}}, {}, /*requires_grad=*/false);
  Var w = tape.input("w[D]", {{"D", 2}}, {}, /*requires_grad=*/true);
  binary(d, w, BinaryOp::mul, {"B", "D"});
  relu(d);
  EXPECT_EQ(tape.bytes_saved_for_backward(d), 8 * 8);
  EXPECT_EQ(tape.bytes_saved_for_backward(w), 0);
}

TEST(ShapeOps, MulGradientsOnTwoAxes) {
  // x[B_X, D_Y] * y[D_Y]: dy sums over B (split by X), so it is [D_Y]{U_X}; dx needs nothing.
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  Program p{mesh, {leaf(mesh, "x[B_X, D_Y]", {3, 5}, 1), leaf(mesh, "y[D_Y]", {5}, 2)}, {}, ""};
  p.ops = {op(Kind::binary_mul, {0, 1}, {"D", "B"}), op(Kind::tanh, {2}), op(Kind::sum, {3})};
  EXPECT_EQ(specs_of(p)[2], "x*y[D_Y, B_X]");
  const testing::Executed run = testing::check_program(p);
  EXPECT_EQ(collectives(mesh, run.events[0], Phase::backward), Strings{"all_reduce(X) [D_Y]{U_X}"});
  // A scalar operand: its gradient sums over everything, partial over every axis.
  Program q{mesh, {leaf(mesh, "x[B_X, D_Y]", {3, 5}, 1), testing::Leaf{Spec{"s", {}, {}}, {}, 2}}, {}, ""};
  q.ops = {op(Kind::binary_mul, {1, 0}, {"B", "D"}), op(Kind::tanh, {2}), op(Kind::sum, {3})};
  EXPECT_EQ(collectives(mesh, testing::check_program(q).events[0], Phase::backward),
            Strings{"all_reduce(XY) []{U_XY}"});
}

TEST(ShapeOps, SubOfPartialSumsBroadcasts) {
  for (const char* m : {"X=2", "X=3"}) {
    SCOPED_TRACE(m);
    const Mesh mesh = Mesh::parse(m);
    Program p{mesh,
              {leaf(mesh, "A[I, J_X]", {3, 4}, 1), leaf(mesh, "B[J_X, K]", {4, 2}, 2), leaf(mesh, "R[J_X]", {4}, 3),
               leaf(mesh, "S[J_X, K]", {4, 2}, 4), leaf(mesh, "C[I, K]", {3, 2}, 5)},
              {},
              ""};
    // [I, K]{U_X} - [K]{U_X} -> [K, I]{U_X}: partial sums subtract; one all_reduce makes it whole.
    p.ops = {op(Kind::local_einsum, {0, 1}, {"I", "K"}),
             op(Kind::local_einsum, {2, 3}, {"K"}),
             op(Kind::binary_sub, {5, 6}, {"K", "I"}),
             Instr{Kind::all_reduce, {7}, {}, {}, "", "", {0}},
             op(Kind::transpose, {8}, {"I", "K"}),
             op(Kind::mul, {9, 4}),
             op(Kind::sum, {10})};
    const std::vector<std::string> specs = specs_of(p);
    EXPECT_EQ(specs[7], "AB-RS[K, I]{U_X}");
    EXPECT_EQ(specs[9], "AB-RS[I, K]");
    testing::check_program(p);
  }
  Tape tape(Mesh::parse("X=2"), {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var a = einsum(tape.input("A[I, J_X]", {{"I", 3}, {"J", 4}}, zeros),
                 tape.input("B[J_X, K]", {{"J", 4}, {"K", 2}}, zeros), {"I", "K"});
  Var k = tape.input("k[K]", {{"K", 2}}, zeros);
  EXPECT_THAT(testing::input_error([&] {
                binary(a, k, BinaryOp::sub, {"I", "K"});
              }),
              HasSubstr("unreduced over different axes (X vs none)"));
  EXPECT_THAT(testing::input_error([&] { binary(a, a, BinaryOp::mul, {"I", "K"}); }), HasSubstr("needs whole values"));
}

TEST(ShapeOps, BinaryRefusesLettersItCannotPlace) {
  Tape tape(Mesh::parse("X=2"), {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var i = tape.input("a[I_X]", {{"I", 3}}, zeros);
  Var j = tape.input("b[J_X]", {{"J", 4}}, zeros);
  Var i5 = tape.input("c[I]", {{"I", 5}}, zeros);
  EXPECT_THAT(testing::input_error([&] {
                binary(i, j, BinaryOp::add, {"I", "J"});
              }),
              HasSubstr("add of a[I_X] and b[J_X] cannot run locally: its output would be a+b[I_X, J_X]"));
  EXPECT_THAT(testing::input_error([&] { binary(i, j, BinaryOp::mul, {"I"}); }),
              HasSubstr("letter 'J' of b[J_X] is not among the output letters (I)"));
  EXPECT_THAT(testing::input_error([&] {
                binary(i, i, BinaryOp::add, {"I", "I"});
              }),
              HasSubstr("output letter 'I' is named twice"));
  EXPECT_THAT(testing::input_error([&] {
                binary(i, i, BinaryOp::add, {"I", "K"});
              }),
              HasSubstr("output letter 'K' is in neither operand"));
  EXPECT_THAT(testing::input_error([&] { binary(reshard(i, tape.spec("[I]")), i5, BinaryOp::sub, {"I"}); }),
              HasSubstr("letter 'I' has size 3 in a[I] but 5 in c[I]"));
  // add and mul keep their one-layout contract.
  EXPECT_THAT(testing::input_error([&] { add(i, reshard(i, tape.spec("[I]"))); }),
              HasSubstr("add needs both operands in one layout"));
  EXPECT_EQ(format_spec(mul(i, i).spec(), tape.mesh()), "a*a[I_X]");
}

TEST(ShapeOps, TransposeCarriesShardingsAndPartialSums) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  // I = 3 and J = 5 split unevenly.
  Program p{mesh, {leaf(mesh, "x[I_X, J_Y, K]", {3, 5, 2}, 1), leaf(mesh, "c[K, I_X, J_Y]", {2, 3, 5}, 2)}, {}, ""};
  p.ops = {op(Kind::transpose, {0}, {"K", "I", "J"}), op(Kind::exp, {2}), op(Kind::mul, {3, 1}), op(Kind::sum, {4})};
  EXPECT_EQ(specs_of(p)[2], "x[K, I_X, J_Y]");
  const testing::Executed run = testing::check_program(p);
  EXPECT_EQ(collectives(mesh, run.events[0], Phase::forward), Strings{});

  Tape tape(mesh, {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var a = einsum(tape.input("A[I, J_X]", {{"I", 3}, {"J", 4}}, zeros),
                 tape.input("B[J_X, K_Y]", {{"J", 4}, {"K", 2}}, zeros), {"I", "K"});
  EXPECT_EQ(format_spec(transpose(a, {"K", "I"}).spec(), mesh), "AB[K_Y, I]{U_X}");
  EXPECT_EQ(testing::input_error([&] {
              transpose(a, {"K", "K"});
            }),
            "transpose of AB[I, K_Y]{U_X}: (K, K) is not a permutation of its letters");
}

TEST(ShapeOps, SplitTakesTheShardingWhenShardsHoldWholeRows) {
  const Mesh x2 = Mesh::parse("X=2");
  const Spec d = parse_spec("x[B, D_X]", x2);
  EXPECT_TRUE(can_split_locally(x2, d, {2, 12}, "D", {{"H", 4}, {"A", 3}}));
  EXPECT_FALSE(can_split_locally(x2, d, {2, 12}, "D", {{"H", 3}, {"A", 4}}));
  EXPECT_TRUE(can_split_locally(x2, d, {2, 3}, "D", {{"H", 3}, {"A", 1}}));  // one element a row: uneven is fine
  EXPECT_TRUE(can_split_locally(x2, d, {2, 0}, "D", {{"H", 3}, {"A", 0}}));  // no data
  const Mesh xy = Mesh::parse("X=2,Y=2");
  EXPECT_TRUE(can_split_locally(xy, parse_spec("[D_XY]", xy), {8}, "D", {{"H", 4}, {"A", 2}}));
  EXPECT_FALSE(can_split_locally(xy, parse_spec("[D_XY]", xy), {8}, "D", {{"H", 2}, {"A", 4}}));
  EXPECT_TRUE(can_split_locally(xy, parse_spec("[D_X, E_Y]", xy), {8, 3}, "E", {{"H", 3}, {"A", 1}}));

  Tape tape(x2, {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var v = tape.input("x[B, D_X]", {{"B", 2}, {"D", 12}}, zeros);
  Var h = split_dim(v, "D", {{"H", 4}, {"A", 3}});
  EXPECT_EQ(format_spec(h.spec(), x2), "x[B, H_X, A]");
  EXPECT_EQ(h.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(testing::input_error([&] {
              split_dim(v, "D", {{"H", 3}, {"A", 4}});
            }),
            "split_dim of x[B, D_X] (D into H=3, A=4): D is sharded over X (2 devices), and H's size 3 is not a "
            "multiple of 2, so the shards would not hold whole rows of H; all_gather D first");
  EXPECT_EQ(format_spec(split_dim(all_gather(v, "D", tape.axes("X")), "D", {{"H", 3}, {"A", 4}}).spec(), x2),
            "x[B, H, A]");
  EXPECT_THAT(testing::input_error([&] {
                split_dim(v, "D", {{"H", 5}, {"A", 2}});
              }),
              HasSubstr("the parts' sizes multiply to 10, not D's size 12"));
  EXPECT_THAT(testing::input_error([&] { split_dim(v, "Q", {{"H", 12}}); }), HasSubstr("it has no dimension 'Q'"));
  EXPECT_THAT(testing::input_error([&] { split_dim(v, "D", {{"B", 4}, {"A", 3}}); }), HasSubstr("appears twice"));
  EXPECT_THAT(testing::input_error([&] {
                can_split_locally(x2, d, {2, 12}, "D", {{"H", 5}, {"A", 2}});
              }),
              HasSubstr("multiply to 10"));

  // Gradients: X=2 (rows of 3), X=3 uneven batch with H = 3 heads, X=4 with an empty shard.
  for (const char* m : {"X=2", "X=3", "X=4"}) {
    SCOPED_TRACE(m);
    const Mesh mesh = Mesh::parse(m);
    const std::int64_t heads = mesh.device_count() == 3 ? 3 : 4;
    Program p{mesh, {leaf(mesh, "x[B_X, D]", {3, heads * 2}, 1), leaf(mesh, "c[B_X, H, A]", {3, heads, 2}, 2)}, {}, ""};
    Instr split{Kind::split, {0}};
    split.dim = "D";
    split.parts = {{"H", heads}, {"A", 2}};
    p.ops = {split, op(Kind::tanh, {2}), op(Kind::mul, {3, 1}), op(Kind::sum, {4})};
    EXPECT_EQ(specs_of(p)[2], "x[B_X, H, A]");
    testing::check_program(p);
  }
}

// torch.chunk can cut whole rows where the size is uneven: 14 = 7 rows of 2 over 4 is
// 4,4,4,2 elements, 2,2,2,1 rows; numpy.array_split's 4,4,3,3 are not whole rows.
TEST(ShapeOps, SplitAndMergeFollowTheMeshsRule) {
  const Mesh array = Mesh::parse("X=4"), chunk = Mesh::parse("X=4", SplitRule::chunk);
  EXPECT_TRUE(can_split_locally(chunk, parse_spec("x[D_X]", chunk), {14}, "D", {{"H", 7}, {"A", 2}}));
  EXPECT_FALSE(can_split_locally(array, parse_spec("x[D_X]", array), {14}, "D", {{"H", 7}, {"A", 2}}));
  EXPECT_TRUE(can_merge_locally(chunk, parse_spec("x[H_X, A]", chunk), {7, 2}, {"H", "A"}));
  // 10 = 5 rows of 2: chunk's 3,3,3,1 elements against 2,2,1,0 rows.
  EXPECT_FALSE(can_split_locally(chunk, parse_spec("x[D_X]", chunk), {10}, "D", {{"H", 5}, {"A", 2}}));
  // Executed on the chunk mesh, with its gradient, against the dense step.
  Program p{chunk, {leaf(chunk, "x[B, D_X]", {2, 14}, 1), leaf(chunk, "c[B, H_X, A]", {2, 7, 2}, 2)}, {}, ""};
  Instr split{Kind::split, {0}};
  split.dim = "D";
  split.parts = {{"H", 7}, {"A", 2}};
  p.ops = {split, op(Kind::tanh, {2}), op(Kind::mul, {3, 1}), op(Kind::sum, {4})};
  EXPECT_EQ(specs_of(p)[2], "x[B, H_X, A]");
  testing::check_program(p);
}

TEST(ShapeOps, MergeNeedsOnlyTheFirstLetterSharded) {
  const Mesh x2 = Mesh::parse("X=2");
  EXPECT_TRUE(can_merge_locally(x2, parse_spec("[B, H_X, A]", x2), {2, 4, 3}, {"H", "A"}));
  EXPECT_FALSE(can_merge_locally(x2, parse_spec("[B, H, A_X]", x2), {2, 4, 3}, {"H", "A"}));
  EXPECT_FALSE(can_merge_locally(x2, parse_spec("[B, H_X, A]", x2), {2, 3, 2}, {"H", "A"}));
  EXPECT_TRUE(can_merge_locally(x2, parse_spec("[B, H_X, A]", x2), {2, 3, 1}, {"H", "A"}));
  EXPECT_TRUE(can_merge_locally(x2, parse_spec("[B_X, H, A]", x2), {3, 3, 2}, {"H", "A"}));

  Tape tape(x2, {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var v = tape.input("x[B, H_X, A]", {{"B", 2}, {"H", 4}, {"A", 3}}, zeros);
  Var d = merge_dims(v, {"H", "A"}, "D");
  EXPECT_EQ(format_spec(d.spec(), x2), "x[B, D_X]");
  EXPECT_EQ(d.shape(), (Shape{2, 12}));
  Var minor = tape.input("y[B, H, A_X]", {{"B", 2}, {"H", 4}, {"A", 3}}, zeros);
  EXPECT_EQ(testing::input_error([&] {
              merge_dims(minor, {"H", "A"}, "D");
            }),
            "merge_dims of y[B, H, A_X] (H, A into D): A is sharded over X, and only the first merged letter may be; "
            "all_gather A first");
  Var uneven = tape.input("z[H_X, A]", {{"H", 3}, {"A", 2}}, zeros);
  EXPECT_THAT(testing::input_error([&] {
                merge_dims(uneven, {"H", "A"}, "D");
              }),
              HasSubstr("H's size 3 is not a multiple of 2, so the shards would not hold whole rows of H; "
                        "all_gather H first"));
  EXPECT_THAT(testing::input_error([&] {
                merge_dims(v, {"A", "H"}, "D");
              }),
              HasSubstr("the letters must be consecutive in the spec and in its order (transpose first)"));
  EXPECT_THAT(testing::input_error([&] { merge_dims(v, {"H", "A"}, "B"); }), HasSubstr("appears twice"));
  EXPECT_THAT(testing::input_error([&] {
                merge_dims(v, {"B", "H"}, "N");
              }),
              HasSubstr("H is sharded over X, and only the first merged letter may be"));
}

TEST(ShapeOps, MergeGradients) {
  for (const char* m : {"X=2", "X=3", "X=4"}) {  // H = 4 and 3 heads of 2; X=4: B = 3 leaves a shard empty
    SCOPED_TRACE(m);
    const Mesh mesh = Mesh::parse(m);
    const std::int64_t heads = mesh.device_count() == 3 ? 3 : 4;
    Program p{mesh, {leaf(mesh, "x[B, H_X, A]", {3, heads, 2}, 1), leaf(mesh, "c[B, D_X]", {3, heads * 2}, 2)}, {}, ""};
    Instr merge = op(Kind::merge, {0}, {"H", "A"});
    merge.dim = "D";
    p.ops = {merge, op(Kind::tanh, {2}), op(Kind::mul, {3, 1}), op(Kind::sum, {4})};
    EXPECT_EQ(specs_of(p)[2], "x[B, D_X]");
    testing::check_program(p);
  }
}

TEST(ShapeOps, SplitBackwardAlignsAGradientItCannotMerge) {
  // The gradient comes back through the reshard as [B, H, A_X], which cannot merge locally:
  // the split's backward aligns it to its own [B, H_X, A] (the reshard's dual) first.
  const Mesh mesh = Mesh::parse("X=2");
  Program p{mesh, {leaf(mesh, "x[B, D_X]", {3, 8}, 1)}, {}, ""};
  Instr split{Kind::split, {0}};
  split.dim = "D";
  split.parts = {{"H", 2}, {"A", 4}};
  p.ops = {split, Instr{Kind::reshard, {1}, {}, parse_spec("x[B, H, A_X]", mesh)}, op(Kind::tanh, {2}),
           op(Kind::sum, {3})};
  const testing::Executed run = testing::check_program(p);
  EXPECT_EQ(collectives(mesh, run.events[0], Phase::forward), Strings{"all_to_all(X) [B, H_X, A]"});
  EXPECT_EQ(collectives(mesh, run.events[0], Phase::backward), Strings{"all_to_all(X) [B, H, A_X]"});
}

TEST(ShapeOps, TanhAndExpByHand) {
  const Mesh mesh = Mesh::parse("X=2");
  const std::vector<double> xs = {0, 1, -2};
  testing::Collected out(mesh);
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    Var x = tape.input("x[I_X]", {{"I", 3}}, testing::from_dense(xs, {3}), true);
    Var t = autodiff::tanh(x);
    Var e = autodiff::exp(x);
    out.put("t", t.value());
    out.put("e", e.value());
    tape.backward(sum(binary(t, e, BinaryOp::add, {"I"})));
    out.put("dx", tape.grad(x));
  });
  const std::vector<double> t = out.global("t"), e = out.global("e"), dx = out.global("dx");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_DOUBLE_EQ(t[i], std::tanh(xs[i]));
    EXPECT_DOUBLE_EQ(e[i], std::exp(xs[i]));
    EXPECT_DOUBLE_EQ(dx[i], 1 - std::tanh(xs[i]) * std::tanh(xs[i]) + std::exp(xs[i]));
  }
  Tape tape(mesh, {DType::f64});
  const auto zeros = [](const Index&, std::int64_t) { return 0.0; };
  Var p = einsum(tape.input("A[I, J_X]", {{"I", 2}, {"J", 2}}, zeros), tape.input("B[J_X]", {{"J", 2}}, zeros), {"I"});
  EXPECT_THAT(testing::input_error([&] { autodiff::exp(p); }), HasSubstr("exp of AB[I]{U_X}: the value is unreduced"));
}

}  // namespace
}  // namespace shardmm
