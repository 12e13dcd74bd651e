// What `program` and `solve` share: reading a program file and the flags that bind it, the
// collectives table and JSON, and executing a step with --run. And the two commands' work
// without CLI11: a request holds their flags' values, evaluate_program/evaluate_solve do what
// the command does, program_json/solve_json make the document --json prints. The Python
// module (python/module.cpp) fills the same requests, so its documents are the command's.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"
#include "shardmm/solve/solve.h"

namespace shardmm::cli {

// What `program` and `solve` compute in without --dtype (bind_program): a run's verification
// wants f64; a prediction takes make_planning's rule.
inline constexpr const char* kProgramDTypeRule = "f64 with --run; else f32 on a calibrated profile, else bf16";

// The flags `program` and `solve` share, as values.
struct ProgramInput {
  std::string file;                 // the program file; with `text`, the name messages and documents give it
  std::optional<std::string> text;  // the program itself (Python's text=): no file is read
  std::optional<std::string> mesh;  // replaces the file's mesh line
  std::vector<std::string> pins;    // NAME=SPEC, each replacing the file's pin
  PlanningFlags common;             // --split, --dims, --dtype, --hw, --json
  bool train = false, infer = false, run = false;
  std::string optimizer = "sgd";
  std::string backend = "threads";  // where --run executes
  bool rings = false;               // einsums may run as collective matmul rings
};

// A program read and bound to its flags: the step to cost, solve or run.
struct BoundProgram {
  program::Program parsed;
  program::Graph graph;
  Planning planning;
  bool train = false;  // else an inference step (forward only)
  nn::Optimizer optimizer = nn::Optimizer::sgd;
};

// InputError as the command reports it; `pins_field` names the pins ("spec", "pin").
BoundProgram bind_program(const ProgramInput& in, const std::string& pins_field);

// --- shardmm program ---

struct ProgramRequest {
  ProgramInput input;
  std::uint64_t seed = 1;           // the inputs' and params' values (--run)
  std::vector<std::string> inputs;  // --input NAME=FILE.npy (--run)
};

struct ProgramReport {
  BoundProgram bound;
  nn::ProgramPrediction prediction;
  std::optional<nn::ProgramRun> run;  // with run: this process's rank's (device 0's on threads)
};

// Binds, costs and (with run) executes one step.
ProgramReport evaluate_program(const ProgramRequest& request);
Json program_json(const ProgramRequest& request, const ProgramReport& report);
void print_program_report(std::ostream& out, const ProgramRequest& request, const ProgramReport& report);

// --- shardmm solve ---

struct SolveRequest {
  ProgramInput input;
  std::optional<std::string> mem_limit;  // per device: "16GiB", "1e9"
  std::optional<std::string> emit;       // the file the caller writes pinned_program_text to (the document names it)
  int top = 1;                           // 1 to kMaxTop
  bool explain = false;
  double seconds = 60;  // building the problem's time limit, and each integer program's
  std::string search = "auto";  // auto, whole or neighbourhoods (solve::SolveOptions::Search)
  std::function<void(const solve::BuildProgress&)> progress;  // building the problem (may be empty)
  bool leave_caches_to_exit = false;                          // the command's process ends next (solve::BuildLimits)
};

inline constexpr int kMaxTop = 100;

struct SolveReport {
  BoundProgram bound;
  solve::SolveOptions options;
  solve::SolveResult result;
  std::optional<nn::ProgramRun> run;  // with run: the chosen sharding's step, this process's rank's
};

// Solves (and with run executes) the program; InputError also when nothing fits the limit.
SolveReport evaluate_solve(const SolveRequest& request);
Json solve_json(const SolveRequest& request, const SolveReport& report);
void print_solve_report(std::ostream& out, const SolveRequest& request, const SolveReport& report);
// The program with every spec pinned, as --emit writes it (`shardmm program` costs it the same).
std::string pinned_program_text(const SolveReport& report);

// The file's text, parsed: InputError for a missing, binary or oversized file or bad grammar.
program::Program read_program(const std::string& file);

// --mesh, --split, --dims, and the NAME=SPEC pins of field `pins_field` ("spec": program's --spec;
// "pin": solve's --pin) as bind options.
program::BindOptions program_bind_options(const std::optional<std::string>& mesh, const std::string& split,
                                          const std::optional<std::string>& dims, const std::vector<std::string>& pins,
                                          const std::string& pins_field);

// Predicted seconds of a step's events by what they do: collectives; einsums; local work on
// each device's own blocks (the local ops and the update, and the slices and to_partial pads
// of reshards), all of it memory traffic.
struct EventTimes {
  double comm = 0, einsum = 0, local = 0;
  double compute() const { return einsum + local; }
  void add(const Step& step);
};
EventTimes event_times(const std::vector<autodiff::TapeEvent>& events);
// "communication 1.20 ms + einsum 3.40 ms + local 512 µs"
std::string event_times_text(const EventTimes& t);

// For a run's measured times beside the predicted ones: where the prediction is for a built-in
// profile (a GPU or TPU, not this machine), a line that says so; else nothing.
std::string prediction_profile_note(const Planning& p);

// The step's collectives per phase, as a table (text) and as rows (JSON).
void print_collectives(std::ostream& out, const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events);
Json collectives_json(const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events);
// Device 0's memory: the breakdown, the peak and the timeline (a point per op forward and
// backward, per leaf reduction, and the update).
Json memory_json(const program::Graph& g, const nn::ProgramMemory& m);
// Where a point of the memory timeline is: "line 12 (u = h @ w_in), backward".
std::string memory_point_text(const program::Graph& g, const nn::ProgramMemoryPoint& m);

// --run: InputError when the dense f64 reference would be too large to compute or to hold here.
void check_run_size(const program::Graph& g, const nn::ProgramPrediction& pred, DType dtype);
// One step of `g` on every rank of `backend`; this process's rank's result (device 0's on threads).
nn::ProgramRun run_program_step(const std::string& backend, const program::Graph& g, const nn::ProgramOptions& options);

}  // namespace shardmm::cli
