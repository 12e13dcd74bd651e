// The parallel layers' programs (nn::model_program) stepped on the mpi backend (a 4-process
// job): every layer and strategy verified against the dense step on device 0, with the
// collectives the symbolic prediction of the same program lists, byte for byte.
#include <gtest/gtest.h>

#include "mpi/mpi_test.h"
#include "shardmm/nn/collectives.h"
#include "shardmm/nn/model.h"
#include "shardmm/nn/program.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm {
namespace {

struct Case {
  const char* layer;
  const char* strategy;
  const char* mesh;
  const char* dims;
};

const Case kCases[] = {
    {"mlp", "tp", "X=4", "B=2,T=3,D=4,F=6"},
    {"mlp", "sp", "X=4", "B=2,T=5,D=4,F=6"},
    {"mlp", "fsdp", "X=4", "B=5,T=2,D=4,F=7"},
    {"mlp", "dp+tp", "dp=2,tp=2", "B=3,T=2,D=4,F=5"},
    {"attention", "tp", "X=4", "B=2,T=3,D=8,H=4"},
    {"block", "tp", "X=4", "B=2,T=3,D=6,F=5,H=3"},
    {"block", "sp", "X=4", "B=2,T=6,D=4,F=6,H=2"},
    {"block", "dp", "X=4", "B=3,T=2,D=4,F=3,H=2"},
    {"block", "dp+sp", "X=2,Y=2", "B=3,T=3,D=4,F=6,H=2"},
    {"moe", "ep", "X=4", "B=5,T=4,D=4,F=3,E=6,K=2"},
    {"moe", "dp", "X=4", "B=4,T=3,D=4,F=3,E=3,K=2"},
};

TEST(MpiLayersTest, EveryLayerStepVerifiesAndMatchesItsPrediction) {
  for (const Case& c : kCases) {
    nn::ModelConfig m = nn::make_model_config(c.layer, c.strategy, Mesh::parse(c.mesh), parse_dims(c.dims));
    m.causal = true;
    const program::Graph g = nn::model_program(m);
    nn::ProgramRun step;
    run_backend("mpi", m.mesh, [&](Communicator& comm) { step = nn::run_program(comm, g, {}); });
    const std::string what = std::string(c.layer) + " " + c.strategy + " on " + c.mesh;
    EXPECT_TRUE(step.verification.verified) << what << ": " << step.verification.detail;
    const auto measured = nn::tally_collectives(step.events, &step.max_bytes_sent);
    const auto predicted = nn::tally_collectives(nn::predict_program(g, nn::ProgramOptions{}).events);
    EXPECT_EQ(measured.size(), predicted.size()) << what;
    for (std::size_t i = 0; i < std::min(measured.size(), predicted.size()); ++i) {
      EXPECT_EQ(measured[i].op, predicted[i].op) << what;
      EXPECT_EQ(measured[i].count, predicted[i].count) << what;
      EXPECT_EQ(measured[i].bytes, predicted[i].bytes) << what;
    }
  }
}

}  // namespace
}  // namespace shardmm
