#include "shardmm/nn/model.h"

#include <algorithm>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"

namespace shardmm::nn {
namespace {

constexpr LayerKind kLayers[] = {LayerKind::mlp, LayerKind::attention, LayerKind::block, LayerKind::moe};
constexpr Strategy kStrategies[] = {Strategy::tp, Strategy::sp, Strategy::fsdp, Strategy::dp, Strategy::ep};

std::string joined(const std::vector<std::string>& parts, const char* sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string written(const std::vector<Strategy>& s) {
  std::vector<std::string> names;
  for (Strategy x : s) names.push_back(to_string(x));
  return joined(names, "+");
}

bool same_set(std::vector<Strategy> a, std::vector<Strategy> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

// What each dimension of --dims means, for messages.
std::string dim_meaning(const std::string& name) {
  if (name == "B") return "batch";
  if (name == "T") return "sequence length";
  if (name == "D") return "model width";
  if (name == "F") return "MLP hidden width";
  if (name == "H") return "attention heads";
  if (name == "E") return "experts";
  if (name == "K") return "experts per token";
  return name;
}

// `dim` split over the strategy's axis when the config uses it: "F_tp", else "F".
std::string dim_over(const ModelConfig& m, const char* dim, std::initializer_list<Strategy> strategies) {
  for (Strategy s : strategies) {
    if (m.has(s)) return std::string(dim) + "_{" + m.mesh.axis(m.axis_of(s)).name + "}";
  }
  return dim;
}

TensorLayout layout(const ModelConfig& m, const std::string& name, const std::vector<std::string>& dims) {
  std::string text = name + "[" + joined(dims) + "]";
  TensorLayout t{name, parse_spec(text, m.mesh), {}};
  t.shape = global_shape(t.spec, m.dims);
  return t;
}

}  // namespace

const char* to_string(LayerKind k) {
  switch (k) {
    case LayerKind::mlp: return "mlp";
    case LayerKind::attention: return "attention";
    case LayerKind::block: return "block";
    case LayerKind::moe: return "moe";
  }
  return "?";
}

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::tp: return "tp";
    case Strategy::sp: return "sp";
    case Strategy::fsdp: return "fsdp";
    case Strategy::dp: return "dp";
    case Strategy::ep: return "ep";
  }
  return "?";
}

LayerKind parse_layer(std::string_view text) {
  for (LayerKind k : kLayers) {
    if (text == to_string(k)) return k;
  }
  throw InputError("unknown layer '" + std::string(text) + "'; the layers are mlp, attention, block, moe");
}

std::vector<Strategy> parse_strategies(std::string_view text) {
  std::vector<Strategy> out;
  std::size_t from = 0;
  while (true) {
    const std::size_t plus = text.find('+', from);
    const std::string_view part = text.substr(from, plus == std::string_view::npos ? text.npos : plus - from);
    const auto it = std::find_if(std::begin(kStrategies), std::end(kStrategies),
                                 [&](Strategy s) { return part == to_string(s); });
    if (it == std::end(kStrategies)) {
      throw InputError("unknown strategy '" + std::string(part) + "' in " + field("strategy") + " '" + std::string(text) +
                       "'; the strategies are tp, sp, fsdp, dp, ep, combined with '+' (e.g. dp+tp)");
    }
    if (std::find(out.begin(), out.end(), *it) != out.end()) {
      throw InputError("strategy '" + std::string(part) + "' appears twice in " + field("strategy") + " '" + std::string(text) +
                       "'; each strategy takes one mesh axis, so name it once");
    }
    out.push_back(*it);
    if (plus == std::string_view::npos) return out;
    from = plus + 1;
  }
}

std::vector<std::string> accepted_strategies(LayerKind layer) {
  if (layer == LayerKind::moe) return {"ep", "dp"};
  return {"tp", "sp", "dp", "fsdp", "dp+tp", "dp+sp"};
}

std::vector<std::string> required_dims(LayerKind layer) {
  switch (layer) {
    case LayerKind::mlp: return {"B", "T", "D", "F"};
    case LayerKind::attention: return {"B", "T", "D", "H"};
    case LayerKind::block: return {"B", "T", "D", "F", "H"};
    case LayerKind::moe: return {"B", "T", "D", "F", "E"};
  }
  return {};
}

std::vector<std::string> optional_dims(LayerKind layer) {
  if (layer == LayerKind::moe) return {"K"};
  return {};
}

bool ModelConfig::has(Strategy s) const { return std::find(strategies.begin(), strategies.end(), s) != strategies.end(); }

int ModelConfig::axis_of(Strategy s) const {
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    if (strategies[i] == s) return axes[i];
  }
  throw UsageError(std::string("the model does not use strategy ") + to_string(s));
}

MoeConfig ModelConfig::moe() const {
  const auto k = dims.find("K");
  return {k == dims.end() ? 1 : k->second, capacity_factor, mlp};
}

ModelConfig make_model_config(std::string_view layer, std::string_view strategies, const Mesh& mesh,
                              const DimSizes& dims) {
  ModelConfig m;
  m.layer = parse_layer(layer);
  m.strategies = parse_strategies(strategies);
  m.mesh = mesh;
  const std::vector<std::string> accepted = accepted_strategies(m.layer);
  const bool ok = std::any_of(accepted.begin(), accepted.end(),
                              [&](const std::string& a) { return same_set(parse_strategies(a), m.strategies); });
  if (!ok) {
    throw InputError("layer " + std::string(to_string(m.layer)) + " does not take " + field("strategy") + " '" +
                     std::string(strategies) + "'; it takes " + joined(accepted));
  }

  // Axes: by name first, then the remaining axes in declared order.
  const std::size_t n = m.strategies.size();
  if (static_cast<std::size_t>(mesh.rank()) != n) {
    throw InputError(field("strategy") + " " + written(m.strategies) + " needs a mesh of " + std::to_string(n) + " ax" +
                     (n == 1 ? "is" : "es") + " (one per strategy), but " + field("mesh") + " " + mesh.to_string() + " has " +
                     std::to_string(mesh.rank()) + "; e.g. " + field("mesh") + " " +
                     (n == 1 ? std::string(to_string(m.strategies[0])) + "=4"
                             : std::string(to_string(m.strategies[0])) + "=2," + to_string(m.strategies[1]) + "=4"));
  }
  m.axes.assign(n, -1);
  std::vector<bool> taken(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    if (const auto a = mesh.find(to_string(m.strategies[i]))) {
      m.axes[i] = *a;
      taken[static_cast<std::size_t>(*a)] = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (m.axes[i] >= 0) continue;
    const auto free = std::find(taken.begin(), taken.end(), false);
    m.axes[i] = static_cast<int>(free - taken.begin());
    *free = true;
  }

  // Dims: the layer's, each at least 1, nothing else.
  const std::vector<std::string> need = required_dims(m.layer), maybe = optional_dims(m.layer);
  std::vector<std::string> known = need;
  known.insert(known.end(), maybe.begin(), maybe.end());
  std::vector<std::string> described;
  for (const std::string& d : known) described.push_back(d + " (" + dim_meaning(d) + ")");
  for (const auto& [name, size] : dims) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      throw InputError(field("dims") + " names " + name + ", which layer " + to_string(m.layer) + " does not use; it takes " +
                       joined(described));
    }
    if (size < 1) {
      throw InputError(field("dims") + " " + name + "=" + std::to_string(size) + ": the " + dim_meaning(name) +
                       " must be at least 1");
    }
  }
  for (const std::string& d : need) {
    if (!dims.count(d)) {
      throw InputError("layer " + std::string(to_string(m.layer)) + " needs " + d + " (" + dim_meaning(d) +
                       ") in " + field("dims") + "; it takes " + joined(described));
    }
  }
  m.dims = dims;
  if (dims.count("H")) {
    if (dims.at("D") % dims.at("H") != 0) {
      throw InputError("H=" + std::to_string(dims.at("H")) + " does not divide D=" + std::to_string(dims.at("D")) +
                       ": attention splits the model width into H heads of D/H each");
    }
    m.dims["A"] = dims.at("D") / dims.at("H");
  }
  if (m.layer == LayerKind::moe) {
    const std::int64_t k = m.moe().top_k, e = dims.at("E");
    if (k > e) {
      throw InputError("K=" + std::to_string(k) + " exceeds E=" + std::to_string(e) +
                       ": each token picks K distinct experts of the E");
    }
  }
  return m;
}

std::vector<TensorLayout> parameter_layouts(const ModelConfig& m) {
  const auto model_split = {Strategy::tp, Strategy::sp, Strategy::fsdp};
  std::vector<TensorLayout> out;
  if (m.layer == LayerKind::attention || m.layer == LayerKind::block) {
    const std::string h = dim_over(m, "H", model_split);
    for (const char* w : {"Wq", "Wk", "Wv"}) out.push_back(layout(m, w, {"D", h, "A"}));
    out.push_back(layout(m, "Wo", {h, "A", "D"}));
  }
  if (m.layer == LayerKind::mlp || m.layer == LayerKind::block) {
    const std::string f = dim_over(m, "F", model_split);
    out.push_back(layout(m, "W_in", {"D", f}));
    out.push_back(layout(m, "W_out", {f, "D"}));
  }
  if (m.layer == LayerKind::moe) {
    const std::string e = dim_over(m, "E", {Strategy::ep});
    out.push_back(layout(m, "W_router", {"D", "E"}));
    out.push_back(layout(m, "W_in", {e, "D", "F"}));
    out.push_back(layout(m, "W_out", {e, "F", "D"}));
  }
  return out;
}

TensorLayout input_layout(const ModelConfig& m) {
  return layout(m, "X", {dim_over(m, "B", {Strategy::dp, Strategy::fsdp, Strategy::ep}),
                         dim_over(m, "T", {Strategy::sp}), "D"});
}

TensorLayout output_layout(const ModelConfig& m) {
  TensorLayout y = input_layout(m);
  y.name = y.spec.tensor = "Y";
  return y;
}

std::int64_t parameter_bytes_per_device(const ModelConfig& m, DType dtype) {
  std::int64_t elements = 0;
  for (const TensorLayout& t : parameter_layouts(m)) elements += local_elements(m.mesh, t.spec, t.shape, 0);
  return elements * dtype_bytes(dtype);
}

}  // namespace shardmm::nn
