// What the executor (runtime/executor.h) holds on a device to run a plan, worked out from the
// plan alone: the one formula behind a plan's peak_bytes_per_device and the runtime's memory
// check (runner.h, memory_need).
//
//   const std::int64_t peak = plan_peak_bytes(mesh, plan, {c.a, c.b}, sizes, DType::f32, false);
//   // == plan.peak_bytes_per_device for a plan made by plan_matmul in f32 (threads backend)
//
// The executor allocates every buffer of every step when it is built and keeps them between
// runs (a benchmark's repeats reuse them), so a plan's peak is the sum of all of them, not
// the most that is live at one step: the caller's inputs; per step its output block, its
// staging copies (plan/step.h, staging_of), an einsum's GEMM workspace (plan/local_einsum.h),
// a collective matmul's chunk and running-sum buffers and its chunks' einsum workspaces; and,
// on a backend that reduces through a workspace (mpi's reduce_scatter and all_reduce: the
// other members' chunks), the largest such workspace, which the backend keeps across calls.
// Each buffer counts as allocated: whole 64-byte lines, at least one. Each is counted at its
// largest over the devices: device 0's (either split rule puts the longer shards first,
// geometry.h), except an exchange's staging, whose largest sender or receiver may be another
// device. So every device holds at most the peak; device 0 holds exactly the peak in a plan
// without an exchange. Verification's copies are the host's, counted apart (runner.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/geometry.h"
#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/local_einsum.h"
#include "shardmm/plan/step.h"

namespace shardmm {

// The bytes a buffer of `elements` takes as the runtime's Buffer allocates it: whole 64-byte
// lines, at least one (so that an empty shard still has an address). Saturating (core/error.h).
std::int64_t buffer_bytes(std::int64_t elements, DType dtype);

// Elements of a block per unit of dimension `dim`: the product of the other extents.
std::int64_t elements_across(const Shape& shape, int dim);

// The elements of a block of `shape`, saturating (core/error.h): past 2^63 - 1 a limit refuses it.
std::int64_t elements_of(const Shape& shape);

// An einsum step's operand orders and `device`'s extents (for LocalEinsum).
std::pair<EinsumLayout, std::map<std::string, std::int64_t>> local_einsum_shape(const Mesh& mesh, const Step& step,
                                                                                const DimSizes& sizes,
                                                                                std::int64_t device);

// What a collective matmul does on one device: the operand split into per-member chunks
// along the ring's dimension D, where each chunk lands in C (D free: its own rows of C; D
// contracted: added into all of C, times the other operand's rows of D), and the buffers it
// needs.
struct RingGeometry {
  std::vector<std::int64_t> members;  // device ids by group rank
  std::size_t me = 0;
  int operand = 0;                     // the chunked operand: 0 A (step.from), 1 B (step.from_b)
  int operand_dim = 0;                 // D in that operand
  std::string letter;                  // D's name
  int out_dim = 0;                     // D in C; -1 where D is contracted (all_gather_einsum only)
  std::int64_t other_stride = 0;       // D contracted: D's row-major stride in the other operand's block
  Shape operand_local;                 // the chunked operand's whole local block (gathered, for all_gather_einsum)
  Shape out_local;                     // C's whole local block (before the scatter, for einsum_reduce_scatter)
  std::vector<Range> pieces;           // per member: its range of D, relative to the whole block
  std::vector<std::int64_t> chunk_at;  // per member: element offset of its chunk in the chunk buffer
  std::int64_t chunk_elements = 0;     // the chunk buffer (0: the chunks are read in place)
  std::int64_t product_elements = 0;   // all_gather_einsum: a chunk's product when C's rows are not
                                       // contiguous; einsum_reduce_scatter: one running sum (four
                                       // per way round: two computed, two arriving)
  EinsumLayout layout;
  std::map<std::string, std::int64_t> extents;  // of the whole blocks; D varies per chunk

  bool contracted() const { return out_dim < 0; }
  std::map<std::string, std::int64_t> chunk_extents(std::size_t m) const;
  // D contracted: a chunk's einsum reads its rows of D in place in the other operand's
  // whole block.
  OperandBuffers chunk_buffers() const;
  // Where member m's rows of D start in the other operand's block (0 where D is free).
  std::int64_t other_offset(std::size_t m) const { return contracted() ? pieces[m].offset * other_stride : 0; }
};
RingGeometry ring_geometry(const Mesh& mesh, const Step& step, const DimSizes& sizes, std::int64_t device);

// plan_local_einsum's workspace_bytes, remembered by layout, extents and buffers: a planner's
// candidates share most of their local einsums (the same letters, extents and orders).
class EinsumWorkspaces {
 public:
  std::int64_t bytes(const EinsumLayout& layout, const std::map<std::string, std::int64_t>& extents, DType dtype,
                     const OperandBuffers& buffers = {});

 private:
  std::map<std::string, std::int64_t, std::less<>> memo_;
};

// One step's memory: the buffers the executor keeps for it, and the workspace a backend that
// reduces through one needs for it (0 for steps that do not reduce).
struct StepMemory {
  std::int64_t held = 0;
  std::int64_t reduction_workspace = 0;
};
// `sizes` gives each of the step's letters its global size.
StepMemory step_memory(const Mesh& mesh, const Step& step, const DimSizes& sizes, DType dtype);

// inputs + every step's held bytes + (where the backend reduces through a workspace) the
// largest reduction workspace; saturating.
std::int64_t peak_bytes(std::int64_t inputs, const std::vector<StepMemory>& steps, bool reduction_workspace);
// The same, a step at a time: for a planner that weighs a plan it has not built.
class PeakBytes {
 public:
  explicit PeakBytes(std::int64_t inputs) : held_(inputs) {}
  void add(const StepMemory& step);
  std::int64_t peak(bool reduction_workspace) const;

 private:
  std::int64_t held_ = 0, workspace_ = 0;
};

// A plan input's block of global `shape` on device 0 (the largest), as allocated.
std::int64_t input_bytes(const Mesh& mesh, const Spec& input, const std::vector<std::int64_t>& shape, DType dtype);

// The peak of `plan` whose inputs are `inputs` (a matmul's A and B, a reshard's source), as
// the header explains.
std::int64_t plan_peak_bytes(const Mesh& mesh, const Plan& plan, const std::vector<Spec>& inputs, const DimSizes& sizes,
                             DType dtype, bool reduction_workspace);

}  // namespace shardmm
