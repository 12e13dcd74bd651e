// The in-process backend's knobs, private to the runtime and its tests.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "shardmm/core/mesh.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::detail {

inline constexpr BackendCapabilities kThreadsCapabilities{.ranks_in_one_process = true,
                                                          .reduces_into_workspace = false};

struct ThreadsOptions {
  // How long a rank waits in a collective or recv for peers that never come before it
  // fails with CollectiveTimeout.
  std::chrono::duration<double> watchdog{300.0};
  // Whether the ranks share cores, which changes who does a collective's copies (see
  // threads_backend.cpp). Unset: when the mesh has more devices than the machine has hardware
  // threads. Tests set it to run either way on any mesh.
  std::optional<bool> shared_cores;
};

// The defaults, with the watchdog taken from SHARDMM_WATCHDOG_S (seconds) when set;
// InputError when it is not a positive number.
ThreadsOptions threads_options_from_env();

// run_threads with explicit options (run_threads uses threads_options_from_env()).
void run_threads(const Mesh& mesh, const std::function<void(Communicator&)>& body, const ThreadsOptions& options);

}  // namespace shardmm::detail
