// The communicator: collectives over groups of mesh axes, one object per rank (SPMD).
//
//   run_threads(Mesh::parse("X=4"), [](Communicator& comm) {
//     std::vector<float> mine(3, float(comm.rank())), all(12);
//     comm.all_gather(mine.data(), all.data(), {3, 3, 3, 3}, DType::f32, {0});
//   });
//
// A group is a list of mesh axes (major to minor); it holds the devices that share
// this device's coordinates on every other axis, ordered by Mesh::group_rank. Counts
// are in elements and may differ per member (uneven shards) or be zero.
//
// Reductions are sums computed in group-rank order ((x0 + x1) + x2) + ..., on every
// backend, so the same inputs give bitwise-identical results on threads and MPI; all_reduce
// with ReduceOp::max takes the same path with max(max(x0, x1), x2) ....
//
// Backends: "threads" (one thread per device, the default) and "mpi" (one process per
// device; built when SHARDMM_WITH_MPI is on). mpi.h never appears in a public header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardmm/core/dtype.h"
#include "shardmm/core/mesh.h"

namespace shardmm {

using Counts = std::vector<std::int64_t>;

// What a backend does that its callers must adapt to, so that no code compares backend names
// (a new backend states its own; backend_capabilities below).
struct BackendCapabilities {
  // Every rank is a thread of this process (threads); otherwise each rank is a process of a
  // launched job (mpi), which allocates, verifies and reports on its own.
  bool ranks_in_one_process = true;
  // Reductions receive the other members' chunks into a workspace about the input block's
  // size (mpi's reduce_scatter, and all_reduce built on it), besides the plan's buffers.
  bool reduces_into_workspace = false;

  bool operator==(const BackendCapabilities&) const = default;
};

// A nonblocking send or receive in flight (Communicator::isend, irecv). wait() returns once
// the buffer may be reused (send) or holds the message (recv), raising what send and recv
// raise (errors.h) under the same watchdog. Destroying a request that was not waited for
// cancels what has not moved yet and waits for a copy under way, so that no peer reads or
// writes the buffer after it is gone.
class P2PRequest {
 public:
  virtual ~P2PRequest() = default;
  virtual void wait() = 0;
  // Lets the transfer advance where the backend moves data only inside its calls (mpi:
  // MPI_Test); true once it has completed (wait() must still be called).
  virtual bool test() = 0;
  // After a receive's wait(): where its bytes are. The receive's own buffer, or for
  // Communicator::irecv_lent the sender's where the backend lent it (until the request is
  // destroyed).
  virtual const void* received() const = 0;
};
using Request = std::unique_ptr<P2PRequest>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::int64_t rank() const = 0;  // this device's id in the mesh
  virtual const Mesh& mesh() const = 0;
  virtual std::string backend() const = 0;
  virtual BackendCapabilities capabilities() const = 0;

  // recv = concatenation over members of each member's `counts[member]` elements;
  // this rank contributes `send` (counts[my group rank] elements).
  virtual void all_gather(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& group) = 0;
  // `send` holds one chunk per member, concatenated (counts[m] elements for member m);
  // recv gets the sum over members of chunk [my group rank] (counts[me] elements).
  virtual void reduce_scatter(const void* send, void* recv, const Counts& counts, DType dtype,
                              const AxisList& group) = 0;
  // In place: data = sum (or, with ReduceOp::max, maximum) over members of their `data`
  // (count elements each). The default belongs to this declaration, the one callers see:
  // overrides take `op` without one.
  virtual void all_reduce(void* data, std::int64_t count, DType dtype, const AxisList& group,
                          ReduceOp op = ReduceOp::sum) = 0;
  // send_counts[m]: elements this rank sends to member m (chunks concatenated in member
  // order); recv_counts[m]: elements it receives from member m (likewise).
  virtual void all_to_all(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                          DType dtype, const AxisList& group) = 0;

  // Point-to-point, for rings and pipelines. `peer` is a device id; messages between
  // a pair are matched in order of `tag`-equal calls.
  virtual void send(const void* data, std::int64_t bytes, std::int64_t peer, int tag) = 0;
  virtual void recv(void* data, std::int64_t bytes, std::int64_t peer, int tag) = 0;
  // Nonblocking forms: the transfer proceeds while this rank computes (threads: a progress
  // thread of the receiving rank copies between the two ranks' buffers; mpi: MPI_Isend and
  // MPI_Irecv). The buffer must stay valid and, for isend, unmodified until wait().
  // Matching is as for send/recv: in order per (peer, tag), and a nonblocking call may
  // meet a blocking one.
  virtual Request isend(const void* data, std::int64_t bytes, std::int64_t peer, int tag) = 0;
  virtual Request irecv(void* data, std::int64_t bytes, std::int64_t peer, int tag) = 0;
  // A receive that is read, not kept: like irecv, but where the ranks share memory the
  // backend may lend the sender's buffer instead of copying the message into `data` (threads:
  // when the send is nonblocking). Read it through received() after wait(); it stays valid,
  // and the lending isend stays incomplete, until the request is destroyed, so drop the
  // request as soon as the read is done. Saves a copy of the message where both ranks are
  // busy computing (the reduce-scatter ring adds a neighbour's running sum straight from it).
  virtual Request irecv_lent(void* data, std::int64_t bytes, std::int64_t peer, int tag) {
    return irecv(data, bytes, peer, tag);
  }
  // Whether requests move only inside this rank's and the peer's calls (mpi through MPI
  // messages: Open MPI's shared-memory transport moves a message past its eager limit only
  // then). A ring then completes its sends when it waits for its receives, as MPI_Sendrecv
  // does: a rank that left with its send unfinished would hold its neighbour for as long as
  // it then computes.
  virtual bool moves_only_in_calls() const { return false; }
  // Whether a rank that computes while its requests are in flight should have a helper
  // thread call test() on them: where they move only in calls, a core is free for the
  // thread, and test() may be called from another thread while the rank's own thread makes
  // no call (MPI initialized with at least MPI_THREAD_SERIALIZED).
  virtual bool wants_progress_thread() const { return false; }
  // Whether every rank reads the same steady clock (threads: one process; mpi: every process
  // on one machine), so that times taken on different ranks compare. Benchmarks then time a
  // span from the first rank's start to the last rank's finish: ranks that share cores start
  // at different moments, and one rank's own start-to-finish misses what the others did first.
  virtual bool clock_is_shared() const = 0;

  virtual void barrier() = 0;
};

// Runs `body` once per device of `mesh`, each on its own thread with its own
// communicator. Returns when all have finished; the first exception thrown by any rank
// is rethrown here after the others are released.
void run_threads(const Mesh& mesh, const std::function<void(Communicator&)>& body);

// The backends this build has: "threads", and "mpi" when built with MPI.
std::vector<std::string> available_backends();
// What the named backend does (InputError for one this build lacks), known before it runs.
BackendCapabilities backend_capabilities(std::string_view backend);

// How a backend guards against ranks that stop agreeing (errors.h).
struct BackendOptions {
  // Before each collective the members of its group compare what they are calling (op,
  // dtype, axes, counts) and all throw CollectiveMismatch when they differ, instead of
  // hanging or moving the wrong bytes. The threads backend always checks (its rendezvous
  // is the check); on mpi it costs one small message per member and collective, so
  // benchmarks turn it off.
  bool check = true;
  // Seconds a rank waits for peers in a checked collective or a recv before it gives up
  // naming the ranks that never came: threads throws CollectiveTimeout, mpi prints the
  // same message and aborts the job (a peer hung elsewhere can be freed no other way).
  // 0: SHARDMM_WATCHDOG_S when set, else 300.
  double watchdog_s = 0;
};

// Runs `body` on the named backend. For "mpi" the process is one rank of an mpirun
// job whose size must equal mesh.device_count(); `body` runs once in this process.
void run_backend(std::string_view backend, const Mesh& mesh, const std::function<void(Communicator&)>& body,
                 const BackendOptions& options);
// With the default BackendOptions: checked, watchdog from SHARDMM_WATCHDOG_S or 300 s.
void run_backend(std::string_view backend, const Mesh& mesh, const std::function<void(Communicator&)>& body);

}  // namespace shardmm
