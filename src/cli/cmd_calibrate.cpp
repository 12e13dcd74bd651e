// shardmm calibrate [--backend threads|mpi] [--mesh M] [--out FILE] [--quick] [--gemm-spread F] [--json]
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <iostream>
#include <memory>
#include <ostream>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "shardmm/core/error.h"
#include "shardmm/core/files.h"
#include "shardmm/nn/local_rates.h"
#include "shardmm/runtime/calibrate.h"
#include "shardmm/runtime/runner.h"

namespace shardmm::cli {

namespace {

// One device per core (threads), or one per process of the job (mpi).
std::string default_mesh(const std::string& backend) {
  if (!backend_capabilities(backend).ranks_in_one_process) {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
      if (const char* v = std::getenv(var)) return "X=" + std::string(v);
    }
    return "X=1";
  }
  return "X=" + std::to_string(std::max(2u, std::thread::hardware_concurrency()));
}

// The profile's file, checked before anything is measured (its directory may not exist yet:
// the default one is created on first use).
std::filesystem::path output_path(const std::optional<std::string>& out) {
  if (out && out->empty()) throw InputError("--out '': give the profile's file name, e.g. --out profile.json");
  const std::string path = out ? *out : calibrated_profile_path();
  if (path.empty()) {
    throw InputError(
        "nowhere to write the calibrated profile: HOME, XDG_CONFIG_HOME and SHARDMM_PROFILE are unset; "
        "give --out FILE");
  }
  if (std::filesystem::path(path).has_parent_path() &&
      !std::filesystem::exists(std::filesystem::path(path).parent_path())) {
    return path;
  }
  check_writable_file(path, out ? "--out '" + path + "'" : "the calibrated profile '" + path + "'");
  return path;
}

void print_calibration(std::ostream& out, const CalibrationResult& r, const std::string& path, bool quick) {
  const HardwareProfile& hw = r.profile;
  const Calibration& c = *hw.calibration;
  out << "Calibrated " << c.host << ": " << c.backend << " backend, mesh " << c.mesh << (quick ? ", --quick" : "")
      << ", " << c.measured_at << "\n";
  out << "  profile   " << hw.name << " written to " << path << "\n";
  out << "            plan and run use it when no --hw is given (or with --hw calibrated)\n";
  out << "\nGEMM, per rank with every rank computing at once\n";
  Table gemm({"dtype", "shape", "m x n x k", "FLOP/byte", "rate"});
  for (const GemmRate& g : c.gemm) {
    gemm.add({to_string(g.dtype), g.shape,
              std::to_string(g.m) + " x " + std::to_string(g.n) + " x " + std::to_string(g.k), format_sig3(g.intensity),
              format_flop_rate(g.flops_per_s)});
  }
  gemm.right_align(3);
  gemm.right_align(4);
  gemm.print(out);
  if (r.gemm_passes == 2) {
    out << "  (the mean of two passes, before and after the collectives; they differed by up to "
        << format_sig3(100 * r.gemm_drift) << "%)\n";
  } else {
    out << "  (the median of three passes: the two before and after the collectives differed by up to "
        << format_sig3(100 * r.gemm_drift) << "%, so a third was taken; this machine's speed is not steady,\n"
        << "   and predictions carry that much uncertainty: bench matmul's speed check tells how fast it runs then)\n";
  }
  out << "\nMemory, per rank: memcpy " << format_bandwidth(c.copy_bandwidth) << ", y += x "
      << format_bandwidth(c.add_bandwidth) << " (bytes read + written)\n";
  out << "\nCollectives: time = alpha + beta x bytes (least squares, relative error; docs/calibration.md)\n";
  Table fits({"op", "ranks", "alpha", "1/beta", "sizes", "max residual"});
  for (const CollectiveFit& f : c.collectives) {
    fits.add({to_string(f.op), std::to_string(f.group_size), format_time(f.alpha_s),
              f.beta_s_per_byte > 0 ? format_bandwidth(1 / f.beta_s_per_byte) : "-",
              format_bytes(static_cast<double>(f.min_bytes)) + " .. " + format_bytes(static_cast<double>(f.max_bytes)),
              format_sig3(100 * f.max_rel_residual) + "%"});
  }
  for (std::size_t col : {1, 2, 3, 5}) fits.right_align(col);
  fits.print(out);
  out << "\nFixed costs: tiny steps through the executor, beyond the model's time for them (docs/calibration.md, "
         "'Fixed costs')\n";
  Table fixed({"step", "contraction", "dims", "measured", "model without", "per call"});
  for (const FixedCostSample& s : r.fixed_costs) {
    fixed.add({to_string(s.op), s.expression, format_sizes(s.sizes), format_time(s.measured_s),
               format_time(s.predicted_s), format_time(s.per_call_s) + (s.calls == 1 ? "" : " / hop")});
  }
  for (std::size_t col : {3, 4, 5}) fixed.right_align(col);
  fixed.print(out);
  out << "  einsum_call_s " << format_time(c.einsum_call_s) << " per local GEMM call, ring_handoff_s "
      << format_time(c.ring_handoff_s) << " per ring hop (the mean of the two rings)\n";
  out << "\nCollective matmul rings vs their serialized twins (medians; docs/calibration.md, 'Ring overlap')\n";
  Table rings({"ring", "contraction", "dims", "ring", "serialized", "ratio", "model: hidden..exposed", "overlap"});
  for (const RingOverlapSample& s : r.rings) {
    rings.add({to_string(s.ring), s.expression, format_sizes(s.sizes), format_time(s.ring_s),
               format_time(s.serialized_s), format_sig3(s.ring_s / s.serialized_s),
               format_sig3(s.predicted_hidden) + " .. " + format_sig3(s.predicted_exposed),
               format_sig3(100 * s.overlap) + "%"});
  }
  for (std::size_t col : {3, 4, 5, 6, 7}) rings.right_align(col);
  rings.print(out);
  out << "  (overlap: the share of a ring's transfers the model hides behind its GEMMs, fitted to the measured "
         "ratio)\n";
  out << "\nLocal functions: seconds per element read or written, on one device (docs/calibration.md, 'Local "
         "functions');\n  a local step takes the slower of this and its bytes over the y += x bandwidth\n";
  std::set<std::string> keys;
  for (const auto& [dtype, rates] : c.local_seconds_per_element) {
    for (const auto& [key, rate] : rates) keys.insert(key);
  }
  Table local({"function", "f32", "f64"});
  const auto rate_of = [&](DType dtype, const std::string& key) -> std::string {
    const auto d = c.local_seconds_per_element.find(dtype);
    if (d == c.local_seconds_per_element.end() || !d->second.contains(key)) return "-";
    return format_sig3(1e9 * d->second.at(key)) + " ns";
  };
  for (const std::string& key : keys) local.add({key, rate_of(DType::f32, key), rate_of(DType::f64, key)});
  local.right_align(1);
  local.right_align(2);
  local.print(out);
  out << "  (one run on this machine as it is now; a busy machine shifts every figure: calibrate again when it "
         "changes)\n";
}

}  // namespace

Command add_calibrate_command(CLI::App& root) {
  struct Flags {
    std::string backend = "threads";
    std::string mesh;
    std::optional<std::string> out;
    bool quick = false;
    bool json = false;
    double gemm_spread = CalibrateOptions{}.gemm_steady_spread;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "calibrate",
      "measure this machine (GEMM rates, memory bandwidth, each collective's latency and per-byte cost, "
      "how much of a collective matmul ring's transfers the backend hides, each local function's time per "
      "element) "
      "and write the hardware profile that plan and run then use");
  app->add_option("--backend", flags->backend,
                  "the backend to measure the collectives of: threads (default) or mpi (under mpirun -n <devices>), "
                  "e.g. --backend mpi");
  app->add_option("--mesh", flags->mesh,
                  "the mesh to measure on: every mesh axis alone and all axes together give the group sizes fitted "
                  "(default X=<cores> on threads, X=<processes> under mpirun), e.g. --mesh X=2,Y=2");
  app->add_option(
      "--out", flags->out,
      "the profile file to write (default: $SHARDMM_PROFILE, else $XDG_CONFIG_HOME/shardmm/calibrated.json, "
      "else ~/.config/shardmm/calibrated.json: the one plan and run load by default), e.g. --out "
      "my-host.json");
  app->add_flag("--quick", flags->quick,
                "fewer sizes and trials and smaller GEMMs: seconds instead of about a minute, and rougher figures, "
                "e.g. --quick");
  app->add_option("--gemm-spread", flags->gemm_spread,
                  "take a third GEMM pass, and keep each shape's median of three, when the passes before and after "
                  "the collectives differ by this fraction or more (default 0.1; 0 always takes it), e.g. "
                  "--gemm-spread 0.05");
  add_json_flag(*app, flags->json);
  app->footer(
      "Progress goes to stderr; under mpirun only rank 0 prints and writes the file.\n"
      "The profile is JSON (docs/json-schema.md, 'Calibrated profile files'); --hw FILE reads one written with "
      "--out.\n\n"
      "Examples:\n"
      "  shardmm calibrate --quick\n"
      "  shardmm calibrate --mesh X=2,Y=2 --out profiles/my-host.json\n"
      "  mpirun -n 4 shardmm calibrate --backend mpi --mesh X=4\n\n" +
      std::string(kDocsHint) + " docs/calibration.md (calibration).");
  return {app, [flags](std::ostream& out) {
            CalibrateOptions o;
            o.backend = flags->backend;
            if (!(flags->gemm_spread >= 0) || !std::isfinite(flags->gemm_spread)) {
              throw InputError("--gemm-spread " + format_given(flags->gemm_spread) +
                               ": must be a fraction >= 0 (0.1: a third GEMM pass when the two differ by 10% or more)");
            }
            o.gemm_steady_spread = flags->gemm_spread;
            o.mesh = parse_mesh(flags->mesh.empty() ? default_mesh(flags->backend) : flags->mesh);
            o.quick = flags->quick;
            check_backend(o.backend, o.mesh);
            const std::filesystem::path path = output_path(flags->out);
            o.progress = [](const std::string& what) { std::cerr << "shardmm: calibrate " + what + "\n"; };
            CalibrationResult r = calibrate(o);
            if (!r.is_root) return 0;
            // The local functions' kernels run on one device of this process: autodiff's and nn's
            // work, which runtime's calibration cannot call.
            for (DType dtype : {DType::f32, DType::f64}) {
              o.progress(std::string("local functions' rates, ") + to_string(dtype));
              nn::LocalRateOptions local;
              if (o.quick) {  // seconds, not half a minute: blocks that fit in cache, one pass
                local.repeats = 1;
                local.block_bytes = nn::kQuickLocalRateBlockBytes;
              }
              r.profile.calibration->local_seconds_per_element[dtype] = nn::measure_local_rates(dtype, local);
            }
            const std::string text = profile_to_json(r.profile);
            write_file_atomically(path, text, "cannot write the calibrated profile to '" + path.string() + "'", true);
            if (!flags->json) {
              print_calibration(out, r, path.string(), o.quick);
              return 0;
            }
            Json doc;
            doc["profile_path"] = path.string();
            doc["profile"] = Json::parse(text);
            doc["gemm_drift"] = r.gemm_drift;
            doc["gemm_passes"] = r.gemm_passes;
            doc["samples"] = Json::array();
            for (const CollectiveSample& s : r.samples) {
              doc["samples"].push_back({{"op", to_string(s.op)},
                                        {"group_size", s.group_size},
                                        {"bytes", s.bytes},
                                        {"measured_s", s.measured_s},
                                        {"fit_input_s", s.fit_input_s},
                                        {"fitted_s", s.fitted_s}});
            }
            doc["fixed_costs"] = Json::array();
            for (const FixedCostSample& s : r.fixed_costs) {
              doc["fixed_costs"].push_back({{"op", to_string(s.op)},
                                            {"expression", s.expression},
                                            {"dims", s.sizes},
                                            {"measured_s", s.measured_s},
                                            {"predicted_s", s.predicted_s},
                                            {"calls", s.calls},
                                            {"per_call_s", s.per_call_s}});
            }
            doc["rings"] = Json::array();
            for (const RingOverlapSample& s : r.rings) {
              doc["rings"].push_back({{"op", to_string(s.ring)},
                                      {"expression", s.expression},
                                      {"dims", s.sizes},
                                      {"ring_s", s.ring_s},
                                      {"serialized_s", s.serialized_s},
                                      {"predicted_hidden", s.predicted_hidden},
                                      {"predicted_exposed", s.predicted_exposed},
                                      {"overlap", s.overlap}});
            }
            out << doc.dump(2) << "\n";
            return 0;
          }};
}

}  // namespace shardmm::cli
