// Hardware profiles: the built-ins, profile files read and written (docs/cost-model.md,
// "Profile files"; docs/calibration.md, "The profile"), and the value rules every profile obeys.
#include "shardmm/plan/cost.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "shardmm/core/error.h"
#include "shardmm/core/files.h"

#include "plan/profile_rules.h"

namespace shardmm {

namespace {

using json = nlohmann::json;

constexpr DType kDTypes[] = {DType::bf16, DType::f16, DType::f32, DType::f64};

// The MXU multiplies bf16; a float32-accurate matmul (XLA's BF16_BF16_F32_X6) takes six
// bf16 passes. See docs/cost-model.md, "Built-in profiles".
constexpr double kTpuF32Passes = 6;

std::string show_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string dtype_names(const std::map<DType, double>& peaks) {
  std::vector<std::string> names;
  for (const auto& [dtype, _] : peaks) names.emplace_back(to_string(dtype));
  return join_names(names);
}

HardwareProfile tpu(std::string name, std::string description, double bf16_flops, double hbm, double ici_one_way) {
  HardwareProfile p;
  p.name = std::move(name);
  p.description = std::move(description);
  p.peak_flops = {{DType::bf16, bf16_flops}, {DType::f32, bf16_flops / kTpuF32Passes}};
  p.hbm_bandwidth = hbm;
  p.link_bandwidth = ici_one_way;
  p.bidirectional = true;
  p.hop_latency_s = 1e-6;
  p.topology = "torus";
  return p;
}

const std::vector<HardwareProfile>& builtins() {
  static const std::vector<HardwareProfile> profiles = [] {
    std::vector<HardwareProfile> v;
    v.push_back(tpu("tpu-v5e",
                    "Google TPU v5e, one chip per device, 2D torus of ICI links (Scaling Book "
                    "ch.2 'TPU specs'); f32 = bf16 / 6 (six bf16 MXU passes); no f16 or f64 peak",
                    1.97e14, 8.1e11, 4.5e10));
    v.push_back(tpu("tpu-v5p",
                    "Google TPU v5p, one chip per device, 3D torus of ICI links (Scaling Book "
                    "ch.2 'TPU specs'); f32 = bf16 / 6 (six bf16 MXU passes); no f16 or f64 peak",
                    4.59e14, 2.8e12, 9e10));
    v.push_back(tpu("tpu-v6e",
                    "Google TPU v6e (Trillium), one chip per device, 2D torus of ICI links "
                    "(Scaling Book ch.2 'TPU specs'); f32 = bf16 / 6 (six bf16 MXU passes); no "
                    "f16 or f64 peak",
                    9.2e14, 1.6e12, 9e10));
    HardwareProfile h100;
    h100.name = "h100";
    h100.description =
        "NVIDIA H100 SXM in an 8-GPU NVLink 4 node behind NVSwitches (Scaling Book 'How to "
        "Think About GPUs'; NVIDIA datasheet): dense bf16/f16 tensor core, f32 on CUDA cores, "
        "f64 on the FP64 tensor core; 450 GB/s NVLink egress per direction; nodes joined by "
        "InfiniBand, one 400 Gbps NIC (50 GB/s each way) per GPU (Scaling Book 'Beyond the node level')";
    h100.peak_flops = {{DType::bf16, 9.9e14}, {DType::f16, 9.9e14}, {DType::f32, 6.7e13}, {DType::f64, 6.7e13}};
    h100.hbm_bandwidth = 3.35e12;
    h100.link_bandwidth = 4.5e11;
    h100.bidirectional = true;
    h100.hop_latency_s = 1e-6;
    h100.topology = "switch";
    h100.node_devices = 8;
    h100.scaleout_bandwidth = 5e10;
    h100.scaleout_latency_s = 5e-6;
    v.push_back(std::move(h100));
    return v;
  }();
  return profiles;
}

// One set of value rules for profiles from files and profiles built in code; `where` names
// the file or the profile in the error. The rules' words are built only for a value that
// breaks them: the cost formulas check their profile on every call (detail::check_profile).
void check_positive(double v, const std::string& where, const std::string& key, const char* unit) {
  if (!std::isfinite(v) || v <= 0) {
    throw InputError(where + ": key '" + key + "' must be a positive finite number (" + unit + "), got " +
                     show_number(v));
  }
}

// A rate (FLOP/s, bytes/s) divides work into a time: below 1 per second the times it gives
// run past any clock (5e-324 bytes/s makes every transfer infinite).
bool is_rate(double v) { return std::isfinite(v) && v >= 1; }
std::string rate_rule(const std::string& key, const char* unit, double v) {
  return "key '" + key + "' must be a finite rate of at least 1 " + unit + ", got " + show_number(v);
}
void check_rate(double v, const std::string& where, const std::string& key, const char* unit) {
  if (!is_rate(v)) throw InputError(where + ": " + rate_rule(key, unit, v));
}
bool is_latency(double v) { return std::isfinite(v) && v >= 0 && v <= 1; }
std::string latency_rule(const std::string& key, double v) {
  return "key '" + key + "' must be a number of seconds from 0 to 1 (a hop takes microseconds), got " + show_number(v);
}

// A profile is a few hundred bytes; the cap stops a path such as /dev/zero from reading
// until memory runs out.
constexpr std::size_t kMaxProfileBytes = std::size_t{1} << 20;

// Reads the whole profile file; errors name the file.
std::string read_file(const std::filesystem::path& path) {
  return read_small_file(path, kMaxProfileBytes, path.string() + ": cannot read hardware profile",
                         "larger than 1 MiB; a profile is a small JSON object (docs/cost-model.md)");
}

// nlohmann reports the 1-based byte index of the character it stopped at; we turn that into
// the line and column and quote the line with a caret.
[[noreturn]] void throw_malformed(std::string_view text, const std::string& origin, const json::parse_error& e) {
  const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
  const std::size_t newline = at == 0 ? std::string_view::npos : text.rfind('\n', at - 1);
  const std::size_t begin = newline == std::string_view::npos ? 0 : newline + 1;
  const std::size_t end = std::min(text.find('\n', begin), text.size());
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(begin), '\n');
  const std::size_t column = at - begin + 1;
  std::string detail = e.what();
  if (const auto colon = detail.find(": "); colon != std::string::npos) detail.erase(0, colon + 2);
  throw InputError(origin + ": malformed JSON at line " + std::to_string(line) + ", column " + std::to_string(column) +
                       ": " + detail,
                   text.substr(begin, end - begin), at - begin);
}

// Parses `text`, rejecting a key repeated within one object (nlohmann would keep the last).
json parse_json(std::string_view text, const std::string& origin) {
  std::vector<std::set<std::string>> seen;
  std::vector<std::string> path;
  std::string last_key;
  const json::parser_callback_t check_keys = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        seen.emplace_back();
        path.push_back(last_key);
        break;
      case json::parse_event_t::object_end:
        seen.pop_back();
        path.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        if (!seen.back().insert(last_key).second) {
          std::string dotted;
          for (const auto& p : path) dotted += p.empty() ? "" : p + ".";
          throw InputError(origin + ": key '" + dotted + last_key + "' appears twice; each key may appear once");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check_keys);
  } catch (const json::parse_error& e) {
    throw_malformed(text, origin, e);
  } catch (const json::exception& e) {
    std::string detail = e.what();
    if (const auto bracket = detail.find("] "); bracket != std::string::npos) detail.erase(0, bracket + 2);
    throw InputError(origin + ": malformed JSON: " + detail);
  }
}

const char* const kKeys[] = {"name",          "description",   "peak_flops", "hbm_bandwidth", "link_bandwidth",
                             "bidirectional", "hop_latency_s", "topology",   "node_devices", "scaleout_bandwidth",
                             "scaleout_latency_s", "calibration"};

const json& required(const json& object, const std::string& key, const std::string& origin) {
  const auto it = object.find(key);
  if (it == object.end()) {
    throw InputError(origin + ": missing key '" + key +
                     "'; a profile needs name, peak_flops, hbm_bandwidth, link_bandwidth, "
                     "bidirectional, hop_latency_s and topology");
  }
  return *it;
}

[[noreturn]] void wrong_type(const std::string& origin, const std::string& key, const char* want, const json& got) {
  throw InputError(origin + ": key '" + key + "' must be " + want + ", got " + got.type_name());
}

double number_value(const json& v, const std::string& key, const std::string& origin) {
  if (!v.is_number()) wrong_type(origin, key, "a number", v);
  return v.get<double>();
}

std::string string_value(const json& v, const std::string& key, const std::string& origin) {
  if (!v.is_string()) wrong_type(origin, key, "a string", v);
  return v.get<std::string>();
}

// --- the "calibration" object (docs/calibration.md, "Profile") ---

// A sub-object of the calibration: every key known (`keys`, or `optional` ones that
// profiles written by older versions lack), every one of `keys` present. `where` is its
// dotted path ("calibration.collectives[0]").
void check_object(const json& object, const std::string& where, const std::vector<std::string>& keys,
                  const std::string& origin, const std::vector<std::string>& optional = {}) {
  if (!object.is_object()) wrong_type(origin, where, "an object", object);
  for (const auto& item : object.items()) {
    const auto known = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), item.key()) != names.end();
    };
    if (!known(keys) && !known(optional)) {
      std::vector<std::string> all = keys;
      all.insert(all.end(), optional.begin(), optional.end());
      throw InputError(origin + ": unknown key '" + where + "." + item.key() + "'; expected " + join_names(all));
    }
  }
  for (const std::string& key : keys) {
    if (!object.contains(key)) {
      throw InputError(origin + ": missing key '" + where + "." + key + "'; it needs " + join_names(keys));
    }
  }
}

double positive_value(const json& object, const std::string& where, const std::string& key, const char* unit,
                      const std::string& origin) {
  const double v = number_value(object.at(key), where + "." + key, origin);
  check_positive(v, origin, where + "." + key, unit);
  return v;
}

double rate_value(const json& object, const std::string& where, const std::string& key, const char* unit,
                  const std::string& origin) {
  const double v = number_value(object.at(key), where + "." + key, origin);
  check_rate(v, origin, where + "." + key, unit);
  return v;
}

double non_negative_value(const json& object, const std::string& where, const std::string& key,
                          const std::string& origin) {
  const double v = number_value(object.at(key), where + "." + key, origin);
  if (!std::isfinite(v) || v < 0) {
    throw InputError(origin + ": key '" + where + "." + key + "' must be a non-negative finite number, got " +
                     show_number(v));
  }
  return v;
}

std::int64_t whole_value(const json& object, const std::string& where, const std::string& key, std::int64_t least,
                         const std::string& origin) {
  const json& v = object.at(key);
  if (!v.is_number_integer() || v.get<std::int64_t>() < least) {
    throw InputError(origin + ": key '" + where + "." + key + "' must be a whole number >= " + std::to_string(least) +
                     ", got " + (v.is_number() ? v.dump() : std::string(v.type_name())));
  }
  return v.get<std::int64_t>();
}

constexpr OpKind kCollectives[] = {OpKind::all_gather, OpKind::reduce_scatter, OpKind::all_reduce, OpKind::all_to_all};

Calibration parse_calibration(const json& doc, const std::string& origin) {
  check_object(doc, "calibration",
               {"backend", "mesh", "host", "measured_at", "copy_bandwidth", "add_bandwidth", "collectives", "gemm"},
               origin,
               {"gather_ring_overlap", "scatter_ring_overlap", "einsum_call_s", "ring_handoff_s",
                "local_seconds_per_element", "copy_bandwidths"});
  Calibration c;
  c.backend = string_value(doc.at("backend"), "calibration.backend", origin);
  if (c.backend != "threads" && c.backend != "mpi") {
    throw InputError(origin + ": key 'calibration.backend' names the backend measured, threads or mpi, got '" +
                     c.backend + "'");
  }
  c.mesh = string_value(doc.at("mesh"), "calibration.mesh", origin);
  c.host = string_value(doc.at("host"), "calibration.host", origin);
  c.measured_at = string_value(doc.at("measured_at"), "calibration.measured_at", origin);
  c.copy_bandwidth = rate_value(doc, "calibration", "copy_bandwidth", "bytes/s", origin);
  c.add_bandwidth = rate_value(doc, "calibration", "add_bandwidth", "bytes/s", origin);
  if (doc.contains("copy_bandwidths")) {
    const json& rates = doc.at("copy_bandwidths");
    if (!rates.is_array()) wrong_type(origin, "calibration.copy_bandwidths", "an array", rates);
    for (std::size_t i = 0; i < rates.size(); ++i) {
      const std::string where = "calibration.copy_bandwidths[" + std::to_string(i) + "]";
      check_object(rates[i], where, {"bytes", "bandwidth"}, origin);
      Calibration::SizedRate r{whole_value(rates[i], where, "bytes", 1, origin),
                               rate_value(rates[i], where, "bandwidth", "bytes/s", origin)};
      if (!c.copy_bandwidths.empty() && r.bytes <= c.copy_bandwidths.back().bytes) {
        throw InputError(origin + ": key '" + where +
                         ".bytes' must be larger than the entry's before it (sizes ascend), got " +
                         std::to_string(r.bytes));
      }
      c.copy_bandwidths.push_back(r);
    }
  }
  for (auto [key, field] : {std::pair{"gather_ring_overlap", &c.gather_ring_overlap},
                            std::pair{"scatter_ring_overlap", &c.scatter_ring_overlap}}) {
    if (!doc.contains(key)) continue;
    *field = non_negative_value(doc, "calibration", key, origin);
    if (*field > 1) {
      throw InputError(origin + ": key 'calibration." + key + "' is a share of the ring's transfers, 0 to 1, got " +
                       show_number(*field));
    }
  }
  for (auto [key, field] :
       {std::pair{"einsum_call_s", &c.einsum_call_s}, std::pair{"ring_handoff_s", &c.ring_handoff_s}}) {
    if (!doc.contains(key)) continue;
    *field = non_negative_value(doc, "calibration", key, origin);
    if (*field > 1) {
      throw InputError(origin + ": key 'calibration." + key +
                       "' is the fixed cost of one step in seconds, 0 to 1 (steps take microseconds), got " +
                       show_number(*field));
    }
  }
  const json& fits = doc.at("collectives");
  if (!fits.is_array()) wrong_type(origin, "calibration.collectives", "an array", fits);
  for (std::size_t i = 0; i < fits.size(); ++i) {
    const std::string where = "calibration.collectives[" + std::to_string(i) + "]";
    check_object(fits[i], where,
                 {"op", "group_size", "alpha_s", "beta_s_per_byte", "min_bytes", "max_bytes", "max_rel_residual"},
                 origin);
    CollectiveFit f;
    const std::string op = string_value(fits[i].at("op"), where + ".op", origin);
    const auto* known =
        std::find_if(std::begin(kCollectives), std::end(kCollectives), [&](OpKind k) { return op == to_string(k); });
    if (known == std::end(kCollectives)) {
      throw InputError(origin + ": key '" + where +
                       ".op' must be all_gather, reduce_scatter, all_reduce or "
                       "all_to_all, got '" +
                       op + "'");
    }
    f.op = *known;
    f.group_size = static_cast<int>(
        std::min<std::int64_t>(whole_value(fits[i], where, "group_size", 2, origin), std::int64_t{1} << 30));
    f.alpha_s = non_negative_value(fits[i], where, "alpha_s", origin);
    f.beta_s_per_byte = non_negative_value(fits[i], where, "beta_s_per_byte", origin);
    f.min_bytes = whole_value(fits[i], where, "min_bytes", 1, origin);
    f.max_bytes = whole_value(fits[i], where, "max_bytes", f.min_bytes, origin);
    f.max_rel_residual = non_negative_value(fits[i], where, "max_rel_residual", origin);
    for (const CollectiveFit& g : c.collectives) {
      if (g.op == f.op && g.group_size == f.group_size && f.min_bytes <= g.max_bytes && g.min_bytes <= f.max_bytes) {
        throw InputError(origin + ": " + where + " overlaps another " + op + " fit on group size " +
                         std::to_string(f.group_size) + " (" + std::to_string(g.min_bytes) + ".." +
                         std::to_string(g.max_bytes) +
                         " bytes); the fits of one collective and group size "
                         "cover disjoint size ranges");
      }
    }
    c.collectives.push_back(f);
  }
  const json& rates = doc.at("gemm");
  if (!rates.is_array()) wrong_type(origin, "calibration.gemm", "an array", rates);
  for (std::size_t i = 0; i < rates.size(); ++i) {
    const std::string where = "calibration.gemm[" + std::to_string(i) + "]";
    check_object(rates[i], where, {"dtype", "shape", "m", "n", "k", "intensity", "flops_per_s"}, origin);
    GemmRate g;
    const std::string dtype = string_value(rates[i].at("dtype"), where + ".dtype", origin);
    const auto* known =
        std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](DType d) { return dtype == to_string(d); });
    if (known == std::end(kDTypes)) {
      throw InputError(origin + ": key '" + where + ".dtype' must be one of bf16, f16, f32, f64, got '" + dtype + "'");
    }
    g.dtype = *known;
    g.shape = string_value(rates[i].at("shape"), where + ".shape", origin);
    g.m = whole_value(rates[i], where, "m", 1, origin);
    g.n = whole_value(rates[i], where, "n", 1, origin);
    g.k = whole_value(rates[i], where, "k", 1, origin);
    g.intensity = positive_value(rates[i], where, "intensity", "FLOP/byte", origin);
    g.flops_per_s = rate_value(rates[i], where, "flops_per_s", "FLOP/s", origin);
    c.gemm.push_back(g);
  }
  if (const auto it = doc.find("local_seconds_per_element"); it != doc.end()) {
    const std::string where = "calibration.local_seconds_per_element";
    if (!it->is_object()) wrong_type(origin, where, "an object", *it);
    for (const auto& [name, rates] : it->items()) {
      const std::string& dtype = name;  // clang cannot capture a structured binding
      const auto* known =
          std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](DType d) { return dtype == to_string(d); });
      if (known == std::end(kDTypes)) {
        throw InputError(origin + ": key '" + where + "." + dtype + "' must be a dtype: bf16, f16, f32 or f64");
      }
      if (!rates.is_object()) wrong_type(origin, where + "." + dtype, "an object", rates);
      auto& into = c.local_seconds_per_element[*known];
      for (const auto& item : rates.items()) {
        const double v = positive_value(rates, where + "." + dtype, item.key(), "seconds per element", origin);
        if (v > 1) {
          throw InputError(origin + ": key '" + where + "." + dtype + "." + item.key() +
                           "' is seconds per element, above 0 and at most 1 (kernels take nanoseconds), got " +
                           show_number(v));
        }
        into[item.key()] = v;
      }
    }
  }
  return c;
}

json calibration_json(const Calibration& c) {
  json fits = json::array();
  for (const CollectiveFit& f : c.collectives) {
    fits.push_back({{"op", to_string(f.op)},
                    {"group_size", f.group_size},
                    {"alpha_s", f.alpha_s},
                    {"beta_s_per_byte", f.beta_s_per_byte},
                    {"min_bytes", f.min_bytes},
                    {"max_bytes", f.max_bytes},
                    {"max_rel_residual", f.max_rel_residual}});
  }
  json rates = json::array();
  for (const GemmRate& g : c.gemm) {
    rates.push_back({{"dtype", to_string(g.dtype)},
                     {"shape", g.shape},
                     {"m", g.m},
                     {"n", g.n},
                     {"k", g.k},
                     {"intensity", g.intensity},
                     {"flops_per_s", g.flops_per_s}});
  }
  json copies = json::array();
  for (const Calibration::SizedRate& r : c.copy_bandwidths)
    copies.push_back({{"bytes", r.bytes}, {"bandwidth", r.bandwidth}});
  json doc = {{"backend", c.backend},
              {"mesh", c.mesh},
              {"host", c.host},
              {"measured_at", c.measured_at},
              {"copy_bandwidth", c.copy_bandwidth},
              {"add_bandwidth", c.add_bandwidth},
              {"copy_bandwidths", copies},
              {"gather_ring_overlap", c.gather_ring_overlap},
              {"scatter_ring_overlap", c.scatter_ring_overlap},
              {"einsum_call_s", c.einsum_call_s},
              {"ring_handoff_s", c.ring_handoff_s},
              {"collectives", fits},
              {"gemm", rates}};
  for (const auto& [dtype, by_key] : c.local_seconds_per_element) {
    doc["local_seconds_per_element"][to_string(dtype)] = by_key;
  }
  return doc;
}

}  // namespace

std::optional<std::string> detail::profile_problem(const HardwareProfile& p) {
  if (p.name.empty()) return "key 'name' must be a non-empty string";
  if (std::any_of(p.name.begin(), p.name.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return "key 'name' must be one line of printable text (it heads reports), without control characters such as a "
           "newline";
  }
  if (p.peak_flops.empty()) return "key 'peak_flops' must give at least one dtype (bf16, f16, f32, f64)";
  for (const auto& [dtype, flops] : p.peak_flops) {
    if (!is_rate(flops)) return rate_rule(std::string("peak_flops.") + to_string(dtype), "FLOP/s", flops);
  }
  if (!is_rate(p.hbm_bandwidth)) return rate_rule("hbm_bandwidth", "bytes/s", p.hbm_bandwidth);
  if (!is_rate(p.link_bandwidth)) return rate_rule("link_bandwidth", "bytes/s", p.link_bandwidth);
  if (!is_latency(p.hop_latency_s)) return latency_rule("hop_latency_s", p.hop_latency_s);
  if (p.topology != "torus" && p.topology != "switch") {
    return "key 'topology' must be 'torus' or 'switch', got '" + p.topology + "'";
  }
  if (p.node_devices < 0) {
    return "key 'node_devices' must be a whole number >= 0 (the devices one switch joins; 0: one node), got " +
           std::to_string(p.node_devices);
  }
  if (p.node_devices > 0) {
    if (p.topology != "switch") {
      return "key 'node_devices' needs topology 'switch' (a torus has no nodes: its axes are its links), got '" +
             p.topology + "'";
    }
    if (!is_rate(p.scaleout_bandwidth)) return rate_rule("scaleout_bandwidth", "bytes/s", p.scaleout_bandwidth);
    if (!is_latency(p.scaleout_latency_s)) return latency_rule("scaleout_latency_s", p.scaleout_latency_s);
  }
  return std::nullopt;
}

void detail::validate_profile(const HardwareProfile& p, const std::string& where) {
  if (const std::optional<std::string> problem = profile_problem(p)) throw InputError(where + ": " + *problem);
}

void detail::check_profile(const HardwareProfile& p) {
  if (const std::optional<std::string> problem = profile_problem(p))
    throw InputError("hardware profile '" + p.name + "': " + *problem);
}

double HardwareProfile::flops_for(DType dtype) const {
  const auto it = peak_flops.find(dtype);
  if (it == peak_flops.end()) {
    throw InputError("profile '" + name + "' has no peak FLOP/s for " + to_string(dtype) + " (it has " +
                     dtype_names(peak_flops) + "); use another dtype, or a profile file " + "that gives peak_flops." +
                     to_string(dtype) + " (docs/cost-model.md)");
  }
  return it->second;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtins()) names.push_back(p.name);
  return names;
}

HardwareProfile builtin_profile(std::string_view name) {
  for (const auto& p : builtins()) {
    if (p.name == name) return p;
  }
  throw InputError("unknown built-in hardware profile '" + std::string(name) + "'; expected one of " +
                   join_names(builtin_profile_names()));
}

HardwareProfile parse_profile_json(std::string_view json_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  if (json_text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw InputError(origin + ": the profile is empty; a hardware profile is a JSON object (docs/cost-model.md)");
  }
  const json doc = parse_json(json_text, origin);
  if (!doc.is_object()) {
    throw InputError(origin + ": a hardware profile must be a JSON object, got " + doc.type_name());
  }
  for (const auto& [key, _] : doc.items()) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      throw InputError(origin + ": unknown key '" + key +
                       "'; expected name, description, peak_flops, hbm_bandwidth, link_bandwidth, bidirectional, "
                       "hop_latency_s, topology, node_devices, scaleout_bandwidth, scaleout_latency_s, calibration");
    }
  }

  HardwareProfile p;
  p.name = string_value(required(doc, "name", origin), "name", origin);
  if (const auto it = doc.find("description"); it != doc.end())
    p.description = string_value(*it, "description", origin);

  const json& peaks = required(doc, "peak_flops", origin);
  if (!peaks.is_object()) wrong_type(origin, "peak_flops", "an object of FLOP/s by dtype", peaks);
  for (const auto& item : peaks.items()) {
    // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& key = item.key();
    const json& value = item.value();
    const auto* dtype =
        std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](DType d) { return key == to_string(d); });
    if (dtype == std::end(kDTypes)) {
      throw InputError(origin + ": key 'peak_flops' has unknown dtype '" + key +
                       "'; expected one of bf16, f16, f32, f64");
    }
    p.peak_flops[*dtype] = number_value(value, "peak_flops." + key, origin);
  }

  p.hbm_bandwidth = number_value(required(doc, "hbm_bandwidth", origin), "hbm_bandwidth", origin);
  p.link_bandwidth = number_value(required(doc, "link_bandwidth", origin), "link_bandwidth", origin);
  const json& bidi = required(doc, "bidirectional", origin);
  if (!bidi.is_boolean()) wrong_type(origin, "bidirectional", "true or false", bidi);
  p.bidirectional = bidi.get<bool>();
  p.hop_latency_s = number_value(required(doc, "hop_latency_s", origin), "hop_latency_s", origin);
  p.topology = string_value(required(doc, "topology", origin), "topology", origin);
  if (const auto it = doc.find("node_devices"); it != doc.end()) {
    if (!it->is_number_integer()) wrong_type(origin, "node_devices", "a whole number", *it);
    // Clamped, not wrapped: a count past any machine still reads as "more than the mesh".
    p.node_devices = it->is_number_unsigned() ? static_cast<std::int64_t>(std::min<std::uint64_t>(
                                                    it->get<std::uint64_t>(), std::uint64_t{1} << 62))
                                              : it->get<std::int64_t>();
  }
  // The scale-out network's figures come exactly with nodes: one without the other is a profile
  // half written (validate_profile says what a negative node_devices means).
  for (auto [key, field] : {std::pair{"scaleout_bandwidth", &p.scaleout_bandwidth},
                            std::pair{"scaleout_latency_s", &p.scaleout_latency_s}}) {
    const auto it = doc.find(key);
    if (p.node_devices > 0 && it == doc.end()) {
      throw InputError(origin + ": missing key '" + key +
                       "'; a profile with node_devices needs scaleout_bandwidth and scaleout_latency_s");
    }
    if (p.node_devices == 0 && it != doc.end()) {
      throw InputError(origin + ": key '" + key +
                       "' needs node_devices above 0 (the scale-out network joins nodes; without them every device "
                       "is behind one switch)");
    }
    if (it != doc.end()) *field = number_value(*it, key, origin);
  }
  if (const auto it = doc.find("calibration"); it != doc.end()) p.calibration = parse_calibration(*it, origin);

  detail::validate_profile(p, origin);
  return p;
}

std::string profile_to_json(const HardwareProfile& hw) {
  json peaks = json::object();
  for (const auto& [dtype, flops] : hw.peak_flops) peaks[to_string(dtype)] = flops;
  json doc = {{"name", hw.name},
              {"description", hw.description},
              {"peak_flops", peaks},
              {"hbm_bandwidth", hw.hbm_bandwidth},
              {"link_bandwidth", hw.link_bandwidth},
              {"bidirectional", hw.bidirectional},
              {"hop_latency_s", hw.hop_latency_s},
              {"topology", hw.topology}};
  if (hw.node_devices > 0) {
    doc["node_devices"] = hw.node_devices;
    doc["scaleout_bandwidth"] = hw.scaleout_bandwidth;
    doc["scaleout_latency_s"] = hw.scaleout_latency_s;
  }
  if (hw.calibration) doc["calibration"] = calibration_json(*hw.calibration);
  return doc.dump(2) + "\n";
}

std::string calibrated_profile_path() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (const std::string explicit_path = env("SHARDMM_PROFILE"); !explicit_path.empty()) return explicit_path;
  if (const std::string xdg = env("XDG_CONFIG_HOME"); !xdg.empty()) return xdg + "/shardmm/calibrated.json";
  if (const std::string home = env("HOME"); !home.empty()) return home + "/.config/shardmm/calibrated.json";
  return "";
}
HardwareProfile load_profile(std::string_view name_or_path) {
  for (const auto& p : builtins()) {
    if (p.name == name_or_path) return p;
  }
  if (name_or_path == kCalibratedProfileName) {
    const std::string path = calibrated_profile_path();
    std::error_code ec;
    if (path.empty() || !std::filesystem::exists(path, ec)) {
      throw InputError("no calibrated hardware profile" +
                       (path.empty() ? std::string(" (HOME is not set)") : " at " + path) +
                       "; run 'shardmm calibrate' first, or set SHARDMM_PROFILE to a profile file "
                       "(docs/calibration.md)");
    }
    return parse_profile_json(read_file(path), path);
  }
  const std::filesystem::path path{std::string(name_or_path)};
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw InputError("unknown hardware profile '" + std::string(name_or_path) + "': not a built-in (" +
                     join_names(builtin_profile_names()) + ") and no such file");
  }
  return parse_profile_json(read_file(path), path.string());
}

}  // namespace shardmm
