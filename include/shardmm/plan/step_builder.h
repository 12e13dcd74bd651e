// Single steps, built and costed as the planners build and cost theirs, for callers that run
// one step at a time rather than a whole plan (the autodiff tape).
//
//   Step s = make_step(OpKind::all_gather, parse_spec("A[I_X, J]", mesh), {0}, 0);  // s.to: A[I, J]
//   cost_step(s, mesh, {8192, 4096}, options);  // s.time_s as plan_reshard predicts it
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/planner.h"
#include "shardmm/plan/step.h"

namespace shardmm {

// The step applying `op` over `axes` to `from`, with `to` its layout after (plan/step.h
// gives each op's transition); `dim` / `dst_dim` as in Step. Not costed. For the reshard
// ops (collectives but exchange, slice, to_partial) and einsum, whose operands and output
// the caller then sets; `from` must allow the transition.
Step make_step(OpKind op, const Spec& from, AxisList axes, int dim = -1, int dst_dim = -1);

// Fills a reshard step's bytes, FLOPs and predicted time for a tensor of global `shape`.
void cost_step(Step& step, const Mesh& mesh, const std::vector<std::int64_t>& shape, const PlanOptions& options);
// The same for an einsum step, its operands (`from`, `from_b`) and result (`to`) of these
// global shapes.
void cost_einsum(Step& step, const Mesh& mesh, const std::vector<std::int64_t>& a_shape,
                 const std::vector<std::int64_t>& b_shape, const std::vector<std::int64_t>& c_shape,
                 const PlanOptions& options);
// A local step (OpKind::local) computing `function` into (or for) `tensor`, in the backward
// pass or not, reading plus writing `memory_bytes` per device (the most any device) in
// elements of `dtype`, costed by local_op_cost.
Step local_step(std::string function, std::string tensor, bool backward, std::int64_t memory_bytes, DType dtype,
                const HardwareProfile& hw);

}  // namespace shardmm
