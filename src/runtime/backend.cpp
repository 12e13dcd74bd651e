// The backend factory: the one place that knows which backends this build has.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/communicator.h"
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

void run_backend(std::string_view backend, const Mesh& mesh, const std::function<void(Communicator&)>& body) {
  if (backend == "threads") return run_threads(mesh, body);
#ifdef SHARDMM_HAVE_MPI
  if (backend == "mpi") {
    // BLAS threads per rank (blas.h): the node's cores shared among the ranks on it, unless
    // the job's environment sets OPENBLAS_NUM_THREADS.
    if (!std::getenv("OPENBLAS_NUM_THREADS")) {
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const auto ranks_on_node = local ? std::max(1, std::atoi(local)) : static_cast<int>(mesh.device_count());
      blas::set_threads(blas::threads_per_rank(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                                               ranks_on_node));
    }
    return detail::run_mpi(mesh, body);
  }
#endif
  std::string have;
  for (const std::string& b : available_backends()) have += (have.empty() ? "" : ", ") + b;
  throw InputError("unknown backend '" + std::string(backend) + "'; this build has: " + have);
}

}  // namespace shardmm
