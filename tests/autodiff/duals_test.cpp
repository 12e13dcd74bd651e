// Each layout change's backward: the dual collective appears where the gradient is next
// aligned (a local op or the leaf's own spec), and the parallel patterns the seeds name
// (Megatron's f and g, sequence parallel, data parallel, FSDP) come out of the rules.
#include <gtest/gtest.h>

#include "autodiff_programs.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::Instr;
using testing::Kind;
using testing::leaf;
using testing::Program;

// One collective as the tests name it: phase, op, axes, and the dimension it works on.
struct Collective {
  Phase phase;
  OpKind op;
  std::string axes;
  std::string dims;  // "I" or "I->J" (all_to_all); "" for all_reduce
  bool operator==(const Collective&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Collective& c) {
  return os << to_string(c.phase) << " " << to_string(c.op) << "(" << c.axes << (c.dims.empty() ? "" : ", ") << c.dims
            << ")";
}

std::vector<Collective> collectives(const Mesh& mesh, const std::vector<TapeEvent>& events, bool with_slices = false) {
  std::vector<Collective> out;
  for (const TapeEvent& e : events) {
    const Step& s = e.step;
    if (!is_collective(s.op) && !(with_slices && s.op == OpKind::slice)) continue;
    std::string dims;
    if (s.dim >= 0) dims = s.from.dims[static_cast<std::size_t>(s.dim)].name;
    if (s.dst_dim >= 0) dims += "->" + s.from.dims[static_cast<std::size_t>(s.dst_dim)].name;
    out.push_back({e.phase, s.op, mesh.axis_names(s.axes), dims});
  }
  return out;
}

// Runs `p` on threads and checks it (testing::check_program); returns device 0's events.
std::vector<TapeEvent> run_checked(const Program& p) { return testing::check_program(p).events.at(0); }

const Phase F = Phase::forward, B = Phase::backward;

TEST(Duals, AllGatherBackwardIsReduceScatterOfAPartialGradient) {
  const Mesh mesh = Mesh::parse("X=3");
  // x[I_X, J] gathered, then contracted with W[J, K_X]: dY = dZ W^T is unreduced over X.
  Program p{mesh, {leaf(mesh, "x[I_X, J]", {7, 4}, 1), leaf(mesh, "W[J, K_X]", {4, 5}, 2)}, {}, ""};
  p.ops = {Instr{Kind::all_gather, {0}, {}, {}, "I", "", {0}}, Instr{Kind::local_einsum, {2, 1}, {"I", "K"}},
           Instr{Kind::gelu, {3}}, Instr{Kind::sum, {4}}};
  EXPECT_EQ(collectives(mesh, run_checked(p)),
            (std::vector<Collective>{{F, OpKind::all_gather, "X", "I"}, {B, OpKind::reduce_scatter, "X", "I"}}));
}

TEST(Duals, AllGatherBackwardIsASliceOfAReplicatedGradient) {
  const Mesh mesh = Mesh::parse("X=3");
  Program p{mesh, {leaf(mesh, "x[I_X, J]", {7, 4}, 1)}, {}, ""};
  p.ops = {Instr{Kind::all_gather, {0}, {}, {}, "I", "", {0}}, Instr{Kind::softmax, {1}}, Instr{Kind::mean, {2}}};
  EXPECT_EQ(collectives(mesh, run_checked(p), true),
            (std::vector<Collective>{{F, OpKind::all_gather, "X", "I"}, {B, OpKind::slice, "X", "I"}}));
}

TEST(Duals, ReduceScatterBackwardIsAllGather) {
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  // A[I, J_X] @ B[J_X, K] is unreduced over X; reduce-scattered onto I.
  Program p{mesh, {leaf(mesh, "A[I, J_X]", {5, 6}, 1), leaf(mesh, "B[J_X, K_Y]", {6, 3}, 2)}, {}, ""};
  p.ops = {Instr{Kind::local_einsum, {0, 1}, {"I", "K"}}, Instr{Kind::reduce_scatter, {2}, {}, {}, "I", "", {0}},
           Instr{Kind::silu, {3}}, Instr{Kind::sum, {4}}};
  // A's gradient dZ B^T contracts K, split over Y: partial over Y, all-reduced into A's spec.
  EXPECT_EQ(collectives(mesh, run_checked(p)), (std::vector<Collective>{{F, OpKind::reduce_scatter, "X", "I"},
                                                                        {B, OpKind::all_gather, "X", "I"},
                                                                        {B, OpKind::all_reduce, "Y", ""}}));
}

TEST(Duals, AllToAllBackwardIsTheInverseAllToAll) {
  const Mesh mesh = Mesh::parse("X=4");
  Program p{mesh, {leaf(mesh, "x[I_X, J]", {6, 5}, 1)}, {}, ""};
  p.ops = {Instr{Kind::all_to_all, {0}, {}, {}, "I", "J", {0}}, Instr{Kind::gelu, {1}}, Instr{Kind::sum, {2}}};
  EXPECT_EQ(collectives(mesh, run_checked(p)),
            (std::vector<Collective>{{F, OpKind::all_to_all, "X", "I->J"}, {B, OpKind::all_to_all, "X", "J->I"}}));
}

std::int64_t comm_bytes(const std::vector<TapeEvent>& events) {
  std::int64_t n = 0;
  for (const TapeEvent& e : events) n += is_collective(e.step.op) ? e.step.bytes_sent : 0;
  return n;
}

// Megatron's MLP: column-parallel W1, GELU, row-parallel W2, one all_reduce (g) forward;
// in backward g is the identity and f (x replicated into a sharded einsum) all-reduces.
Program megatron_mlp(const Mesh& mesh) {
  Program p{
      mesh,
      {leaf(mesh, "x[B, D]", {4, 6}, 1), leaf(mesh, "W1[D, F_X]", {6, 8}, 2), leaf(mesh, "W2[F_X, E]", {8, 6}, 3)},
      {},
      ""};
  p.ops = {Instr{Kind::local_einsum, {0, 1}, {"B", "F"}}, Instr{Kind::gelu, {3}},
           Instr{Kind::local_einsum, {4, 2}, {"B", "E"}}, Instr{Kind::all_reduce, {5}, {}, {}, "", "", {0}},
           Instr{Kind::mean, {6}}};
  return p;
}

TEST(Duals, MegatronMlpOneAllReduceEachWay) {
  const Mesh mesh = Mesh::parse("X=4");
  const std::vector<TapeEvent> events = run_checked(megatron_mlp(mesh));
  EXPECT_EQ(collectives(mesh, events),
            (std::vector<Collective>{{F, OpKind::all_reduce, "X", ""}, {B, OpKind::all_reduce, "X", ""}}));
  // Both move the same [B, D]-sized array: 2 (n - n/4) elements of 8 bytes per device.
  for (const TapeEvent& e : events) {
    if (e.step.op == OpKind::all_reduce) {
      EXPECT_EQ(e.step.bytes_sent, 2 * (24 - 6) * 8);
    }
  }
}

TEST(Duals, SequenceParallelSwapsEachAllReduceForAllGatherAndReduceScatter) {
  const Mesh mesh = Mesh::parse("X=4");
  Program p{
      mesh,
      {leaf(mesh, "x[B_X, D]", {4, 6}, 1), leaf(mesh, "W1[D, F_X]", {6, 8}, 2), leaf(mesh, "W2[F_X, E]", {8, 6}, 3)},
      {},
      ""};
  p.ops = {Instr{Kind::all_gather, {0}, {}, {}, "B", "", {0}},
           Instr{Kind::local_einsum, {3, 1}, {"B", "F"}},
           Instr{Kind::gelu, {4}},
           Instr{Kind::local_einsum, {5, 2}, {"B", "E"}},
           Instr{Kind::reduce_scatter, {6}, {}, {}, "B", "", {0}},
           Instr{Kind::mean, {7}}};
  const std::vector<TapeEvent> sp = run_checked(p);
  EXPECT_EQ(collectives(mesh, sp), (std::vector<Collective>{{F, OpKind::all_gather, "X", "B"},
                                                            {F, OpKind::reduce_scatter, "X", "B"},
                                                            {B, OpKind::all_gather, "X", "B"},
                                                            {B, OpKind::reduce_scatter, "X", "B"}}));
  // The same bytes as tensor parallel's two all_reduces.
  const testing::Executed tp = testing::execute(megatron_mlp(mesh), mesh, false);
  EXPECT_EQ(comm_bytes(sp), comm_bytes(tp.events[0]));
}

// Data parallel: replicated W, batch split; FSDP: W split and gathered for use.
Program data_parallel(const Mesh& mesh, bool fsdp, Gathered keep) {
  Program p{mesh, {leaf(mesh, "x[B_X, D]", {8, 8}, 1), leaf(mesh, fsdp ? "W[D_X, F]" : "W[D, F]", {8, 4}, 2)}, {}, ""};
  if (fsdp) {
    Instr gather{Kind::all_gather, {1}, {}, {}, "D", "", {0}};
    gather.keep = keep;
    p.ops = {gather, Instr{Kind::local_einsum, {0, 2}, {"B", "F"}}, Instr{Kind::silu, {3}}, Instr{Kind::mean, {4}}};
  } else {
    p.ops = {Instr{Kind::local_einsum, {0, 1}, {"B", "F"}}, Instr{Kind::silu, {2}}, Instr{Kind::mean, {3}}};
  }
  return p;
}

TEST(Duals, DataParallelAllReducesAndFsdpReduceScattersGradients) {
  const Mesh mesh = Mesh::parse("X=4");
  const std::vector<TapeEvent> dp = run_checked(data_parallel(mesh, false, Gathered::kept));
  EXPECT_EQ(collectives(mesh, dp), (std::vector<Collective>{{B, OpKind::all_reduce, "X", ""}}));
  const std::vector<TapeEvent> fsdp = run_checked(data_parallel(mesh, true, Gathered::regathered));
  EXPECT_EQ(collectives(mesh, fsdp), (std::vector<Collective>{{F, OpKind::all_gather, "X", "D"},
                                                              {B, OpKind::all_gather, "X", "D"},
                                                              {B, OpKind::reduce_scatter, "X", "D"}}));
  // FSDP moves 3 V against data parallel's 2 V.
  EXPECT_EQ(2 * comm_bytes(fsdp), 3 * comm_bytes(dp));
  // Keeping the gathered weight saves the second gather and costs its memory.
  const testing::Executed kept = testing::execute(data_parallel(mesh, true, Gathered::kept), mesh, false);
  const testing::Executed regathered = testing::execute(data_parallel(mesh, true, Gathered::regathered), mesh, false);
  EXPECT_EQ(collectives(mesh, kept.events[0]),
            (std::vector<Collective>{{F, OpKind::all_gather, "X", "D"}, {B, OpKind::reduce_scatter, "X", "D"}}));
  EXPECT_EQ(kept.memory[0].activations - regathered.memory[0].activations, 8 * 4 * 8);
  EXPECT_EQ(kept.grads, regathered.grads);
}

TEST(Duals, ALeafTheLossDoesNotReachGetsZeros) {
  const Mesh mesh = Mesh::parse("X=2");
  Program p{mesh, {leaf(mesh, "x[I_X, J]", {3, 2}, 1), leaf(mesh, "unused[K]", {3}, 2)}, {}, ""};
  p.ops = {Instr{Kind::relu, {0}}, Instr{Kind::sum, {2}}};
  const testing::Executed run = testing::execute(p, mesh, false);
  EXPECT_EQ(run.grads[1], (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(run.grads_in_leaf_spec[1]);
}

}  // namespace
}  // namespace shardmm
