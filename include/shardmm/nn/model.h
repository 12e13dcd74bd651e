// A parallel layer as `shardmm model` describes it: which layer, which strategies on which
// mesh axes, its sizes, and every tensor's sharding.
//
//   Mesh mesh = Mesh::parse("dp=2,tp=4");
//   nn::ModelConfig m = nn::make_model_config("block", "dp+tp", mesh,
//                                             parse_dims("B=8,T=128,D=512,F=2048,H=8"));
//   m.axis_of(nn::Strategy::tp);           // 1: the mesh axis named tp
//   for (const nn::TensorLayout& t : nn::parameter_layouts(m))
//     format_spec(t.spec, m.mesh);          // "Wq[D, H_tp, A]", ...
//
// Strategies (one mesh axis each; combine two with '+'):
//   tp    Megatron tensor parallel: first weight split by output columns, second by rows;
//         attention split by heads. Activations between the two are never gathered.
//   sp    tp plus sequence parallel: the token dimension T is split on the same axis
//         outside the tensor-parallel region, so all_reduce becomes reduce_scatter +
//         all_gather and layer-norm activations are 1/N per device.
//   dp    data parallel: the batch B is split, weights replicated, gradients all-reduced.
//   fsdp  fully sharded data parallel: B split, each weight stored split along the
//         dimension tp would split (F or H) and all-gathered before forward and again
//         before backward; gradients reduce-scattered back to the weight's split.
//   ep    expert parallel (moe only): the batch B and the experts E split on one axis;
//         tokens move to their experts' devices and back with all_to_all.
// Sharded sizes need not divide evenly: uneven and empty shards are legal.
//
// The head width of attention is A = D / H (H must divide D). Mesh axes: a strategy takes the axis named after it (tp, dp, ...) when the mesh
// has one, else the axes in declared order; the mesh has exactly one axis per strategy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/nn/reference.h"

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
  DimSizes dims;          // B, T, D, F, H, E, K as given, plus A = D / H
  bool train = true;      // false: forward only (inference)
  MlpConfig mlp;          // the MLP's (and each expert's) activation
  AttentionConfig attention;
  double capacity_factor = 1.25;

  bool has(Strategy s) const;
  // The mesh axis of `s`; throws UsageError when the config does not use it.
  int axis_of(Strategy s) const;
  MoeConfig moe() const;
};

// Validates everything `shardmm model` checks before it runs (InputError, one line naming
// the offending text and the rule): the layer and strategy names, that the layer accepts
// the combination, that the mesh has one axis per strategy, the dims the layer needs
// (present, positive, no unknown names), H dividing D, 1 <= K <= E.
ModelConfig make_model_config(std::string_view layer, std::string_view strategies, const Mesh& mesh,
                              const DimSizes& dims);

// A tensor of the layer with its sharding as stored between steps.
struct TensorLayout {
  std::string name;
  Spec spec;
  Shape shape;
};
// The parameters (as each device stores them between steps) and the input X / output Y.
std::vector<TensorLayout> parameter_layouts(const ModelConfig& m);
TensorLayout input_layout(const ModelConfig& m);
TensorLayout output_layout(const ModelConfig& m);

// Bytes of the parameters stored on the device holding the most of them (device 0: the
// first shards of an uneven split are the larger ones).
std::int64_t parameter_bytes_per_device(const ModelConfig& m, DType dtype);

}  // namespace shardmm::nn
