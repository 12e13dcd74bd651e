// Memory checks of a run (runner.h): what a run needs, worked out from the plan in closed
// form; refusal with the figures before anything is allocated, against a per-device limit
// and against the memory available; allocation failure as an InputError, not a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <limits>

#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/kernels.h"
#include "shardmm/runtime/runner.h"
#include "test_paths.h"

// Under AddressSanitizer or ThreadSanitizer an allocation the sanitizer cannot serve
// (petabytes, below) aborts the program unless it may return null as malloc does.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }

namespace shardmm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

PlanOptions options(DType dtype) {
  PlanOptions o;
  o.dtype = dtype;
  o.hw = builtin_profile("h100");
  return o;
}

// A reshard request; the specs and the plan stay alive with the request.
struct Reshard {
  Mesh mesh;
  Spec from;
  RunRequest req;
  Reshard(const std::string& mesh_text, const std::string& from_text, const std::string& to_text,
          const std::string& dims, DType dtype, const std::string& backend = "threads")
      : mesh(Mesh::parse(mesh_text)), from(parse_spec(from_text, mesh)) {
    const Spec to = parse_spec(to_text, mesh);
    req.backend = backend;
    req.mesh = mesh;
    req.sizes = parse_dims(dims);
    req.dtype = dtype;
    req.plan = plan_reshard(mesh, from, to, global_shape(from, req.sizes), options(dtype));
    req.reshard_from = &from;
    req.warmup = 0;
    req.repeat = 1;
  }
  Reshard(const Reshard&) = delete;
};

// Buffers are whole 64-byte lines; the dense reference is f64 (8 bytes an element).
// Each figure below: device 0's source block, its executor's buffers, the copy of its
// result it sends for verification; then what device 0 gathers and the dense arrays.

TEST(MemoryTest, GatherInPlaceNeedsTheOutputBlockOnly) {
  // [I_X, J] -> [I, J]: gathering along the leading dimension writes each piece in place.
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=9,J=16", DType::f32);
  ASSERT_EQ(r.req.plan.steps.size(), 1u);
  ASSERT_EQ(r.req.plan.steps[0].op, OpKind::all_gather);
  const MemoryNeed need = memory_need(r.req);
  // I=9 over 4: device 0 holds 3 rows. Source 3*16*4 = 192; output 9*16*4 = 576, no staging.
  EXPECT_EQ(need.device_bytes, 192 + 576);
  EXPECT_EQ(need.verify_copy_bytes, 576);
  // Four replicated 576-byte results, and the assembled and expected 9x16 in f64.
  EXPECT_EQ(need.verify_bytes, 4 * 576 + 2 * 8 * 144);
  EXPECT_EQ(need.devices_sharing, 4);
  EXPECT_EQ(need.total_bytes, 4 * (192 + 576 + 576) + 4 * 576 + 2 * 8 * 144);
}

TEST(MemoryTest, GatherAlongAnInnerDimensionNeedsAStagingCopy) {
  Reshard r("X=4", "T[I, J_X]", "T[I, J]", "I=9,J=16", DType::f32);
  ASSERT_EQ(r.req.plan.steps.size(), 1u);
  ASSERT_EQ(r.req.plan.steps[0].op, OpKind::all_gather);
  // Source 9*4*4 = 144 -> 192 (whole lines); output 576 and its receive staging 576.
  EXPECT_EQ(memory_need(r.req).device_bytes, 192 + 576 + 576);
}

TEST(MemoryTest, WithoutVerificationNothingIsGathered) {
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=9,J=16", DType::f32);
  r.req.verify = false;
  const MemoryNeed need = memory_need(r.req);
  EXPECT_EQ(need.device_bytes, 192 + 576);
  EXPECT_EQ(need.verify_bytes, 0);
  EXPECT_EQ(need.total_bytes, 4 * (192 + 576));
}

TEST(MemoryTest, MpiRanksOnANodeShareItsMemoryAndReduceThroughAWorkspace) {
  // {U_X} -> [I_X, J]: one reduce_scatter, in place along I; the mpi backend receives the
  // other members' chunks into a workspace the size of the input block.
  Reshard r("X=4", "T[I, J]{U_X}", "T[I_X, J]", "I=9,J=16", DType::f32, "mpi");
  ASSERT_EQ(r.req.plan.steps.size(), 1u);
  ASSERT_EQ(r.req.plan.steps[0].op, OpKind::reduce_scatter);
  ASSERT_EQ(setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1), 0);
  const MemoryNeed need = memory_need(r.req);
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  // Source 576; output 3 rows = 192; workspace 576; the result copy sent to device 0, 192.
  EXPECT_EQ(need.device_bytes, 576 + 192 + 576);
  EXPECT_EQ(need.verify_copy_bytes, 192);
  // Result blocks of 3, 2, 2, 2 rows: 192 + 128 * 3; the dense arrays 2 * 8 * 144.
  EXPECT_EQ(need.verify_bytes, 192 + 3 * 128 + 2 * 8 * 144);
  EXPECT_EQ(need.devices_sharing, 2);
  EXPECT_EQ(need.total_bytes, 2 * (need.device_bytes + need.verify_copy_bytes) + need.verify_bytes);
}

TEST(MemoryTest, MatmulCountsBothInputsAndTheDenseReference) {
  const Mesh mesh = Mesh::parse("X=2");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
  RunRequest req;
  req.mesh = mesh;
  req.sizes = parse_dims("I=4,J=6,K=8");
  req.dtype = DType::f64;
  req.contraction = &c;
  const MatmulPlanning p = plan_matmul(mesh, c, req.sizes, options(DType::f64));
  bool found = false;
  for (const Plan& plan : p.candidates) {
    if (plan.steps.size() == 2 && plan.steps[0].op == OpKind::einsum && plan.steps[1].op == OpKind::all_reduce) {
      req.plan = plan;
      found = true;
    }
  }
  ASSERT_TRUE(found) << "no candidate 'local einsum, then all_reduce'";
  const MemoryNeed need = memory_need(req);
  // A block 4*3*8 = 96 -> 128, B block 3*8*8 = 192; the einsum's partial C 4*8*8 = 256
  // (A, B and C are GEMM views: no workspace), the all_reduce's output 256; the result copy 256.
  EXPECT_EQ(need.device_bytes, 128 + 192 + 256 + 256);
  EXPECT_EQ(need.verify_copy_bytes, 256);
  // Two result blocks; dense A (24), B (48), expected and assembled C (2 * 32) in f64.
  EXPECT_EQ(need.verify_bytes, 2 * 256 + 8 * (24 + 48 + 2 * 32));
  EXPECT_EQ(need.device_bytes, req.plan.peak_bytes_per_device);
}

TEST(MemoryTest, EinsumWorkspaceIsKnownWithoutAllocatingIt) {
  const std::map<std::string, std::int64_t> extents = {{"B", 3}, {"I", 5}, {"J", 7}, {"K", 2}};
  const std::vector<EinsumLayout> layouts = {
      {{"I", "J"}, {"J", "K"}, {"I", "K"}},                 // plain GEMM: no copy
      {{"J", "I"}, {"K", "J"}, {"K", "I"}},                 // transposed views: no copy
      {{"I", "B", "J"}, {"B", "J", "K"}, {"B", "I", "K"}},  // a batch dimension inside A
      {{"I", "J", "K"}, {"J"}, {"I"}},                      // K summed over A first: a reduced copy
  };
  bool some_copy = false;
  for (const EinsumLayout& layout : layouts) {
    for (DType dtype : {DType::f32, DType::f64}) {
      const LocalEinsum built(layout, extents, dtype);
      EXPECT_EQ(LocalEinsum::workspace_bytes_for(layout, extents, dtype), built.workspace_bytes());
      some_copy = some_copy || built.workspace_bytes() > 0;
    }
  }
  EXPECT_TRUE(some_copy);
}

TEST(MemoryTest, RefusesARunOverTheDeviceLimitWithTheFigures) {
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=9,J=16", DType::f32);
  // Device 0 holds 768 bytes (its 3 x 16 block and the gathered 9 x 16, as the plan's peak
  // counts them); verifying takes 576 + 4608 more, which the devices' limit does not count.
  EXPECT_EQ(r.req.plan.peak_bytes_per_device, 768);
  r.req.mem_limit_bytes = 767;
  try {
    run_plan(r.req);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(),
              "the run needs 768 B per device, the plan's peak (its inputs, and every step's buffers, which the "
              "executor keeps between repeats), over the memory limit of 767 B per device (verifying takes 5.06 KiB "
              "more on device 0, not counted against the limit); use smaller dims or more devices");
  }
  r.req.mem_limit_bytes = 768;
  EXPECT_TRUE(run_plan(r.req).verification.verified);
}

TEST(MemoryTest, RefusesARunOverTheAvailableMemoryWithTheFigures) {
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=9,J=16", DType::f32);
  // 4 devices x (768 + the 576-byte copy) + 4608 = 9984 bytes = 9.75 KiB.
  r.req.available_bytes = 5000;
  try {
    run_plan(r.req);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.headline(),
              "the run needs 1.31 KiB per device x 4 devices in this process + 4.50 KiB to verify on device 0 = "
              "9.75 KiB, but only 4.88 KiB is available; use smaller dims or more processes (backend mpi, across "
              "machines)");
  }
  r.req.available_bytes = 9984;
  EXPECT_TRUE(run_plan(r.req).verification.verified);
}

// 2^26 x 2^26 f32 over X=4: 4 PiB of source per device. Nothing runs, so nothing allocates:
// progress is reported only once the ranks run.
TEST(MemoryTest, AHugeRunIsRefusedBeforeAnythingIsAllocated) {
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=67108864,J=67108864", DType::f32);
  bool started = false;
  r.req.progress = [&](const std::string&) { started = true; };
  try {
    run_plan(r.req);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    // Source 4 PiB, output and the result's copy for verification 16 PiB each.
    EXPECT_THAT(e.headline(), StartsWith("the run needs 36.0 PiB per device x 4 devices in this process + "));
    EXPECT_THAT(e.headline(), HasSubstr(", but only "));
  }
  EXPECT_FALSE(started);
}

// With the check out of the way (the caller vouches for the memory), the first buffer
// cannot be had: an InputError naming the bytes, on the rank that asked, propagated.
TEST(MemoryTest, AllocationFailureIsAnInputErrorNotACrash) {
  Reshard r("X=4", "T[I_X, J]", "T[I, J]", "I=67108864,J=67108864", DType::f32);
  r.req.available_bytes = std::numeric_limits<std::int64_t>::max();
  try {
    run_plan(r.req);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_THAT(e.headline(), StartsWith("cannot allocate 4503599627370496 bytes for one buffer"));
  }
}

#ifdef SHARDMM_CLI_FROM_BINARY
// The command gets the check through run_plan: one line, exit status 2.
TEST(MemoryTest, TheCommandRefusesARunLargerThanTheMachine) {
  const std::string command = shardmm::testing::cli_path() +
                              " run 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=4 --dims I=1048576,J=1048576,K=1048576"
                              " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char chunk[4096];
  while (std::fgets(chunk, sizeof chunk, pipe)) out += chunk;
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_THAT(out, StartsWith("shardmm: error: the run needs "));
  EXPECT_THAT(out, HasSubstr(" per device x 4 devices in this process + "));
  EXPECT_THAT(out, HasSubstr(" is available; use smaller --dims or more processes"));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}
#endif

}  // namespace
}  // namespace shardmm
