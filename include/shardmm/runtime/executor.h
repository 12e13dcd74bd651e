// The executor: runs a plan on one rank (SPMD: every rank runs the same plan).
//
//   run_backend("threads", mesh, [&](Communicator& comm) {
//     DistTensor a = DistTensor::filled(mesh, comm.rank(), c.a, a_shape, DType::f32, gen);
//     DistTensor b = DistTensor::filled(mesh, comm.rank(), c.b, b_shape, DType::f32, gen);
//     Executor exec(comm, plan, sizes, DType::f32);   // allocates every buffer once
//     const DistTensor& out = exec.run(a, &b);        // run as often as you like
//     exec.trace();                                   // what each step did, and when
//   });
//
// Each step is carried out exactly as plan/step.h describes its layout transition, on
// this device's block; collectives move real data between the ranks' buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardmm/core/spec.h"
#include "shardmm/plan/step.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"

namespace shardmm {

// One executed step on one rank.
struct TraceEvent {
  int step = 0;  // index into the plan's steps
  OpKind op = OpKind::einsum;
  AxisList axes;
  std::string tensor;
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  double flops = 0;
  double start_s = 0;  // seconds since the executor was built
  double end_s = 0;
};

class Executor {
 public:
  // `sizes` gives every dimension's global size; dtype f32 or f64 (else InputError).
  Executor(Communicator& comm, const Plan& plan, const DimSizes& sizes, DType dtype);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the plan. For a matmul plan pass both operands, for a reshard only `a`; their
  // specs must be the plan's starting layouts. The result lives in the executor and
  // is overwritten by the next run.
  const DistTensor& run(const DistTensor& a, const DistTensor* b = nullptr);
  // Moves the latest run's result out, for a caller that keeps it and drops the executor (the
  // autodiff tape) without copying it; the executor must not run again. UsageError when no
  // step made the result (a plan without steps returns its input).
  DistTensor release();

  // The events of the latest run, in order.
  const std::vector<TraceEvent>& trace() const;
  // Seconds since the executor was built: the clock of the trace's start_s and end_s.
  double clock() const;

  // The bytes this executor holds: every step's buffers and einsum workspaces, as allocated
  // (whole 64-byte lines), kept between runs. plan/memory.h works out the same from the plan
  // alone, without building an executor: a plan's peak, and run_plan's memory check.
  std::int64_t bytes_held() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardmm
