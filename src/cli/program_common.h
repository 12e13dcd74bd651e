// What `program` and `solve` share: reading a program file and the flags that bind it, the
// collectives table and JSON, and executing a step with --run.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "shardmm/nn/program.h"
#include "shardmm/program/program.h"

namespace shardmm::cli {

// The file's text, parsed: InputError for a missing, binary or oversized file or bad grammar.
program::Program read_program(const std::string& file);

// --mesh, --split, --dims, and the NAME=SPEC pins of `pin_flag` (--spec, --pin) as bind options.
program::BindOptions program_bind_options(const std::optional<std::string>& mesh, const std::string& split,
                                          const std::optional<std::string>& dims, const std::vector<std::string>& pins,
                                          const std::string& pin_flag);

// The step's collectives per phase, as a table (text) and as rows (JSON).
void print_collectives(std::ostream& out, const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events);
Json collectives_json(const Mesh& mesh, const std::vector<autodiff::TapeEvent>& events);
Json memory_json(const nn::ProgramMemory& m);

// --run: InputError when the dense f64 reference would be too large to compute or to hold here.
void check_run_size(const program::Graph& g, const nn::ProgramPrediction& pred, DType dtype);
// One step of `g` on every rank of `backend`; this process's rank's result (device 0's on threads).
nn::ProgramRun run_program_step(const std::string& backend, const program::Graph& g, const nn::ProgramOptions& options);

}  // namespace shardmm::cli
