// Reading and writing the small files shardmm takes and leaves (hardware profiles, traces),
// so that a FIFO or a device never blocks or replaces anything, a failed write leaves no
// half-written file, and every error names the file, what it is for and the reason.
//
//   check_writable_file("run.json", "--trace 'run.json'");   // before the run
//   ...
//   write_file_atomically("run.json", text, "--trace 'run.json'");  // after it
//
// `label` starts each message (the caller's name for the file); all errors are InputError.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace shardmm {

// The whole of a regular file of at most `max_bytes`; anything else (missing, a directory, a
// FIFO, a device) is refused with the reason after `label`, a larger file with `too_large`.
std::string read_small_file(const std::filesystem::path& path, std::size_t max_bytes, std::string_view label,
                            std::string_view too_large);

// Refuses, before any work, a `path` that could not be written: empty, a directory or another
// file that is not regular (a FIFO, a device), in a directory that is missing, not a directory
// or not writable.
void check_writable_file(const std::filesystem::path& path, std::string_view label);

// Writes `text` to a new file beside `path` and renames it over `path`: a reader never sees
// half of it, and a full disk or any other failure removes the new file and leaves `path` as
// it was. Creates missing parent directories when `create_directories` is set.
void write_file_atomically(const std::filesystem::path& path, std::string_view text, std::string_view label,
                           bool create_directories = false);

}  // namespace shardmm
