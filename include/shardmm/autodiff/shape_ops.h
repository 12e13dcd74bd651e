// Ops on the tape that work by letter: elementwise arithmetic with broadcasting, and the
// letters' order and grouping (transpose, split, merge). Each runs on the rank's own block,
// without communication; only a backward may move data, where it aligns a gradient first
// (tape.h's gradient layouts).
//
//   // On X=2, x[B_X, D] + bias[D]: bias is broadcast over B; the output is [B_X, D].
//   Var y = binary(x, bias, BinaryOp::add, {"B", "D"});
//   // bias's gradient sums the output's over B, which X splits: it comes out [D]{U_X}
//   // (each rank's partial sum) and is all_reduced where it meets its leaf.
//   // A letter both operands have is sharded alike: reshard or slice one first.
//   // Attention heads: z[B, D_X] -> [B, H_X, A] (8 heads of 64; 8 is a multiple of 2).
//   Var h = split_dim(z, "D", {{"H", 8}, {"A", 64}});
//   Var t = transpose(h, {"H", "B", "A"});                                  // [H_X, B, A]
//   Var back = merge_dims(transpose(t, {"B", "H", "A"}), {"H", "A"}, "D");  // [B, D_X]
//
// Rules of layout: docs/autodiff.md's op table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardmm/autodiff/tape.h"

namespace shardmm::autodiff {

enum class BinaryOp { add, sub, mul };

// a op b with broadcasting by letter: `out_dims` lists the output's letters, the union of
// both operands' letters, in the order wanted. A letter both operands have must be of one
// size and sharded alike in both; the output shards each letter as the operand that has
// it does, and must obey the one-axis rule (an axis sharding a letter of a cannot shard
// another letter in b). add and sub: the operands' unreduced axes must be the same set
// (partial sums add); mul: both whole. InputError naming the letter or axis otherwise.
// Backward: each operand's gradient is the output's (times the other operand for mul,
// negated for sub's b) summed over the letters that operand lacks, each rank over its own
// block: where a summed letter is sharded over axes G, the operand's gradient comes out
// unreduced over G (partial sums; tape.h's gradient layouts). add and sub take the
// gradient in whatever layout it comes; mul first aligns it to the output's sharding.
Var binary(Var a, Var b, BinaryOp op, const std::vector<std::string>& out_dims);

// x's letters permuted: `dims` is a permutation of them. Each rank permutes its own block;
// shardings and unreduced axes travel with the letters. Backward: the inverse permutation,
// in whatever layout the gradient comes.
Var transpose(Var x, const std::vector<std::string>& dims);

// One letter split into consecutive letters, major first: split_dim(x, "D", {{"H", 8},
// {"A", 64}}) needs 8 * 64 == the size of D, and puts H and A where D was. If D is sharded
// over axes G (p devices), the first part takes G, which is local when its size is a
// multiple of p (each shard then holds whole rows of the first part) or the other parts
// hold one element per row (their sizes multiply to 1, or to 0: no data); otherwise
// InputError saying to gather D first. The other parts come out unsharded. Backward: the
// merge, in the gradient's layout when that is local, else after aligning it to the output's
// sharding.
Var split_dim(Var x, std::string_view dim, const std::vector<std::pair<std::string, std::int64_t>>& parts);

// Consecutive letters of x, in x's order (major first), merged into one where they were:
// merge_dims(x, {"H", "A"}, "D"). Only the first may be sharded (over G, p devices), and
// then its size must be a multiple of p or the others' sizes multiply to 1 (or 0);
// otherwise InputError saying to gather first. Backward: the split, in the gradient's
// layout when that is local, else after aligning it to the output's sharding.
Var merge_dims(Var x, const std::vector<std::string>& dims, std::string_view into);

// Whether split_dim / merge_dims run locally on this layout (a program's lowering asks
// before it calls, and gathers first when not). Requests that no layout could satisfy (a
// letter x lacks, sizes that do not multiply to D's, letters out of order, a name taken)
// throw InputError, as the ops do.
bool can_split_locally(const Mesh& mesh, const Spec& spec, const Shape& shape, std::string_view dim,
                       const std::vector<std::pair<std::string, std::int64_t>>& parts);
bool can_merge_locally(const Mesh& mesh, const Spec& spec, const Shape& shape, const std::vector<std::string>& dims);

}  // namespace shardmm::autodiff
