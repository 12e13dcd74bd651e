// Every sharded matmul written in the seeds (../shared/seeds/), with the seeds' answer:
// the four cases, Megatron's column/row pair, FSDP's gather, the gather-vs-all_reduce
// trade-off, AllToAll, and the collectives' cost ratios.
//
// Expected figures are closed-form: shard sizes by hand, times from the formulas of
// docs/cost-model.md on the tpu-v5e profile (link 4.5e10 B/s each way, so W = 9e10 B/s on a
// bidirectional ring; HBM 8.1e11 B/s; bf16 peak 1.97e14 FLOP/s; 1 us per hop).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"

namespace shardmm {
namespace {

constexpr double kW = 2 * 4.5e10;  // ring bandwidth per device, bidirectional
constexpr double kHbm = 8.1e11;
constexpr double kPeak = 1.97e14;
constexpr double kBf16 = 2;

PlanOptions v5e() { return PlanOptions{DType::bf16, builtin_profile("tpu-v5e"), std::nullopt}; }

struct Planned {
  Mesh mesh;
  Contraction c;
  MatmulPlanning p;
  const Plan& chosen() const { return p.candidates.at(static_cast<std::size_t>(p.chosen)); }
};

Planned plan(const std::string& mesh, const std::string& text, const std::string& dims,
             const PlanOptions& options = v5e()) {
  Planned r{Mesh::parse(mesh), {}, {}};
  r.c = parse_contraction(text, r.mesh);
  r.p = plan_matmul(r.mesh, r.c, parse_dims(dims), options);
  return r;
}

// "op TENSOR over AXES: FROM -> TO" (einsum: "einsum: A x B -> C").
std::string show(const Step& s, const Mesh& m) {
  if (s.op == OpKind::einsum)
    return "einsum: " + format_spec(s.from, m) + " x " + format_spec(s.from_b, m) + " -> " + format_spec(s.to, m);
  return std::string(to_string(s.op)) + " " + s.tensor + " over " + m.axis_names(s.axes) + ": " +
         format_spec(s.from, m) + " -> " + format_spec(s.to, m);
}

std::vector<std::string> show(const Plan& p, const Mesh& m) {
  std::vector<std::string> out;
  for (const Step& s : p.steps) out.push_back(show(s, m));
  return out;
}

// The candidate with exactly these steps, or nullptr.
const Plan* find(const Planned& r, const std::vector<std::string>& steps) {
  for (const Plan& p : r.p.candidates) {
    if (show(p, r.mesh) == steps) return &p;
  }
  return nullptr;
}

std::string all_candidates(const Planned& r) {
  std::string out;
  for (const Plan& p : r.p.candidates) {
    out += "\n  " + std::to_string(p.total_time_s) + " s:";
    for (const std::string& s : show(p, r.mesh)) out += "\n    " + s;
  }
  return out;
}

int collectives(const Plan& p) {
  return static_cast<int>(
      std::count_if(p.steps.begin(), p.steps.end(), [](const Step& s) { return is_collective(s.op); }));
}

void expect_time(double got, double want) { EXPECT_NEAR(got, want, want * 1e-12) << "want " << want; }

// Case 1: the contracting dimension is not sharded: a local block matmul, no communication.
TEST(Seeds, Case1NoCommunication) {
  const Planned r = plan("X=4,Y=2", "A[I_X, J] @ B[J, K_Y] -> C[I_X, K_Y]", "I=1024,J=512,K=2048");
  ASSERT_EQ(r.p.cases.size(), 2u);
  EXPECT_EQ(r.p.cases[0].case_number, 1);
  EXPECT_EQ(r.p.cases[1].case_number, 1);
  EXPECT_EQ(show(r.chosen(), r.mesh), (std::vector<std::string>{"einsum: A[I_X, J] x B[J, K_Y] -> C[I_X, K_Y]"}))
      << all_candidates(r);
  EXPECT_EQ(r.chosen().comm_time_s, 0);
  // Each device multiplies a 256x512 block by a 512x1024 block.
  EXPECT_EQ(r.chosen().steps[0].flops, 2.0 * 256 * 512 * 1024);
}

// Case 2: one input shards the contracting dimension: all_gather it first, or slice the
// other input to match and all_reduce the partial sums after.
TEST(Seeds, Case2GatherOrSliceAndReduce) {
  const std::string text = "A[I, J_X] @ B[J, K] -> C[I, K]";
  const Planned r = plan("X=4", text, "I=1024,J=1024,K=1024");
  ASSERT_EQ(r.p.cases.size(), 1u);
  EXPECT_EQ(r.p.cases[0].case_number, 2);
  const Plan* gather = find(r, {"all_gather A over X: A[I, J_X] -> A[I, J]", "einsum: A[I, J] x B[J, K] -> C[I, K]"});
  const Plan* reduce = find(r, {"slice B over X: B[J, K] -> B[J_X, K]", "einsum: A[I, J_X] x B[J_X, K] -> C[I, K]{U_X}",
                                "all_reduce C over X: C[I, K]{U_X} -> C[I, K]"});
  ASSERT_TRUE(gather) << all_candidates(r);
  ASSERT_TRUE(reduce) << all_candidates(r);
  // The gather brings in the 3 missing quarters of A: 1024 x 768 bf16.
  EXPECT_EQ(gather->steps[0].bytes_received, 1024 * 768 * 2);
  EXPECT_EQ(gather->steps[0].bytes_sent, 1024 * 768 * 2);
  // Bandwidth-bound: V / W with V the gathered 2 MiB; the all_reduce of the 2 MiB C costs twice that.
  expect_time(gather->steps[0].time_s, 1024.0 * 1024 * 2 / kW);
  expect_time(reduce->steps[2].time_s, 2 * 1024.0 * 1024 * 2 / kW);
  // With J = K the gather moves half as much: it wins. With K << J the output is small and
  // the all_reduce wins (the seeds: "if the output is clearly smaller than the gathered
  // tensor, compute locally then reduce").
  EXPECT_EQ(&r.chosen(), gather);
  const Planned small = plan("X=4", text, "I=1024,J=16384,K=256");
  const Plan* small_reduce =
      find(small, {"slice B over X: B[J, K] -> B[J_X, K]", "einsum: A[I, J_X] x B[J_X, K] -> C[I, K]{U_X}",
                   "all_reduce C over X: C[I, K]{U_X} -> C[I, K]"});
  ASSERT_TRUE(small_reduce) << all_candidates(small);
  EXPECT_EQ(&small.chosen(), small_reduce) << all_candidates(small);
}

// Case 3: both inputs shard the contracting dimension over the same axis: the local matmul
// gives partial sums C{U_X}, kept, all_reduced or reduce_scattered.
TEST(Seeds, Case3PartialSums) {
  const std::string in = "A[I, J_X] @ B[J_X, K]";
  const std::string dims = "I=2048,J=4096,K=1024";
  const std::string einsum = "einsum: A[I, J_X] x B[J_X, K] -> C[I, K]{U_X}";
  {
    const Planned r = plan("X=4", in + " -> C[I, K]{U_X}", dims);
    EXPECT_EQ(r.p.cases[0].case_number, 3);
    EXPECT_EQ(show(r.chosen(), r.mesh), (std::vector<std::string>{einsum})) << all_candidates(r);
    EXPECT_EQ(r.chosen().comm_time_s, 0);
    EXPECT_EQ(r.chosen().steps[0].flops, 2.0 * 2048 * 1024 * 1024);
  }
  const double c_bytes = 2048.0 * 1024 * 2;  // C, 4 MiB
  {
    const Planned r = plan("X=4", in + " -> C[I, K]", dims);
    EXPECT_EQ(show(r.chosen(), r.mesh),
              (std::vector<std::string>{einsum, "all_reduce C over X: C[I, K]{U_X} -> C[I, K]"}))
        << all_candidates(r);
    expect_time(r.chosen().steps[1].time_s, 2 * c_bytes / kW);
    // Ring all_reduce = reduce_scatter + all_gather: each device sends 2 x 3/4 of C.
    EXPECT_EQ(r.chosen().steps[1].bytes_sent, 2 * 2048 * 1024 * 2 * 3 / 4);
  }
  for (const auto& [out, step] : std::vector<std::pair<std::string, std::string>>{
           {"C[I_X, K]", "reduce_scatter C over X: C[I, K]{U_X} -> C[I_X, K]"},
           {"C[I, K_X]", "reduce_scatter C over X: C[I, K]{U_X} -> C[I, K_X]"}}) {
    const Planned r = plan("X=4", in + " -> " + out, dims);
    const Plan* serial = find(r, {einsum, step});
    ASSERT_NE(serial, nullptr) << all_candidates(r);
    // Half the all_reduce: the seeds' "ReduceScatter = V/W, AllReduce = 2V/W".
    expect_time(serial->steps[1].time_s, c_bytes / kW);
    EXPECT_EQ(serial->steps[1].bytes_received, 2048 * 1024 * 2 * 3 / 4);
    // The same bytes moved while the matmul runs (the seeds' collective matmul): partial sums
    // both ways round v5e's torus, two hops of one block each, hide most of it and win.
    ASSERT_EQ(r.chosen().steps.size(), 1u) << all_candidates(r);
    EXPECT_EQ(r.chosen().steps[0].op, OpKind::einsum_reduce_scatter);
    EXPECT_TRUE(r.chosen().steps[0].bidirectional);
    EXPECT_EQ(r.chosen().steps[0].bytes_received, serial->steps[1].bytes_received);
    EXPECT_LT(r.chosen().total_time_s, serial->total_time_s);
  }
}

// Case 4: the inputs shard different non-contracted dimensions over the same axis; C[I_X,
// K_X] would be illegal, so one side is gathered first: both options are candidates.
TEST(Seeds, Case4GatherOneSide) {
  const Planned r = plan("X=4", "A[I_X, J] @ B[J, K_X]", "I=1024,J=1024,K=1024");
  EXPECT_EQ(r.p.cases[0].case_number, 4);
  const Plan* option_a =
      find(r, {"all_gather A over X: A[I_X, J] -> A[I, J]", "einsum: A[I, J] x B[J, K_X] -> C[I, K_X]"});
  const Plan* option_b =
      find(r, {"all_gather B over X: B[J, K_X] -> B[J, K]", "einsum: A[I_X, J] x B[J, K] -> C[I_X, K]"});
  ASSERT_TRUE(option_a) << all_candidates(r);
  ASSERT_TRUE(option_b) << all_candidates(r);
  EXPECT_EQ(format_spec(option_a->output, r.mesh), "C[I, K_X]");
  EXPECT_EQ(format_spec(option_b->output, r.mesh), "C[I_X, K]");
  // The illegal output is refused as written.
  EXPECT_THROW(parse_contraction("A[I_X, J] @ B[J, K_X] -> C[I_X, K_X]", r.mesh), InputError);
}

// Megatron: column parallel (case 1, no communication) then row parallel (case 3, one all_reduce).
TEST(Seeds, MegatronColumnThenRow) {
  const std::string dims = "B=64,D=4096,F=16384";
  const Planned column = plan("X=8", "X[B, D] @ W[D, F_X] -> Y[B, F_X]", dims);
  EXPECT_EQ(column.p.cases[0].case_number, 1);
  EXPECT_EQ(show(column.chosen(), column.mesh), (std::vector<std::string>{"einsum: X[B, D] x W[D, F_X] -> Y[B, F_X]"}))
      << all_candidates(column);
  const Planned row = plan("X=8", "Y[B, F_X] @ W2[F_X, D] -> Z[B, D]", dims);
  EXPECT_EQ(row.p.cases[0].case_number, 3);
  EXPECT_EQ(show(row.chosen(), row.mesh), (std::vector<std::string>{"einsum: Y[B, F_X] x W2[F_X, D] -> Z[B, D]{U_X}",
                                                                    "all_reduce Z over X: Z[B, D]{U_X} -> Z[B, D]"}))
      << all_candidates(row);
  EXPECT_EQ(collectives(row.chosen()), 1);
  // The column's output layout is exactly the row's input: no reshard in between.
  EXPECT_EQ(column.chosen().output, row.c.a);
}

// FSDP (seeds 4.2): W[D, F_X] is gathered, then B[B_X, D] @ W[D, F] -> Y[B_X, F] is case 1.
// Judged from the inputs alone, X shards B's batch rows and W's F: case 4.
TEST(Seeds, FsdpGathersTheWeights) {
  const Planned r = plan("X=8", "B[B_X, D] @ W[D, F_X] -> Y[B_X, F]", "B=65536,D=4096,F=16384");
  EXPECT_EQ(r.p.cases[0].case_number, 4);
  const Plan* fsdp = find(r, {"all_gather W over X: W[D, F_X] -> W[D, F]", "einsum: B[B_X, D] x W[D, F] -> Y[B_X, F]"});
  ASSERT_TRUE(fsdp) << all_candidates(r);
  // With many tokens per weight, gathering W (128 MiB) is the cheapest serialized plan.
  expect_time(fsdp->steps[0].time_s, 4096.0 * 16384 * 2 / kW);
  EXPECT_EQ(fsdp->steps[1].flops, 2.0 * (65536 / 8) * 4096 * 16384);
  // Cheaper still, the same gather as a collective matmul (docs/cost-model.md): each of
  // the 8 ring steps multiplies by one eighth of W (0.70 ms at peak) while the next eighth
  // (16 MiB) crosses one link (0.37 ms), so every hop hides and the plan costs the
  // einsum alone; one way or both ways round ties.
  const Plan& chosen = r.chosen();
  ASSERT_EQ(chosen.steps.size(), 1u) << all_candidates(r);
  const Step& ring = chosen.steps[0];
  EXPECT_EQ(ring.op, OpKind::all_gather_einsum);
  EXPECT_EQ(ring.ring_operand, 1);
  EXPECT_EQ(format_spec(ring.from_b, r.mesh), "W[D, F_X]");
  const double chunk = fsdp->steps[1].time_s / 8, hop = v5e().hw.hop_latency_s + 4096.0 * 2048 * 2 / 4.5e10;
  EXPECT_LT(hop, chunk);
  expect_time(chunk * 8, 2.0 * (65536 / 8) * 4096 * 16384 / kPeak);
  expect_time(ring.time_s, fsdp->steps[1].time_s);
  EXPECT_EQ(ring.bytes_received, fsdp->steps[0].bytes_received);
}

// X[B, D] @ Y[D_X, F] -> Z[B, F] on X=4: gather Y (input communication), or slice X's D,
// multiply locally and all_reduce Z (output communication). Which is cheaper depends on
// B, D, F. The times, from docs/cost-model.md (n = 4, e = 2 bytes):
//   T_gather(B) = D F e / W + max(2 B D F / P, (B D + D F + B F) e / H)
//   T_reduce(B) = 2 (B D / n) e / H                              (the slice: read + write)
//               + max(2 B D F / (n P), (B D / n + D F / n + B F) e / H)
//               + 2 B F e / W                                    (all_reduce of Z)
double t_gather(double B, double D, double F) {
  return D * F * kBf16 / kW + std::max(2 * B * D * F / kPeak, (B * D + D * F + B * F) * kBf16 / kHbm);
}
double t_reduce(double B, double D, double F) {
  const double n = 4;
  return 2 * (B * D / n) * kBf16 / kHbm +
         std::max(2 * B * D * F / (n * kPeak), (B * D / n + D * F / n + B * F) * kBf16 / kHbm) + 2 * B * F * kBf16 / kW;
}

TEST(Seeds, GatherVersusReduceCrossover) {
  const std::string text = "X[B, D] @ Y[D_X, F] -> Z[B, F]";
  const double D = 1024, F = 8192;
  // Near the crossover the gather's einsum is compute-bound and the reduce's memory-bound;
  // equating the two linear forms:
  //   B* = (D F e / W - D F e / (n H)) / (3 D e / (n H) + F e / H + 2 F e / W - 2 D F / P)
  const double n = 4, e = kBf16;
  const double crossover = (D * F * e / kW - D * F * e / (n * kHbm)) /
                           (3 * D * e / (n * kHbm) + F * e / kHbm + 2 * F * e / kW - 2 * D * F / kPeak);
  ASSERT_GT(crossover, 602);
  ASSERT_LT(crossover, 603);
  for (double B : {std::floor(crossover), std::ceil(crossover)}) {
    ASSERT_GT(2 * B * D * F / kPeak, (B * D + D * F + B * F) * e / kHbm);                // compute-bound
    ASSERT_LT(2 * B * D * F / (n * kPeak), (B * D / n + D * F / n + B * F) * e / kHbm);  // memory-bound
  }
  const auto run = [&](double B, double d, double f) {
    const std::string dims = "B=" + std::to_string(static_cast<long>(B)) +
                             ",D=" + std::to_string(static_cast<long>(d)) +
                             ",F=" + std::to_string(static_cast<long>(f));
    return plan("X=4", text, dims);
  };
  const std::vector<std::string> gather{"all_gather Y over X: Y[D_X, F] -> Y[D, F]",
                                        "einsum: X[B, D] x Y[D, F] -> Z[B, F]"};
  const std::vector<std::string> reduce{"slice X over X: X[B, D] -> X[B, D_X]",
                                        "einsum: X[B, D_X] x Y[D_X, F] -> Z[B, F]{U_X}",
                                        "all_reduce Z over X: Z[B, F]{U_X} -> Z[B, F]"};
  for (const auto& [B, d, f, want_gather] : std::vector<std::tuple<double, double, double, bool>>{
           {std::floor(crossover), D, F, false},  // just below: the all_reduce of the small Z wins
           {std::ceil(crossover), D, F, true},    // just above: gathering Y wins
           {64, D, F, false},
           {4096, D, F, true},
           {4096, 8192, F, false},  // a larger D makes the gathered Y larger: back to the reduce
       }) {
    SCOPED_TRACE("B=" + std::to_string(B) + " D=" + std::to_string(d));
    const Planned r = run(B, d, f);
    ASSERT_EQ(r.p.cases[0].case_number, 2);
    ASSERT_EQ(r.p.candidates.size(), 2u) << all_candidates(r);
    const Plan* g = find(r, gather);
    const Plan* s = find(r, reduce);
    ASSERT_TRUE(g && s) << all_candidates(r);
    EXPECT_NEAR(g->total_time_s, t_gather(B, d, f), 1e-12 * t_gather(B, d, f));
    EXPECT_NEAR(s->total_time_s, t_reduce(B, d, f), 1e-12 * t_reduce(B, d, f));
    EXPECT_EQ(&r.chosen(), want_gather ? g : s) << all_candidates(r);
  }
}

// AllToAll [A, B_X] -> [A_X, B] moves the sharded index from one dimension to the other.
TEST(Seeds, AllToAllMovesTheIndex) {
  const Mesh m = Mesh::parse("X=4");
  const Spec from = parse_spec("T[A, B_X]", m), to = parse_spec("T[A_X, B]", m);
  const Plan p = plan_reshard(m, from, to, {1024, 2048}, v5e());
  ASSERT_EQ(p.steps.size(), 1u);
  const Step& s = p.steps[0];
  EXPECT_EQ(s.op, OpKind::all_to_all);
  EXPECT_EQ(s.axes, AxisList{0});
  EXPECT_EQ(s.dim, 1);
  EXPECT_EQ(s.dst_dim, 0);
  EXPECT_EQ(s.to, to);
  EXPECT_EQ(p.output, to);
  // Each device holds 1024 x 512 and keeps the 256 x 512 block that stays: sends the rest.
  EXPECT_EQ(s.bytes_sent, (1024 * 512 - 256 * 512) * 2);
  EXPECT_EQ(s.bytes_received, (1024 * 512 - 256 * 512) * 2);
  // And back: [A_X, B] -> [A, B_X].
  const Plan back = plan_reshard(m, to, from, {1024, 2048}, v5e());
  ASSERT_EQ(back.steps.size(), 1u);
  EXPECT_EQ(back.steps[0].op, OpKind::all_to_all);
}

// For big arrays (bandwidth-bound) on a bidirectional ring: AllReduce = 2 x AllGather and
// AllToAll = AllGather / 4, comparing collectives over the same global array (the seeds'
// table; docs/cost-model.md for the exact forms).
TEST(Seeds, CollectiveCostRatios) {
  for (const char* mesh : {"X=4", "X=8", "X=16"}) {
    SCOPED_TRACE(mesh);
    const Mesh m = Mesh::parse(mesh);
    const std::vector<std::int64_t> shape{8192, 8192};  // 128 MiB of bf16
    const auto one = [&](const char* from, const char* to, OpKind op) {
      const Plan p = plan_reshard(m, parse_spec(from, m), parse_spec(to, m), shape, v5e());
      EXPECT_EQ(p.steps.size(), 1u);
      EXPECT_EQ(p.steps.at(0).op, op);
      return p.steps.at(0).time_s;
    };
    const double gather = one("T[A_X, B]", "T[A, B]", OpKind::all_gather);
    const double reduce = one("T[A, B]{U_X}", "T[A, B]", OpKind::all_reduce);
    const double scatter = one("T[A, B]{U_X}", "T[A_X, B]", OpKind::reduce_scatter);
    const double to_all = one("T[A, B_X]", "T[A_X, B]", OpKind::all_to_all);
    expect_time(gather, 8192.0 * 8192 * 2 / kW);  // V / W, whatever the axis size
    expect_time(reduce, 2 * gather);
    expect_time(scatter, gather);
    expect_time(to_all, gather / 4);
  }
}

// Batch-sharded activations times a weight sharded on its output features: case 1 on both
// axes, no communication; likewise a true batch dimension shared by both inputs.
TEST(Seeds, BatchDimensions) {
  const Planned r = plan("X=2,Y=4", "X[B_X, T, D] @ W[D, F_Y] -> Y[B_X, T, F_Y]", "B=16,T=128,D=1024,F=4096");
  EXPECT_EQ(r.p.cases[0].case_number, 1);
  EXPECT_EQ(r.p.cases[1].case_number, 1);
  EXPECT_EQ(show(r.chosen(), r.mesh), (std::vector<std::string>{"einsum: X[B_X, T, D] x W[D, F_Y] -> Y[B_X, T, F_Y]"}))
      << all_candidates(r);
  EXPECT_EQ(r.chosen().steps[0].flops, 2.0 * 8 * 128 * 1024 * 1024);
  const Planned batch = plan("X=4", "A[N_X, I, J] @ B[N_X, J, K] -> C[N_X, I, K]", "N=8,I=64,J=64,K=64");
  EXPECT_EQ(batch.p.cases[0].case_number, 1);
  EXPECT_EQ(show(batch.chosen(), batch.mesh),
            (std::vector<std::string>{"einsum: A[N_X, I, J] x B[N_X, J, K] -> C[N_X, I, K]"}))
      << all_candidates(batch);
}

}  // namespace
}  // namespace shardmm
