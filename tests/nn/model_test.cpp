// The layer configurations of `shardmm model`: names, axes, dims, and the layer's program
// with every tensor's layout pinned by the strategy.
#include "shardmm/nn/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "shardmm/core/error.h"
#include "shardmm/nn/program.h"

namespace shardmm::nn {
namespace {

using ::testing::HasSubstr;

std::string error_of(std::string_view layer, std::string_view strategy, const char* mesh, const char* dims) {
  try {
    make_model_config(layer, strategy, Mesh::parse(mesh), parse_dims(dims));
  } catch (const InputError& e) {
    return e.headline();
  }
  return "";
}

// The params' pins, then the input X's and the output Y's.
std::vector<std::string> specs(const ModelConfig& m) {
  const program::Graph g = model_program(m);
  std::vector<std::string> out;
  const auto pin = [&](int i) { return format_spec(*g.tensors[static_cast<std::size_t>(i)].pinned, m.mesh); };
  for (int i : g.leaves()) {
    if (g.tensors[static_cast<std::size_t>(i)].role == program::Role::param) out.push_back(pin(i));
  }
  out.push_back(pin(g.find("X")));
  out.push_back(pin(g.find("Y")));
  return out;
}

TEST(ModelConfigTest, LayoutsPerStrategy) {
  const char* dims = "B=4,T=6,D=8,F=12,H=2";
  EXPECT_EQ(specs(make_model_config("mlp", "tp", Mesh::parse("X=4"), parse_dims("B=4,T=6,D=8,F=12"))),
            (std::vector<std::string>{"W_in[D, F_X]", "W_out[F_X, D]", "X[B, T, D]", "Y[B, T, D]"}));
  EXPECT_EQ(specs(make_model_config("block", "sp", Mesh::parse("tp=2"), parse_dims(dims))),
            (std::vector<std::string>{"Wq[D, H_tp, A]", "Wk[D, H_tp, A]", "Wv[D, H_tp, A]", "Wo[H_tp, A, D]",
                                      "W_in[D, F_tp]", "W_out[F_tp, D]", "X[B, T_tp, D]", "Y[B, T_tp, D]"}));
  EXPECT_EQ(specs(make_model_config("attention", "fsdp", Mesh::parse("X=2"), parse_dims("B=4,T=6,D=8,H=2"))),
            (std::vector<std::string>{"Wq[D, H_X, A]", "Wk[D, H_X, A]", "Wv[D, H_X, A]", "Wo[H_X, A, D]",
                                      "X[B_X, T, D]", "Y[B_X, T, D]"}));
  EXPECT_EQ(specs(make_model_config("mlp", "dp", Mesh::parse("X=2"), parse_dims("B=4,T=6,D=8,F=12"))),
            (std::vector<std::string>{"W_in[D, F]", "W_out[F, D]", "X[B_X, T, D]", "Y[B_X, T, D]"}));
  EXPECT_EQ(specs(make_model_config("moe", "ep", Mesh::parse("X=2"), parse_dims("B=2,T=3,D=4,F=5,E=3,K=2"))),
            (std::vector<std::string>{"W_router[D, E]", "W_in[E_X, D, F]", "W_out[E_X, F, D]", "X[B_X, T, D]",
                                      "Y[B_X, T, D]"}));
}

TEST(ModelConfigTest, AxesByNameThenInOrder) {
  const char* dims = "B=4,T=6,D=8,F=12";
  const ModelConfig named = make_model_config("mlp", "dp+tp", Mesh::parse("tp=2,dp=3"), parse_dims(dims));
  EXPECT_EQ(named.axis_of(Strategy::tp), 0);
  EXPECT_EQ(named.axis_of(Strategy::dp), 1);
  const ModelConfig ordered = make_model_config("mlp", "dp+tp", Mesh::parse("X=3,Y=2"), parse_dims(dims));
  EXPECT_EQ(ordered.axis_of(Strategy::dp), 0);
  EXPECT_EQ(ordered.axis_of(Strategy::tp), 1);
  EXPECT_EQ(specs(ordered)[0], "W_in[D, F_Y]");
  EXPECT_EQ(specs(ordered)[2], "X[B_X, T, D]");
  const ModelConfig mixed = make_model_config("mlp", "dp+tp", Mesh::parse("X=3,tp=2"), parse_dims(dims));
  EXPECT_EQ(mixed.axis_of(Strategy::dp), 0);
  EXPECT_THROW(mixed.axis_of(Strategy::fsdp), UsageError);
}

TEST(ModelConfigTest, DerivedDimsAndMoeDefaults) {
  ModelConfig m = make_model_config("moe", "ep", Mesh::parse("X=2"), parse_dims("B=2,T=8,D=4,F=5,E=3"));
  EXPECT_EQ(m.top_k(), 1);
  EXPECT_EQ(model_program(m).dims.at("C"), 4);  // ceil(1.25 * 8 * 1 / 3)
  m.capacity_factor = 0.5;
  EXPECT_EQ(model_program(m).dims.at("C"), 2);
  const ModelConfig a = make_model_config("attention", "tp", Mesh::parse("X=2"), parse_dims("B=1,T=2,D=12,H=3"));
  const program::Graph g = model_program(a);
  EXPECT_EQ(g.dims.at("A"), 4);
  EXPECT_EQ(g.dims.at("S"), 2);
}

// No expert sees a token twice: capacity stops at the sequence's T tokens, however large the
// factor (1e19 * T * k overflowed 64 bits before).
TEST(ModelConfigTest, MoeCapacityIsAtMostTheSequence) {
  EXPECT_EQ(moe_capacity(1e19, 4, 2, 2), 4);
  EXPECT_EQ(moe_capacity(1e300, 7, 1, 3), 7);
  EXPECT_EQ(moe_capacity(1.0, 4, 2, 2), 4);  // exactly T: the cap changes nothing
  EXPECT_EQ(moe_capacity(1.25, 8, 1, 4), 3);
}

TEST(ModelConfigTest, UnevenShardsAreLegalAndParameterBytesCountDeviceZero) {
  // F=10 over 4: 3, 3, 2, 2; device 0 holds 3 columns of W_in and 3 rows of W_out.
  const ModelConfig m = make_model_config("mlp", "tp", Mesh::parse("X=4"), parse_dims("B=1,T=1,D=5,F=10"));
  ProgramOptions f32;
  f32.dtype = DType::f32;
  EXPECT_EQ(predict_program(model_program(m), f32).memory.params, (5 * 3 + 3 * 5) * 4);
  const ModelConfig dp = make_model_config("mlp", "dp", Mesh::parse("X=4"), parse_dims("B=1,T=1,D=5,F=10"));
  EXPECT_EQ(predict_program(model_program(dp), ProgramOptions{}).memory.params, 2 * 5 * 10 * 8);
}

// The printed program is the one the model runs: it parses back, pins every tensor, reads
// the options (causal mask, activation, top-K), and FSDP's weights are regathered.
TEST(ModelConfigTest, TheProgramPinsEveryTensorAndCarriesTheOptions) {
  ModelConfig m = make_model_config("block", "dp+sp", Mesh::parse("dp=2,tp=2"), parse_dims("B=4,T=6,D=8,F=12,H=2"));
  m.causal = true;
  m.activation = Activation::silu;
  const std::string text = model_program_text(m);
  EXPECT_NE(text.find("causal_mask("), std::string::npos) << text;
  EXPECT_NE(text.find("silu(h) @ W_out"), std::string::npos) << text;
  const program::Graph g = program::bind(program::parse_program(text, "block.prog"), {});
  EXPECT_EQ(g.mesh, m.mesh);
  for (const program::Tensor& t : g.tensors) {
    if (!t.temporary && &t != &g.tensors[static_cast<std::size_t>(g.loss)]) {
      EXPECT_TRUE(t.pinned.has_value()) << t.name;
    }
  }
  EXPECT_EQ(format_spec(*g.tensors[static_cast<std::size_t>(g.find("h"))].pinned, g.mesh), "h[B_dp, T, F_tp]");
  m.causal = false;
  EXPECT_EQ(model_program_text(m).find("causal_mask("), std::string::npos);

  ModelConfig moe = make_model_config("moe", "ep", Mesh::parse("X=2"), parse_dims("B=2,T=3,D=4,F=5,E=3,K=2"));
  EXPECT_NE(model_program_text(moe).find("top=2"), std::string::npos);
  const program::Graph fsdp =
      model_program(make_model_config("mlp", "fsdp", Mesh::parse("X=2"), parse_dims("B=4,T=6,D=8,F=12")));
  EXPECT_TRUE(fsdp.tensors[static_cast<std::size_t>(fsdp.find("W_in"))].regathered);
  EXPECT_TRUE(fsdp.tensors[static_cast<std::size_t>(fsdp.find("W_out"))].regathered);
}

TEST(ModelConfigTest, BadInputNamesTheTextAndTheRule) {
  const char* dims = "B=4,T=6,D=8,F=12";
  EXPECT_THAT(error_of("conv", "tp", "X=2", dims), HasSubstr("unknown layer 'conv'; the layers are"));
  EXPECT_THAT(error_of("mlp", "tq", "X=2", dims), HasSubstr("unknown strategy 'tq'"));
  EXPECT_THAT(error_of("mlp", "tp+", "X=2", dims), HasSubstr("unknown strategy ''"));
  EXPECT_THAT(error_of("mlp", "tp+tp", "X=2,Y=2", dims), HasSubstr("appears twice"));
  EXPECT_THAT(error_of("mlp", "ep", "X=2", dims), HasSubstr("layer mlp does not take strategy 'ep'; it takes tp"));
  EXPECT_THAT(error_of("moe", "tp", "X=2", "B=1,T=1,D=2,F=2,E=2"), HasSubstr("it takes ep, dp"));
  EXPECT_THAT(error_of("mlp", "dp+tp", "X=2", dims), HasSubstr("needs a mesh of 2 axes (one per strategy)"));
  EXPECT_THAT(error_of("mlp", "tp", "X=2,Y=2", dims), HasSubstr("needs a mesh of 1 axis"));
  EXPECT_THAT(error_of("mlp", "tp", "X=2", "B=4,T=6,D=8"), HasSubstr("layer mlp needs F (MLP hidden width)"));
  EXPECT_THAT(error_of("mlp", "tp", "X=2", "B=4,T=6,D=8,F=12,H=2"), HasSubstr("names H, which layer mlp does not use"));
  // parse_dims refuses 0 itself; sizes built in code are checked here.
  try {
    make_model_config("mlp", "tp", Mesh::parse("X=2"), {{"B", 0}, {"T", 6}, {"D", 8}, {"F", 12}});
    ADD_FAILURE() << "B=0 accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.headline(), HasSubstr("dims B=0: the batch must be at least 1"));
  }
  EXPECT_THAT(error_of("attention", "tp", "X=2", "B=1,T=2,D=10,H=3"), HasSubstr("H=3 does not divide D=10"));
  EXPECT_THAT(error_of("moe", "ep", "X=2", "B=1,T=2,D=4,F=4,E=2,K=3"), HasSubstr("K=3 exceeds E=2"));
}

}  // namespace
}  // namespace shardmm::nn
