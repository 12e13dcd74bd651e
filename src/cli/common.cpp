#include "cli/common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <set>
#include <sstream>

#include <unistd.h>

#include "shardmm/core/error.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::cli {

namespace {

// An option whose absence differs from an empty value (`--dims ''` is an error, not "unset").
CLI::Option* add_optional(CLI::App& app, const std::string& name, std::optional<std::string>& value,
                          const std::string& help) {
  return app.add_option_function<std::string>(
      name, [&value](const std::string& text) { value = text; }, help);
}

}  // namespace

void add_mesh_flag(CLI::App& app, std::string& mesh) {
  app.add_option("--mesh", mesh,
                 "device mesh: named axes NAME=SIZE in order, e.g. --mesh X=4,Y=2 (8 devices; device ids "
                 "are row-major, first axis major)")
      ->required();
}

void add_split_flag(CLI::App& app, std::string& split) { app.add_option("--split", split, kSplitHelp); }

void add_rings_flag(CLI::App& app, bool& rings) {
  app.add_flag("--rings", rings,
               "let einsums run as the planner's collective matmul rings (a collective overlapped with the "
               "einsum), where a ring's backward costs what the unfused pair's does: reduce_scatter rings, and "
               "all_gather rings of a regathered operand or one no backward reads (docs/programs.md), e.g. --rings");
}

void add_dims_flag(CLI::App& app, std::optional<std::string>& dims, bool required) {
  auto* option = add_optional(app, "--dims", dims,
                              "size of every dimension named in the specs, e.g. --dims I=8192,J=4096,K=16384");
  if (required) option->required();
}

void add_dtype_flag(CLI::App& app, std::optional<std::string>& dtype, std::string_view default_rule) {
  // A command that computes data presets its dtype; a planning one takes make_planning's rule.
  const std::string rule = !default_rule.empty() ? std::string(default_rule)
                           : dtype               ? *dtype
                                                 : "f32 on a calibrated profile (measured on this machine), else bf16";
  add_optional(app, "--dtype", dtype, "element type: bf16, f16, f32 or f64, e.g. --dtype f32 (default: " + rule + ")");
}

void add_hw_flag(CLI::App& app, std::optional<std::string>& hw) {
  add_optional(app, "--hw", hw,
               "hardware profile: a built-in name (" + join(builtin_profile_names(), ", ") +
                   "), 'calibrated' (what 'shardmm calibrate' measured: the default when it has run) or a JSON "
                   "profile file, e.g. --hw h100 or --hw profiles/example-cpu.json");
}

void add_json_flag(CLI::App& app, bool& json) {
  app.add_flag("--json", json, "print one JSON document instead of text (docs/json-schema.md), e.g. --json");
}

void add_planning_flags(CLI::App& app, PlanningFlags& flags, bool dims_required) {
  add_mesh_flag(app, flags.mesh);
  add_split_flag(app, flags.split);
  add_dims_flag(app, flags.dims, dims_required);
  add_dtype_flag(app, flags.dtype);
  add_hw_flag(app, flags.hw);
  add_optional(app, "--mem-limit", flags.mem_limit,
               "memory per device that a plan may use, e.g. --mem-limit 16GiB (also 512MiB, 1.5GB, 1e9 = "
               "bytes; units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  app.add_option("--tie-margin", flags.tie_margin,
                 "candidates predicted within this fraction of the cheapest one's time are a near tie, which goes to "
                 "the one whose devices synchronize least often (collectives, ring steps), e.g. --tie-margin 0.02 "
                 "(default 0: the cheapest)");
  add_json_flag(app, flags.json);
  app.add_flag("--show", flags.show, "draw how each tensor's blocks lie on the mesh devices, e.g. --show");
}

Planning make_planning(const PlanningFlags& flags) {
  Planning p;
  p.mesh = parse_mesh(flags.mesh, flags.split);
  if (flags.dims) p.sizes = parse_dims(*flags.dims);
  p.default_hw = !flags.hw;
  // Without --hw: the calibrated profile when one exists (a broken one is an error, not
  // silently skipped), else the command's fallback.
  const std::string calibrated_path = calibrated_profile_path();
  std::error_code ec;
  const bool have_calibrated = !calibrated_path.empty() && std::filesystem::exists(calibrated_path, ec);
  const std::string hw = flags.hw          ? *flags.hw
                         : have_calibrated ? std::string(kCalibratedProfileName)
                                           : std::string(flags.fallback_hw ? flags.fallback_hw : kDefaultProfile);
  const std::vector<std::string> builtins = builtin_profile_names();
  p.calibrated = hw == kCalibratedProfileName;
  p.hw_source = std::find(builtins.begin(), builtins.end(), hw) != builtins.end() ? "built-in"
                : p.calibrated                                                    ? calibrated_path
                                                                                  : hw;
  p.options.hw = load_profile(hw);
  p.default_dtype = !flags.dtype;
  // The default dtype is bf16, except on a calibrated profile: measured on this machine,
  // whose runs compute in f32 or f64, it has no bf16 rate.
  p.options.dtype = flags.dtype ? parse_dtype(*flags.dtype) : p.options.hw.calibration ? DType::f32 : kDefaultDType;
  if (flags.mem_limit) p.options.mem_limit_bytes = parse_byte_size(*flags.mem_limit, field("mem_limit"));
  if (!(flags.tie_margin >= 0 && flags.tie_margin <= 1)) {
    throw InputError("--tie-margin " + format_given(flags.tie_margin) +
                     ": must be a fraction from 0 to 1 (0.02: plans predicted within 2% of the cheapest are a tie)");
  }
  p.options.tie_margin = flags.tie_margin;
  return p;
}

Mesh parse_mesh(std::string_view text, std::string_view split) { return parse_mesh(text, parse_split_rule(split)); }

Mesh parse_mesh(std::string_view text, SplitRule split) {
  Mesh mesh = Mesh::parse(text, split);
  if (mesh.device_count() > kMaxDevices) {
    throw InputError("mesh " + mesh.to_string() + " has " + std::to_string(mesh.device_count()) +
                     " devices; shardmm handles meshes of up to " + std::to_string(kMaxDevices) +
                     " devices (2^24), since it costs every device's shard");
  }
  return mesh;
}

void check_backend(const std::string& backend, const Mesh& mesh) {
  const std::vector<std::string> backends = available_backends();
  if (std::find(backends.begin(), backends.end(), backend) == backends.end()) {
    throw InputError("unknown backend '" + backend + "'; this build has: " + join(backends, ", "));
  }
  if (backend_capabilities(backend).ranks_in_one_process && mesh.device_count() > kMaxThreadRanks) {
    throw InputError("mesh " + mesh.to_string() + " has " + std::to_string(mesh.device_count()) +
                     " devices; the threads backend runs one thread per device and takes up to " +
                     std::to_string(kMaxThreadRanks) + " (larger meshes run on the mpi backend, under mpirun)");
  }
}

namespace {

struct Unit {
  const char* name;
  double bytes;
};
constexpr Unit kByteUnits[] = {
    {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12},
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::int64_t parse_byte_size(std::string_view text, std::string_view flag) {
  const std::string forms =
      "; write a byte count such as 16GiB, 512MiB, 1.5GB or 1e9 (bytes), with an optional unit B, KiB, MiB, "
      "GiB, TiB, KB, MB, GB or TB";
  const auto fail = [&](const std::string& why, std::size_t pos, std::size_t len) {
    throw InputError("bad " + std::string(flag) + " '" + std::string(text) + "': " + why + forms, text, pos,
                     std::max<std::size_t>(len, 1));
  };
  std::size_t pos = 0;
  while (pos < text.size() && text[pos] == ' ') ++pos;
  if (pos == text.size()) throw InputError("empty " + std::string(flag) + forms);
  if (text[pos] == '-') fail("a byte size must be positive", pos, 1);
  // [digits][.digits][e[+-]digits], at least one digit before the exponent.
  const std::size_t start = pos;
  std::size_t mantissa_digits = 0;
  while (pos < text.size() && is_digit(text[pos])) ++pos, ++mantissa_digits;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos, ++mantissa_digits;
  }
  if (mantissa_digits == 0) fail("no number before the unit", start, text.size() - start);
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    std::size_t e = pos + 1;
    if (e < text.size() && (text[e] == '+' || text[e] == '-')) ++e;
    const std::size_t digits_from = e;
    while (e < text.size() && is_digit(text[e])) ++e;
    if (e == digits_from) fail("the exponent has no digits", pos, e - pos);
    pos = e;
  }
  const std::string number(text.substr(start, pos - start));
  const double value = std::strtod(number.c_str(), nullptr);
  while (pos < text.size() && text[pos] == ' ') ++pos;
  std::size_t end = text.size();
  while (end > pos && text[end - 1] == ' ') --end;
  const std::string_view unit = text.substr(pos, end - pos);
  double scale = 1;
  if (!unit.empty()) {
    const auto* u =
        std::find_if(std::begin(kByteUnits), std::end(kByteUnits), [&](const Unit& x) { return unit == x.name; });
    if (u == std::end(kByteUnits)) fail("unknown unit '" + std::string(unit) + "'", pos, unit.size());
    scale = u->bytes;
  }
  const double bytes = std::round(value * scale);
  if (!(bytes >= 1)) fail("a byte size must be at least 1 byte", start, end - start);
  if (bytes >= 9.2e18) fail("more bytes than a signed 64-bit count holds", start, end - start);
  return static_cast<std::int64_t>(bytes);
}

// --- units ---

std::string format_sig3(double v) {
  if (v == 0) return "0";
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(v))));
  const int decimals = std::max(0, 2 - magnitude);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string format_error(double v) {
  std::ostringstream s;
  s << std::setprecision(3) << v;
  return s.str();
}

std::string format_given(double v) {
  std::ostringstream s;  // the shortest form of up to 6 significant digits
  s << v;
  return s.str();
}

namespace {

// v scaled to the largest unit (stepping by `step`) that keeps it >= 1.
std::string scaled(double v, double step, const std::vector<const char*>& units) {
  std::size_t i = 0;
  while (i + 1 < units.size() && std::fabs(v) >= step) {
    v /= step;
    ++i;
  }
  return format_sig3(v) + " " + units[i];
}

}  // namespace

std::string format_bytes(double bytes) {
  if (std::fabs(bytes) < 1024) return std::to_string(static_cast<long long>(bytes)) + " B";
  return scaled(bytes, 1024, {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"});
}

std::string format_bytes_exact(std::int64_t bytes) {
  const std::string shown = format_bytes(static_cast<double>(bytes));
  return bytes < 1024 ? shown : shown + " (" + std::to_string(bytes) + " B)";
}

std::string format_time(double s) {
  if (s == 0) return "0 s";
  if (s < 1e-9) return "< 1 ns";
  if (s < 1e-6) return format_sig3(s * 1e9) + " ns";
  if (s < 1e-3) return format_sig3(s * 1e6) + " µs";
  if (s < 1) return format_sig3(s * 1e3) + " ms";
  return format_sig3(s) + " s";
}

std::string format_flops(double flops) {
  return scaled(flops, 1000, {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"});
}

std::string format_flop_rate(double flops_s) {
  return scaled(flops_s, 1000, {"FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s", "EFLOP/s"});
}

std::string format_bandwidth(double bytes_s) {
  return scaled(bytes_s, 1000, {"B/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s"});
}

// --- text ---

std::size_t display_width(std::string_view text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

Table::Table(std::vector<std::string> header, std::string indent) : indent_(std::move(indent)) {
  right_.assign(header.size(), false);
  rows_.push_back(std::move(header));
}

void Table::add(std::vector<std::string> row) {
  row.resize(rows_.front().size());
  rows_.push_back(std::move(row));
}

void Table::right_align(std::size_t column) { right_.at(column) = true; }

void Table::print(std::ostream& out) const {
  std::vector<std::size_t> widths(rows_.front().size(), 0);
  for (const auto& row : rows_) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], display_width(row[c]));
  }
  for (const auto& row : rows_) {
    std::string line = indent_;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - display_width(row[c]), ' ');
      const bool last = c + 1 == row.size();
      if (right_[c]) {
        line += pad + row[c];
      } else {
        line += row[c];
        if (!last) line += pad;
      }
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
}

std::string wrap(std::string_view text, std::size_t width, std::string_view indent) {
  // Words, with a number kept together with the unit after it ("1.40 ms", "45.0 GB/s").
  std::vector<std::string> words;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = std::min(text.find(' ', pos), text.size());
    const std::string word(text.substr(pos, end - pos));
    const bool after_number =
        !words.empty() && !words.back().empty() && words.back().find_first_not_of("0123456789.") == std::string::npos;
    if (after_number && !word.empty() && display_width(word) <= 8) {
      words.back() += " " + word;
    } else if (!word.empty()) {
      words.push_back(word);
    }
    pos = end + 1;
  }
  std::string out, line;
  for (const std::string& word : words) {
    if (!line.empty() && display_width(line) + 1 + display_width(word) > width) {
      out += line + "\n" + std::string(indent);
      line.clear();
    }
    if (!line.empty()) line += " ";
    line += word;
  }
  return out + line;
}

std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

std::string format_sizes(const DimSizes& sizes) {
  std::vector<std::string> parts;
  for (const auto& [name, size] : sizes) parts.push_back(name + "=" + std::to_string(size));
  return join(parts, ", ");
}

void print_hardware(std::ostream& out, const Planning& p) {
  const HardwareProfile& hw = p.options.hw;
  std::string origin = p.hw_source == "built-in" ? "built-in" : "from " + p.hw_source;
  if (p.default_hw) {
    origin +=
        p.calibrated ? ", the calibrated default; choose another with --hw" : ", the default; choose another with --hw";
  }
  out << "  hardware  " << hw.name << " (" << origin << ")\n";
  if (!hw.description.empty()) out << "            " << wrap(hw.description, 88, "            ") << "\n";
  std::vector<std::string> peaks;
  for (const auto& [dtype, flops] : hw.peak_flops) peaks.push_back(format_flop_rate(flops) + " " + to_string(dtype));
  const std::string figures = "peak " + join(peaks, ", ") + "; HBM " + format_bandwidth(hw.hbm_bandwidth) + "; links " +
                              format_bandwidth(hw.link_bandwidth) +
                              (hw.bidirectional ? " each way (bidirectional)" : " one way") + "; " + hw.topology +
                              "; " + format_time(hw.hop_latency_s) + " per hop" +
                              (hw.node_devices > 0 ? "; " + std::to_string(hw.node_devices) +
                                                         " devices per node; between nodes " +
                                                         format_bandwidth(hw.scaleout_bandwidth) +
                                                         " each way per device, " +
                                                         format_time(hw.scaleout_latency_s) + " per hop"
                                                   : std::string());
  out << "            " << wrap(figures, 88, "            ") << "\n";
  if (hw.calibration) {
    std::set<int> group_sizes;
    for (const CollectiveFit& f : hw.calibration->collectives) group_sizes.insert(f.group_size);
    std::vector<std::string> sizes;
    for (int n : group_sizes) sizes.push_back(std::to_string(n));
    // A profile measured before calibrate had the fixed costs reads them as 0: say nothing then.
    const Calibration& cal = *hw.calibration;
    const std::string fixed_costs = cal.einsum_call_s > 0 || cal.ring_handoff_s > 0
                                        ? ", each GEMM call " + format_time(cal.einsum_call_s) +
                                              " more and each ring hop's hand-off " + format_time(cal.ring_handoff_s) +
                                              " (calibration.md, 'Fixed costs')"
                                        : std::string();
    out << "            "
        << wrap("calibrated on the " + hw.calibration->backend +
                    " backend: collectives by measured alpha-beta fit on " + join(sizes, ", ") +
                    " ranks (other sizes by the formulas above); einsums at the measured GEMM "
                    "rate for their shape" +
                    fixed_costs,
                88, "            ")
        << "\n";
  }
}

// --- JSON ---

Json mesh_json(const Mesh& mesh) {
  Json j = Json::object();
  for (const MeshAxis& a : mesh.axes()) j[a.name] = a.size;
  return j;
}

std::string describe_mesh(const Mesh& mesh) {
  return mesh.to_string() + " (" + std::to_string(mesh.device_count()) +
         (mesh.device_count() == 1 ? " device" : " devices") +
         (mesh.split_rule() == SplitRule::array ? "" : "; --split " + std::string(to_string(mesh.split_rule()))) + ")";
}

void add_mesh_json(Json& doc, const Mesh& mesh) {
  doc["mesh"] = mesh_json(mesh);
  doc["split"] = to_string(mesh.split_rule());
}

Json dims_json(const DimSizes& sizes) {
  Json j = Json::object();
  for (const auto& [name, size] : sizes) j[name] = size;
  return j;
}

namespace {

Json axes_json(const Mesh& mesh, const AxisList& axes) {
  Json j = Json::array();
  for (int a : axes) j.push_back(mesh.axis(a).name);
  return j;
}

Json dim_name(const Spec& spec, int dim) {
  if (dim < 0 || dim >= spec.rank()) return nullptr;
  return spec.dims[static_cast<std::size_t>(dim)].name;
}

}  // namespace

void add_run_confidence(Confidence& confidence, std::int64_t ranks, std::int64_t cores, const HardwareProfile& hw,
                        bool other_hardware, double time_s) {
  if (ranks > cores) {
    confidence.add(std::to_string(ranks) + " ranks take turns on " + std::to_string(cores) +
                       " cores: waits for a core are not in the model",
                   kModelBand * time_s);
  }
  if (other_hardware && !hw.calibration) {
    confidence.add("the profile " + hw.name + " models other hardware, not this machine", kModelBand * time_s);
  }
}

void print_confidence(std::ostream& out, const std::vector<Confidence>& confidence) {
  if (std::none_of(confidence.begin(), confidence.end(), [](const Confidence& c) { return c.low(); })) return;
  out << "  low confidence (docs/cost-model.md, 'Confidence'): the step's time may be off by about what is given\n";
  for (std::size_t i = 0; i < confidence.size(); ++i) {
    const Confidence& c = confidence[i];
    if (!c.low()) continue;
    const std::string head = "    step " + std::to_string(i + 1) + ", ±" + format_time(c.uncertainty_s) + ": ";
    out << head << wrap(join(c.why, "; "), 100 - head.size(), std::string(head.size(), ' ')) << "\n";
  }
}

void add_confidence_json(Json& step, const Confidence& c) {
  if (!c.low()) return;
  step["confidence"] = "low";
  step["why"] = c.why;
  step["uncertainty_s"] = c.uncertainty_s;
}

Json step_json(const Step& s, const Mesh& mesh) {
  Json j;
  j["op"] = op_name(s);
  j["axes"] = axes_json(mesh, s.axes);
  j["tensor"] = s.tensor;
  const Spec& dim_of = s.op == OpKind::einsum_reduce_scatter ? s.to : s.ring_operand == 1 ? s.from_b : s.from;
  j["dim"] = s.op == OpKind::einsum ? Json(nullptr) : dim_name(dim_of, s.dim);
  j["dst_dim"] = s.op == OpKind::all_to_all ? dim_name(s.from, s.dst_dim) : Json(nullptr);
  j["from"] = format_spec(s.from, mesh);
  j["from_b"] = multiplies(s.op) ? Json(format_spec(s.from_b, mesh)) : Json(nullptr);
  j["to"] = format_spec(s.to, mesh);
  j["bytes_per_device"] = std::max(s.bytes_sent, s.bytes_received);
  j["bytes_sent"] = s.bytes_sent;
  j["bytes_received"] = s.bytes_received;
  j["flops"] = s.flops;
  j["time_s"] = s.time_s;
  j["bound"] = s.bound == Bound::none ? Json(nullptr) : Json(to_string(s.bound));
  add_confidence_json(j, s.confidence);
  if (is_collective_matmul(s.op)) {
    Json ring;
    ring["operand"] = s.op == OpKind::all_gather_einsum ? Json(s.ring_operand == 0 ? "a" : "b") : Json(nullptr);
    ring["contracted"] = gathers_contracted(s);
    ring["bidirectional"] = s.bidirectional;
    ring["steps"] = s.ring_steps;
    ring["comm_time_s"] = s.comm_time_s;
    ring["compute_time_s"] = s.compute_time_s;
    j["ring"] = ring;
  } else {
    j["ring"] = nullptr;
  }
  return j;
}

Json plan_json(const Plan& plan, const Mesh& mesh) {
  Json j;
  j["description"] = plan.description;
  j["steps"] = Json::array();
  for (const Step& s : plan.steps) j["steps"].push_back(step_json(s, mesh));
  j["output"] = format_spec(plan.output, mesh);
  j["comm_time_s"] = plan.comm_time_s;
  j["compute_time_s"] = plan.compute_time_s;
  j["total_time_s"] = plan.total_time_s;
  j["overlapped_time_s"] = plan.overlapped_time_s;
  j["peak_bytes_per_device"] = plan.peak_bytes_per_device;
  j["fits_memory"] = plan.fits_memory;
  j["synchronizations"] = synchronizations(plan);
  return j;
}

ProgressLine::ProgressLine(double quiet_s, bool terminal_only)
    : tty_(isatty(2) != 0), silent_(terminal_only && !tty_), quiet_s_(quiet_s) {}

void ProgressLine::show(const std::string& what) {
  const auto now = std::chrono::steady_clock::now();
  if (silent_ || std::chrono::duration<double>(now - start_).count() < quiet_s_) return;
  const std::string phase = what.substr(0, what.find(' '));
  if (shown_ && phase == phase_ && now - last_ < std::chrono::milliseconds(tty_ ? 100 : 1000)) return;
  phase_ = phase;
  last_ = now;
  shown_ = true;
  // One write: a line written in pieces can be split by another process's output.
  std::cerr << std::string(tty_ ? "\r\033[K" : "") + "shardmm: " + what + (tty_ ? "" : "\n") << std::flush;
}

void ProgressLine::clear() {
  if (tty_ && shown_) std::cerr << "\r\033[K" << std::flush;
  shown_ = false;
}

}  // namespace shardmm::cli
