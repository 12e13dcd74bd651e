// The backend factory: the one place that knows which backends this build has.
#include <string>
#include <vector>

#include "shardmm/core/error.h"
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
  if (backend == "mpi") return detail::run_mpi(mesh, body);
#endif
  std::string have;
  for (const std::string& b : available_backends()) have += (have.empty() ? "" : ", ") + b;
  throw InputError("unknown backend '" + std::string(backend) + "'; this build has: " + have);
}

}  // namespace shardmm
