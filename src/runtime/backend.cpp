// The backend factory: the one place that knows which backends this build has.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/communicator.h"
#include "shardmm/runtime/runner.h"
#include "runtime/buffer_pool.h"
#include "runtime/fingerprint.h"
#include "runtime/machine_cores.h"
#include "runtime/threads_backend.h"
#ifdef SHARDMM_HAVE_MPI
#include "runtime/mpi/mpi_backend.h"
#endif

namespace shardmm {

std::vector<std::string> available_backends() {
#ifdef SHARDMM_HAVE_MPI
  return {"threads", "mpi"};
#else
  return {"threads"};
#endif
}

namespace {

[[noreturn]] void unknown_backend(std::string_view backend) {
  std::string have;
  for (const std::string& b : available_backends()) have += (have.empty() ? "" : ", ") + b;
  throw InputError("unknown backend '" + std::string(backend) + "'; this build has: " + have);
}

}  // namespace

BackendCapabilities backend_capabilities(std::string_view backend) {
  if (backend == "threads") return detail::kThreadsCapabilities;
#ifdef SHARDMM_HAVE_MPI
  if (backend == "mpi") return detail::kMpiCapabilities;
#endif
  unknown_backend(backend);
}

int process_rank(std::string_view backend) {
#ifdef SHARDMM_HAVE_MPI
  if (backend == "mpi") return detail::mpi_world_rank();
#endif
  (void)backend;
  return 0;
}

std::optional<std::string> agree_at_launch(const std::string& failure, const std::string& fingerprint,
                                           double timeout_s) {
#ifdef SHARDMM_HAVE_MPI
  return detail::mpi_agree(true, failure, fingerprint, timeout_s);
#else
  (void)failure, (void)fingerprint, (void)timeout_s;
  return std::string();
#endif
}

std::optional<std::string> report_failure_before_run(const std::string& failure, double timeout_s) {
#ifdef SHARDMM_HAVE_MPI
  return detail::mpi_agree(false, failure, "", timeout_s);
#else
  (void)failure, (void)timeout_s;
  return std::string();
#endif
}

void run_backend(std::string_view backend, const Mesh& mesh, const std::function<void(Communicator&)>& body) {
  run_backend(backend, mesh, body, BackendOptions{});
}

void run_backend(std::string_view backend, const Mesh& mesh, const std::function<void(Communicator&)>& body,
                 const BackendOptions& options) {
  if (!(options.watchdog_s >= 0) || !std::isfinite(options.watchdog_s)) {
    throw InputError("a watchdog of " + detail::seconds(options.watchdog_s) +
                     "; a watchdog is a positive number of seconds, or 0 for SHARDMM_WATCHDOG_S or 300 s");
  }
  const detail::ReleasePoolAtEnd release_pool;
  // The environment is read only when the program leaves the watchdog to it.
  const double watchdog_s =
      options.watchdog_s > 0 ? options.watchdog_s : detail::threads_options_from_env().watchdog.count();
  if (backend == "threads") {
    detail::ThreadsOptions threads;
    threads.watchdog = std::chrono::duration<double>(watchdog_s);
    return detail::run_threads(mesh, body, threads);
  }
#ifdef SHARDMM_HAVE_MPI
  if (backend == "mpi") {
    // BLAS threads per rank (blas.h): the node's cores shared among the ranks on it, unless
    // the job's environment sets OPENBLAS_NUM_THREADS.
    if (!std::getenv("OPENBLAS_NUM_THREADS")) {
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const auto ranks_on_node = local ? std::max(1, std::atoi(local)) : static_cast<int>(mesh.device_count());
      blas::set_threads(blas::threads_per_rank(detail::machine_cores(), ranks_on_node));
    }
    return detail::run_mpi(mesh, body, {options.check, watchdog_s, blas::threads()});
  }
#endif
  unknown_backend(backend);
}

}  // namespace shardmm
