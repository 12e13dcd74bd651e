// The cost model. Every formula and constant here is derived, with its source, in
// docs/cost-model.md; the comments only say which section to read.
#include "shardmm/plan/cost.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "shardmm/core/error.h"

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

HardwareProfile tpu(std::string name, std::string description, double bf16_flops, double hbm,
                    double ici_one_way) {
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
        "f64 on the FP64 tensor core; 450 GB/s NVLink egress per direction";
    h100.peak_flops = {{DType::bf16, 9.9e14}, {DType::f16, 9.9e14}, {DType::f32, 6.7e13},
                       {DType::f64, 6.7e13}};
    h100.hbm_bandwidth = 3.35e12;
    h100.link_bandwidth = 4.5e11;
    h100.bidirectional = true;
    h100.hop_latency_s = 1e-6;
    h100.topology = "switch";
    v.push_back(std::move(h100));
    return v;
  }();
  return profiles;
}

// One set of value rules for profiles from files and profiles built in code; `where` names
// the origin ("profiles/x.json" or "hardware profile 'x'").
void check_positive(double v, const std::string& where, const std::string& key, const char* unit) {
  if (!std::isfinite(v) || v <= 0) {
    throw InputError(where + ": key '" + key + "' must be a positive finite number (" + unit +
                     "), got " + show_number(v));
  }
}

void validate(const HardwareProfile& p, const std::string& where) {
  if (p.name.empty()) throw InputError(where + ": key 'name' must be a non-empty string");
  if (p.peak_flops.empty()) {
    throw InputError(where + ": key 'peak_flops' must give at least one dtype (bf16, f16, f32, f64)");
  }
  for (const auto& [dtype, flops] : p.peak_flops) {
    check_positive(flops, where, std::string("peak_flops.") + to_string(dtype), "FLOP/s");
  }
  check_positive(p.hbm_bandwidth, where, "hbm_bandwidth", "bytes/s");
  check_positive(p.link_bandwidth, where, "link_bandwidth", "bytes/s");
  if (!std::isfinite(p.hop_latency_s) || p.hop_latency_s < 0) {
    throw InputError(where + ": key 'hop_latency_s' must be a non-negative finite number (seconds), got " +
                     show_number(p.hop_latency_s));
  }
  if (p.topology != "torus" && p.topology != "switch") {
    throw InputError(where + ": key 'topology' must be 'torus' or 'switch', got '" + p.topology + "'");
  }
}

// --- collectives (docs/cost-model.md, "Collectives on a torus" and "... behind a switch") ---

struct Regimes {
  double hops = 0;       // latency-bound: hops * hop_latency_s
  double bandwidth = 0;  // bandwidth-bound: seconds
  double time(double hop_latency) const { return std::max(hops * hop_latency, bandwidth); }
};

// One ring per mesh axis, the group's axes on disjoint links (the Scaling Book, ch.3).
Regimes torus(const HardwareProfile& hw, OpKind op, const std::vector<double>& sizes, double bytes) {
  const bool bidi = hw.bidirectional;
  const double w = hw.link_bandwidth * (bidi ? 2 : 1);
  double hops = 0;
  double ring_share = 0;  // the fraction of V a device's links carry, per unit of w
  double longest = 0;
  for (double n : sizes) {
    const double h = bidi ? std::floor(n / 2) : n - 1;
    hops += h;
    ring_share = std::max(ring_share, h * (bidi ? 2 : 1) / n);
    longest = std::max(longest, n);
  }
  const auto axes = static_cast<double>(sizes.size());
  switch (op) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter: return {hops, ring_share * bytes / (axes * w)};
    case OpKind::all_reduce: return {2 * hops, 2 * ring_share * bytes / (axes * w)};
    case OpKind::all_to_all: {
      // Chunk-hops per device: every chunk (a shard of the shard, bytes / n) travels the ring
      // distance to its destination; the longest axis is the bottleneck.
      const double chunk_hops = bidi ? std::floor(longest * longest / 4) : longest * (longest - 1) / 2;
      return {hops, chunk_hops * bytes / (longest * w)};
    }
    default: break;
  }
  throw std::logic_error("torus(): not a collective");
}

// A non-blocking switch: nccl-tests' bus-bandwidth relations with busbw = link_bandwidth,
// and NCCL's ring step counts for the latency term.
Regimes switched(const HardwareProfile& hw, OpKind op, double n, double bytes) {
  const double moved = bytes * (n - 1) / n / hw.link_bandwidth;
  switch (op) {
    case OpKind::all_gather:
    case OpKind::reduce_scatter: return {n - 1, moved};
    case OpKind::all_reduce: return {2 * (n - 1), 2 * moved};
    case OpKind::all_to_all: return {1, moved};
    default: break;
  }
  throw std::logic_error("switched(): not a collective");
}

// A profile is a few hundred bytes; the cap stops a path such as /dev/zero from reading
// until memory runs out.
constexpr std::size_t kMaxProfileBytes = std::size_t{1} << 20;

// Reads the whole profile file; errors name the file.
std::string read_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(path.string() + ": cannot read hardware profile: it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path.string() + ": cannot read hardware profile: " + std::strerror(errno));
  }
  std::string text(kMaxProfileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) {
    throw InputError(path.string() + ": cannot read hardware profile: " + std::strerror(errno));
  }
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxProfileBytes) {
    throw InputError(path.string() + ": cannot read hardware profile: larger than 1 MiB; a profile is a small JSON "
                     "object (docs/cost-model.md)");
  }
  return text;
}

// nlohmann reports the 1-based byte index of the character it stopped at; we turn that into
// the line and column and quote the line with a caret.
[[noreturn]] void throw_malformed(std::string_view text, const std::string& origin,
                                  const json::parse_error& e) {
  const std::size_t at = std::min<std::size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
  const std::size_t newline = at == 0 ? std::string_view::npos : text.rfind('\n', at - 1);
  const std::size_t begin = newline == std::string_view::npos ? 0 : newline + 1;
  const std::size_t end = std::min(text.find('\n', begin), text.size());
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(begin), '\n');
  const std::size_t column = at - begin + 1;
  std::string detail = e.what();
  if (const auto colon = detail.find(": "); colon != std::string::npos) detail.erase(0, colon + 2);
  throw InputError(origin + ": malformed JSON at line " + std::to_string(line) + ", column " +
                       std::to_string(column) + ": " + detail,
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
      default: break;
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

const char* const kKeys[] = {"name",           "description",   "peak_flops", "hbm_bandwidth",
                             "link_bandwidth", "bidirectional", "hop_latency_s", "topology"};

const json& required(const json& object, const std::string& key, const std::string& origin) {
  const auto it = object.find(key);
  if (it == object.end()) {
    throw InputError(origin + ": missing key '" + key +
                     "'; a profile needs name, peak_flops, hbm_bandwidth, link_bandwidth, "
                     "bidirectional, hop_latency_s and topology");
  }
  return *it;
}

[[noreturn]] void wrong_type(const std::string& origin, const std::string& key, const char* want,
                             const json& got) {
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

}  // namespace

double HardwareProfile::flops_for(DType dtype) const {
  const auto it = peak_flops.find(dtype);
  if (it == peak_flops.end()) {
    throw InputError("profile '" + name + "' has no peak FLOP/s for " + to_string(dtype) +
                     " (it has " + dtype_names(peak_flops) + "); use another dtype, or a profile file " +
                     "that gives peak_flops." + to_string(dtype) + " (docs/cost-model.md)");
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
      throw InputError(origin + ": unknown key '" + key + "'; expected name, description, peak_flops, "
                       "hbm_bandwidth, link_bandwidth, bidirectional, hop_latency_s, topology");
    }
  }

  HardwareProfile p;
  p.name = string_value(required(doc, "name", origin), "name", origin);
  if (const auto it = doc.find("description"); it != doc.end()) p.description = string_value(*it, "description", origin);

  const json& peaks = required(doc, "peak_flops", origin);
  if (!peaks.is_object()) wrong_type(origin, "peak_flops", "an object of FLOP/s by dtype", peaks);
  for (const auto& item : peaks.items()) {
    // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& key = item.key();
    const json& value = item.value();
    const auto* dtype = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                     [&](DType d) { return key == to_string(d); });
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

  validate(p, origin);
  return p;
}

HardwareProfile load_profile(std::string_view name_or_path) {
  for (const auto& p : builtins()) {
    if (p.name == name_or_path) return p;
  }
  const std::filesystem::path path{std::string(name_or_path)};
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw InputError("unknown hardware profile '" + std::string(name_or_path) + "': not a built-in (" +
                     join_names(builtin_profile_names()) + ") and no such file");
  }
  return parse_profile_json(read_file(path), path.string());
}

double collective_time(const HardwareProfile& hw, const Mesh& mesh, OpKind op, const AxisList& group,
                       std::int64_t array_bytes) {
  if (!is_collective(op)) {
    throw std::invalid_argument(std::string("collective_time: ") + to_string(op) + " is not a collective");
  }
  if (array_bytes < 0) throw std::invalid_argument("collective_time: negative array_bytes");
  std::vector<double> sizes;  // the group's axes that have links to use
  for (std::size_t i = 0; i < group.size(); ++i) {
    const int axis = group[i];
    if (axis < 0 || axis >= mesh.rank()) {
      throw std::invalid_argument("collective_time: axis index " + std::to_string(axis) + " is not in mesh " +
                                  mesh.to_string());
    }
    if (std::find(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(i), axis) !=
        group.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw std::invalid_argument("collective_time: axis " + mesh.axis(axis).name + " repeats in the group");
    }
    if (mesh.size(axis) > 1) sizes.push_back(static_cast<double>(mesh.size(axis)));
  }
  validate(hw, "hardware profile '" + hw.name + "'");
  if (sizes.empty() || array_bytes == 0) return 0;

  const auto bytes = static_cast<double>(array_bytes);
  if (hw.topology == "switch") {
    double n = 1;
    for (double s : sizes) n *= s;
    return switched(hw, op, n, bytes).time(hw.hop_latency_s);
  }
  return torus(hw, op, sizes, bytes).time(hw.hop_latency_s);
}

double einsum_time(const HardwareProfile& hw, DType dtype, double flops, std::int64_t bytes) {
  if (!std::isfinite(flops) || flops < 0) throw std::invalid_argument("einsum_time: flops must be finite and >= 0");
  if (bytes < 0) throw std::invalid_argument("einsum_time: negative bytes");
  const double peak = hw.flops_for(dtype);
  validate(hw, "hardware profile '" + hw.name + "'");
  return std::max(flops / peak, static_cast<double>(bytes) / hw.hbm_bandwidth);
}

double local_copy_time(const HardwareProfile& hw, std::int64_t bytes) {
  if (bytes < 0) throw std::invalid_argument("local_copy_time: negative bytes");
  validate(hw, "hardware profile '" + hw.name + "'");
  return 2 * static_cast<double>(bytes) / hw.hbm_bandwidth;
}

double ring_hop_time(const HardwareProfile& hw, std::int64_t bytes) {
  if (bytes < 0) throw std::invalid_argument("ring_hop_time: negative bytes");
  validate(hw, "hardware profile '" + hw.name + "'");
  return hw.hop_latency_s + static_cast<double>(bytes) / hw.link_bandwidth;
}

std::vector<int> ring_chunks(std::int64_t members, bool bidirectional) {
  if (members < 1) throw std::invalid_argument("ring_chunks: a ring has at least one member");
  if (!bidirectional) return std::vector<int>(static_cast<std::size_t>(members), 1);
  // The shards from the left travel ceil((n-1)/2) hops, those from the right floor((n-1)/2).
  const std::int64_t from_left = members / 2, from_right = (members - 1) / 2;
  std::vector<int> chunks{1};
  for (std::int64_t s = 1; s <= from_left; ++s) chunks.push_back(1 + (s <= from_right ? 1 : 0));
  return chunks;
}

double overlapped_ring_time(const std::vector<int>& chunks, double chunk_compute_s, double hop_s) {
  if (chunks.empty()) throw std::invalid_argument("overlapped_ring_time: a ring has at least one step");
  double total = 0;
  for (std::size_t s = 0; s + 1 < chunks.size(); ++s) total += std::max(hop_s, chunks[s] * chunk_compute_s);
  return total + chunks.back() * chunk_compute_s;
}

}  // namespace shardmm
