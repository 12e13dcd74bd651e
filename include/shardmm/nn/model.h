// A parallel layer as `shardmm model` describes it (which layer, which strategies on which
// mesh axes, its sizes), and the program that is the layer: every tensor pinned by the
// strategies, costed, run and verified through the program path (nn/program.h).
//
//   Mesh mesh = Mesh::parse("dp=2,tp=4");
//   nn::ModelConfig m = nn::make_model_config("block", "dp+tp", mesh,
//                                             parse_dims("B=8,T=128,D=512,F=2048,H=8"));
//   m.axis_of(nn::Strategy::tp);                // 1: the mesh axis named tp
//   std::string text = nn::model_program_text(m);  // "param Wq[D, H, A] : Wq[D, H_tp, A]", ...
//   program::Graph g = nn::model_program(m);     // the same text, bound
//   nn::predict_program(g, {DType::bf16, builtin_profile("h100")});
//
// Strategies (one mesh axis each; combine two with '+'):
//   tp    Megatron tensor parallel: first weight split by output columns, second by rows;
//         attention split by heads. Activations between the two are never gathered; the
//         second einsum's partial sums {U_f} are all-reduced.
//   sp    tp plus sequence parallel: the token dimension T is split on the same axis
//         outside the tensor-parallel region, so all_reduce becomes reduce_scatter +
//         all_gather and layer-norm activations are 1/N per device.
//   dp    data parallel: the batch B is split, weights replicated, gradients all-reduced.
//   fsdp  fully sharded data parallel: B split, each weight stored split along the
//         dimension tp would split (F or H), `regathered`: all-gathered before forward and
//         again before backward; gradients reduce-scattered back to the weight's split.
//   ep    expert parallel (moe only): the batch B and the experts E split on one axis;
//         tokens move to their experts' devices and back with all_to_all.
// Sharded sizes need not divide evenly: uneven and empty shards are legal.
//
// The programs (f = the axis of tp or sp, s = sp's, b = dp's, fsdp's or ep's). Every
// collective is where the strategy puts it, whatever the sizes: a reshard is written as a
// pinned tensor (`transpose(x)` with x's own letters is a copy resharded to its pin), never
// left to the matmul planner, except FSDP's weight gathers (the einsum's plan of a
// `regathered` param).
//   mlp        h = X W_in [B_b, T, F_f]; z = act(h) W_out {U_f}; Y = z reduced to [B_b, T_s, D]
//              (sp: X first gathered to Xg [B, T, D]).
//   attention  q, k, v = X Wq|Wk|Wv [B_b, T, H_f, A] (k and v renamed T -> S), s = q k
//              [B_b, H_f, T, S], p = softmax(causal_mask(scale(s, 1/sqrt(A)))), o = p v,
//              z = o Wo {U_f}, reduced as the MLP.
//   block      n1 = layer_norm(X) (sp: on T/N rows, then gathered), attention, r = X + att
//              (att's partial sums reduced by the add), n2 = layer_norm(r), the MLP,
//              Y = r + m; the norms without scale or bias.
//   moe        logits = X W_router, probs = softmax over E, dispatch = route(probs, top=K)
//              [B_b, T, E, C], xe = dispatch X [B, E, C, D], the experts' MLPs (W_in [E, D, F],
//              W_out [E, F, D]), gates = probs * dispatch, Y = gates ye. ep: xe moved from
//              B to E and the experts' outputs back by all_to_all.
// The loss is sum(Y * G) for an input G shaped and sharded as Y: G is the gradient the
// backward pass starts from. The head width is A = D / H (H must divide D), S = T; the
// capacity C = min(T, ceil(capacity_factor T K / E)) slots per expert and sequence.
// Mesh axes: a strategy takes the axis named after it (tp, dp, ...) when the mesh has one,
// else the axes in declared order; the mesh has exactly one axis per strategy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/nn/reference.h"
#include "shardmm/program/program.h"

namespace shardmm::nn {

enum class LayerKind { mlp, attention, block, moe };
enum class Strategy { tp, sp, fsdp, dp, ep };

const char* to_string(LayerKind k);
const char* to_string(Strategy s);
// Throws InputError naming the text and the accepted names.
LayerKind parse_layer(std::string_view text);
// "tp", "dp+tp", ...: the strategies in the order written.
std::vector<Strategy> parse_strategies(std::string_view text);

// The combinations each layer accepts (as written on the command line), for --help.
std::vector<std::string> accepted_strategies(LayerKind layer);
// The --dims names a layer needs, and the optional ones.
std::vector<std::string> required_dims(LayerKind layer);
std::vector<std::string> optional_dims(LayerKind layer);

struct ModelConfig {
  LayerKind layer = LayerKind::mlp;
  std::vector<Strategy> strategies;
  std::vector<int> axes;  // the mesh axis of each strategy
  Mesh mesh;
  DimSizes dims;                             // B, T, D, F, H, E, K as given
  bool train = true;                         // false: forward only (inference); the program is the same
  bool causal = false;                       // attention sees only earlier positions
  Activation activation = Activation::gelu;  // the MLP's (and each expert's)
  double capacity_factor = 1.25;

  bool has(Strategy s) const;
  // The mesh axis of `s`; throws UsageError when the config does not use it.
  int axis_of(Strategy s) const;
  std::int64_t top_k() const;  // K, 1 unless given
};

// Validates everything `shardmm model` checks before it runs (InputError, one line naming
// the offending text and the rule): the layer and strategy names, that the layer accepts
// the combination, that the mesh has one axis per strategy, the dims the layer needs
// (present, positive, no unknown names), H dividing D, 1 <= K <= E.
ModelConfig make_model_config(std::string_view layer, std::string_view strategies, const Mesh& mesh,
                              const DimSizes& dims);

// Each expert's slots per sequence: min(tokens, ceil(capacity_factor * tokens * top_k / experts)).
std::int64_t moe_capacity(double capacity_factor, std::int64_t tokens, std::int64_t top_k, std::int64_t experts);

// The layer's program (docs/programs.md's language), every tensor pinned by the strategies;
// `shardmm program` of this text costs and runs the same step.
std::string model_program_text(const ModelConfig& m);
// model_program_text bound on m's mesh (its split rule included).
program::Graph model_program(const ModelConfig& m);

}  // namespace shardmm::nn
