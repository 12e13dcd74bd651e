// Scatter a global array into shards and gather it back, for random specs (including
// unreduced axes and empty shards), on the threads backend.
#include <gtest/gtest.h>

#include <numeric>

#include "random_cases.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/tensor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {
namespace {

TEST(TensorTest, ScatterThenGatherGivesTheGlobalArrayBack) {
  for (int i = 0; i < 300; ++i) {
    testing::Rng rng(500 + static_cast<std::uint64_t>(i));
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    const Spec spec = testing::random_spec(rng, mesh, "T", {"I", "J", "K"}, true);
    const Shape shape{testing::uniform(rng, 1, 6), testing::uniform(rng, 1, 6), testing::uniform(rng, 1, 4)};
    std::vector<double> global(static_cast<std::size_t>(shape[0] * shape[1] * shape[2]));
    std::iota(global.begin(), global.end(), 1.0);
    std::vector<float> global32(global.begin(), global.end());
    for (DType dtype : {DType::f32, DType::f64}) {
      std::vector<double> back;
      run_threads(mesh, [&](Communicator& comm) {
        const void* data = dtype == DType::f32 ? static_cast<const void*>(global32.data()) : global.data();
        const DistTensor t = DistTensor::from_global(mesh, comm.rank(), spec, shape, dtype, data);
        std::vector<double> g = gather_global(comm, t);
        if (comm.rank() == 0) back = std::move(g);
        else EXPECT_TRUE(g.empty());
      });
      EXPECT_EQ(back, global) << "seed " << 500 + i << " " << mesh.to_string() << " " << format_spec(spec, mesh);
    }
  }
}

TEST(TensorTest, FilledShardsHoldTheirBlockOfTheGenerator) {
  const Mesh mesh = Mesh::parse("X=3,Y=2");
  const Spec spec = parse_spec("T[I_YX, J]", mesh);
  run_threads(mesh, [&](Communicator& comm) {
    const DistTensor t = DistTensor::filled(mesh, comm.rank(), spec, {7, 2}, DType::f64,
                                            [](const Index& i, std::int64_t) { return double(10 * i[0] + i[1]); });
    const double* p = t.buffer().as<double>();
    for (std::int64_t r = 0; r < t.local_shape()[0]; ++r) {
      for (std::int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(p[r * 2 + c], double(10 * (t.box()[0].offset + r) + c));
      }
    }
  });
}

// Replicas that should hold the same block but do not are a wrong result (ReplicasDisagree,
// which verification reports as such); any other failure on device 0 is not caught as one.
TEST(TensorTest, ReplicasThatDisagreeAreAWrongResult) {
  const Mesh mesh = Mesh::parse("X=2");
  const Spec spec = parse_spec("A[I]", mesh);  // replicated over X
  const Shape shape{4};
  const auto values = [](const Index& i, std::int64_t) { return static_cast<double>(i[0]); };
  std::string thrown;
  Verification v;
  run_threads(mesh, [&](Communicator& comm) {
    DistTensor t = DistTensor::filled(mesh, comm.rank(), spec, shape, DType::f64, values);
    if (comm.rank() == 1) t.buffer().as<double>()[2] = 7;  // device 1's replica is off
    try {
      gather_global(comm, t);
    } catch (const ReplicasDisagree& e) {
      thrown = e.what();
    }
    const Verification mine = verify_reshard(comm, spec, shape, DType::f64, t, values);
    if (comm.rank() == 0) v = mine;
  });
  EXPECT_EQ(thrown, "replicas disagree: device 1 and device 0 should hold the same block of A");
  EXPECT_FALSE(v.verified);
  EXPECT_EQ(v.detail, thrown);
}

}  // namespace
}  // namespace shardmm
