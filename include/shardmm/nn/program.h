// Programs (program/program.h) on the autodiff tape: recorded with every tensor's spec
// resolved, executed on real ranks or recorded symbolically for predictions, and checked
// against an independent dense f64 step of the same program.
//
//   program::Graph g = program::bind(program::parse_program(text, "mlp.prog"), {});
//   nn::ProgramPrediction p = nn::predict_program(g, {DType::bf16, builtin_profile("h100")});
//   p.specs[g.find("u")];            // u[B, T, F_X]: how the program shards u
//   p.events;                        // every collective and einsum, forward and backward,
//                                    // labelled with the program op that ran it (scope)
//   run_backend("threads", g.mesh, [&](Communicator& comm) {
//     nn::ProgramRun r = nn::run_program(comm, g, {DType::f64});
//     r.verification.verified;       // outputs, loss, every gradient and updated param
//   });
//
// How an unpinned tensor is sharded (docs/programs.md has each op's rule):
//   * a leaf (input, param) without a pinned spec is replicated;
//   * an einsum keeps its operands' shardings where they are compatible (the local
//     einsum: contracted axes become unreduced, {U_X}); where they are not (the Scaling
//     Book's cases 2 and 4) the matmul planner's cheapest plan decides the layout;
//   * elementwise ops, norms and the rest keep their operand's sharding; ops that need whole
//     values (every nonlinear one) first all-reduce an unreduced operand; add and sub keep
//     matching partial sums; broadcasting operands are resharded to agree letter by letter;
//   * a pinned computed tensor is resharded to its pin (an einsum is planned to it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/autodiff/tape.h"
#include "shardmm/nn/reference.h"
#include "shardmm/program/program.h"
#include "shardmm/runtime/verify.h"

namespace shardmm::nn {

enum class Optimizer { sgd, adam };
const char* to_string(Optimizer o);
// Blocks of a param's layout its update reads plus writes (docs/cost-model.md, "Local ops"):
// sgd reads w and its gradient and writes w (3); adam also reads and writes its two moments (7).
int update_blocks(Optimizer o);
Optimizer parse_optimizer(std::string_view text);  // InputError naming the choices

struct ProgramOptions {
  DType dtype = DType::f64;  // executed: f32 or f64; predicted: any
  HardwareProfile hw = builtin_profile("h100");
  bool train = true;  // forward, backward and the update; false: forward only
  Optimizer optimizer = Optimizer::sgd;
  double lr = 0.1;
  std::uint64_t seed = 1;
  // Leaves' values given by the caller (`--input x=x.npy`), by tensor name, row-major in the
  // tensor's letters; check_program_inputs() validates them.
  std::map<std::string, DenseTensor> inputs;
  // Einsums may run as the planner's collective matmul rings (autodiff::planned_einsum says
  // where); false: no ring.
  bool rings = false;
};

// The options of a tape that records `options`' program (device 0's shards when symbolic).
autodiff::TapeOptions tape_options(const ProgramOptions& options, autodiff::PlanCache* plans = nullptr);

// A leaf's values: the caller's (options.inputs), else deterministic from options.seed:
// uniform in [-1, 1), a param's scaled by 1/sqrt(n), n the size of its first letter (the
// fan-in of x @ w).
DistTensor::Generator leaf_values(const program::Graph& g, int tensor, const ProgramOptions& options);
// Each given input names a leaf of `g` and has its shape; InputError naming the field
// "input" and the rule otherwise.
void check_program_inputs(const program::Graph& g, const std::map<std::string, DenseTensor>& inputs);

// What recording did to each tensor and op.
struct ProgramRecord {
  std::vector<autodiff::Var> values;            // by tensor index
  std::vector<Spec> specs;                      // by tensor index: the layout the program holds it in
  std::vector<std::string> origin;              // by tensor index: "pinned", "replicated (not pinned)", ...
  std::vector<std::vector<std::string>> notes;  // by op index: each reshard inserted and why
};
// Records the forward pass (and the loss) on `tape`, each op under tape.set_scope(op index).
// InputError when a pin cannot be honoured.
ProgramRecord record_program(autodiff::Tape& tape, const program::Graph& g, const ProgramOptions& options);

// One point of a step's memory timeline, per device: the bytes held while a program op runs
// forward or backward, while a leaf's gradient is brought into its spec, or at the update
// (autodiff::MemoryPoint has what is live when).
struct ProgramMemoryPoint {
  autodiff::Phase phase = autodiff::Phase::forward;
  int op = -1;  // the program op (index into Graph::ops); -1: a leaf's
                // gradient reduction (`tensor` names the leaf) or the update
  std::string tensor;
  std::int64_t params = 0;
  std::int64_t inputs = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;  // adam's moments, for the whole step
  std::int64_t activations = 0;      // forward values live (kept for backward, or not yet read)
  std::int64_t transient = 0;        // the op's own buffers that come and go inside it
  std::int64_t total() const { return params + inputs + gradients + optimizer_state + activations + transient; }
};

// Per device (the most loaded one: device 0), bytes.
struct ProgramMemory {
  std::int64_t params = 0;
  std::int64_t inputs = 0;
  std::int64_t gradients = 0;        // of every leaf, in the leaf's spec (train)
  std::int64_t optimizer_state = 0;  // adam: two moments per param element (train)
  std::int64_t activations = 0;      // values kept for the backward pass (train)
  // Everything above held at once: the memory if nothing were freed (an upper bound on the
  // peak but for transients).
  std::int64_t total() const { return params + inputs + gradients + optimizer_state + activations; }
  // The step's timeline: each forward op, each backward op (and leaf reduction), then the
  // update (train); forward only in inference.
  std::vector<ProgramMemoryPoint> timeline;
  std::size_t peak_point = 0;  // the first point with the most bytes
  std::int64_t peak() const { return timeline.empty() ? total() : timeline[peak_point].total(); }
};

struct ProgramPrediction {
  ProgramRecord record;
  std::vector<autodiff::TapeEvent> events;
  ProgramMemory memory;
};
ProgramPrediction predict_program(const program::Graph& g, const ProgramOptions& options);

// One step executed on this rank's tape (a tape over a communicator): forward, then (train)
// backward and each param's update into a new tensor. The tape keeps every value and gradient
// (tape.grad) until it goes; what run_program verifies, and what a benchmark times.
struct ExecutedStep {
  ProgramRecord record;
  std::vector<DistTensor> updated;  // by tensor index: a param's value after the update (train)
};
ExecutedStep execute_program_step(autodiff::Tape& tape, const program::Graph& g, const ProgramOptions& options);

struct ProgramRun {
  ProgramRecord record;                      // this rank's tape values are gone; specs and notes stay
  std::vector<autodiff::TapeEvent> events;   // this rank's, measured
  std::vector<std::int64_t> max_bytes_sent;  // per event, the most any rank sent (every rank)
  ProgramMemory memory;                      // this rank's
  Verification verification;                 // the same verdict on every rank
  // Device 0: every named computed tensor and (training) every leaf's gradient (`x.grad`), dense.
  std::vector<std::pair<std::string, DenseTensor>> results;
};
// Runs one step on every rank of comm and verifies it on device 0 against
// dense_program_step: every output, the loss, and (train) every leaf's gradient and every
// param after the update.
ProgramRun run_program(Communicator& comm, const program::Graph& g, const ProgramOptions& options);

// ---- The dense reference: plain f64 loops, independent of the tape.
struct DenseProgramStep {
  std::vector<DenseTensor> values;   // by tensor index
  std::vector<DenseTensor> grads;    // by tensor index; leaves only (train)
  std::vector<DenseTensor> updated;  // by tensor index; params only (train)
};
DenseProgramStep dense_program_step(const program::Graph& g, const ProgramOptions& options);

// The update of one param element (both the sharded step and the dense one use it):
// SGD w - lr g; Adam's first step from zero moments (bias-corrected: w - lr g / (|g| + eps)).
double updated_value(Optimizer o, double w, double g, double lr);

}  // namespace shardmm::nn
