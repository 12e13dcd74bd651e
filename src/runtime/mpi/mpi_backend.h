// The MPI backend, private to the runtime: run_backend("mpi", ...) lands here. mpi.h stays
// inside mpi_backend.cpp so that no public header (and no consumer) needs MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "shardmm/core/mesh.h"
#include "shardmm/runtime/communicator.h"

namespace shardmm::detail {

inline constexpr BackendCapabilities kMpiCapabilities{.ranks_in_one_process = false, .reduces_into_workspace = true};

// BackendOptions (communicator.h), with the watchdog resolved to seconds, and what the
// runtime decided for this process that the backend weighs: it is given, not asked for, so
// that this target links nothing above core.
struct MpiOptions {
  bool check = true;
  double watchdog_s = 300;
  int blas_threads = 1;  // OpenBLAS's thread count in this process (blas.h)
};

// This process is one rank of an mpirun job whose size must equal mesh.device_count()
// (InputError otherwise, raised identically on every rank); world rank = device id.
// Initializes MPI on first use and finalizes it at exit. Runs `body` once. An exception
// escaping `body` aborts the whole job (see mpi_backend.cpp for why), and so does the
// watchdog in check mode.
void run_mpi(const Mesh& mesh, const std::function<void(Communicator&)>& body, const MpiOptions& options);

// The start of an mpirun job, where the ranks compare notes before they depend on one another
// (they may have been started with different flags or environments, or one may have failed
// alone, and a collective would then hang or move the wrong bytes). `failure` is this rank's
// error ("" when it has none), `fingerprint` how it was started (one item a line). Every rank
// gets the same answer: "" when none failed and the fingerprints agree, else the message
// they all stop with (a failure seen by every rank alike once, others with their ranks; a
// difference naming the ranks and the items). nullopt when not every rank came within
// `timeout_s` (< 0: no limit). Initializes MPI. Once per process at most for `at_launch`
// (after parsing) and once for the first run of the mpi backend (run_mpi's own call, or a
// rank's that failed before it); outside an mpirun job, "".
std::optional<std::string> mpi_agree(bool at_launch, const std::string& failure, const std::string& fingerprint,
                                     double timeout_s);

// Whether a launcher (mpirun, mpiexec, srun with PMI/PMIx) started this process; read from
// the environment, so it is safe to ask before MPI is initialized.
bool mpi_launched();
// This process's rank in MPI_COMM_WORLD: from MPI once initialized, from the launcher's
// environment before that, 0 when not launched. Lets the CLI print on rank 0 only.
int mpi_world_rank();

// The most elements (bytes for send/recv) handed to one MPI call, INT_MAX by default since
// MPI counts are int. Larger transfers go out in pieces; tests lower the limit to exercise
// that path without gigabyte buffers. Returns the previous limit.
std::int64_t set_mpi_count_limit(std::int64_t limit);

// The bytes a member moves to each peer per round of a shared-memory exchange, for groups
// joined from now on; 0 (the default) splits 1 MiB between the peers. Tests lower it to run
// many rounds with small arrays. Returns the previous value.
std::int64_t set_mpi_shared_part(std::int64_t bytes);
// Exchanges this process has made through a group's shared window so far: tests tell by it
// which path a collective took.
std::int64_t mpi_shared_exchanges();
// Pieces of collectives this process has received lent, read out of their senders' memory.
std::int64_t mpi_lent_pieces();
// Point-to-point sends this process has made through shared memory so far: those that lent
// their data in place (`lent`), or those copied into a bounce block (and the empty ones).
std::int64_t mpi_shared_sends(bool lent);

}  // namespace shardmm::detail
