// The cost model against hand-computed figures: the Scaling Book's worked examples, the
// ratios between collectives, both regimes, multi-axis groups, the switch model, and every
// way a profile file can be wrong (docs/cost-model.md).
#include "shardmm/plan/cost.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "shardmm/core/error.h"
#include "shardmm/plan/step_builder.h"
#include "input_error.h"
#include "plan/steps.h"
#include "random_cases.h"
#include "shardmm/core/geometry.h"
#include "test_paths.h"

namespace shardmm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::input_error;

HardwareProfile ring_profile(double link_bandwidth, bool bidirectional, double hop_latency_s) {
  HardwareProfile p;
  p.name = "test-ring";
  p.peak_flops = {{DType::bf16, 1e14}};
  p.hbm_bandwidth = 1e12;
  p.link_bandwidth = link_bandwidth;
  p.bidirectional = bidirectional;
  p.hop_latency_s = hop_latency_s;
  p.topology = "torus";
  return p;
}

double time_on(const HardwareProfile& hw, const std::string& mesh_text, OpKind op, const AxisList& group,
               std::int64_t bytes) {
  return collective_time(hw, Mesh::parse(mesh_text), op, group, bytes);
}

// ---- built-in profiles: the book's constants ----

TEST(BuiltinProfiles, NamesInOrder) {
  EXPECT_EQ(builtin_profile_names(), (std::vector<std::string>{"tpu-v5e", "tpu-v5p", "tpu-v6e", "h100"}));
}

TEST(BuiltinProfiles, TpuV5eHasTheBooksFigures) {
  const HardwareProfile p = builtin_profile("tpu-v5e");
  EXPECT_EQ(p.name, "tpu-v5e");
  EXPECT_DOUBLE_EQ(p.flops_for(DType::bf16), 1.97e14);
  EXPECT_DOUBLE_EQ(p.flops_for(DType::f32), 1.97e14 / 6);  // six bf16 passes
  EXPECT_DOUBLE_EQ(p.hbm_bandwidth, 8.1e11);
  EXPECT_DOUBLE_EQ(p.link_bandwidth, 4.5e10);
  EXPECT_TRUE(p.bidirectional);
  EXPECT_DOUBLE_EQ(p.hop_latency_s, 1e-6);
  EXPECT_EQ(p.topology, "torus");
  // The book's latency-bound threshold for v5e: 4.5e10 B/s * 1e-6 s = 45 kB per hop.
  EXPECT_DOUBLE_EQ(p.link_bandwidth * p.hop_latency_s, 45e3);
}

TEST(BuiltinProfiles, OtherTpusAndH100) {
  const HardwareProfile v5p = builtin_profile("tpu-v5p");
  EXPECT_DOUBLE_EQ(v5p.flops_for(DType::bf16), 4.59e14);
  EXPECT_DOUBLE_EQ(v5p.hbm_bandwidth, 2.8e12);
  EXPECT_DOUBLE_EQ(v5p.link_bandwidth, 9e10);
  const HardwareProfile v6e = builtin_profile("tpu-v6e");
  EXPECT_DOUBLE_EQ(v6e.flops_for(DType::bf16), 9.2e14);
  EXPECT_DOUBLE_EQ(v6e.hbm_bandwidth, 1.6e12);
  EXPECT_DOUBLE_EQ(v6e.link_bandwidth, 9e10);
  const HardwareProfile h100 = builtin_profile("h100");
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::bf16), 9.9e14);
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::f16), 9.9e14);
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::f32), 6.7e13);
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::f64), 6.7e13);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.link_bandwidth, 4.5e11);
  EXPECT_EQ(h100.topology, "switch");
}

TEST(BuiltinProfiles, UnknownNameListsTheKnownOnes) {
  EXPECT_EQ(input_error([] { builtin_profile("tpu-v9"); }),
            "unknown built-in hardware profile 'tpu-v9'; expected one of tpu-v5e, tpu-v5p, tpu-v6e, h100");
}

TEST(BuiltinProfiles, MissingDtypePeakIsAnInputError) {
  EXPECT_EQ(input_error([] { builtin_profile("tpu-v5e").flops_for(DType::f64); }),
            "profile 'tpu-v5e' has no peak FLOP/s for f64 (it has bf16, f32); use another dtype, or a "
            "profile file that gives peak_flops.f64 (docs/cost-model.md)");
  EXPECT_EQ(input_error([] { builtin_profile("tpu-v6e").flops_for(DType::f16); }),
            "profile 'tpu-v6e' has no peak FLOP/s for f16 (it has bf16, f32); use another dtype, or a "
            "profile file that gives peak_flops.f16 (docs/cost-model.md)");
}

// ---- torus, one axis ----

TEST(TorusCollectives, AllGatherBandwidthBoundIsBytesOverBidirectionalBandwidth) {
  // 64 MiB gathered over an 8-ring of v5e: 4 hops of 8 MiB each way at 4.5e10 B/s,
  // = 67108864 / (2 * 4.5e10) = 7.4565e-4 s; the latency term is 4 * 1e-6.
  const double t = time_on(builtin_profile("tpu-v5e"), "X=8", OpKind::all_gather, {0}, 67108864);
  EXPECT_DOUBLE_EQ(t, 67108864.0 / 9e10);
}

TEST(TorusCollectives, BooksPopQuizAllGatherOverY) {
  // Scaling Book ch.3 Pop Quiz 2: AllGather_Y([E_Y, F]) on a v5e {'X': 8, 'Y': 4}.
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  // (1) E=2048, F=8192 bf16: V = 2048*8192*2 = 33554432 bytes; V / 9e10 = 372.8 us
  //     (the book rounds V to 34e6 and gets 377 us).
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8,Y=4", OpKind::all_gather, {1}, 33554432), 33554432.0 / 9e10);
  // (2) E=F=256: V = 131072 bytes; each hop moves V/4 = 32 kB per direction, 0.73 us at
  //     4.5e10 B/s, under the 1 us hop latency: latency-bound at floor(4/2) = 2 hops = 2 us.
  //     (The book counts 3 hops because a 4-chip v5e axis has no wraparound link; the model
  //     assumes a full ring.)
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8,Y=4", OpKind::all_gather, {1}, 131072), 2e-6);
}

TEST(TorusCollectives, BooksLatencyBoundQuestion) {
  // Scaling Book ch.3 Question 3: AllGather_X([B_X]) with B=128 bf16 on a v4p 4x4x4
  // (4.5e10 B/s per direction, full rings): 256 bytes, 2 hops, about 2 us.
  const HardwareProfile v4p = ring_profile(4.5e10, true, 1e-6);
  EXPECT_DOUBLE_EQ(time_on(v4p, "X=4,Y=4,Z=4", OpKind::all_gather, {0}, 256), 2e-6);
}

TEST(TorusCollectives, RatiosBetweenCollectivesAreExactOnEvenBidirectionalRings) {
  const HardwareProfile v5p = builtin_profile("tpu-v5p");
  const std::int64_t shard = 1 << 24;  // 16 MiB per device: bandwidth-bound for every n below
  for (int n : {2, 4, 8, 16}) {
    SCOPED_TRACE(n);
    const std::string mesh = "X=" + std::to_string(n);
    const std::int64_t full = shard * n;  // the gathered array
    const double ag = time_on(v5p, mesh, OpKind::all_gather, {0}, full);
    EXPECT_DOUBLE_EQ(ag, static_cast<double>(full) / 1.8e11);
    EXPECT_DOUBLE_EQ(time_on(v5p, mesh, OpKind::reduce_scatter, {0}, full), ag);
    EXPECT_DOUBLE_EQ(time_on(v5p, mesh, OpKind::all_reduce, {0}, full), 2 * ag);
    // AllToAll of the same array (array_bytes = the per-device shard): a quarter of the AllGather.
    EXPECT_DOUBLE_EQ(time_on(v5p, mesh, OpKind::all_to_all, {0}, shard), ag / 4);
  }
}

TEST(TorusCollectives, BandwidthRegimeBarelyDependsOnRingSize) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  const std::int64_t v = 1LL << 30;
  // Even rings: exactly V / W_bidir, whatever n.
  for (int n : {2, 4, 8, 16, 64}) {
    EXPECT_DOUBLE_EQ(time_on(v5e, "X=" + std::to_string(n), OpKind::all_gather, {0}, v), v / 9e10) << n;
  }
  // Odd rings: floor(n/2) hops of V/n each way = (n-1)/n * V / W_bidir, within 1/n of it.
  for (int n : {3, 5, 7}) {
    EXPECT_DOUBLE_EQ(time_on(v5e, "X=" + std::to_string(n), OpKind::all_gather, {0}, v), (n - 1.0) / n * v / 9e10) << n;
  }
}

TEST(TorusCollectives, LatencyRegimeIsHopLatencyTimesHops) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  // 64 bytes over a 16-ring: 8 hops each way (bidirectional), the data is negligible.
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=16", OpKind::all_gather, {0}, 64), 8 * 1e-6);
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=16", OpKind::reduce_scatter, {0}, 64), 8 * 1e-6);
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=16", OpKind::all_reduce, {0}, 64), 16 * 1e-6);
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=16", OpKind::all_to_all, {0}, 64), 8 * 1e-6);
  // A unidirectional ring needs n - 1 hops.
  const HardwareProfile one_way = ring_profile(4.5e10, false, 1e-6);
  EXPECT_DOUBLE_EQ(time_on(one_way, "X=16", OpKind::all_gather, {0}, 64), 15 * 1e-6);
  EXPECT_DOUBLE_EQ(time_on(one_way, "X=16", OpKind::all_reduce, {0}, 64), 30 * 1e-6);
}

TEST(TorusCollectives, RegimeBoundaryIsWherePerHopChunkTimeEqualsHopLatency) {
  // v5e 8-ring: per-hop chunk V/8 per direction; the regimes meet at V/8 = 45 kB.
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  const std::int64_t boundary = 8 * 45000;
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8", OpKind::all_gather, {0}, boundary), 4e-6);
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8", OpKind::all_gather, {0}, boundary / 2), 4e-6);  // latency
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8", OpKind::all_gather, {0}, boundary * 2), 8e-6);  // bandwidth
}

TEST(TorusCollectives, BoundNamesTheLargerTermOnEitherSideOfTheBoundary) {
  // The same v5e 8-ring: below 45 kB per hop the hops' latency sets the time, above it the links.
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  const Mesh mesh = Mesh::parse("X=8");
  const std::int64_t boundary = 8 * 45000;
  const CollectiveCost small = collective_cost(v5e, mesh, OpKind::all_gather, {0}, boundary / 2);
  EXPECT_DOUBLE_EQ(small.latency_s, 4e-6);
  EXPECT_DOUBLE_EQ(small.bandwidth_s, 2e-6);
  EXPECT_DOUBLE_EQ(small.time_s, 4e-6);
  EXPECT_EQ(small.bound(), Bound::latency);
  const CollectiveCost large = collective_cost(v5e, mesh, OpKind::all_gather, {0}, boundary * 2);
  EXPECT_DOUBLE_EQ(large.bandwidth_s, 8e-6);
  EXPECT_EQ(large.bound(), Bound::bandwidth);
  EXPECT_DOUBLE_EQ(large.time_s, time_on(v5e, "X=8", OpKind::all_gather, {0}, boundary * 2));
  EXPECT_EQ(collective_cost(v5e, mesh, OpKind::all_gather, {0}, 0).bound(), Bound::none);
  // A ring's hop: the same rule, one link one way (45 kB at 1 us over 45 GB/s).
  EXPECT_EQ(ring_hop_bound(v5e, mesh, {0}, 40000), Bound::latency);
  EXPECT_EQ(ring_hop_bound(v5e, mesh, {0}, 50000), Bound::bandwidth);
}

TEST(LocalWork, EinsumBoundIsTheRooflinesLargerTerm) {
  const HardwareProfile hw = ring_profile(1e10, true, 0);                  // 1e14 FLOP/s, 1e12 B/s: 100 FLOP/byte
  const auto bound = [&](double flops, std::int64_t bytes) {
    return einsum_bound(hw, einsum_time(hw, DType::bf16, flops, bytes), bytes);
  };
  EXPECT_EQ(bound(1e9, 1000000), Bound::compute);  // 1000 FLOP/byte
  EXPECT_EQ(bound(1e7, 1000000), Bound::memory);   // 10 FLOP/byte
  EXPECT_EQ(bound(0, 0), Bound::none);
}

TEST(TorusCollectives, UnidirectionalRing) {
  // Scaling Book ch.3 Question 10: on a one-way ring an AllGather moves (n-1)/n * V over
  // each link and an AllToAll half of that.
  const HardwareProfile one_way = ring_profile(1e10, false, 0);
  const std::int64_t shard = 1 << 20;
  const std::int64_t full = 4 * shard;
  const double ag = time_on(one_way, "X=4", OpKind::all_gather, {0}, full);
  EXPECT_DOUBLE_EQ(ag, 3.0 / 4 * full / 1e10);
  EXPECT_DOUBLE_EQ(time_on(one_way, "X=4", OpKind::all_reduce, {0}, full), 2 * ag);
  EXPECT_DOUBLE_EQ(time_on(one_way, "X=4", OpKind::all_to_all, {0}, shard), ag / 2);
}

TEST(TorusCollectives, AllToAllOnOddBidirectionalRingCountsChunkHops) {
  // n = 5: chunks (shard/5) travel 1, 1, 2, 2 hops = 6 chunk-hops over both directions:
  // 6 * S/5 / (2 * 1e10).
  const HardwareProfile ring = ring_profile(1e10, true, 0);
  const std::int64_t shard = 5 << 20;
  EXPECT_DOUBLE_EQ(time_on(ring, "X=5", OpKind::all_to_all, {0}, shard), 6.0 * shard / 5 / 2e10);
}

TEST(TorusCollectives, GroupOfOneDeviceCostsNothing) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
    EXPECT_EQ(time_on(v5e, "X=1,Y=4", op, {0}, 1 << 20), 0.0) << to_string(op);
    EXPECT_EQ(time_on(v5e, "X=1,Y=4", op, {}, 1 << 20), 0.0) << to_string(op);
    EXPECT_EQ(time_on(builtin_profile("h100"), "X=1", op, {0}, 1 << 20), 0.0) << to_string(op);
  }
  // A size-1 axis in a larger group adds no links and no hops.
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=1,Y=4", OpKind::all_gather, {0, 1}, 1 << 20),
                   time_on(v5e, "X=1,Y=4", OpKind::all_gather, {1}, 1 << 20));
}

// ---- torus, several axes ----

TEST(TorusMultiAxis, BooksAllGatherOverTwoAxes) {
  // Scaling Book ch.3 Question 2: AllGather_XY([B_X, D_Y]) on a v4p 4x4x4, B=1024, D=4096 bf16:
  // V = 2*1024*4096 = 8388608 bytes over 2 axes: V / (2 * 9e10) = 46.6 us, well above the
  // latency term (2 + 2 hops) * 1 us = 4 us.
  const HardwareProfile v4p = ring_profile(4.5e10, true, 1e-6);
  EXPECT_DOUBLE_EQ(time_on(v4p, "X=4,Y=4,Z=4", OpKind::all_gather, {0, 1}, 8388608), 8388608.0 / (2 * 9e10));
  // The same over one axis takes twice as long: the second axis doubles the links in use.
  EXPECT_DOUBLE_EQ(time_on(v4p, "X=4,Y=4,Z=4", OpKind::all_gather, {0}, 8388608), 8388608.0 / 9e10);
  // Latency-bound: the longest path is the sum of the axes' hops, 2 + 2.
  EXPECT_DOUBLE_EQ(time_on(v4p, "X=4,Y=4,Z=4", OpKind::all_gather, {0, 1}, 64), 4e-6);
  EXPECT_DOUBLE_EQ(time_on(v4p, "X=4,Y=4,Z=4", OpKind::all_reduce, {0, 1, 2}, 64), 2 * 6e-6);
}

TEST(TorusMultiAxis, ThreeAxesAndAllReduce) {
  // V / (3 * W_bidir), AllReduce twice that.
  const HardwareProfile v5p = builtin_profile("tpu-v5p");
  const std::int64_t v = 3LL << 28;
  EXPECT_DOUBLE_EQ(time_on(v5p, "X=4,Y=4,Z=4", OpKind::all_gather, {0, 1, 2}, v), v / (3 * 1.8e11));
  EXPECT_DOUBLE_EQ(time_on(v5p, "X=4,Y=4,Z=4", OpKind::all_reduce, {2, 0, 1}, v), 2 * v / (3 * 1.8e11));
}

TEST(TorusMultiAxis, AllToAllIsBoundByTheLongestAxis) {
  // Scaling Book ch.3: (per-device bytes) * max(A, B, ...) / (4 * W_bidir).
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  const std::int64_t shard = 1 << 24;
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8,Y=4", OpKind::all_to_all, {0, 1}, shard), shard * 8.0 / (4 * 9e10));
  EXPECT_DOUBLE_EQ(time_on(v5e, "X=8,Y=4", OpKind::all_to_all, {1}, shard), shard * 4.0 / (4 * 9e10));
}

// ---- switch (NVLink within a node) ----

TEST(SwitchCollectives, BooksH100AllGather) {
  // Scaling Book GPU chapter, Pop Quiz 1: AllGather(bf16[B_X, F]), B=1024, F=16384 on 8xH100:
  // V = 2*1024*16384 = 33554432 bytes; V * 7 / (8 * 450e9) = 65.2 us.
  const HardwareProfile h100 = builtin_profile("h100");
  EXPECT_DOUBLE_EQ(time_on(h100, "X=8", OpKind::all_gather, {0}, 33554432), 33554432.0 * 7 / (8 * 4.5e11));
}

TEST(SwitchCollectives, NcclTestsBusBandwidthEqualsLinkBandwidth) {
  // nccl-tests: busbw = algbw * (n-1)/n (AllGather, ReduceScatter, AllToAll) and
  // algbw * 2(n-1)/n (AllReduce), algbw = S / t; in the bandwidth regime busbw is the link.
  const HardwareProfile h100 = builtin_profile("h100");
  const double s = 1 << 30;
  for (int n : {2, 4, 8}) {
    const std::string mesh = "X=" + std::to_string(n);
    const double factor = (n - 1.0) / n;
    EXPECT_DOUBLE_EQ(s / time_on(h100, mesh, OpKind::all_gather, {0}, 1 << 30) * factor, 4.5e11) << n;
    EXPECT_DOUBLE_EQ(s / time_on(h100, mesh, OpKind::reduce_scatter, {0}, 1 << 30) * factor, 4.5e11) << n;
    EXPECT_DOUBLE_EQ(s / time_on(h100, mesh, OpKind::all_reduce, {0}, 1 << 30) * 2 * factor, 4.5e11) << n;
    EXPECT_DOUBLE_EQ(s / time_on(h100, mesh, OpKind::all_to_all, {0}, 1 << 30) * factor, 4.5e11) << n;
  }
}

TEST(SwitchCollectives, LatencyStepsAndAxesDoNotMatter) {
  const HardwareProfile h100 = builtin_profile("h100");
  // Ring steps: n-1 for AllGather/ReduceScatter, 2(n-1) for AllReduce; AllToAll sends to every
  // peer at once, one step.
  EXPECT_DOUBLE_EQ(time_on(h100, "X=8", OpKind::all_gather, {0}, 64), 7e-6);
  EXPECT_DOUBLE_EQ(time_on(h100, "X=8", OpKind::all_reduce, {0}, 64), 14e-6);
  EXPECT_DOUBLE_EQ(time_on(h100, "X=8", OpKind::all_to_all, {0}, 64), 1e-6);
  // Behind a switch a group over X=2,Y=4 is just 8 devices.
  for (OpKind op : {OpKind::all_gather, OpKind::all_reduce, OpKind::all_to_all}) {
    EXPECT_DOUBLE_EQ(time_on(h100, "X=2,Y=4", op, {0, 1}, 1 << 26), time_on(h100, "X=8", op, {0}, 1 << 26));
  }
}

// ---- across the nodes of a switch profile (docs/cost-model.md, "Collectives across nodes") ----

TEST(NodeCollectives, H100HasTheBooksNode) {
  // 8 GPUs per node, 8 x 400 Gbps NICs per node: 50 GB/s each way per GPU [SBG].
  const HardwareProfile h100 = builtin_profile("h100");
  EXPECT_EQ(h100.node_devices, 8);
  EXPECT_DOUBLE_EQ(h100.scaleout_bandwidth, 5e10);
  EXPECT_DOUBLE_EQ(h100.scaleout_latency_s, 5e-6);
}

TEST(NodeCollectives, AGroupInsideANodeCostsAsBehindOneSwitch) {
  // X=4,Y=8: each node holds one x and every y, so a group over Y is 8 GPUs of one node.
  const HardwareProfile h100 = builtin_profile("h100");
  HardwareProfile one_domain = h100;
  one_domain.node_devices = 0;
  for (OpKind op : {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all}) {
    for (std::int64_t bytes : {std::int64_t{64}, std::int64_t{1} << 30}) {
      EXPECT_EQ(time_on(h100, "X=4,Y=8", op, {1}, bytes), time_on(one_domain, "X=4,Y=8", op, {1}, bytes))
          << to_string(op);
      EXPECT_DOUBLE_EQ(time_on(h100, "X=4,Y=8", op, {1}, bytes), time_on(h100, "Y=8", op, {0}, bytes))
          << to_string(op);
    }
  }
  // A mesh no larger than a node never leaves it.
  EXPECT_EQ(time_on(h100, "X=2,Y=4", OpKind::all_gather, {0, 1}, 1 << 26),
            time_on(one_domain, "X=2,Y=4", OpKind::all_gather, {0, 1}, 1 << 26));
}

TEST(NodeCollectives, BooksAllGatherOverTwoNodesIsBoundByTheNode) {
  // Scaling Book GPU chapter, Quiz 4 Question 5: an AllGather of B bytes over exactly 2 nodes
  // costs B * 7 / (8 * 450e9) = B / 514e9 in the node and B * 1 / (2 * 400e9) = B / 800e9 between
  // the nodes (8 NICs of 50 GB/s): bounded by the node level.
  const HardwareProfile h100 = builtin_profile("h100");
  const double b = 1 << 30;
  const CollectiveCost c = collective_cost(h100, Mesh::parse("X=16"), OpKind::all_gather, {0}, 1 << 30);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, b * 7 / (8 * 4.5e11));
  EXPECT_DOUBLE_EQ(c.time_s, b * 7 / (8 * 4.5e11));
  // The scale-out part alone, seen where it is the larger: the NICs at 1/100 of the book's.
  HardwareProfile slow = h100;
  slow.scaleout_bandwidth = 5e8;
  EXPECT_DOUBLE_EQ(time_on(slow, "X=16", OpKind::all_gather, {0}, 1 << 30), b / (2 * 8 * 5e8));
}

TEST(NodeCollectives, BooksAllGatherBeyondTheNodeIsBytesOverNodeEgress) {
  // Many nodes, all 8 GPUs of each in the group: B (M - 1) / (M * W_node), W_node = 400 GB/s
  // [SBG "Cross-node collectives", Quiz 4 Question 1]; the node's B * 7 / (8 * 450e9) is less.
  const HardwareProfile h100 = builtin_profile("h100");
  const double b = 1 << 30;
  EXPECT_DOUBLE_EQ(time_on(h100, "X=64", OpKind::all_gather, {0}, 1 << 30), b * 7 / (8 * 4e11));
  EXPECT_DOUBLE_EQ(time_on(h100, "X=64", OpKind::reduce_scatter, {0}, 1 << 30), b * 7 / (8 * 4e11));
  // An AllReduce is twice that without in-network reduction.
  EXPECT_DOUBLE_EQ(time_on(h100, "X=64", OpKind::all_reduce, {0}, 1 << 30), 2 * b * 7 / (8 * 4e11));
}

TEST(NodeCollectives, AnOuterAxisGoesThroughOneNicPerNode) {
  // AllGather_X(bf16[D_X, F_Y]) with Y the inner axis of 8 (one node per x), D = 8192, F = 32768:
  // each device gathers V = 2 D F / 8 bytes from the other 3 nodes through its own NIC:
  // V * 3 / (4 * 50e9), which is the whole array's 2 D F * 3 / (4 * 400e9): an inner axis of
  // exactly a node leaves the outer collective's cost as it was [SBG, "Reductions when array is
  // sharded over a separate axis", Pop Quiz 3].
  const HardwareProfile h100 = builtin_profile("h100");
  const double whole = 2.0 * 8192 * 32768;
  const auto v = static_cast<std::int64_t>(whole / 8);
  EXPECT_DOUBLE_EQ(time_on(h100, "X=4,Y=8", OpKind::all_gather, {0}, v), whole * 3 / (4 * 4e11));
  // The same group behind one switch took V * 3 / (4 * 450e9): nine times less.
  HardwareProfile one_domain = h100;
  one_domain.node_devices = 0;
  EXPECT_DOUBLE_EQ(time_on(one_domain, "X=4,Y=8", OpKind::all_gather, {0}, v), v * 3.0 / (4 * 4.5e11));
  // The same axis sizes the other way round: Y=8 is then the outer axis, two y per node.
  EXPECT_DOUBLE_EQ(time_on(h100, "Y=8,X=4", OpKind::all_gather, {0}, v), v * (8.0 - 2) / (8 * 2 * 5e10));
}

TEST(NodeCollectives, BooksAllToAllAcrossNodes) {
  // N-way AllToAll over M = N / 8 nodes: B (M - 1) / (M^2 W_node) for a global array of B = N S
  // bytes [SBG, "Other collectives"]; per device S (M - 1) / (M * 50e9).
  const HardwareProfile h100 = builtin_profile("h100");
  const double s = 1 << 30;
  EXPECT_DOUBLE_EQ(time_on(h100, "X=16", OpKind::all_to_all, {0}, 1 << 30), 16 * s * 1 / (4 * 4e11));
  EXPECT_DOUBLE_EQ(time_on(h100, "X=32", OpKind::all_to_all, {0}, 1 << 30), 32 * s * 3 / (16 * 4e11));
  // More than 4x slower than inside one node: S * 7 / (8 * 450e9) [SBG].
  EXPECT_GT(time_on(h100, "X=16", OpKind::all_to_all, {0}, 1 << 30),
            4 * time_on(h100, "X=8", OpKind::all_to_all, {0}, 1 << 30));
}

TEST(NodeCollectives, LatencyCountsTheStepsBetweenNodesAtTheScaleOutLatency) {
  // NCCL's ring: n - 1 steps, of which m - 1 cross nodes [NC]; 16 GPUs on 2 nodes:
  // 14 * 1 us + 1 * 5 us; an AllReduce twice that; an AllToAll one step, at the network's.
  const HardwareProfile h100 = builtin_profile("h100");
  EXPECT_DOUBLE_EQ(time_on(h100, "X=16", OpKind::all_gather, {0}, 64), 19e-6);
  EXPECT_DOUBLE_EQ(time_on(h100, "X=16", OpKind::all_reduce, {0}, 64), 38e-6);
  EXPECT_DOUBLE_EQ(time_on(h100, "X=16", OpKind::all_to_all, {0}, 64), 5e-6);
  EXPECT_EQ(collective_cost(h100, Mesh::parse("X=16"), OpKind::all_gather, {0}, 64).bound(), Bound::latency);
}

TEST(NodeCollectives, UnevenNodesArePacedByTheNodeWithFewestMembers) {
  // X=12 on 8-GPU nodes: devices 0-7 and 8-11. The second node's 4 NICs bring in the 8 of 12
  // shards it lacks; the first node's ring has 8 members.
  const HardwareProfile h100 = builtin_profile("h100");
  const double v = 1 << 30;
  EXPECT_DOUBLE_EQ(time_on(h100, "X=12", OpKind::all_gather, {0}, 1 << 30),
                   std::max(v * 7 / (8 * 4.5e11), v * 8 / (12 * 4 * 5e10)));
  EXPECT_TRUE(group_spans_nodes(h100, Mesh::parse("X=12"), {0}));
  EXPECT_FALSE(group_spans_nodes(h100, Mesh::parse("X=4,Y=8"), {1}));
  EXPECT_FALSE(group_spans_nodes(builtin_profile("tpu-v5e"), Mesh::parse("X=12"), {0}));
}

TEST(NodeCollectives, ARingAcrossNodesHopsAtTheNicsPace) {
  const HardwareProfile h100 = builtin_profile("h100");
  const Mesh mesh = Mesh::parse("X=2,Y=8");
  EXPECT_DOUBLE_EQ(ring_hop_time(h100, mesh, {1}, 1 << 20), 1e-6 + (1 << 20) / 4.5e11);
  EXPECT_DOUBLE_EQ(ring_hop_time(h100, mesh, {0}, 1 << 20), 5e-6 + (1 << 20) / 5e10);
  // The boundary moves with the link: 5 us * 50 GB/s = 250 kB per hop between nodes, 1 us *
  // 450 GB/s = 450 kB inside one.
  EXPECT_EQ(ring_hop_bound(h100, mesh, {0}, 200000), Bound::latency);
  EXPECT_EQ(ring_hop_bound(h100, mesh, {0}, 300000), Bound::bandwidth);
  EXPECT_EQ(ring_hop_bound(h100, mesh, {1}, 300000), Bound::latency);
}

// ---- misuse of the API (programming errors, not user input) ----

TEST(CollectiveTime, RejectsProgrammingErrors) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  const Mesh mesh = Mesh::parse("X=4");
  EXPECT_THROW(collective_time(v5e, mesh, OpKind::einsum, {0}, 8), UsageError);
  EXPECT_THROW(collective_time(v5e, mesh, OpKind::all_gather, {1}, 8), UsageError);
  EXPECT_THROW(collective_time(v5e, mesh, OpKind::all_gather, {0, 0}, 8), UsageError);
  EXPECT_THROW(collective_time(v5e, mesh, OpKind::all_gather, {0}, -1), UsageError);
  EXPECT_EQ(collective_time(v5e, mesh, OpKind::all_gather, {0}, 0), 0.0);
}

TEST(CollectiveTime, HandBuiltProfileIsValidated) {
  HardwareProfile p = ring_profile(0, true, 1e-6);
  p.name = "mine";
  EXPECT_EQ(input_error([&] { time_on(p, "X=4", OpKind::all_gather, {0}, 8); }),
            "hardware profile 'mine': key 'link_bandwidth' must be a finite rate of at least 1 bytes/s, got 0");
  p.link_bandwidth = 1e9;
  p.topology = "mesh";
  EXPECT_EQ(input_error([&] { time_on(p, "X=4", OpKind::all_gather, {0}, 8); }),
            "hardware profile 'mine': key 'topology' must be 'torus' or 'switch', got 'mesh'");
}

// ---- local work ----

TEST(EinsumTime, RooflineTakesTheSlowerOfComputeAndMemory) {
  const HardwareProfile v5e = builtin_profile("tpu-v5e");
  // 4096^3 bf16 matmul: 2*4096^3 = 1.374e11 FLOPs -> 0.698 ms at 1.97e14; reads and writes
  // 3 * 4096*4096*2 = 100663296 bytes -> 0.124 ms at 8.1e11: compute-bound.
  const double flops = 2.0 * 4096 * 4096 * 4096;
  EXPECT_DOUBLE_EQ(einsum_time(v5e, DType::bf16, flops, 100663296), flops / 1.97e14);
  // The same in f32 at a sixth of the rate.
  EXPECT_DOUBLE_EQ(einsum_time(v5e, DType::f32, flops, 201326592), flops / (1.97e14 / 6));
  // A matrix-vector product: 2*4096*4096 FLOPs, 33562624 bytes -> memory-bound.
  EXPECT_DOUBLE_EQ(einsum_time(v5e, DType::bf16, 2.0 * 4096 * 4096, 33562624), 33562624 / 8.1e11);
  EXPECT_EQ(einsum_time(v5e, DType::bf16, 0, 0), 0.0);
  EXPECT_THAT(input_error([&] { einsum_time(v5e, DType::f64, flops, 8); }),
              StartsWith("profile 'tpu-v5e' has no peak FLOP/s for f64"));
}

// A local op is memory-bound: its bytes read plus written over the profile's bandwidth for
// that traffic (HBM; on a calibrated profile the measured y += x, else its memcpy).
TEST(LocalOpTime, IsBytesOverTheLocalBandwidth) {
  const HardwareProfile h100 = builtin_profile("h100");
  EXPECT_DOUBLE_EQ(local_op_time(h100, 3 << 20), 3.0 * (1 << 20) / 3.35e12);
  EXPECT_EQ(local_op_time(h100, 0), 0.0);
  // A copy of n bytes is a local op of 2n: the two share one bandwidth on analytic profiles.
  EXPECT_DOUBLE_EQ(local_op_time(h100, 2 << 20), local_copy_time(h100, 1 << 20));

  HardwareProfile calibrated = h100;
  calibrated.hbm_bandwidth = 1e11;  // calibrate sets it to the memcpy rate; the add rate wins
  Calibration c;
  c.copy_bandwidth = 1e11;
  c.add_bandwidth = 4e10;
  calibrated.calibration = c;
  EXPECT_EQ(local_op_bandwidth(calibrated), 4e10);
  EXPECT_DOUBLE_EQ(local_op_time(calibrated, 8e10), 2.0);
  calibrated.calibration->add_bandwidth = 0;  // not measured: memcpy's rate
  EXPECT_EQ(local_op_bandwidth(calibrated), 1e11);
  EXPECT_DOUBLE_EQ(local_op_time(calibrated, 8e10), 0.8);

  EXPECT_THROW(local_op_time(h100, -1), UsageError);
}

TEST(LocalOpTime, AStepCarriesItsFunctionBytesAndBound) {
  const HardwareProfile h100 = builtin_profile("h100");
  const Step gelu = local_step("gelu", "h", false, 96 << 20, DType::f32, h100);
  EXPECT_EQ(gelu.op, OpKind::local);
  EXPECT_EQ(op_name(gelu), "gelu");
  EXPECT_EQ(gelu.tensor, "h");
  EXPECT_EQ(gelu.memory_bytes, 96 << 20);
  EXPECT_EQ(gelu.elements, 24 << 20);
  EXPECT_FALSE(gelu.backward);
  EXPECT_EQ(gelu.bytes_sent, 0);
  EXPECT_DOUBLE_EQ(gelu.time_s, local_op_time(h100, 96 << 20));
  EXPECT_EQ(gelu.bound, Bound::memory);
  EXPECT_FALSE(is_collective(gelu.op));
  EXPECT_FALSE(multiplies(gelu.op));
  EXPECT_EQ(local_step("add", "dx", true, 0, DType::f32, h100).bound, Bound::none);
}

// With a measured per-element rate a local op takes the slower of its traffic and its
// arithmetic: gelu's tanh, element by element, outlasts the bytes on a CPU.
TEST(LocalOpTime, AMeasuredRateMakesAStepComputeBound) {
  HardwareProfile hw = builtin_profile("h100");
  Calibration c;
  c.add_bandwidth = 1e10;
  c.local_seconds_per_element[DType::f32] = {{"gelu", 2e-9}, {"gelu backward", 1e-11}};
  c.local_seconds_per_element[DType::f64] = {{"gelu", 3e-9}};
  hw.calibration = c;
  // 2^20 elements of f32 read and written: 8 MiB, 0.8388608 ms of traffic; 2 ms of arithmetic.
  const std::int64_t bytes = std::int64_t{2} * 4 * (1 << 20);
  const Step forward = local_step("gelu", "h", false, bytes, DType::f32, hw);
  EXPECT_EQ(forward.elements, 2 << 20);
  EXPECT_DOUBLE_EQ(forward.time_s, (2 << 20) * 2e-9);
  EXPECT_EQ(forward.bound, Bound::compute);
  const LocalOpCost cost = local_op_cost(hw, DType::f32, "gelu", bytes);
  EXPECT_DOUBLE_EQ(cost.memory_s, bytes / 1e10);
  EXPECT_DOUBLE_EQ(cost.compute_s, (2 << 20) * 2e-9);
  // The backward's own rate is cheaper than its traffic: memory-bound.
  const Step backward = local_step("gelu", "dh", true, bytes, DType::f32, hw);
  EXPECT_DOUBLE_EQ(backward.time_s, bytes / 1e10);
  EXPECT_EQ(backward.bound, Bound::memory);
  // Rates are by dtype: f64's elements are half as many for the bytes.
  EXPECT_DOUBLE_EQ(local_step("gelu", "h", false, bytes, DType::f64, hw).time_s, (1 << 20) * 3e-9);
  // No rate for the function or the dtype: the traffic alone, as before the measurement.
  EXPECT_DOUBLE_EQ(local_step("relu", "h", false, bytes, DType::f32, hw).time_s, bytes / 1e10);
  EXPECT_DOUBLE_EQ(local_step("gelu", "h", false, bytes, DType::bf16, hw).time_s, bytes / 1e10);
  EXPECT_EQ(local_rate_key("softmax", true), "softmax backward");
  EXPECT_EQ(local_rate_key("adam", false), "adam");
}

TEST(LocalCopyTime, ReadsAndWritesTheBytes) {
  EXPECT_DOUBLE_EQ(local_copy_time(builtin_profile("h100"), 1 << 30), 2.0 * (1 << 30) / 3.35e12);
  EXPECT_EQ(local_copy_time(builtin_profile("h100"), 0), 0.0);
}

// ---- profile files ----

// The library's own writer: what parse_profile_json must read back unchanged.
json to_json(const HardwareProfile& p) { return json::parse(profile_to_json(p)); }

void expect_same(const HardwareProfile& a, const HardwareProfile& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.peak_flops, b.peak_flops);
  EXPECT_EQ(a.hbm_bandwidth, b.hbm_bandwidth);
  EXPECT_EQ(a.link_bandwidth, b.link_bandwidth);
  EXPECT_EQ(a.bidirectional, b.bidirectional);
  EXPECT_EQ(a.hop_latency_s, b.hop_latency_s);
  EXPECT_EQ(a.topology, b.topology);
  EXPECT_EQ(a.node_devices, b.node_devices);
  EXPECT_EQ(a.scaleout_bandwidth, b.scaleout_bandwidth);
  EXPECT_EQ(a.scaleout_latency_s, b.scaleout_latency_s);
}

TEST(ProfileJson, BuiltinsRoundTrip) {
  for (const std::string& name : builtin_profile_names()) {
    SCOPED_TRACE(name);
    const HardwareProfile p = builtin_profile(name);
    expect_same(parse_profile_json(to_json(p).dump(2), name + ".json"), p);
  }
}

TEST(ProfileJson, ParsesAValidProfile) {
  const HardwareProfile p = parse_profile_json(R"({
    "name": "lab-box",
    "peak_flops": {"f32": 2e12, "f64": 1e12},
    "hbm_bandwidth": 1e11,
    "link_bandwidth": 25000000000,
    "bidirectional": false,
    "hop_latency_s": 0,
    "topology": "switch"
  })",
                                               "lab.json");
  EXPECT_EQ(p.name, "lab-box");
  EXPECT_EQ(p.description, "");
  EXPECT_EQ(p.peak_flops, (std::map<DType, double>{{DType::f32, 2e12}, {DType::f64, 1e12}}));
  EXPECT_EQ(p.hbm_bandwidth, 1e11);
  EXPECT_EQ(p.link_bandwidth, 2.5e10);  // an integer literal is a number too
  EXPECT_FALSE(p.bidirectional);
  EXPECT_EQ(p.hop_latency_s, 0.0);
  EXPECT_EQ(p.topology, "switch");
}

json valid_profile() { return to_json(builtin_profile("tpu-v5e")); }

// `d` made a switch of 8-device nodes with the h100's scale-out figures.
json& with_nodes(json& d) {
  d["topology"] = "switch";
  d["node_devices"] = 8;
  d["scaleout_bandwidth"] = 5e10;
  d["scaleout_latency_s"] = 5e-6;
  return d;
}

struct BadProfile {
  std::string what;
  std::function<void(json&)> edit;
  std::string message;  // after "p.json: "
};

class BadProfileJson : public ::testing::TestWithParam<BadProfile> {};

TEST_P(BadProfileJson, NamesTheFileTheKeyAndTheRule) {
  json doc = valid_profile();
  GetParam().edit(doc);
  EXPECT_EQ(input_error([&] { parse_profile_json(doc.dump(), "p.json"); }), "p.json: " + GetParam().message);
}

const char* const kMissingTail =
    "; a profile needs name, peak_flops, hbm_bandwidth, link_bandwidth, bidirectional, hop_latency_s and topology";

INSTANTIATE_TEST_SUITE_P(
    Rules, BadProfileJson,
    ::testing::Values(
        BadProfile{"missing_name", [](json& d) { d.erase("name"); }, std::string("missing key 'name'") + kMissingTail},
        BadProfile{"missing_peak_flops", [](json& d) { d.erase("peak_flops"); },
                   std::string("missing key 'peak_flops'") + kMissingTail},
        BadProfile{"missing_hbm", [](json& d) { d.erase("hbm_bandwidth"); },
                   std::string("missing key 'hbm_bandwidth'") + kMissingTail},
        BadProfile{"missing_link", [](json& d) { d.erase("link_bandwidth"); },
                   std::string("missing key 'link_bandwidth'") + kMissingTail},
        BadProfile{"missing_bidirectional", [](json& d) { d.erase("bidirectional"); },
                   std::string("missing key 'bidirectional'") + kMissingTail},
        BadProfile{"missing_latency", [](json& d) { d.erase("hop_latency_s"); },
                   std::string("missing key 'hop_latency_s'") + kMissingTail},
        BadProfile{"missing_topology", [](json& d) { d.erase("topology"); },
                   std::string("missing key 'topology'") + kMissingTail},
        BadProfile{"unknown_key", [](json& d) { d["hbm_bw"] = 1; },
                   "unknown key 'hbm_bw'; expected name, description, peak_flops, hbm_bandwidth, link_bandwidth, "
                   "bidirectional, hop_latency_s, topology, node_devices, scaleout_bandwidth, scaleout_latency_s, "
                   "calibration"},
        BadProfile{"name_not_string", [](json& d) { d["name"] = 5; }, "key 'name' must be a string, got number"},
        BadProfile{"name_empty", [](json& d) { d["name"] = ""; }, "key 'name' must be a non-empty string"},
        BadProfile{"description_not_string", [](json& d) { d["description"] = json::array(); },
                   "key 'description' must be a string, got array"},
        BadProfile{"peaks_not_object", [](json& d) { d["peak_flops"] = 1e14; },
                   "key 'peak_flops' must be an object of FLOP/s by dtype, got number"},
        BadProfile{"peaks_empty", [](json& d) { d["peak_flops"] = json::object(); },
                   "key 'peak_flops' must give at least one dtype (bf16, f16, f32, f64)"},
        BadProfile{"peaks_unknown_dtype", [](json& d) { d["peak_flops"]["fp32"] = 1e13; },
                   "key 'peak_flops' has unknown dtype 'fp32'; expected one of bf16, f16, f32, f64"},
        BadProfile{"peak_not_number", [](json& d) { d["peak_flops"]["bf16"] = "fast"; },
                   "key 'peak_flops.bf16' must be a number, got string"},
        BadProfile{"peak_zero", [](json& d) { d["peak_flops"]["bf16"] = 0; },
                   "key 'peak_flops.bf16' must be a finite rate of at least 1 FLOP/s, got 0"},
        BadProfile{"hbm_not_number", [](json& d) { d["hbm_bandwidth"] = "8.1e11"; },
                   "key 'hbm_bandwidth' must be a number, got string"},
        BadProfile{"hbm_negative", [](json& d) { d["hbm_bandwidth"] = -8.1e11; },
                   "key 'hbm_bandwidth' must be a finite rate of at least 1 bytes/s, got -8.1e+11"},
        BadProfile{"link_zero", [](json& d) { d["link_bandwidth"] = 0; },
                   "key 'link_bandwidth' must be a finite rate of at least 1 bytes/s, got 0"},
        BadProfile{"link_null", [](json& d) { d["link_bandwidth"] = nullptr; },
                   "key 'link_bandwidth' must be a number, got null"},
        BadProfile{"bidirectional_not_bool", [](json& d) { d["bidirectional"] = "yes"; },
                   "key 'bidirectional' must be true or false, got string"},
        BadProfile{"link_subnormal", [](json& d) { d["link_bandwidth"] = 5e-324; },
                   "key 'link_bandwidth' must be a finite rate of at least 1 bytes/s, got 4.94066e-324"},
        BadProfile{
            "latency_huge", [](json& d) { d["hop_latency_s"] = 1e300; },
            "key 'hop_latency_s' must be a number of seconds from 0 to 1 (a hop takes microseconds), got 1e+300"},
        BadProfile{"name_two_lines", [](json& d) { d["name"] = "a\nb"; },
                   "key 'name' must be one line of printable text (it heads reports), without control characters "
                   "such as a newline"},
        BadProfile{
            "latency_negative", [](json& d) { d["hop_latency_s"] = -1e-6; },
            "key 'hop_latency_s' must be a number of seconds from 0 to 1 (a hop takes microseconds), got -1e-06"},
        BadProfile{"topology_not_string", [](json& d) { d["topology"] = 3; },
                   "key 'topology' must be a string, got number"},
        BadProfile{"topology_unknown", [](json& d) { d["topology"] = "ring"; },
                   "key 'topology' must be 'torus' or 'switch', got 'ring'"},
        BadProfile{"nodes_negative", [](json& d) { with_nodes(d)["node_devices"] = -8; },
                   "key 'node_devices' must be a whole number >= 0 (the devices one switch joins; 0: one node), got "
                   "-8"},
        BadProfile{"nodes_fraction", [](json& d) { with_nodes(d)["node_devices"] = 7.5; },
                   "key 'node_devices' must be a whole number, got number"},
        BadProfile{"nodes_on_a_torus", [](json& d) { with_nodes(d)["topology"] = "torus"; },
                   "key 'node_devices' needs topology 'switch' (a torus has no nodes: its axes are its links), got "
                   "'torus'"},
        BadProfile{"nodes_without_scaleout_bandwidth", [](json& d) { with_nodes(d).erase("scaleout_bandwidth"); },
                   "missing key 'scaleout_bandwidth'; a profile with node_devices needs scaleout_bandwidth and "
                   "scaleout_latency_s"},
        BadProfile{"nodes_without_scaleout_latency", [](json& d) { with_nodes(d).erase("scaleout_latency_s"); },
                   "missing key 'scaleout_latency_s'; a profile with node_devices needs scaleout_bandwidth and "
                   "scaleout_latency_s"},
        BadProfile{"scaleout_without_nodes", [](json& d) { with_nodes(d).erase("node_devices"); },
                   "key 'scaleout_bandwidth' needs node_devices above 0 (the scale-out network joins nodes; without "
                   "them every device is behind one switch)"},
        BadProfile{"scaleout_bandwidth_zero", [](json& d) { with_nodes(d)["scaleout_bandwidth"] = 0; },
                   "key 'scaleout_bandwidth' must be a finite rate of at least 1 bytes/s, got 0"},
        BadProfile{"scaleout_latency_huge", [](json& d) { with_nodes(d)["scaleout_latency_s"] = 2; },
                   "key 'scaleout_latency_s' must be a number of seconds from 0 to 1 (a hop takes microseconds), got "
                   "2"}),
    [](const ::testing::TestParamInfo<BadProfile>& info) { return info.param.what; });

TEST(ProfileJson, NotAnObject) {
  EXPECT_EQ(input_error([] { parse_profile_json("[1, 2]", "p.json"); }),
            "p.json: a hardware profile must be a JSON object, got array");
}

TEST(ProfileJson, MalformedJsonGivesLineAndColumnAndQuotesTheLine) {
  const std::string text = "{\n  \"name\": \"x\",\n  \"peak_flops\": }\n";
  try {
    parse_profile_json(text, "p.json");
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    // Line 3 is `  "peak_flops": }`; the '}' is its 17th character.
    EXPECT_THAT(e.headline(), StartsWith("p.json: malformed JSON at line 3, column 17: "));
    EXPECT_THAT(e.headline(), HasSubstr("unexpected '}'"));
    EXPECT_EQ(e.context(), "    \"peak_flops\": }\n                  ^");
  }
  EXPECT_EQ(input_error([] { parse_profile_json(" \n", "empty.json"); }),
            "empty.json: the profile is empty; a hardware profile is a JSON object (docs/cost-model.md)");
  EXPECT_THAT(input_error([] { parse_profile_json("{\"name\": \"x\",}", "p.json"); }),
              StartsWith("p.json: malformed JSON at line 1, column 14: "));
}

TEST(ProfileJson, NumberTooLargeForADouble) {
  EXPECT_EQ(input_error([] { parse_profile_json(R"({"hbm_bandwidth": 1e999})", "p.json"); }),
            "p.json: malformed JSON: number overflow parsing '1e999'");
}

TEST(ProfileJson, RepeatedKey) {
  EXPECT_EQ(input_error([] { parse_profile_json(R"({"name": "a", "name": "b"})", "p.json"); }),
            "p.json: key 'name' appears twice; each key may appear once");
  EXPECT_EQ(input_error([] { parse_profile_json(R"({"peak_flops": {"bf16": 1, "bf16": 2}})", "p.json"); }),
            "p.json: key 'peak_flops.bf16' appears twice; each key may appear once");
}

// ---- load_profile ----

class LoadProfile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardmm_cost_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& file, const std::string& text) {
    const auto path = dir_ / file;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST_F(LoadProfile, BuiltinName) { expect_same(load_profile("h100"), builtin_profile("h100")); }

TEST_F(LoadProfile, FileErrorsNameTheFile) {
  const std::string good = write("good.json", valid_profile().dump());
  expect_same(load_profile(good), builtin_profile("tpu-v5e"));
  json bad = valid_profile();
  bad["topology"] = "ring";
  const std::string path = write("bad.json", bad.dump());
  EXPECT_EQ(input_error([&] { load_profile(path); }),
            path + ": key 'topology' must be 'torus' or 'switch', got 'ring'");
}

TEST_F(LoadProfile, NeitherBuiltinNorFile) {
  const std::string missing = (dir_ / "nope.json").string();
  EXPECT_EQ(
      input_error([&] { load_profile(missing); }),
      "unknown hardware profile '" + missing + "': not a built-in (tpu-v5e, tpu-v5p, tpu-v6e, h100) and no such file");
  EXPECT_EQ(input_error([] { load_profile("tpu-v5"); }),
            "unknown hardware profile 'tpu-v5': not a built-in (tpu-v5e, tpu-v5p, tpu-v6e, h100) and no such file");
}

TEST_F(LoadProfile, UnreadableFile) {
  EXPECT_EQ(input_error([&] { load_profile(dir_.string()); }),
            dir_.string() + ": cannot read hardware profile: it is a directory");
}

// A path that never ends (/dev/zero) must not be read until memory runs out: profiles are
// read up to 1 MiB.
TEST_F(LoadProfile, ReadsAtMostOneMiB) {
  const std::string text = valid_profile().dump();
  const std::size_t mib = std::size_t{1} << 20;
  expect_same(load_profile(write("padded.json", text + std::string(mib - text.size(), ' '))),
              builtin_profile("tpu-v5e"));
  const std::string big = write("big.json", text + std::string(mib - text.size() + 1, ' '));
  EXPECT_EQ(input_error([&] { load_profile(big); }),
            big +
                ": cannot read hardware profile: larger than 1 MiB; a profile is a small JSON object "
                "(docs/cost-model.md)");
}

TEST(ExampleProfiles, ShippedExamplesLoad) {
  const auto dir = std::filesystem::path(shardmm::testing::repo_dir()) / "profiles";
  const HardwareProfile cpu = load_profile((dir / "example-cpu.json").string());
  EXPECT_EQ(cpu.name, "example-cpu");
  EXPECT_GT(cpu.flops_for(DType::f32), 0);
  EXPECT_GT(cpu.flops_for(DType::f64), 0);
}

// An exchange's traffic against every pair of group members summed: what each device's block
// under `from` shares with each member's block under `to` and the reverse, on random meshes of
// up to four axes (uneven and empty blocks under both split rules, and even ones). exchange_traffic
// instead multiplies per-dimension sums, takes a dimension whose sums are the same on every device
// as a constant, and combines the distinct ones of independent dimensions; with a memo, it takes
// each dimension's sums from the exchanges it costed before on the mesh.
TEST(ExchangeTraffic, EqualsEveryMemberPairSummed) {
  const auto box_overlap = [](const std::vector<Range>& a, const std::vector<Range>& b) {
    std::int64_t n = 1;
    for (std::size_t k = 0; k < a.size(); ++k) n *= overlap_extent(a[k], b[k]);
    return n;
  };
  for (unsigned seed = 1; seed <= testing::scaled_cases(400); ++seed) {
    testing::Rng rng(seed);
    const Mesh mesh(testing::random_mesh(rng, 4, 36).axes(), seed % 2 ? SplitRule::array : SplitRule::chunk);
    const std::vector<std::string> all_letters{"I", "J", "K"};
    const std::vector<std::string> letters(all_letters.begin(), all_letters.begin() + testing::uniform(rng, 1, 3));
    std::vector<std::int64_t> shape;
    // Every third mesh splits its extents evenly (multiples of the device count): dimensions
    // whose layouts nest then have one factor for every device.
    const std::int64_t even = seed % 3 == 0 ? mesh.device_count() : 1;
    for (std::size_t k = 0; k < letters.size(); ++k) shape.push_back(testing::uniform(rng, 1, 9) * even);
    detail::ExchangeDimMemo memo;  // the mesh's, across the exchanges below
    // Three exchanges between random layouts, each costed without the memo and with it.
    for (int exchange = 0; exchange < 3; ++exchange) {
      const Spec from = testing::random_spec(rng, mesh, "A", letters, true);
      Spec to = testing::random_spec(rng, mesh, "A", letters, false);
      to.unreduced = from.unreduced;  // an exchange keeps the pending sums
      for (int a : to.unreduced) {    // and moves no axis they are pending over
        for (DimSpec& d : to.dims) d.axes.erase(std::remove(d.axes.begin(), d.axes.end(), a), d.axes.end());
      }
      const Step step = detail::make_exchange(from, to);
      detail::ExchangeTraffic expected;
      for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
        const std::vector<Range> mine_from = shard_box(mesh, from, shape, d), mine_to = shard_box(mesh, to, shape, d);
        const std::int64_t kept = box_overlap(mine_from, mine_to);
        std::int64_t sent = -kept, received = -kept;
        for (std::int64_t m : mesh.group_members(d, step.axes)) {
          sent += box_overlap(mine_from, shard_box(mesh, to, shape, m));
          received += box_overlap(mine_to, shard_box(mesh, from, shape, m));
        }
        expected.sent = std::max(expected.sent, sent);
        expected.received = std::max(expected.received, received);
        expected.copied = std::max(expected.copied, sent + received + kept);
      }
      SCOPED_TRACE("seed " + std::to_string(seed) + ": " + mesh.to_string() + " split " +
                   std::string(to_string(mesh.split_rule())) + ", " + format_spec(from, mesh) + " -> " +
                   format_spec(to, mesh));
      for (detail::ExchangeDimMemo* with : {static_cast<detail::ExchangeDimMemo*>(nullptr), &memo}) {
        const detail::ExchangeTraffic t = detail::exchange_traffic(mesh, step, shape, with);
        EXPECT_EQ(t.sent, expected.sent) << (with ? "with the memo" : "without a memo");
        EXPECT_EQ(t.received, expected.received) << (with ? "with the memo" : "without a memo");
        EXPECT_EQ(t.copied, expected.copied) << (with ? "with the memo" : "without a memo");
      }
      if (::testing::Test::HasFailure()) return;  // one reproducible failure, not a flood
    }
  }
}

}  // namespace
}  // namespace shardmm
