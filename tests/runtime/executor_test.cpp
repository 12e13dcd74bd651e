// Differential tests of the executor: every candidate plan of thousands of random
// sharded contractions, and every reshard between pairs of specs on small meshes, run on
// the threads backend and compared with the dense single-device reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "dense_reference.h"
#include "plan/steps.h"
#include "random_cases.h"
#include "sampled_candidates.h"
#include "shardmm/core/error.h"
#include "shardmm/plan/planner.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/executor.h"
#include "shardmm/runtime/verify.h"

namespace shardmm {
namespace {

using testing::dense_einsum;
using testing::dim_names;
using testing::generator;

std::vector<double> dense_tensor(const Mesh& mesh, const Spec& spec, const Shape& shape, std::uint64_t seed) {
  return dense_logical(mesh, spec, shape, DType::f64, generator(seed));
}

PlanOptions options(DType dtype) {
  PlanOptions o;
  o.dtype = dtype;
  o.hw = builtin_profile("h100");
  return o;
}

// A copy of a rank's result, made before its executor goes away.
DistTensor copy_of(const Mesh& mesh, const DistTensor& t) {
  DistTensor c(mesh, t.device(), t.spec(), t.global_shape(), t.dtype());
  std::memcpy(c.data(), t.data(), static_cast<std::size_t>(t.buffer().bytes()));
  return c;
}

struct RunResult {
  std::vector<double> global;
  std::vector<std::vector<TraceEvent>> traces;  // per device
};

// Wraps a rank's communicator for the executor (a test double that watches its calls).
using CommunicatorWrapper = std::function<std::unique_ptr<Communicator>(Communicator&)>;

// Runs `plan` on every device of `mesh` (through `wrap`'s communicator where given) and
// assembles the logical result.
RunResult run_plan(const Mesh& mesh, const Plan& plan, const DimSizes& sizes, DType dtype, const Spec& a_spec,
                   const Spec* b_spec, const CommunicatorWrapper& wrap = nullptr) {
  std::vector<DistTensor> results(static_cast<std::size_t>(mesh.device_count()));
  RunResult out;
  out.traces.resize(results.size());
  run_threads(mesh, [&](Communicator& rank_comm) {
    const std::unique_ptr<Communicator> wrapped = wrap ? wrap(rank_comm) : nullptr;
    Communicator& comm = wrapped ? *wrapped : rank_comm;
    const std::int64_t me = comm.rank();
    DistTensor a = DistTensor::filled(mesh, me, a_spec, global_shape(a_spec, sizes), dtype, generator(1));
    DistTensor b;
    if (b_spec) b = DistTensor::filled(mesh, me, *b_spec, global_shape(*b_spec, sizes), dtype, generator(2));
    Executor exec(comm, plan, sizes, dtype);
    // Twice: buffers are reused, and the second run must not see the first's leftovers.
    exec.run(a, b_spec ? &b : nullptr);
    const DistTensor& r = exec.run(a, b_spec ? &b : nullptr);
    results[static_cast<std::size_t>(me)] = copy_of(mesh, r);
    out.traces[static_cast<std::size_t>(me)] = exec.trace();
  });
  std::vector<const DistTensor*> shards;
  for (const DistTensor& t : results) shards.push_back(&t);
  out.global = assemble_global(mesh, shards);
  return out;
}

// The trace's bytes agree with the plan's: the plan states the most any device moves.
void expect_trace_matches(const Plan& plan, const RunResult& run, const std::string& context) {
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    std::int64_t sent = 0, received = 0;
    for (const auto& trace : run.traces) {
      ASSERT_EQ(trace.size(), plan.steps.size()) << context;
      EXPECT_EQ(trace[s].op, plan.steps[s].op) << context;
      sent = std::max(sent, trace[s].bytes_sent);
      received = std::max(received, trace[s].bytes_received);
    }
    EXPECT_EQ(sent, plan.steps[s].bytes_sent) << context << " step " << s;
    EXPECT_EQ(received, plan.steps[s].bytes_received) << context << " step " << s;
  }
}

int case_count(int fallback) {
  const char* env = std::getenv("SHARDMM_RANDOM_CASES");
  return env ? std::atoi(env) : fallback;
}

TEST(ExecutorTest, SeedsCaseThreeOnFourRanks) {
  const Mesh mesh = Mesh::parse("X=4");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
  const DimSizes sizes = parse_dims("I=6,J=10,K=5");
  const MatmulPlanning p = plan_matmul(mesh, c, sizes, options(DType::f64));
  for (const Plan& plan : p.candidates) {
    const RunResult r = run_plan(mesh, plan, sizes, DType::f64, c.a, &c.b);
    const auto expected = dense_einsum(dim_names(c.a), dense_tensor(mesh, c.a, {6, 10}, 1), dim_names(c.b),
                                       dense_tensor(mesh, c.b, {10, 5}, 2), {"I", "K"}, sizes);
    EXPECT_EQ(r.global, expected) << plan.description;
  }
}

// A released result is the run's, moved out; the executor has no result left to give.
TEST(ExecutorTest, ReleaseMovesTheResultOut) {
  const Mesh mesh = Mesh::parse("X=2");
  const Contraction c = parse_contraction("A[I, J_X] @ B[J_X, K] -> C[I, K]", mesh);
  const DimSizes sizes = parse_dims("I=3,J=4,K=5");
  const MatmulPlanning p = plan_matmul(mesh, c, sizes, options(DType::f64));
  const Plan& plan = p.candidates.at(static_cast<std::size_t>(p.chosen));
  run_threads(mesh, [&](Communicator& comm) {
    const std::int64_t me = comm.rank();
    const DistTensor a = DistTensor::filled(mesh, me, c.a, {3, 4}, DType::f64, generator(1));
    const DistTensor b = DistTensor::filled(mesh, me, c.b, {4, 5}, DType::f64, generator(2));
    Executor exec(comm, plan, sizes, DType::f64);
    const DistTensor ran = copy_of(mesh, exec.run(a, &b));
    const DistTensor released = exec.release();
    EXPECT_EQ(released.spec(), ran.spec());
    ASSERT_EQ(released.buffer().bytes(), ran.buffer().bytes());
    EXPECT_EQ(std::memcmp(released.data(), ran.data(), static_cast<std::size_t>(ran.buffer().bytes())), 0);
    EXPECT_THROW(exec.release(), UsageError);
  });
}

// Runs `plan` with real-valued (not integer) inputs, so that the order of additions shows
// in the bits, and assembles the logical result.
std::vector<double> run_real_valued(const Mesh& mesh, const Plan& plan, const Contraction& c, const DimSizes& sizes,
                                    DType dtype) {
  const auto value = [](double phase) {
    return [phase](const Index& i, std::int64_t r) {
      double v = phase + 0.37 * static_cast<double>(r);
      for (std::size_t d = 0; d < i.size(); ++d) v += 1.618 * static_cast<double>(d + 1) * static_cast<double>(i[d]);
      return std::sin(v);
    };
  };
  std::vector<DistTensor> results(static_cast<std::size_t>(mesh.device_count()));
  run_threads(mesh, [&](Communicator& comm) {
    const std::int64_t me = comm.rank();
    const DistTensor a = DistTensor::filled(mesh, me, c.a, global_shape(c.a, sizes), dtype, value(0.1));
    const DistTensor b = DistTensor::filled(mesh, me, c.b, global_shape(c.b, sizes), dtype, value(0.7));
    Executor exec(comm, plan, sizes, dtype);
    results[static_cast<std::size_t>(me)] = copy_of(mesh, exec.run(a, &b));
  });
  std::vector<const DistTensor*> shards;
  for (const DistTensor& t : results) shards.push_back(&t);
  return assemble_global(mesh, shards);
}

// The candidate whose steps are exactly `ops`.
const Plan& plan_with(const MatmulPlanning& p, const std::vector<OpKind>& ops, bool bidirectional = false) {
  for (const Plan& plan : p.candidates) {
    std::vector<OpKind> got;
    bool bidi = false;
    for (const Step& s : plan.steps) {
      got.push_back(s.op);
      bidi = bidi || s.bidirectional;
    }
    if (got == ops && bidi == bidirectional) return plan;
  }
  throw std::runtime_error("no candidate with those steps");
}

struct RingCase {
  const char* mesh;
  const char* expr;
  const char* dims;
};

// Runs each case's candidates whose steps are `ring` (one way round, and both ways from 3
// members; planned for tpu-v5e, a torus) and its serialized twin on real-valued f64 data and
// expects them within rounding of each other. Returns how many rings ran.
int expect_rings_near_serialized(const std::vector<RingCase>& cases, const std::vector<OpKind>& ring,
                                 const std::vector<OpKind>& twin) {
  PlanOptions torus = options(DType::f32);  // tpu-v5e has no f64 peak; the plan's steps do not depend on it
  torus.hw = builtin_profile("tpu-v5e");
  int rings = 0;
  for (const RingCase& k : cases) {
    const Mesh mesh = Mesh::parse(k.mesh);
    const Contraction c = parse_contraction(k.expr, mesh);
    const DimSizes sizes = parse_dims(k.dims);
    const MatmulPlanning p = plan_matmul(mesh, c, sizes, torus);
    const std::vector<double> serial = run_real_valued(mesh, plan_with(p, twin), c, sizes, DType::f64);
    for (bool both_ways : {false, true}) {
      if (both_ways && mesh.device_count() < 3) continue;
      const std::vector<double> got = run_real_valued(mesh, plan_with(p, ring, both_ways), c, sizes, DType::f64);
      EXPECT_EQ(got.size(), serial.size()) << k.expr;
      for (std::size_t i = 0; i < std::min(got.size(), serial.size()); ++i) {
        EXPECT_NEAR(got[i], serial[i], 1e-12) << k.expr << (both_ways ? " both ways " : " one way ") << i;
      }
      ++rings;
    }
  }
  return rings;
}

// The all_gather_einsum ring multiplies each gathered shard into its own rows of C: the
// same products and sums per element as one einsum over the gathered operand, but OpenBLAS
// picks its kernels by the GEMM's row count, and the association of a dot product differs
// between them, so the bits may differ (they do here in f32): within rounding, not
// bitwise. Uneven shards, one and both directions round the ring, A or B gathered, the free
// dimension leading in C or not.
TEST(ExecutorTest, AllGatherEinsumIsWithinRoundingOfTheSerializedPlan) {
  EXPECT_EQ(expect_rings_near_serialized({{"X=4", "A[I_X, J] @ B[J, K] -> C[I, K]", "I=37,J=29,K=23"},
                                          {"X=3", "A[I, J] @ B[J, K_X] -> C[I, K]", "I=19,J=31,K=17"},
                                          {"X=5", "A[J, I_X] @ B[J, K] -> C[K, I]", "I=23,J=9,K=12"}},
                                         {OpKind::all_gather_einsum}, {OpKind::all_gather, OpKind::einsum}),
            6);
}

// all_gather_einsum over a contracted dimension: each arriving shard times the other
// operand's rows of that dimension, read in place, adds into all of C (the own shard first,
// then in ring order), where one einsum over the gathered operand sums the dimension in one
// GEMM: within rounding, not bitwise. C is sharded over the ring (the planner offers the ring
// only then: replicas would sum in different orders). The other operand's rows strided
// (A[I, J]'s columns) or contiguous, A or B gathered, uneven shards and an empty one (J = 2
// over 3), C transposed, one and both ways round.
TEST(ExecutorTest, AllGatherEinsumOverAContractedDimensionIsWithinRoundingOfTheSerializedPlan) {
  const std::vector<RingCase> cases = {{"X=2", "A[I_X, J] @ B[J_X, K] -> C[I_X, K]", "I=26,J=41,K=15"},
                                       {"X=4", "A[I, J_X] @ B[J, K_X] -> C[I, K_X]", "I=13,J=22,K=9"},
                                       {"X=3", "A[J, I_X] @ B[K, J_X] -> C[I_X, K]", "I=7,J=10,K=12"},
                                       {"X=5", "A[I_X, J] @ B[J_X, K] -> C[K, I_X]", "I=6,J=9,K=11"},
                                       {"X=3", "A[I_X, J] @ B[J_X, K] -> C[I_X, K]", "I=6,J=2,K=5"}};
  PlanOptions torus = options(DType::f32);
  torus.hw = builtin_profile("tpu-v5e");
  for (const RingCase& k : cases) {
    const Mesh mesh = Mesh::parse(k.mesh);
    const MatmulPlanning p = plan_matmul(mesh, parse_contraction(k.expr, mesh), parse_dims(k.dims), torus);
    for (bool both_ways : {false, true}) {
      if (both_ways && mesh.device_count() < 3) continue;
      const Plan& ring = plan_with(p, {OpKind::all_gather_einsum}, both_ways);
      EXPECT_TRUE(gathers_contracted(ring.steps[0])) << k.expr;
    }
  }
  EXPECT_EQ(expect_rings_near_serialized(cases, {OpKind::all_gather_einsum}, {OpKind::all_gather, OpKind::einsum}), 9);
}

// A rank's threads communicator that reports, as mpi does through MPI messages, that its
// requests move only inside calls, and lends nothing (irecv_lent is a plain irecv). It counts
// the rank's sends not yet waited for each time the rank posts a receive.
class CallsOnlyCommunicator : public Communicator {
 public:
  CallsOnlyCommunicator(Communicator& inner, bool moves_only_in_calls, std::atomic<int>& most_pending)
      : inner_(inner), moves_only_in_calls_(moves_only_in_calls), most_pending_(most_pending) {}

  std::int64_t rank() const override { return inner_.rank(); }
  const Mesh& mesh() const override { return inner_.mesh(); }
  std::string backend() const override { return inner_.backend(); }
  BackendCapabilities capabilities() const override { return inner_.capabilities(); }
  void all_gather(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& group) override {
    inner_.all_gather(send, recv, counts, dtype, group);
  }
  void reduce_scatter(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& group) override {
    inner_.reduce_scatter(send, recv, counts, dtype, group);
  }
  void all_reduce(void* data, std::int64_t count, DType dtype, const AxisList& group, ReduceOp op) override {
    inner_.all_reduce(data, count, dtype, group, op);
  }
  void all_to_all(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts, DType dtype,
                  const AxisList& group) override {
    inner_.all_to_all(send, send_counts, recv, recv_counts, dtype, group);
  }
  void send(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    inner_.send(data, bytes, peer, tag);
  }
  void recv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    inner_.recv(data, bytes, peer, tag);
  }
  Request isend(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    return std::make_unique<CountedSend>(inner_.isend(data, bytes, peer, tag), pending_);
  }
  Request irecv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    int seen = most_pending_.load();
    while (pending_ > seen && !most_pending_.compare_exchange_weak(seen, pending_)) {
    }
    return inner_.irecv(data, bytes, peer, tag);
  }
  bool moves_only_in_calls() const override { return moves_only_in_calls_; }
  bool clock_is_shared() const override { return inner_.clock_is_shared(); }
  void barrier() override { inner_.barrier(); }

 private:
  class CountedSend : public P2PRequest {
   public:
    CountedSend(Request inner, int& pending) : inner_(std::move(inner)), pending_(pending) { ++pending_; }
    ~CountedSend() override { done(); }
    void wait() override {
      inner_->wait();
      done();
    }
    bool test() override { return inner_->test(); }
    const void* received() const override { return inner_->received(); }

   private:
    void done() {
      if (counted_) --pending_;
      counted_ = false;
    }
    Request inner_;
    int& pending_;
    bool counted_ = true;
  };
  Communicator& inner_;
  bool moves_only_in_calls_;
  std::atomic<int>& most_pending_;
  int pending_ = 0;
};

// Where requests move only inside calls, a ring waits for its sends when it waits for its
// receives (MPI_Sendrecv's contract): a rank that went on to its next GEMM with a send
// unfinished would hold the receiver until that GEMM ends (through MPI messages the gather
// ring ran 0.70x the serialized plan so, collective-matmul.md). So when a rank posts a
// receive, the gather ring's only pending send is the other way's of the same step, and each
// way of the reduce-scatter ring has at most the send of the step before, which its receiver
// waits for in this step. The same rings on a communicator that does not say so keep more
// sends in flight (which shows the count can fail). Exact against the dense reference.
TEST(ExecutorTest, RingsWaitForTheirSendsWhereRequestsMoveOnlyInCalls) {
  PlanOptions torus = options(DType::f32);  // tpu-v5e has no f64 peak; the plan's steps do not depend on it
  torus.hw = builtin_profile("tpu-v5e");
  struct Ring {
    const char* mesh;
    const char* expr;
    OpKind op;
    bool both_ways;
  };
  for (const Ring& k :
       std::vector<Ring>{{"X=4", "A[I_X, J] @ B[J, K] -> C[I, K]", OpKind::all_gather_einsum, false},
                         {"X=5", "A[I_X, J] @ B[J, K] -> C[I, K]", OpKind::all_gather_einsum, true},
                         {"X=4", "A[I_X, J] @ B[J_X, K] -> C[I_X, K]", OpKind::all_gather_einsum, false},
                         {"X=4", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]", OpKind::einsum_reduce_scatter, false},
                         {"X=7", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]", OpKind::einsum_reduce_scatter, true}}) {
    const Mesh mesh = Mesh::parse(k.mesh);
    const Contraction c = parse_contraction(k.expr, mesh);
    const DimSizes sizes = parse_dims("I=23,J=17,K=9");
    const MatmulPlanning p = plan_matmul(mesh, c, sizes, torus);
    const Plan& ring = plan_with(p, {k.op}, k.both_ways);
    const auto expected =
        dense_einsum(dim_names(c.a), dense_tensor(mesh, c.a, global_shape(c.a, sizes), 1), dim_names(c.b),
                     dense_tensor(mesh, c.b, global_shape(c.b, sizes), 2), c.out_dims, sizes);
    const int ways = k.both_ways ? 2 : 1;
    const int allowed = k.op == OpKind::all_gather_einsum ? ways - 1 : ways;
    for (bool only_in_calls : {true, false}) {
      std::atomic<int> most_pending{0};
      const RunResult r = run_plan(mesh, ring, sizes, DType::f64, c.a, &c.b, [&](Communicator& comm) {
        return std::make_unique<CallsOnlyCommunicator>(comm, only_in_calls, most_pending);
      });
      EXPECT_EQ(r.global, expected) << k.expr << " " << ring.description;
      if (only_in_calls) {
        EXPECT_LE(most_pending.load(), allowed) << k.expr << " " << ring.description;
      } else {
        EXPECT_GT(most_pending.load(), allowed) << k.expr << " " << ring.description;
      }
    }
  }
}

// einsum_reduce_scatter sums each block in ring order from its owner's successor (both ways
// round: the sum from the left, plus the owner's part, plus the sum from the right), not in
// group-rank order as reduce_scatter does: within rounding of the serialized plan and the
// dense reference, not bitwise. Uneven blocks, rings of 2 to 5, the scattered letter from A
// or B, leading in C or not.
TEST(ExecutorTest, EinsumReduceScatterIsWithinRoundingOfTheSerializedPlan) {
  EXPECT_EQ(expect_rings_near_serialized({{"X=2", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]", "I=26,J=41,K=15"},
                                          {"X=4", "A[I, J_X] @ B[J_X, K] -> C[I_X, K]", "I=26,J=41,K=15"},
                                          {"X=3", "A[I, J_X] @ B[J_X, K] -> C[I, K_X]", "I=13,J=22,K=29"},
                                          {"X=5", "A[J_X, I] @ B[K, J_X] -> C[K, I_X]", "I=23,J=9,K=12"}},
                                         {OpKind::einsum_reduce_scatter}, {OpKind::einsum, OpKind::reduce_scatter}),
            7);
}

// A ring over the leading axes of a gather or scatter over two, the rest gathered before it
// or scattered after it (plan/matmul.cpp, add_split_ways) against the serialized split: A's
// rows gathered, B's contracted dimension gathered, the partial sums scattered; uneven shards
// on X=3,Y=2, the ring over X one way and both ways round.
TEST(ExecutorTest, RingsOverSomeOfACollectivesAxesAreWithinRoundingOfTheSerializedPlan) {
  const std::vector<RingCase> gathers = {{"X=3,Y=2", "A[I_XY, J] @ B[J, K] -> C[I, K]", "I=37,J=13,K=11"},
                                         {"X=3,Y=2", "A[I_XY, J] @ B[J_XY, K] -> C[I_XY, K]", "I=20,J=29,K=9"}};
  const std::vector<RingCase> scatters = {{"X=3,Y=2", "A[I, J_XY] @ B[J_XY, K] -> C[I_XY, K]", "I=17,J=29,K=7"}};
  PlanOptions torus = options(DType::f32);
  torus.hw = builtin_profile("tpu-v5e");
  for (const auto& [cases, ring] :
       {std::pair{gathers, std::vector{OpKind::all_gather, OpKind::all_gather_einsum}},
        std::pair{scatters, std::vector{OpKind::einsum_reduce_scatter, OpKind::reduce_scatter}}}) {
    for (const RingCase& k : cases) {
      const Mesh mesh = Mesh::parse(k.mesh);
      const MatmulPlanning p = plan_matmul(mesh, parse_contraction(k.expr, mesh), parse_dims(k.dims), torus);
      const Plan& split = plan_with(p, ring);
      const bool gathered = ring[0] == OpKind::all_gather;
      EXPECT_EQ(split.steps[gathered ? 0 : 1].axes, AxisList{1}) << k.expr;
      EXPECT_EQ(split.steps[gathered ? 1 : 0].axes, AxisList{0}) << k.expr;
    }
  }
  EXPECT_EQ(expect_rings_near_serialized(gathers, {OpKind::all_gather, OpKind::all_gather_einsum},
                                         {OpKind::all_gather, OpKind::all_gather, OpKind::einsum}),
            4);
  EXPECT_EQ(expect_rings_near_serialized(scatters, {OpKind::einsum_reduce_scatter, OpKind::reduce_scatter},
                                         {OpKind::einsum, OpKind::reduce_scatter, OpKind::reduce_scatter}),
            2);
}

TEST(ExecutorTest, RandomContractionsEveryCandidateMatchesDenseReference) {
  const int cases = case_count(1000);
  std::int64_t plans_run = 0;
  std::map<std::string, int> rings_run;  // collective matmuls, by kind and way round
  int exchanges_run = 0;                 // operand or result reshards done as one exchange
  int split_rings_run = 0;               // rings beside a collective of theirs on the same dimension
  for (int i = 0; i < cases; ++i) {
    const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(i);
    testing::Rng rng(seed);
    // Half the cases under each split rule (the same draws either way).
    const SplitRule rule = (i / 4) % 2 ? SplitRule::chunk : SplitRule::array;
    const Mesh mesh(testing::random_mesh(rng, 4, 8).axes(), rule);
    const auto rc = testing::random_contraction(rng, mesh);
    const DType dtype = i % 2 ? DType::f32 : DType::f64;
    // Half the f32 cases planned for a torus (tpu-v5e, which has no f64 rate), where the
    // rings also go both ways round.
    PlanOptions planning = options(dtype);
    if (i % 4 == 3) planning.hw = builtin_profile("tpu-v5e");
    const MatmulPlanning p = plan_matmul(mesh, rc.contraction, rc.sizes, planning);
    ASSERT_FALSE(p.candidates.empty()) << "seed " << seed << ": " << rc.text;
    const Contraction& c = rc.contraction;
    const auto expected =
        dense_einsum(dim_names(c.a), dense_tensor(mesh, c.a, global_shape(c.a, rc.sizes), 1), dim_names(c.b),
                     dense_tensor(mesh, c.b, global_shape(c.b, rc.sizes), 2), c.out_dims, rc.sizes);
    for (const Plan& plan : testing::sampled_candidates(p.candidates, c.out.has_value(), p.chosen)) {
      const std::string context = "seed " + std::to_string(seed) + " mesh " + mesh.to_string() + " split " +
                                  std::string(to_string(rule)) + ": " + rc.text + " [" + plan.description + "]";
      const RunResult r = run_plan(mesh, plan, rc.sizes, dtype, c.a, &c.b);
      ASSERT_EQ(r.global, expected) << context;
      expect_trace_matches(plan, r, context);
      ++plans_run;
      for (std::size_t k = 0; k < plan.steps.size(); ++k) {
        const Step& s = plan.steps[k];
        if (is_collective_matmul(s.op)) {
          ++rings_run[std::string(to_string(s.op)) + (gathers_contracted(s) ? " contracted" : "") +
                      (s.bidirectional ? " both ways" : "")];
          // A ring over the leading axes of a gather split in two (the rest gathered right
          // before it) or of a scatter (the rest scattered right after).
          const bool gather = s.op == OpKind::all_gather_einsum;
          const Step* beside = gather ? (k > 0 ? &plan.steps[k - 1] : nullptr)
                                      : (k + 1 < plan.steps.size() ? &plan.steps[k + 1] : nullptr);
          split_rings_run += beside && beside->op == (gather ? OpKind::all_gather : OpKind::reduce_scatter) &&
                             beside->dim == s.dim && (!gather || beside->operand == s.ring_operand);
        }
        exchanges_run += s.op == OpKind::exchange;
      }
    }
  }
  RecordProperty("plans_run", static_cast<int>(plans_run));
  if (cases >= 1000) {  // every kind of ring ran (the default count; SHARDMM_RANDOM_CASES may lower it)
    for (const char* kind :
         {"all_gather_einsum", "all_gather_einsum both ways", "all_gather_einsum contracted",
          "all_gather_einsum contracted both ways", "einsum_reduce_scatter", "einsum_reduce_scatter both ways"}) {
      EXPECT_GE(rings_run[kind], 20) << kind;
    }
    EXPECT_GE(exchanges_run, 20);
    EXPECT_GE(split_rings_run, 20);
  }
  RecordProperty("exchanges_run", exchanges_run);
  RecordProperty("split_rings_run", split_rings_run);
  for (const auto& [kind, count] : rings_run) RecordProperty(kind, count);
}

// Every legal spec of a 2-D tensor on `mesh` (each axis: unused, unreduced, or sharding
// I or J at any position).
std::vector<Spec> all_specs(const Mesh& mesh) {
  std::vector<Spec> specs{Spec{"T", {{"I", {}}, {"J", {}}}, {}}};
  for (int a = 0; a < mesh.rank(); ++a) {
    std::vector<Spec> next;
    for (const Spec& s : specs) {
      next.push_back(s);
      Spec u = s;
      u.unreduced.push_back(a);
      next.push_back(u);
      for (std::size_t d = 0; d < 2; ++d) {
        for (std::size_t pos = 0; pos <= s.dims[d].axes.size(); ++pos) {
          Spec t = s;
          t.dims[d].axes.insert(t.dims[d].axes.begin() + static_cast<std::ptrdiff_t>(pos), a);
          next.push_back(t);
        }
      }
    }
    specs.swap(next);
  }
  return specs;
}

// The pairs numbered `first` mod `stride`, in the order the specs list them.
void check_all_reshards(const Mesh& mesh, const DimSizes& sizes, DType dtype, int stride, int first = 0) {
  const std::vector<Spec> specs = all_specs(mesh);
  int pair = 0, exchanges = 0;
  for (const Spec& from : specs) {
    for (const Spec& to : specs) {
      if (pair++ % stride != first) continue;
      const Shape shape = global_shape(from, sizes);
      const Plan plan = plan_reshard(mesh, from, to, shape, options(dtype));
      const std::string context = mesh.to_string() + " split " + std::string(to_string(mesh.split_rule())) + " " +
                                  format_spec(from, mesh) + " -> " + format_spec(to, mesh) + " [" + plan.description +
                                  "]";
      ASSERT_EQ(plan.output, to) << context;
      const RunResult r = run_plan(mesh, plan, sizes, dtype, from, nullptr);
      ASSERT_EQ(r.global, dense_tensor(mesh, from, shape, 1)) << context;
      expect_trace_matches(plan, r, context);
      // The same move as one exchange, whether or not the planner would choose it: every
      // geometry of its pieces runs, and its trace shows the bytes the planner costs.
      if (from.unreduced != to.unreduced) continue;
      Plan exchange;
      exchange.steps = {detail::make_exchange(from, to)};
      exchange.output = to;
      const PlanOptions o = options(dtype);
      detail::StepCoster(mesh, o).cost(exchange.steps[0], shape);
      const std::string exchanged = mesh.to_string() + " split " + std::string(to_string(mesh.split_rule())) + " " +
                                    format_spec(from, mesh) + " -> " + format_spec(to, mesh) + " [exchange over " +
                                    mesh.axis_names(exchange.steps[0].axes) + "]";
      const RunResult x = run_plan(mesh, exchange, sizes, dtype, from, nullptr);
      ASSERT_EQ(x.global, dense_tensor(mesh, from, shape, 1)) << exchanged;
      expect_trace_matches(exchange, x, exchanged);
      ++exchanges;
    }
  }
  EXPECT_GT(exchanges, 0);
}

// Each test's pairs split between the rules: the even-numbered ones under array_split, the odd
// ones under torch.chunk, on sizes where chunk's blocks differ from array's (a split in two is
// the same under both): 7 over 3 is 3,3,1 (not 3,2,2), 4 over 3 is 2,2,0 (not 2,1,1).
TEST(ExecutorTest, EveryReshardPairOnTwoAxes) {
  check_all_reshards(Mesh::parse("X=2,Y=3"), parse_dims("I=5,J=7"), DType::f64, 2, 0);
  check_all_reshards(Mesh::parse("X=2,Y=3", SplitRule::chunk), parse_dims("I=4,J=7"), DType::f64, 2, 1);
}

TEST(ExecutorTest, EveryReshardPairOnTwoByTwoWithEmptyShards) {
  check_all_reshards(Mesh::parse("X=2,Y=2"), parse_dims("I=3,J=1"), DType::f32, 2, 0);
  check_all_reshards(Mesh::parse("X=3,Y=2", SplitRule::chunk), parse_dims("I=4,J=1"), DType::f32, 2, 1);
}

TEST(ExecutorTest, ReshardPairsOnThreeAxes) {
  check_all_reshards(Mesh::parse("X=2,Y=2,Z=2"), parse_dims("I=9,J=6"), DType::f64, 14, 0);
  check_all_reshards(Mesh::parse("X=3,Y=2,Z=2", SplitRule::chunk), parse_dims("I=10,J=7"), DType::f64, 14, 7);
}

}  // namespace
}  // namespace shardmm

namespace shardmm {
namespace {

// Reductions run in a fixed order: the same plan on the same inputs gives the same bits
// every time, whether the executor is reused or built anew. Values with many significant
// bits (uniform_values) make a changed summation order visible.
TEST(ExecutorTest, ReducingPlansAreBitwiseRepeatable) {
  const Mesh mesh = Mesh::parse("X=4,Y=2");
  for (const char* expr : {"A[I, J_XY] @ B[J_XY, K] -> C[I, K]", "A[I, J_X] @ B[J_X, K_Y] -> C[I_X, K_Y]",
                           "A[I_Y, J]{U_X} @ B[J, K] -> C[I, K_XY]"}) {
    const Contraction c = parse_contraction(expr, mesh);
    const DimSizes sizes = parse_dims("I=13,J=97,K=11");
    const MatmulPlanning p = plan_matmul(mesh, c, sizes, options(DType::f32));
    for (const Plan& plan : p.candidates) {
      std::vector<std::vector<unsigned char>> first(static_cast<std::size_t>(mesh.device_count()));
      for (int round = 0; round < 10; ++round) {
        run_threads(mesh, [&](Communicator& comm) {
          DistTensor a =
              DistTensor::filled(mesh, comm.rank(), c.a, global_shape(c.a, sizes), DType::f32, uniform_values(5));
          DistTensor b =
              DistTensor::filled(mesh, comm.rank(), c.b, global_shape(c.b, sizes), DType::f32, uniform_values(6));
          Executor exec(comm, plan, sizes, DType::f32);
          for (int rep = 0; rep < 3; ++rep) {
            const DistTensor& r = exec.run(a, &b);
            const auto* bytes = static_cast<const unsigned char*>(r.data());
            std::vector<unsigned char> now(bytes, bytes + r.buffer().bytes());
            auto& ref = first[static_cast<std::size_t>(comm.rank())];
            if (round == 0 && rep == 0) {
              ref = now;
            } else {
              EXPECT_EQ(now, ref) << expr << " [" << plan.description << "] round " << round;
            }
          }
        });
      }
    }
  }
}

}  // namespace
}  // namespace shardmm
