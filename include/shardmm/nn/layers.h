// The parallel layers as per-rank programs on an autodiff tape, one training step each,
// executed on real ranks or recorded symbolically for predictions (the SAME program).
//
//   nn::ModelConfig m = nn::make_model_config("mlp", "tp", Mesh::parse("X=2"), parse_dims("B=2,T=4,D=8,F=16"));
//   // Predicted: collectives, bytes, FLOPs and memory, without data.
//   nn::LayerPrediction p = nn::predict_layer(m, DType::bf16, builtin_profile("h100"));
//   // Executed on every rank, then checked against nn::dense_layer_step on device 0.
//   run_backend("threads", m.mesh, [&](Communicator& comm) {
//     nn::LayerStep s = nn::run_layer_step(comm, m, {DType::f64});
//     s.verification.verified;  // the same verdict on every rank
//   });
//
// The programs (axis names from the config; f = the mesh axis of tp or sp):
//   MLP        h = X W_in [.., F_f]; y = act(h) W_out {U_f}; all_reduce over f (tp), or
//              reduce_scatter over T (sp, whose input all_gathers T first).
//   attention  Q, K, V = X Wq|Wk|Wv [.., H_f, A] (K and V renamed T -> S), scores
//              Q K^T / sqrt(A) [B, H_f, T, S], optional causal mask, softmax over S,
//              heads = P V, y = heads Wo {U_f}, reduced as the MLP.
//   block      layer norms (unit scale, zero bias, not trained) and residuals around
//              attention and the MLP; with sp the norms and residuals run on T_f.
//   MoE        router logits X W_router, softmax; routing (moe_assign, per sequence)
//              gives a one-hot dispatch tensor [B, T, E, C]; tokens einsum into expert
//              buffers [B, E, C, D], all_to_all B -> E (ep), the experts' MLPs, all_to_all
//              E -> B, and the combine einsum with the gates.
//   dp / fsdp  the batch B split; fsdp stores each weight split and all_gathers it
//              (Gathered::regathered: again in backward), so its gradient is
//              reduce-scattered; dp's replicated weights get all-reduced gradients.
// The loss is <Y, G> for a fixed G (the backward's seed, shaped and sharded as Y); the
// step ends with SGD: W -= lr * dL/dW on each rank's own shard.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/nn/model.h"
#include "shardmm/nn/reference.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::nn {

// The deterministic value of every tensor of the step by name: "X", "G" (the output
// gradient) uniform in [-1, 1); weights uniform scaled by 1/sqrt(their fan-in).
DistTensor::Generator step_values(const ModelConfig& m, const std::string& tensor, std::uint64_t seed);

struct LayerProgram {
  autodiff::Var input;
  autodiff::Var output;
  autodiff::Var loss;  // invalid for inference configs
  std::vector<std::pair<TensorLayout, autodiff::Var>> parameters;
};
// Records the layer's forward pass (and the loss, when m.train) on `tape`.
LayerProgram record_layer(autodiff::Tape& tape, const ModelConfig& m, std::uint64_t seed);

// The dense single-device step of the same layer and values (reference.h).
DenseStep dense_layer_step(const ModelConfig& m, double lr, std::uint64_t seed);

struct StepOptions {
  DType dtype = DType::f64;  // f32 or f64
  double lr = 0.1;
  std::uint64_t seed = 1;
  HardwareProfile hw = builtin_profile("h100");
};

struct LayerStep {
  std::vector<autodiff::TapeEvent> events;  // this rank's
  // The most any rank sent in each event (same order as events), gathered on every rank.
  std::vector<std::int64_t> max_bytes_sent;
  autodiff::TapeMemory memory;              // this rank's
  Verification verification;                // output, input gradient, gradients, updated weights
};
// Runs one step on every rank of comm (SPMD) and verifies it on device 0 against
// dense_layer_step; every rank returns the same verdict. Forward only when !m.train.
LayerStep run_layer_step(Communicator& comm, const ModelConfig& m, const StepOptions& options);

struct LayerPrediction {
  std::vector<autodiff::TapeEvent> events;
  autodiff::TapeMemory memory;  // device 0, which holds the largest shards
};
LayerPrediction predict_layer(const ModelConfig& m, DType dtype, const HardwareProfile& hw);

// Per phase, collective and mesh axes: how many and their bytes (the most any device sends).
struct CollectiveTally {
  autodiff::Phase phase = autodiff::Phase::forward;
  OpKind op = OpKind::all_reduce;
  AxisList axes;
  int count = 0;
  std::int64_t bytes = 0;
  double time_s = 0;  // predicted
  ReduceOp reduce = ReduceOp::sum;  // all_reduce: sums, or the max of a softmax's or max's rows
};
// One per phase, collective, axes and (all_reduce) reduction, in order of first appearance. `bytes` (same length as events, optional) overrides the
// events' own predicted bytes (a run's measured figures).
std::vector<CollectiveTally> tally_collectives(const std::vector<autodiff::TapeEvent>& events,
                                               const std::vector<std::int64_t>* bytes = nullptr);

}  // namespace shardmm::nn
