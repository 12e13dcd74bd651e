#include "shardmm/nn/model.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "shardmm/core/error.h"

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

// The program's letters and their sizes, in the order the layers read them: S = T (the
// keys' positions), A = D / H, C = the experts' slots per sequence.
std::vector<std::pair<std::string, std::int64_t>> letters_of(const ModelConfig& m) {
  const DimSizes& d = m.dims;
  std::vector<std::pair<std::string, std::int64_t>> out = {{"B", d.at("B")}, {"T", d.at("T")}};
  if (d.count("H")) out.emplace_back("S", d.at("T"));
  out.emplace_back("D", d.at("D"));
  if (d.count("H")) {
    out.emplace_back("H", d.at("H"));
    out.emplace_back("A", d.at("D") / d.at("H"));
  }
  if (d.count("F")) out.emplace_back("F", d.at("F"));
  if (m.layer == LayerKind::moe) {
    out.emplace_back("E", d.at("E"));
    out.emplace_back("C", moe_capacity(m.capacity_factor, d.at("T"), m.top_k(), d.at("E")));
  }
  return out;
}

// Writes a layer's program: its leaves, then one line per computed tensor, each pinned.
class ProgramWriter {
 public:
  explicit ProgramWriter(const ModelConfig& m) : m_(m), letters_(letters_of(m)) {
    for (Strategy s : {Strategy::tp, Strategy::sp}) {
      if (m.has(s)) f_ = m.axis_of(s);
    }
    if (m.has(Strategy::sp)) s_ = m.axis_of(Strategy::sp);
    for (Strategy s : {Strategy::dp, Strategy::fsdp, Strategy::ep}) {
      if (m.has(s)) b_ = m.axis_of(s);
    }
    if (m.has(Strategy::fsdp)) fsdp_ = m.axis_of(Strategy::fsdp);
    if (m.has(Strategy::ep)) e_ = m.axis_of(Strategy::ep);
  }

  std::string text() {
    switch (m_.layer) {
      case LayerKind::mlp:
        mlp(gathered_input(), "Y", true);
        break;
      case LayerKind::attention:
        attention(gathered_input(), "Y", true);
        break;
      case LayerKind::block:
        block();
        break;
      case LayerKind::moe:
        moe();
        break;
    }
    std::string strategies, mesh, dims;
    for (Strategy s : m_.strategies) strategies += (strategies.empty() ? "" : "+") + std::string(to_string(s));
    for (const MeshAxis& a : m_.mesh.axes()) mesh += (mesh.empty() ? "" : ", ") + a.name + "=" + std::to_string(a.size);
    for (const auto& [l, size] : letters_) dims += (dims.empty() ? "" : ", ") + l + "=" + std::to_string(size);
    std::string out = "# shardmm model " + std::string(to_string(m_.layer)) + " --strategy " + strategies +
                      (m_.mesh.split_rule() == SplitRule::array
                           ? ""
                           : " (uneven shards split by --split " + std::string(to_string(m_.mesh.split_rule())) + ")") +
                      ": every tensor pinned by the strategy\nmesh " + mesh + "\ndims " + dims + "\n";
    // The leaves first: X, the params in the order the layer reads them, G.
    const auto computed = std::stable_partition(lines_.begin(), lines_.end(),
                                                [](const auto& l) { return l.first.rfind("param ", 0) == 0; });
    lines_.insert(computed, {"input " + declared("G", outer()), spec("G", outer())});
    lines_.insert(lines_.begin(), {"input " + declared("X", outer()), spec("X", outer())});
    std::size_t width = 0;
    for (const auto& [statement, pin] : lines_) width = std::max(width, statement.size());
    for (const auto& [statement, pin] : lines_)
      out += statement + std::string(width + 1 - statement.size(), ' ') + ": " + pin + "\n";
    return out + "loss sum(Y * G)\n";
  }

 private:
  using Axis = std::optional<int>;
  using Letter = std::pair<std::string, Axis>;  // a letter and the axis splitting it (none: whole)

  std::string spec(const std::string& name, const std::vector<Letter>& letters, Axis unreduced = {}) const {
    Spec s{name, {}, {}};
    for (const auto& [l, axis] : letters) s.dims.push_back({l, axis ? AxisList{*axis} : AxisList{}});
    if (unreduced) s.unreduced = {*unreduced};
    return format_spec(s, m_.mesh);
  }
  static std::string declared(const std::string& name, const std::vector<Letter>& letters) {
    std::string out = name + "[";
    for (std::size_t i = 0; i < letters.size(); ++i) out += (i ? ", " : "") + letters[i].first;
    return out + "]";
  }
  void tensor(const std::string& name, const std::vector<Letter>& letters, const std::string& expr,
              Axis unreduced = {}) {
    lines_.emplace_back(declared(name, letters) + " = " + expr, spec(name, letters, unreduced));
  }
  // FSDP's weights are stored split and `regathered`: gathered for each use, dropped after
  // the forward pass and gathered again for the backward one.
  void param(const std::string& name, const std::vector<Letter>& letters) {
    lines_.emplace_back("param " + declared(name, letters) + (fsdp_ ? " regathered" : ""), spec(name, letters));
  }

  // The residual stream (the layer's input and output): B over the batch axis, T over sp's.
  std::vector<Letter> outer() const { return {{"B", b_}, {"T", s_}, {"D", {}}}; }
  // The same, T whole: what the tensor-parallel region reads.
  std::vector<Letter> whole_t() const { return {{"B", b_}, {"T", {}}, {"D", {}}}; }
  Axis weight_split() const { return f_ ? f_ : fsdp_; }
  std::string activation() const { return to_string(m_.activation); }

  // sp: the sequence-split input gathered once for the tensor-parallel region (a copy
  // pinned whole), rather than once by each einsum that reads it.
  std::string gathered_input() {
    if (!s_) return "X";
    tensor("Xg", whole_t(), "transpose(X)");
    return "Xg";
  }

  // The row-parallel einsum: partial sums {U_f} (whole values without tp), then, as the
  // layer's output, reduced to the stream's layout by a copy pinned there (all_reduce, or
  // reduce_scatter over T under sp).
  void row_parallel(const std::string& y, const std::string& einsum, bool output) {
    if (output && f_) {
      tensor("z", whole_t(), einsum, f_);
      tensor(y, outer(), "transpose(z)");
    } else {
      tensor(y, output ? outer() : whole_t(), einsum, f_);
    }
  }

  void mlp(const std::string& x, const std::string& y, bool output) {
    param("W_in", {{"D", {}}, {"F", weight_split()}});
    param("W_out", {{"F", weight_split()}, {"D", {}}});
    tensor("h", {{"B", b_}, {"T", {}}, {"F", f_}}, x + " @ W_in");
    row_parallel(y, activation() + "(h) @ W_out", output);
  }

  void attention(const std::string& x, const std::string& y, bool output) {
    for (const char* w : {"Wq", "Wk", "Wv"}) param(w, {{"D", {}}, {"H", weight_split()}, {"A", {}}});
    param("Wo", {{"H", weight_split()}, {"A", {}}, {"D", {}}});
    const std::vector<Letter> heads = {{"B", b_}, {"T", {}}, {"H", f_}, {"A", {}}};
    const std::vector<Letter> keys = {{"B", b_}, {"S", {}}, {"H", f_}, {"A", {}}};
    const std::vector<Letter> scores = {{"B", b_}, {"H", f_}, {"T", {}}, {"S", {}}};
    tensor("q", heads, x + " @ Wq");
    tensor("kt", heads, x + " @ Wk");
    tensor("vt", heads, x + " @ Wv");
    tensor("k", keys, "rename(kt, T -> S)");
    tensor("v", keys, "rename(vt, T -> S)");
    tensor("s", scores, "q @ k");
    std::ostringstream factor;
    factor << std::setprecision(17) << 1.0 / std::sqrt(static_cast<double>(size("A")));
    const std::string scaled = "scale(s, " + factor.str() + ")";
    tensor("p", scores, "softmax(" + (m_.causal ? "causal_mask(" + scaled + ", T, S)" : scaled) + ", over=S)");
    tensor("o", heads, "p @ v");
    row_parallel(y, "o @ Wo", output);
  }

  // Pre-norm: each norm runs on the stream's layout (T/N rows under sp) and its output is
  // gathered (pinned T whole) for the tensor-parallel region; each residual add reduces its
  // branch's partial sums to the stream's layout.
  void block() {
    tensor("n1", whole_t(), "layer_norm(X, over=D)");
    attention("n1", "att", false);
    tensor("r", outer(), "X + att");
    tensor("n2", whole_t(), "layer_norm(r, over=D)");
    mlp("n2", "m", false);
    tensor("Y", outer(), "r + m");
  }

  // Each device routes and fills its own sequences' slots; ep then sends the slots to their
  // experts' devices (B split -> E split) and the experts' outputs back, by copies pinned
  // there (all_to_all each way).
  void moe() {
    const std::vector<Letter> tokens = {{"B", b_}, {"T", {}}, {"E", {}}};
    const std::vector<Letter> slots = {{"B", b_}, {"T", {}}, {"E", {}}, {"C", {}}};
    const std::vector<Letter> local = {{"B", b_}, {"E", {}}, {"C", {}}, {"D", {}}};
    const std::vector<Letter> at_experts = e_ ? std::vector<Letter>{{"B", {}}, {"E", e_}, {"C", {}}, {"D", {}}} : local;
    param("W_router", {{"D", {}}, {"E", {}}});
    param("W_in", {{"E", e_}, {"D", {}}, {"F", {}}});
    param("W_out", {{"E", e_}, {"F", {}}, {"D", {}}});
    tensor("logits", tokens, "X @ W_router");
    tensor("probs", tokens, "softmax(logits, over=E)");
    tensor("dispatch", slots, "route(probs, over=E, tokens=T, top=" + std::to_string(m_.top_k()) + ")");
    tensor(e_ ? "xb" : "xe", local, "dispatch @ X");
    if (e_) tensor("xe", at_experts, "transpose(xb)");
    tensor("h", {at_experts[0], at_experts[1], {"C", {}}, {"F", {}}}, "xe @ W_in");
    tensor("ye", at_experts, activation() + "(h) @ W_out");
    if (e_) tensor("yb", local, "transpose(ye)");
    tensor("gates", slots, "probs * dispatch");
    tensor("Y", outer(), std::string("gates @ ") + (e_ ? "yb" : "ye"));
  }

  std::int64_t size(const std::string& letter) const {
    for (const auto& [l, n] : letters_) {
      if (l == letter) return n;
    }
    throw std::logic_error("no letter " + letter);
  }

  const ModelConfig& m_;
  std::vector<std::pair<std::string, std::int64_t>> letters_;
  Axis f_, s_, b_, fsdp_, e_;
  std::vector<std::pair<std::string, std::string>> lines_;  // statement, pin
};

}  // namespace

const char* to_string(LayerKind k) {
  switch (k) {
    case LayerKind::mlp:
      return "mlp";
    case LayerKind::attention:
      return "attention";
    case LayerKind::block:
      return "block";
    case LayerKind::moe:
      return "moe";
  }
  return "?";
}

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::tp:
      return "tp";
    case Strategy::sp:
      return "sp";
    case Strategy::fsdp:
      return "fsdp";
    case Strategy::dp:
      return "dp";
    case Strategy::ep:
      return "ep";
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
    const auto it =
        std::find_if(std::begin(kStrategies), std::end(kStrategies), [&](Strategy s) { return part == to_string(s); });
    if (it == std::end(kStrategies)) {
      throw InputError("unknown strategy '" + std::string(part) + "' in " + field("strategy") + " '" +
                       std::string(text) +
                       "'; the strategies are tp, sp, fsdp, dp, ep, combined with '+' (e.g. dp+tp)");
    }
    if (std::find(out.begin(), out.end(), *it) != out.end()) {
      throw InputError("strategy '" + std::string(part) + "' appears twice in " + field("strategy") + " '" +
                       std::string(text) + "'; each strategy takes one mesh axis, so name it once");
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
    case LayerKind::mlp:
      return {"B", "T", "D", "F"};
    case LayerKind::attention:
      return {"B", "T", "D", "H"};
    case LayerKind::block:
      return {"B", "T", "D", "F", "H"};
    case LayerKind::moe:
      return {"B", "T", "D", "F", "E"};
  }
  return {};
}

std::vector<std::string> optional_dims(LayerKind layer) {
  if (layer == LayerKind::moe) return {"K"};
  return {};
}

bool ModelConfig::has(Strategy s) const {
  return std::find(strategies.begin(), strategies.end(), s) != strategies.end();
}

int ModelConfig::axis_of(Strategy s) const {
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    if (strategies[i] == s) return axes[i];
  }
  throw UsageError(std::string("the model does not use strategy ") + to_string(s));
}

std::int64_t ModelConfig::top_k() const {
  const auto k = dims.find("K");
  return k == dims.end() ? 1 : k->second;
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
                     (n == 1 ? "is" : "es") + " (one per strategy), but " + field("mesh") + " " + mesh.to_string() +
                     " has " + std::to_string(mesh.rank()) + "; e.g. " + field("mesh") + " " +
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
      throw InputError(field("dims") + " names " + name + ", which layer " + to_string(m.layer) +
                       " does not use; it takes " + joined(described));
    }
    if (size < 1) {
      throw InputError(field("dims") + " " + name + "=" + std::to_string(size) + ": the " + dim_meaning(name) +
                       " must be at least 1");
    }
  }
  for (const std::string& d : need) {
    if (!dims.count(d)) {
      throw InputError("layer " + std::string(to_string(m.layer)) + " needs " + d + " (" + dim_meaning(d) + ") in " +
                       field("dims") + "; it takes " + joined(described));
    }
  }
  m.dims = dims;
  if (dims.count("H")) {
    if (dims.at("D") % dims.at("H") != 0) {
      throw InputError("H=" + std::to_string(dims.at("H")) + " does not divide D=" + std::to_string(dims.at("D")) +
                       ": attention splits the model width into H heads of D/H each");
    }
  }
  if (m.layer == LayerKind::moe) {
    const std::int64_t k = m.top_k(), e = dims.at("E");
    if (k > e) {
      throw InputError("K=" + std::to_string(k) + " exceeds E=" + std::to_string(e) +
                       ": each token picks K distinct experts of the E");
    }
  }
  return m;
}

std::int64_t moe_capacity(double capacity_factor, std::int64_t tokens, std::int64_t top_k, std::int64_t experts) {
  if (experts < 1) throw InputError("an MoE layer needs at least one expert (E >= 1)");
  // In double: a large factor must cap at `tokens`, not overflow on the way.
  const double share = std::ceil(capacity_factor * static_cast<double>(tokens) * static_cast<double>(top_k) /
                                 static_cast<double>(experts));
  return share >= static_cast<double>(tokens) ? tokens : static_cast<std::int64_t>(share);
}

std::string model_program_text(const ModelConfig& m) { return ProgramWriter(m).text(); }

program::Graph model_program(const ModelConfig& m) {
  program::BindOptions o;
  o.mesh = m.mesh;
  o.split = m.mesh.split_rule();
  return program::bind(
      program::parse_program(model_program_text(m), "shardmm model " + std::string(to_string(m.layer))), o);
}
}  // namespace shardmm::nn
