// Every op's backward on random sharded programs (random meshes up to 8 devices, uneven
// and empty shards): gradients against central finite differences of an independent
// dense interpreter, against the same program on one device, and the symbolic tape's
// events and memory against the executed ones.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "autodiff_programs.h"
#include "autodiff_testing.h"

namespace shardmm {
namespace {

using namespace autodiff;
using testing::Collected;
using testing::Kind;
using testing::Program;

struct Executed {
  std::vector<std::vector<double>> grads;          // per leaf, logical
  double loss = 0;
  std::vector<std::vector<TapeEvent>> events;      // per device
  std::vector<TapeMemory> memory;                  // per device
  std::vector<bool> grads_in_leaf_spec;            // per leaf, on every device
};

Executed execute(const Program& p, const Mesh& mesh, bool one_device) {
  Collected out(mesh);
  Executed r;
  r.events.resize(static_cast<std::size_t>(mesh.device_count()));
  r.memory.resize(r.events.size());
  std::vector<std::vector<bool>> in_spec(r.events.size());
  run_threads(mesh, [&](Communicator& comm) {
    Tape tape(comm, {DType::f64});
    const std::vector<Var> v = testing::replay(tape, p, one_device);
    out.put("loss", v.back().value());
    tape.backward(v.back());
    const auto me = static_cast<std::size_t>(comm.rank());
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      out.put("d" + std::to_string(l), tape.grad(v[l]));
      in_spec[me].push_back(tape.grad(v[l]).spec() == v[l].spec());
    }
    r.events[me] = tape.events();
    r.memory[me] = tape.memory();
  });
  r.loss = out.global("loss").at(0);
  for (std::size_t l = 0; l < p.leaves.size(); ++l) r.grads.push_back(out.global("d" + std::to_string(l)));
  r.grads_in_leaf_spec.assign(p.leaves.size(), true);
  for (const auto& dev : in_spec) {
    for (std::size_t l = 0; l < dev.size(); ++l) r.grads_in_leaf_spec[l] = r.grads_in_leaf_spec[l] && dev[l];
  }
  return r;
}

// A symbolic tape for each device predicts that device's executed run: the same steps in
// the same order and phase, the plan layer's bytes and FLOPs equal to the most any device
// measured, and the same memory figures.
void check_symbolic(const Program& p, const Mesh& mesh, const Executed& run) {
  std::vector<TapeEvent> predicted;
  for (std::int64_t d = 0; d < mesh.device_count(); ++d) {
    Tape tape(mesh, {DType::f64, builtin_profile("h100"), d});
    const std::vector<Var> v = testing::replay(tape, p);
    tape.backward(v.back());
    const std::vector<TapeEvent>& got = run.events[static_cast<std::size_t>(d)];
    ASSERT_EQ(tape.events().size(), got.size()) << "device " << d;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const Step& want = tape.events()[i].step;
      EXPECT_EQ(tape.events()[i].phase, got[i].phase) << "event " << i;
      EXPECT_FALSE(tape.events()[i].executed);
      EXPECT_TRUE(got[i].executed);
      EXPECT_EQ(want.op, got[i].step.op) << "event " << i;
      EXPECT_EQ(want.axes, got[i].step.axes) << "event " << i;
      EXPECT_EQ(want.from, got[i].step.from) << "event " << i;
      EXPECT_EQ(want.to, got[i].step.to) << "event " << i;
      EXPECT_EQ(want.bytes_sent, got[i].step.bytes_sent) << "event " << i;
    }
    const TapeMemory m = tape.memory(), e = run.memory[static_cast<std::size_t>(d)];
    EXPECT_EQ(m.leaves, e.leaves) << "device " << d;
    EXPECT_EQ(m.activations, e.activations) << "device " << d;
    EXPECT_EQ(m.gradients, e.gradients) << "device " << d;
    if (d == 0) predicted = tape.events();
  }
  // The most any device moved or computed is what the plan layer predicts.
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    std::int64_t sent = 0, received = 0;
    double flops = 0;
    for (const auto& dev : run.events) {
      sent = std::max(sent, dev[i].measured.bytes_sent);
      received = std::max(received, dev[i].measured.bytes_received);
      flops = std::max(flops, dev[i].measured.flops);
    }
    EXPECT_EQ(sent, predicted[i].step.bytes_sent) << "event " << i << " " << to_string(predicted[i].step.op);
    EXPECT_EQ(received, predicted[i].step.bytes_received) << "event " << i;
    EXPECT_EQ(flops, predicted[i].step.flops) << "event " << i;
  }
}

bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * (1 + std::abs(b)); }

TEST(Gradients, RandomCompositionsMatchFiniteDifferencesAndOneDevice) {
  testing::Rng rng(20261129);
  std::map<Kind, int> seen;
  const int cases = 400;
  for (int c = 0; c < cases; ++c) {
    const Mesh mesh = testing::random_mesh(rng, 3, 8);
    testing::ProgramGenerator gen(rng);
    const Program p = gen.generate(mesh, testing::uniform(rng, 3, 7));
    for (const auto& in : p.ops) ++seen[in.kind];
    SCOPED_TRACE("case " + std::to_string(c) + ": " + p.text);

    const Executed sharded = execute(p, mesh, false);
    const Executed single = execute(p, Mesh::parse("X=1"), true);
    const std::vector<std::vector<double>> fd = testing::finite_differences(p);
    const double dense = testing::dense_loss(p, testing::dense_leaves(p));
    EXPECT_TRUE(close(sharded.loss, dense, 1e-12)) << sharded.loss << " vs dense " << dense;
    for (std::size_t l = 0; l < p.leaves.size(); ++l) {
      EXPECT_TRUE(sharded.grads_in_leaf_spec[l]) << "leaf " << l << " gradient not in the leaf's spec";
      ASSERT_EQ(sharded.grads[l].size(), fd[l].size());
      for (std::size_t i = 0; i < fd[l].size(); ++i) {
        EXPECT_TRUE(close(sharded.grads[l][i], fd[l][i], 1e-6))
            << "leaf " << l << " (" << format_spec(p.leaves[l].spec, mesh) << ") element " << i << ": "
            << sharded.grads[l][i] << " vs finite difference " << fd[l][i];
        EXPECT_TRUE(close(sharded.grads[l][i], single.grads[l][i], 1e-11))
            << "leaf " << l << " element " << i << ": " << sharded.grads[l][i] << " vs one device " << single.grads[l][i];
      }
    }

    check_symbolic(p, mesh, sharded);
  }
  for (int k = 0; k <= static_cast<int>(Kind::mean); ++k) {
    EXPECT_GE(seen[static_cast<Kind>(k)], 5) << "op " << testing::kind_name(static_cast<Kind>(k)) << " rarely generated";
  }
}

}  // namespace
}  // namespace shardmm
