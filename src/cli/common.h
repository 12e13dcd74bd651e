// Pieces shared by the shardmm subcommands: the command registry, the planning flags
// (mesh, dims, dtype, hardware, memory limit), units, plain-text tables and the JSON
// writers for steps and plans (docs/json-schema.md).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/mesh.h"
#include "shardmm/core/spec.h"
#include "shardmm/plan/cost.h"
#include "shardmm/plan/planner.h"
#include "shardmm/plan/step.h"

namespace shardmm::cli {

// Key order is part of the documented schema, so documents keep insertion order.
using Json = nlohmann::ordered_json;

// A subcommand: its CLI11 app and what it does once its flags are parsed. `run` writes
// the command's whole output to `out`, a buffer that run_cli (cli.h) passes on to its own
// `out` only when `run` returns, so a failing command leaves that stream empty.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(std::ostream& out)> run;
};

// Where the documentation lives, for --help footers.
inline constexpr const char* kDocsHint =
    "Docs: docs/cli.md (commands), docs/notation.md (specs), docs/json-schema.md (--json), "
    "docs/cost-model.md (costs).";
// What --split chooses, for the help of the commands that take it.
inline constexpr const char* kSplitHelp =
    "how a mesh axis splits a dimension it does not divide: 'array' as numpy.array_split, the first n mod p "
    "blocks one longer (10 over 4: 3,3,2,2; the default), or 'chunk' as torch.chunk and PyTorch DTensor's "
    "Shard, blocks of ceil(n/p) with the last ones short or empty (10 over 4: 3,3,3,1), e.g. --split chunk";
// The notation in two lines, for --help footers.
inline constexpr const char* kNotationHint =
    "Notation: A[I_X, J_Y] shards I over mesh axis X and J over Y; a bare dimension is replicated;\n"
    "I_XY (or I_{dp,tp}) splits I over X then Y; {U_X} marks partial sums over X; an axis shards one dimension.\n"
    "Or the letters, then a JAX PartitionSpec or DTensor placements: A[I, J] = P('X', None), A[I, J] = [Shard(0)].";

// --- flags shared by the planning commands ---

struct PlanningFlags {
  std::string mesh;
  std::string split = "array";           // --split: how the mesh splits uneven dimensions
  std::optional<std::string> dims;       // unset when --dims is not given
  std::optional<std::string> dtype;      // unset: bf16
  std::optional<std::string> hw;         // unset: the calibrated profile if there is one, else fallback_hw
  const char* fallback_hw = nullptr;     // null: kDefaultProfile
  std::optional<std::string> mem_limit;  // unset: no limit
  double tie_margin = PlanOptions{}.tie_margin;
  bool json = false;
  bool show = false;
};

inline constexpr const char* kDefaultProfile = "tpu-v5e";
inline constexpr DType kDefaultDType = DType::bf16;

// One flag each, with its help text (an example included).
void add_mesh_flag(CLI::App& app, std::string& mesh);
void add_split_flag(CLI::App& app, std::string& split);
void add_rings_flag(CLI::App& app, bool& rings);
void add_dims_flag(CLI::App& app, std::optional<std::string>& dims, bool required);
// `default_rule` says what the command takes without --dtype; empty: the preset value of
// `dtype`, else make_planning's (f32 on a calibrated profile, else bf16).
void add_dtype_flag(CLI::App& app, std::optional<std::string>& dtype, std::string_view default_rule = {});
void add_hw_flag(CLI::App& app, std::optional<std::string>& hw);
void add_json_flag(CLI::App& app, bool& json);
// All of the above (--split too) plus --mem-limit and --show.
void add_planning_flags(CLI::App& app, PlanningFlags& flags, bool dims_required);

// The parsed planning context.
struct Planning {
  Mesh mesh;
  DimSizes sizes;
  PlanOptions options;
  bool default_dtype = true;
  bool default_hw = true;
  std::string hw_source;    // "built-in" or the profile file's path
  bool calibrated = false;  // the profile came from calibrated_profile_path() (--hw calibrated or the default)
};

Planning make_planning(const PlanningFlags& flags);

// The most devices a mesh may have: planning and `check` visit every device, which takes
// about a second per million devices.
inline constexpr std::int64_t kMaxDevices = std::int64_t{1} << 24;
// Mesh::parse, and the device limit.
Mesh parse_mesh(std::string_view text, SplitRule split = SplitRule::array);
// parse_mesh with --split's text.
Mesh parse_mesh(std::string_view text, std::string_view split);

// The threads backend runs one thread per device on this machine; past about a thousand
// threads the run is slow and its memory grows with the square of the device count.
inline constexpr std::int64_t kMaxThreadRanks = 1024;
// Rejects a backend this build lacks, and a mesh too large for the threads backend.
void check_backend(const std::string& backend, const Mesh& mesh);

// "16GiB", "512 MiB", "1e9", "1.5GB": bytes (rounded to the nearest byte). Throws InputError
// naming the text and the accepted forms; `flag` names the option in the message.
std::int64_t parse_byte_size(std::string_view text, std::string_view flag);

// --- units: three significant digits, binary units for bytes, SI for rates ---

std::string format_bytes(double bytes);              // 512 B, 8.00 MiB, 1.50 GiB
std::string format_bytes_exact(std::int64_t bytes);  // 60 B, 16.0 GiB (17179869184 B)
std::string format_time(double seconds);             // 0 s, < 1 ns, 980 ns, 12.3 µs, 4.56 ms, 1.20 s
std::string format_flops(double flops);              // 2.75 TFLOP (a count)
std::string format_flop_rate(double flops_s);        // 197 TFLOP/s
std::string format_bandwidth(double bytes_s);        // 45.0 GB/s
std::string format_sig3(double v);                   // 3 significant digits, no exponent
std::string format_error(double v);                  // 3 significant digits: 0.0114, 3.55e-15 (errors span decades)
std::string format_given(double v);                  // as a flag's value was typed: 0.02, -0.5, inf, nan

// --- text ---

// Columns padded to their widest cell (UTF-8 aware); the last column is not padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::string indent = "  ");
  void add(std::vector<std::string> row);
  void right_align(std::size_t column);
  void print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<bool> right_;
  std::string indent_;
};

// Display width of UTF-8 text (one column per code point).
std::size_t display_width(std::string_view text);
// `text` wrapped into lines of at most `width` columns; lines after the first start with
// `indent` (not counted in `width`).
std::string wrap(std::string_view text, std::size_t width, std::string_view indent);
std::string join(const std::vector<std::string>& parts, std::string_view separator);
// What only a run knows against a prediction of `time_s` (docs/cost-model.md, "Confidence"):
// more ranks than cores (a rank a collective wakes may wait for a core: the scheduler's, not the
// model's), and, with `other_hardware`, a profile of other hardware predicting this machine.
void add_run_confidence(Confidence& confidence, std::int64_t ranks, std::int64_t cores, const HardwareProfile& hw,
                        bool other_hardware, double time_s);
// Under a table of steps, one line per step whose prediction is weak (step i is confidence[i - 1]),
// each reason after it; nothing when every step's confidence is clear.
void print_confidence(std::ostream& out, const std::vector<Confidence>& confidence);

// "I=8192, J=4096"
std::string format_sizes(const DimSizes& sizes);
// "X=4,Y=2 (8 devices)", and "; --split chunk" inside the parentheses on a chunk mesh.
std::string describe_mesh(const Mesh& mesh);
// The hardware profile: name and origin, its description, its key figures.
void print_hardware(std::ostream& out, const Planning& p);

// --- JSON (docs/json-schema.md) ---

Json mesh_json(const Mesh& mesh);
// `mesh` (mesh_json) and, after it, `split` (the rule's name): where a document records its mesh.
void add_mesh_json(Json& doc, const Mesh& mesh);
Json dims_json(const DimSizes& sizes);
Json step_json(const Step& step, const Mesh& mesh);
// A weak prediction's keys on a step's JSON ("confidence": "low", "why": [...], "uncertainty_s");
// none where the model knows nothing against it (docs/cost-model.md, "Confidence").
void add_confidence_json(Json& step, const Confidence& confidence);
Json plan_json(const Plan& plan, const Mesh& mesh);

// Long work's progress on stderr: on a terminal one live line, redrawn at most 10 times a
// second and cleared at the end; in a log a line a second, and the first of each phase (the
// text's first word), so a run of short steps does not write thousands of lines. Nothing
// before `quiet_s` of work: a quick command prints none; nothing in a log when `terminal_only`.
class ProgressLine {
 public:
  explicit ProgressLine(double quiet_s = 0, bool terminal_only = false);
  void show(const std::string& what);  // printed as "shardmm: <what>"
  std::function<void(const std::string&)> reporter() {
    return [this](const std::string& what) { show(what); };
  }
  void clear();  // the live line's end (a log's lines stay)

 private:
  bool tty_, silent_;
  double quiet_s_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_;
  std::string phase_;
  bool shown_ = false;
};

}  // namespace shardmm::cli
