// A program: a whole sharded model in one text, one op per line, in the Scaling Book's
// notation (docs/programs.md has the grammar and every op's sharding rule).
//
//   program::Program p = program::parse_program(text, "mlp.prog");   // InputError: FILE:LINE:COL
//   program::Graph g = program::bind(p, {});      // the file's mesh and dims, unrolled, checked
//   g.tensors[g.find("u")].letters;                // {"B", "T", "F"}
//   program::format_program(p);                    // the canonical text; parses back to p
//
//   mesh   X=4
//   dims   B=8, T=1024, D=4096, F=16384
//   input  x[B, T, D]
//   param  w_in[D, F]   : w_in[D, F_X]        # a pinned spec
//   u[B, T, F] = layer_norm(x, over=D) @ w_in
//   ...
//   loss sum(out * g)
//
// A Program is the parsed text, repeat blocks kept; a Graph is what runs: every repeat
// unrolled (iteration k's tensors named `name.k`), every nested expression its own tensor,
// every letter sized, every spec parsed on the mesh, every shape checked. Neither touches a
// communicator: a Graph for 8,192 devices is built on a laptop.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"

namespace shardmm {
using Shape = std::vector<std::int64_t>;  // a global shape, as runtime/tensor.h names it
}  // namespace shardmm

namespace shardmm::program {

// Where a construct starts in the program text (1-based).
struct Location {
  int line = 0;
  int column = 0;
};

enum class OpKind {
  einsum,       // a @ b, output letters as declared
  unary,        // relu, gelu, silu, tanh, exp
  scale,        // scale(x, c)
  binary,       // a + b, a - b, a * b, broadcasting by letter
  reduce,       // sum, mean, max (over=L: drops L; no over: to a scalar, loss only)
  normalize,    // softmax, layer_norm, rms_norm over a letter
  causal_mask,  // causal_mask(x, T, S): entries with S > T masked out (-inf)
  transpose,    // transpose(x): letters permuted to the declared order
  split,        // split(x, D -> H A)
  merge,        // merge(x, H A -> D)
  rename,       // rename(x, T -> S)
  route,        // route(p, over=E, tokens=T, top=K): MoE's one-hot dispatch, a new capacity letter last
};
const char* to_string(OpKind kind);

// One op: `function` names the variant ("relu", "add", "sum", "softmax", ...).
struct Op {
  OpKind kind = OpKind::unary;
  std::string function;
  std::string over;                   // reduce / normalize: the letter ("" for a scalar sum)
  double constant = 0;                // scale's factor
  std::vector<std::string> from, to;  // split, merge, rename: letters before -> after;
                                      // causal_mask: from = {row}, to = {col}; route: from = {tokens}
  int top = 0;                        // route: the experts each token goes to
};

// An expression as written: a tensor name, or an op applied to expressions.
struct Expr {
  std::string tensor;  // a reference (args empty), else ""
  Op op;
  std::vector<Expr> args;
  std::string text;  // its source text
  Location where;
  bool is_reference() const { return !tensor.empty(); }
};

enum class Role { input, param, computed };
const char* to_string(Role role);

// A tensor statement as written: `input x[B, D]`, `u[B, F] = x @ w : u[B, F_X]`.
struct Statement {
  Role role = Role::computed;
  std::string name;
  std::vector<std::string> letters;
  std::optional<std::string> spec;  // pinned, as written after ':'
  bool regathered = false;          // param: `param w[D, F] regathered`, FSDP's gather again in backward
  Expr expr;                        // computed only
  Location where;                   // the name
  Location spec_where;              // the pinned spec
};

struct Block;
// A line of the program: a statement, a loss, or a repeat block.
struct Item {
  enum class Kind { statement, loss, repeat } kind = Kind::statement;
  Statement statement;     // statement, and loss (its name is "loss", its letters empty)
  int count = 0;           // repeat
  std::vector<Item> body;  // repeat
  Location where;
};

struct Program {
  std::string file;                 // for messages
  std::optional<std::string> mesh;  // the `mesh` line's text
  std::optional<std::string> dims;  // the `dims` line's text
  Location mesh_where, dims_where;
  std::vector<Item> items;
  std::vector<std::string> lines;  // the source, for bind()'s messages
};

// Parses a program; InputError "FILE:LINE:COL: message" with the line and a caret. Checks
// the grammar and names only; bind() checks shapes and specs.
Program parse_program(std::string_view text, std::string_view file = "<program>");
// The canonical text (parse_program(format_program(p)) formats to the same text).
std::string format_program(const Program& program);

// ---- The bound program

struct Tensor {
  std::string name;         // unique in the graph (`h.3`: iteration 3 of a repeat)
  std::string source_name;  // as written (`h`)
  Role role = Role::computed;
  std::vector<std::string> letters;
  Shape shape;
  std::optional<Spec> pinned;  // from the file or the caller's overrides
  int producer = -1;           // index into Graph::ops (computed tensors)
  std::vector<int> consumers;  // ops that read it
  bool temporary = false;
  bool regathered = false;     // a param whose einsums' all_gathers are dropped after
                               // forward and run again in backward (FSDP), not kept
  bool differentiable = true;  // false: no gradient reaches it (a route's dispatch, and
                               // what is computed from such values alone)
  Location where;
};

// An op of the unrolled program; a nested expression's value is a temporary tensor named
// after its statement (`loss.1`).
struct GraphOp {
  Op op;
  int result = -1;            // tensor index
  std::vector<int> operands;  // tensor indices
  std::string expression;     // source text
  Location where;
};

struct Graph {
  std::string file;
  Mesh mesh;
  DimSizes dims;
  std::vector<Tensor> tensors;  // leaves and computed values, in definition order
  std::vector<GraphOp> ops;     // in execution order
  int loss = -1;                // the loss tensor (scalar), -1 when the program has none

  int find(std::string_view name) const;  // -1 when absent
  // Tensors that no op reads and that are not the loss: the program's outputs.
  std::vector<int> outputs() const;
  std::vector<int> leaves() const;
  std::vector<int> params() const;
};

struct BindOptions {
  std::optional<Mesh> mesh;                  // overrides the file's `mesh` line
  SplitRule split = SplitRule::array;        // how the file's `mesh` line splits (`mesh` has its own)
  std::optional<DimSizes> dims;              // overrides (entry by entry) the file's `dims`
  std::map<std::string, std::string> specs;  // NAME -> spec text, overriding the file's pins; a
                                             // repeat's tensor by its written name pins every copy
  std::string specs_field = "spec";          // the field `specs` came in, as messages name it
};

// Unrolls, sizes and checks the program: every letter sized, every operand defined
// before use, every input and param used, every line's declared letters what its op
// gives, pinned specs valid on the mesh and naming the tensor's letters in order.
// InputError "FILE:LINE:COL: message" (overrides: naming the field).
Graph bind(const Program& program, const BindOptions& options);

// The Graph's tensor as a spec with no sharding (`u[B, T, F]`), for messages and plans.
Spec replicated_spec(const Tensor& tensor);

}  // namespace shardmm::program
