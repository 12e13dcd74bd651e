// Autodiff on the mpi backend (a 4-process job): seed 003's example, softmax and max over a
// sharded letter, and random sharded programs, whose gradients equal the threads backend's
// bit for bit and, gathered on device 0, the finite differences of the dense interpreter.
#include <gtest/gtest.h>

#include "autodiff_programs.h"
#include "mpi/mpi_test.h"

namespace shardmm {
namespace {

using namespace autodiff;

// What this process's device holds after a program's backward on `backend`.
struct RankResult {
  std::vector<std::vector<unsigned char>> grads;      // this device's shard of each leaf gradient
  std::vector<std::vector<double>> gathered;          // device 0: the logical gradients
  std::vector<std::pair<OpKind, std::int64_t>> comm;  // collectives and the bytes this device sent
};

std::vector<unsigned char> bytes_of(const DistTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + t.buffer().bytes()};
}

RankResult run_program(const std::string& backend, const testing::Program& p, DType dtype) {
  RankResult out;
  run_backend(backend, p.mesh, [&](Communicator& comm) {
    Tape tape(comm, {dtype});
    const std::vector<Var> v = testing::replay(tape, p);
    tape.backward(v.back());
    const bool mine = comm.rank() == world_rank;
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      std::vector<double> global = gather_global(comm, tape.grad(v[l]));
      if (mine) {
        out.grads.push_back(bytes_of(tape.grad(v[l])));
        out.gathered.push_back(std::move(global));
      }
    }
    if (mine) {
      for (const TapeEvent& e : tape.events()) {
        if (is_collective(e.step.op)) out.comm.push_back({e.step.op, e.measured.bytes_sent});
      }
    }
  });
  return out;
}

TEST(MpiAutodiffTest, SeedTensorParallelFfn) {
  // Seed 003 on two tensor-parallel ranks, replicated over a second axis of two.
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  std::vector<double> y, dx;
  run_backend("mpi", mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    Var x = tape.input("x[N, D]", {{"N", 1}, {"D", 2}}, testing::from_dense({2, -1}, {1, 2}), true);
    Var a = tape.input("A[D, F_X]", {{"D", 2}, {"F", 4}}, testing::from_dense({1, 0, -1, 2, 1, 1, 0, 0}, {2, 4}), true);
    Var b = tape.input("B[F_X, E]", {{"F", 4}, {"E", 2}}, testing::from_dense({1, 2, 0, 1, 1, 0, 2, 1}, {4, 2}), true);
    Var out = all_reduce(einsum(relu(einsum(x, a, {"N", "F"})), b, {"N", "E"}), tape.axes("X"));
    y = gather_global(comm, out.value());
    tape.backward(sum(out));
    dx = gather_global(comm, tape.grad(x));
  });
  if (world_rank == 0) {
    EXPECT_EQ(y, (std::vector<double>{9, 6}));
    EXPECT_EQ(dx, (std::vector<double>{9, 3}));
  }
}

TEST(MpiAutodiffTest, ShardedLetterSoftmaxAndMaxMatchThreadsBitForBit) {
  // Both ops over J split four ways (X then Y), unevenly: their row statistics are
  // all_reduces over XY, max and sum, forward and backward.
  const Mesh mesh = Mesh::parse("X=2,Y=2");
  testing::Program p{mesh, {{parse_spec("x[I, J_{XY}]", mesh), {3, 6}, 5}, {parse_spec("w[L]", mesh), {2}, 6}}, {}, ""};
  testing::Instr softmax_j{testing::Kind::softmax_over, {0}}, max_j{testing::Kind::reduce_max, {2}};
  softmax_j.dim = max_j.dim = "J";
  p.ops = {softmax_j, max_j, testing::Instr{testing::Kind::local_einsum, {3, 1}, {"I", "L"}},
           testing::Instr{testing::Kind::sum, {4}}};
  for (DType dtype : {DType::f64, DType::f32}) {
    const RankResult mpi = run_program("mpi", p, dtype);
    const RankResult threads = run_program("threads", p, dtype);
    EXPECT_EQ(mpi.grads, threads.grads) << to_string(dtype) << " rank " << world_rank;
    EXPECT_EQ(mpi.comm, threads.comm) << to_string(dtype) << " rank " << world_rank;
    // Forward: max and sum of softmax's rows, max of reduce_max's; backward: reduce_max's tie
    // counts, softmax's sum(g y).
    EXPECT_EQ(mpi.comm.size(), 5u);
    if (world_rank == 0 && dtype == DType::f64) {
      const auto fd = testing::finite_differences(p);
      for (std::size_t l = 0; l < fd.size(); ++l) {
        for (std::size_t k = 0; k < fd[l].size(); ++k) {
          EXPECT_NEAR(mpi.gathered[l][k], fd[l][k], 1e-6 * (1 + std::abs(fd[l][k])))
              << "leaf " << l << " element " << k;
        }
      }
    }
  }
}

TEST(MpiAutodiffTest, RandomProgramsMatchThreadsBitForBit) {
  static const char* meshes[] = {"X=4", "X=2,Y=2", "X=1,Y=4", "X=2,Y=1,Z=2"};
  for (int i = 0; i < 40; ++i) {
    testing::Rng rng(9100 + static_cast<std::uint64_t>(i));  // every rank draws the same program
    const Mesh mesh = Mesh::parse(meshes[testing::uniform(rng, 0, 3)]);
    testing::ProgramGenerator gen(rng);
    const testing::Program p = gen.generate(mesh, testing::uniform(rng, 3, 7));
    const DType dtype = i % 2 ? DType::f32 : DType::f64;
    const RankResult mpi = run_program("mpi", p, dtype);
    const RankResult threads = run_program("threads", p, dtype);
    EXPECT_EQ(mpi.grads, threads.grads) << "program " << i << " rank " << world_rank << ": " << p.text;
    EXPECT_EQ(mpi.comm, threads.comm) << "program " << i << " rank " << world_rank;
    if (world_rank == 0 && dtype == DType::f64) {
      const auto fd = testing::finite_differences(p);
      for (std::size_t l = 0; l < fd.size(); ++l) {
        for (std::size_t k = 0; k < fd[l].size(); ++k) {
          EXPECT_NEAR(mpi.gathered[l][k], fd[l][k], 1e-6 * (1 + std::abs(fd[l][k])))
              << "program " << i << " leaf " << l << " element " << k << ": " << p.text;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardmm
