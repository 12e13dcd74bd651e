#include "runtime/mpi/mpi_backend.h"

#include "runtime/cpu_relax.h"
#include "runtime/fingerprint.h"
#include "runtime/machine_cores.h"
#include "runtime/mpi/lend_choice.h"
#include "runtime/mpi/shareable_memory.h"
#include "runtime/mpi/shared_exchange.h"
#include "runtime/mpi/shared_messages.h"
#include "runtime/ordered_sum.h"

// The C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/runtime/errors.h"

namespace shardmm::detail {

namespace {

std::atomic<std::int64_t> count_limit{INT_MAX};
std::atomic<std::int64_t> shared_part_limit{0};  // 0: shared_bank_bytes() over the peers
std::atomic<std::int64_t> shared_exchanges{0};
std::atomic<std::int64_t> lent_pieces{0};
std::atomic<std::int64_t> shared_lent_sends{0};
std::atomic<std::int64_t> shared_copied_sends{0};

using Clock = std::chrono::steady_clock;

// Tags on the backend's private communicators, which user send/recv never see.
constexpr int kCreateGroupTag = 1;
constexpr int kPieceTag = 2;
constexpr int kCheckTag = 3;
constexpr int kGatherTag = 4;  // all_reduce's second half, apart from its first
// A collective's pieces among shared_messages' point-to-point posts: below every user tag (>= 0).
constexpr int kLentPieceTag = -1;

// A collective's piece in shareable memory is lent to its receiver (exchange) from this size;
// a smaller one goes through the shared window, whose one flag each way is quicker than a
// post and its acknowledgement.
constexpr std::int64_t kLentPieceBytes = std::int64_t{256} << 10;

// all_reduce's segment, per member chunk: small enough that a segment's arrived copies and
// its sum are still in cache when it is summed and sent back out. Three paired runs on 2 ranks
// of the dev VM, MPI_Allreduce / ours at 1, 4, 16 MiB: 256 KiB 0.93-0.98, 1.02-1.03,
// 0.96-1.03; 512 KiB 0.98-1.01, 1.02, 1.04-1.10; 128 KiB lower, one whole segment lower.
constexpr std::int64_t kAllReduceSegmentBytes = std::int64_t{512} << 10;

// A member's bank in a group's shared window (shared_exchange.h), split between its peers: a
// round moves up to this much from each member, and a member's segment holds two banks. Half
// the core's L2, so that a round's source and its copy in the bank fit there together and the
// reader takes the copy from the writer's cache. Measured on 2 ranks, bench/mpi_collectives_bench
// at 1-64 MiB: on a 2 MiB-L2 Xeon VM 1 MiB was ahead of 512 KiB at 16 and 64 MiB (all_gather
// 1.56-1.66x MPI_Allgather, against 1.15-1.41x); on a 1 MiB-L2 EPYC VM 512 KiB was ahead of
// 1 MiB at 4 MiB (1.27-1.29x against 1.03-1.08x, fresh inputs) and even elsewhere.
std::int64_t shared_bank_bytes() {
  return std::clamp<std::int64_t>(l2_cache_bytes() / 2, std::int64_t{256} << 10, std::int64_t{2} << 20);
}
// A shared-memory exchange enters MPI (progress, the watchdog) once per this many idle passes.
constexpr std::int64_t kSharedProgressEvery = 1024;

// Our communicators use MPI_ERRORS_RETURN, so every failing call lands here and becomes an
// exception naming the call, instead of MPI's default abort without context.
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  std::string why = MPI_Error_string(rc, text, &len) == MPI_SUCCESS ? std::string(text, static_cast<std::size_t>(len))
                                                                    : "MPI error code " + std::to_string(rc);
  throw std::runtime_error(std::string(call) + " failed: " + why);
}

int error_class(int rc) {
  int cls = MPI_SUCCESS;
  MPI_Error_class(rc, &cls);
  return cls;
}

[[noreturn]] void abort_job(int rank, const char* what) {
  // One write: mpirun's own lines from other processes cannot land inside it.
  std::cerr << "shardmm: rank " + std::to_string(rank) + ": " + what + "\n" << std::flush;
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // MPI_Abort does not return; this keeps the compiler and a broken MPI honest
}

// The ranks of this job on this node. Collective over MPI_COMM_WORLD the first time, so called
// where every rank is (run_mpi).
int ranks_on_node() {
  static const int ranks = [] {
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int size = 1;
    MPI_Comm_size(node, &size);
    MPI_Comm_free(&node);
    return size;
  }();
  return ranks;
}

// Whether this node runs more ranks than it has cores. A rank polling for its peers then gives
// up its core each time it finds nothing, as MPI's own waits do when oversubscribed (Open MPI's
// mpi_yield_when_idle); otherwise it spins: a yield on a busy machine can hand the core to
// another program for milliseconds, which made each checked 1 MiB collective ~10 ms slower.
bool node_oversubscribed() { return ranks_on_node() > machine_cores(); }

// A 0/1 switch from the environment, nullopt when unset. Anything else is an InputError naming
// the variable and `meanings` (what 1, 0 and unset do).
std::optional<bool> env_switch(const char* name, const char* meanings) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  const std::string value = v;
  if (value != "0" && value != "1") throw InputError(std::string(name) + "='" + value + "': it is " + meanings);
  return value == "1";
}

// Whether the rings should have a helper thread call test() while they compute (Communicator::
// wants_progress_thread). Only where it gets a core of its own: the node's ranks times their
// BLAS threads leave one free. On busy cores the messages it moves cost the GEMMs as much as
// it saves: 2 ranks of one BLAS thread on the 2-core VM ran both mpi rings 3-12% faster
// without it (10 of 10 paired measurements, collective-matmul.md). SHARDMM_PROGRESS_THREAD=1
// or 0 decides instead. Needs MPI_THREAD_SERIALIZED: test() then comes from another thread.
// Never where messages go through shared memory (share_messages): nothing waits for MPI there.
bool progress_thread_wanted(int blas_threads) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_SERIALIZED) return false;
  const std::optional<bool> wanted =
      env_switch("SHARDMM_PROGRESS_THREAD",
                 "1 (a helper thread moves the rings' messages), 0 (none) or unset (one where a "
                 "core is free for it)");
  return wanted.value_or(ranks_on_node() * blas_threads < machine_cores());
}

// How ranks on one node use shared memory (the environment's settings, read once per run).
struct SharedMemorySettings {
  // Whether groups whose members share a node exchange through a shared window
  // (shared_exchange.h), and ranks all on one node send point to point through shared memory
  // (shared_messages.h), rather than by MPI messages. SHARDMM_MPI_SHARED_MEMORY=0 turns both
  // off, to compare or to test the message path on one node.
  bool on = true;
  // How the shared window's writers copy into their segments: SHARDMM_MPI_STREAMING_COPY=1
  // always with streaming stores, 0 always with memcpy, unset whichever has been faster in this
  // run's recent large exchanges.
  ExchangeCopy copy = ExchangeCopy::learn;
  // Whether a collective's large pieces in Buffers are lent (lend_choice.h): SHARDMM_MPI_LEND=1
  // always, 0 never, unset whichever has made each exchange's calls follow each other sooner.
  LendChoice::Mode lend = LendChoice::Mode::learn;
};

SharedMemorySettings shared_memory_wanted() {
  SharedMemorySettings s;
  s.on = env_switch("SHARDMM_MPI_SHARED_MEMORY",
                    "1 (ranks on one node exchange through shared memory), 0 (MPI messages only) or unset (1)")
             .value_or(true);
  if (const std::optional<bool> streaming = env_switch(
          "SHARDMM_MPI_STREAMING_COPY",
          "1 (the shared window's writers copy with streaming stores), 0 (with memcpy) or unset (whichever has "
          "been faster in the run's large exchanges)")) {
    s.copy = *streaming ? ExchangeCopy::streaming : ExchangeCopy::cached;
  }
  if (const std::optional<bool> lend = env_switch(
          "SHARDMM_MPI_LEND",
          "1 (a collective's large pieces in Buffers are lent to their receivers), 0 (all go through the shared "
          "window) or unset (whichever has made the exchange's calls follow each other sooner)")) {
    s.lend = *lend ? LendChoice::Mode::always : LendChoice::Mode::never;
  }
  return s;
}

// Bodies running in this process: run_mpi counts them.
std::atomic<int> running_bodies{0};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (running_bodies > 0) {
    // exit() from inside a body: MPI_Finalize would wait for peers that are waiting for this
    // rank in the run, and the job would hang. It ends instead.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    abort_job(rank, "the process exited in the middle of a run of the mpi backend (exit() in the body?)");
  }
  MPI_Finalize();
}

// MPI is initialized once per process and finalized by atexit, after main returns and so after
// every run_mpi has completed its communication. When the application initialized MPI itself,
// finalizing is its business.
void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) throw UsageError("the mpi backend was used after MPI_Finalize");
    return;
  }
  mpi_launched();  // reads the environment before MPI_Init adds to it
  // SERIALIZED: run_mpi may be called from any thread, one at a time; the body's own worker
  // threads (BLAS) never call MPI.
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  std::atexit(finalize_mpi);
}

std::string count_of(std::int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16:
      break;
  }
  throw InputError(std::string("the mpi backend computes in f32 and f64; got ") + to_string(dtype));
}

// Offsets of the concatenated chunks, in elements.
// `count` elements split over `members` as numpy.array_split does (the first count % members
// take one extra): an all_reduce's own split of its buffer, not a shard geometry, so the same
// whatever the mesh's rule (as the threads backend splits).
Counts even_split(std::int64_t count, std::int64_t members) {
  Counts split(static_cast<std::size_t>(members));
  for (std::size_t m = 0; m < split.size(); ++m) {
    split[m] = split_range(count, members, static_cast<std::int64_t>(m), SplitRule::array).extent;
  }
  return split;
}

std::vector<std::int64_t> displacements(const Counts& counts) {
  std::vector<std::int64_t> displs(counts.size());
  std::int64_t at = 0;
  for (std::size_t m = 0; m < counts.size(); ++m) {
    displs[m] = at;
    at = checked_add(at, counts[m], "a collective's element count");
  }
  return displs;
}

// Whether all_gather's counts and displacements can be handed to MPI_Allgatherv as ints. Every
// member must take the same path (one collective call, or pieces); the counts, which every
// member passes alike, decide it.
bool fits_one_call(const Counts& counts, const std::vector<std::int64_t>& displs) {
  const std::int64_t limit = count_limit.load();
  auto small = [limit](std::int64_t v) { return v <= limit; };
  return std::all_of(counts.begin(), counts.end(), small) && std::all_of(displs.begin(), displs.end(), small);
}

// "all_to_all(f32)", as mismatch messages name a call.
std::string op_label(const char* op, DType dtype) { return std::string(op) + "(" + to_string(dtype) + ")"; }

std::vector<int> as_ints(const std::vector<std::int64_t>& values) { return {values.begin(), values.end()}; }

// Misuse of the API is an InputError, with the threads backend's wording.
void check_counts(const Counts& counts, std::int64_t group_size, const char* op) {
  if (static_cast<std::int64_t>(counts.size()) != group_size) {
    throw InputError(std::string(op) + ": got " + std::to_string(counts.size()) + " counts for " +
                     std::to_string(group_size) + " members; pass one count per member");
  }
  for (std::int64_t c : counts) {
    if (c < 0) {
      throw InputError(std::string(op) + ": count " + std::to_string(c) + "; a count is a number of elements >= 0");
    }
  }
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `world` and `checks`, this run's duplicates of MPI_COMM_WORLD.
  MpiCommunicator(const Mesh& mesh, int rank, MPI_Comm world, MPI_Comm checks, const MpiOptions& options,
                  bool progress_thread, const SharedMemorySettings& shared_memory)
      : mesh_(mesh),
        rank_(rank),
        world_(world),
        checks_(checks),
        check_(options.check),
        // A far-future deadline would overflow the clock; a century is "never".
        watchdog_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(std::min(options.watchdog_s, 3.2e9)))),
        watchdog_text_(seconds(options.watchdog_s)),
        inbox_(static_cast<std::size_t>(mesh.device_count())),
        yield_(node_oversubscribed()),
        progress_thread_(progress_thread),
        shared_memory_(shared_memory.on),
        exchange_copy_(shared_memory.copy),
        lend_choice_(shared_memory.lend) {
    int flag = 0;
    int* tag_ub = nullptr;
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr");
    tag_ub_ = flag ? *tag_ub : 32767;  // 32767 is the least the standard allows
    if (shared_memory_ && mesh.device_count() > 1) share_messages();
  }
  ~MpiCommunicator() override {
    // Collective over each group: every rank frees its groups in the same (axes) order, and a
    // group over the same axes is the same group on each of its members, so none waits in a
    // cycle.
    for (auto& [axes, g] : groups_) {
      g.shared.reset();
      if (g.window != MPI_WIN_NULL) MPI_Win_free(&g.window);
      if (g.comm != MPI_COMM_NULL) MPI_Comm_free(&g.comm);
    }
    if (messages_) {
      set_buffers_shareable(false);
      messages_.reset();
      peer_mailboxes_.clear();
      free_shareable(own_mailbox_);
    }
    MPI_Comm_free(&checks_);
    MPI_Comm_free(&world_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::int64_t rank() const override { return rank_; }
  const Mesh& mesh() const override { return mesh_; }
  std::string backend() const override { return "mpi"; }
  BackendCapabilities capabilities() const override { return kMpiCapabilities; }

  void all_gather(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& axes) override {
    mpi_type(dtype);  // rejects bf16 and f16 before any communication
    Group& g = group(axes);
    check_counts(counts, g.size, "all_gather");
    agree(g, {CollectiveOp::all_gather, axes, dtype, counts, {}});
    gather(joined(g), send, recv, counts, dtype);
  }

  void reduce_scatter(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& axes) override {
    mpi_type(dtype);
    Group& g = group(axes);
    check_counts(counts, g.size, "reduce_scatter");
    agree(g, {CollectiveOp::reduce_scatter, axes, dtype, counts, {}});
    scatter_reduce(joined(g), send, recv, counts, dtype, ReduceOp::sum);
  }

  void all_reduce(void* data, std::int64_t count, DType dtype, const AxisList& axes, ReduceOp op) override {
    mpi_type(dtype);
    if (count < 0) {
      throw InputError("all_reduce of " + std::to_string(count) + " elements; a count is a number of elements >= 0");
    }
    Group& g = group(axes);
    agree(g, {CollectiveOp::all_reduce, axes, dtype, {count}, {}, op});
    if (joined(g).shared) {
      shared_all_reduce(g, static_cast<char*>(data), count, dtype, op);
    } else {
      segmented_all_reduce(g, static_cast<char*>(data), count, dtype, op);
    }
  }

  void all_to_all(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts, DType dtype,
                  const AxisList& axes) override {
    const MPI_Datatype type = mpi_type(dtype);
    Group& g = group(axes);
    check_counts(send_counts, g.size, "all_to_all (send counts)");
    check_counts(recv_counts, g.size, "all_to_all (recv counts)");
    if (send_counts[g.me] != recv_counts[g.me]) {
      throw CollectiveMismatch("collective mismatch in " + op_label("all_to_all", dtype) + ": rank " +
                               std::to_string(rank_) + " sends " + std::to_string(send_counts[g.me]) +
                               " elements to itself but expects " + std::to_string(recv_counts[g.me]));
    }
    agree(g, {CollectiveOp::all_to_all, axes, dtype, send_counts, recv_counts});
    // Always point to point: only this rank knows its counts, so choosing between
    // MPI_Alltoallv (int counts and offsets) and pieces would take the members a round trip to
    // agree on, and that 4-byte MPI_Allreduce made all_to_all 1.7x slower than MPI_Alltoall at
    // 16 MiB on 2 ranks. Open MPI's alltoallv posts these same nonblocking sends and receives.
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    const std::vector<Transfer> transfers =
        chunk_transfers(static_cast<const char*>(send), send_counts, displacements(send_counts),
                        static_cast<char*>(recv), recv_counts, displacements(recv_counts), esz);
    exchange(joined(g), transfers, type, esz, op_label("all_to_all", dtype));
  }

  // Buffered, like the threads backend's mailboxes: the data is copied and sent in the
  // background, so a ring where every rank sends before it receives cannot deadlock.
  void send(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "send to");
    if (messages_) {
      shared_send(data, bytes, peer, tag, false);
      return;
    }
    reap_sends();
    Outgoing& o = outgoing_.emplace_back();
    o.data = std::make_unique_for_overwrite<char[]>(static_cast<std::size_t>(bytes));
    // memcpy from a null pointer is undefined even for 0 bytes (an empty vector's data()).
    if (bytes > 0) std::memcpy(o.data.get(), data, static_cast<std::size_t>(bytes));
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      MPI_Request& r = o.requests.emplace_back();
      check(MPI_Isend(o.data.get() + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &r), "MPI_Isend");
    });
  }

  void recv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "recv from");
    if (messages_) {
      shared_receive(data, bytes, peer, tag, false)->wait();
      return;
    }
    char* out = static_cast<char*>(data);
    auto mismatch = [&] { return p2p_mismatch(p2p_call(false, bytes, peer, tag), peer); };
    const Clock::time_point deadline = Clock::now() + watchdog_;
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      MPI_Status status;
      int rc = MPI_SUCCESS;
      if (check_) {
        // Polled, so that a peer that never sends ends the job instead of hanging it.
        MPI_Request request = MPI_REQUEST_NULL;
        check(MPI_Irecv(out + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &request), "MPI_Irecv");
        poll_until(
            deadline,
            [&] {
              int done = 0;
              rc = MPI_Test(&request, &done, &status);
              return rc != MPI_SUCCESS || done != 0;
            },
            [&] {
              return "p2p timeout: rank " + std::to_string(rank_) + " waited " + watchdog_text_ + " in recv(" +
                     std::to_string(bytes) + " bytes from rank " + std::to_string(peer) + ", tag " +
                     std::to_string(tag) + "); " +
                     (offset == 0 ? std::string("nothing") : std::to_string(offset) + " bytes") + " arrived" +
                     watchdog_hint(watchdog_text_);
            });
      } else {
        rc = MPI_Recv(out + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &status);
      }
      if (error_class(rc) == MPI_ERR_TRUNCATE) throw mismatch();
      check(rc, "MPI_Recv");
      int got = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
      if (got != size) throw mismatch();
    });
  }

  // Messages through shared memory move without MPI (lent or copied by the receiver).
  bool moves_only_in_calls() const override { return !messages_; }
  bool wants_progress_thread() const override { return progress_thread_ && moves_only_in_calls(); }

  // steady_clock is CLOCK_MONOTONIC, one clock per machine; ranks_on_node() was settled in
  // the constructor (node_oversubscribed), where every rank took part.
  bool clock_is_shared() const override { return ranks_on_node() == mesh_.device_count(); }

  Request isend(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "isend to");
    if (messages_) return shared_send(data, bytes, peer, tag, true);
    auto r = std::make_unique<MpiRequest>(*this, bytes, peer, tag, true);
    const char* in = static_cast<const char*>(data);
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      check(MPI_Isend(in + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &r->requests.emplace_back()),
            "MPI_Isend");
    });
    return r;
  }

  Request irecv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "recv from");
    if (messages_) return shared_receive(data, bytes, peer, tag, false);
    auto r = std::make_unique<MpiRequest>(*this, bytes, peer, tag, false);
    char* out = static_cast<char*>(data);
    r->buffer = out;
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      r->sizes.push_back(size);
      check(MPI_Irecv(out + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &r->requests.emplace_back()),
            "MPI_Irecv");
    });
    return r;
  }

  // Through shared memory the sender's buffer is lent where it lies in shareable memory
  // (shared_messages.h); otherwise as irecv.
  Request irecv_lent(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    if (!messages_) return irecv(data, bytes, peer, tag);
    check_message(bytes, peer, tag, "recv from");
    return shared_receive(data, bytes, peer, tag, true);
  }

  void barrier() override {
    if (check_) {
      const AxisList all = mesh_.all_axes();
      agree(group(all), {CollectiveOp::barrier, all, DType::f32, {}, {}});
    }
    check(MPI_Barrier(world_), "MPI_Barrier");
  }

  // A nonblocking transfer: its MPI requests, one per piece (for_each_piece).
  class MpiRequest final : public P2PRequest {
   public:
    MpiRequest(MpiCommunicator& comm, std::int64_t bytes, std::int64_t peer, int tag, bool sending)
        : comm_(comm), bytes_(bytes), peer_(peer), tag_(tag), sending_(sending) {}
    // Only an exception unwinding the body drops a request unwaited, and that ends the job
    // (run_mpi); a receive is still cancelled so that nothing lands in freed memory first.
    ~MpiRequest() override {
      if (waited_) return;
      for (MPI_Request& r : requests) {
        if (r == MPI_REQUEST_NULL) continue;
        if (!sending_) MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    }
    void wait() override {
      waited_ = true;
      comm_.complete(*this);
    }
    // Once MPI_Testall has completed the requests it has also freed them and filled the
    // statuses: keep both results for wait(), which would otherwise see empty statuses.
    bool test() override {
      if (!done_) {
        int done = 0;
        rc_ = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses());
        done_ = done != 0 || rc_ != MPI_SUCCESS;  // an error is reported by wait()
      }
      return done_;
    }

    const void* received() const override { return buffer; }

    std::vector<MPI_Request> requests;
    std::vector<int> sizes;        // receives: the bytes each piece expects
    const void* buffer = nullptr;  // a receive's

   private:
    friend class MpiCommunicator;
    MPI_Status* statuses() {
      statuses_.resize(requests.size());
      return statuses_.data();
    }
    MpiCommunicator& comm_;
    std::int64_t bytes_, peer_;
    int tag_;
    bool sending_;
    bool waited_ = false;
    bool done_ = false;  // test() completed the requests (or failed): rc_ and statuses_ hold the result
    int rc_ = MPI_SUCCESS;
    std::vector<MPI_Status> statuses_;
  };

  void complete(MpiRequest& r) {
    const std::string call = p2p_call(r.sending_, r.bytes_, r.peer_, r.tag_);
    MPI_Status* statuses = r.statuses();
    int rc = MPI_SUCCESS;
    if (r.done_) {
      rc = r.rc_;
    } else if (check_) {
      // Polled, so that a peer that never matches ends the job instead of hanging it.
      poll_until(
          Clock::now() + watchdog_, [&] { return r.test(); }, [&] { return p2p_timeout(r.sending_, call); });
      rc = r.rc_;
    } else {
      rc = MPI_Waitall(static_cast<int>(r.requests.size()), r.requests.data(), statuses);
    }
    const auto mismatch = [&] { return p2p_mismatch(call, r.peer_); };
    if (error_class(rc) == MPI_ERR_IN_STATUS) {
      for (std::size_t i = 0; i < r.requests.size(); ++i) {
        if (error_class(statuses[i].MPI_ERROR) == MPI_ERR_TRUNCATE) throw mismatch();
        check(statuses[i].MPI_ERROR, r.sending_ ? "MPI_Isend" : "MPI_Irecv");
      }
    }
    if (error_class(rc) == MPI_ERR_TRUNCATE) throw mismatch();
    check(rc, r.sending_ ? "MPI_Isend" : "MPI_Irecv");
    for (std::size_t i = 0; i < r.sizes.size(); ++i) {
      int got = 0;
      check(MPI_Get_count(&statuses[i], MPI_BYTE, &got), "MPI_Get_count");
      if (got != r.sizes[i]) throw mismatch();
    }
  }

  // How a point-to-point call is named in errors: "recv(8 bytes from rank 1, tag 3)".
  static std::string p2p_call(bool sending, std::int64_t bytes, std::int64_t peer, int tag) {
    return std::string(sending ? "isend(" : "recv(") + std::to_string(bytes) + " bytes " + (sending ? "to" : "from") +
           " rank " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
  }
  CollectiveMismatch p2p_mismatch(const std::string& call, std::int64_t peer) const {
    return CollectiveMismatch("p2p mismatch: rank " + std::to_string(rank_) + " called " + call + " but rank " +
                              std::to_string(peer) + " sent a message of another size");
  }
  std::string p2p_timeout(bool sending, const std::string& call) const {
    return "p2p timeout: rank " + std::to_string(rank_) + " waited " + watchdog_text_ + " in " + call + "; " +
           (sending ? "no receive was posted" : "nothing arrived") + watchdog_hint(watchdog_text_);
  }

  // A send or receive through shared memory (shared_messages.h). A send that lent its data is
  // complete once its receiver is done with it; a receive once it is matched (and copied in,
  // unless lent).
  class SharedRequest final : public P2PRequest {
   public:
    SharedRequest(MpiCommunicator& comm, std::int64_t bytes, std::int64_t peer, int tag,
                  std::optional<SharedMessages::Ticket> ticket, std::shared_ptr<SharedMessages::Receive> receive)
        : comm_(comm), bytes_(bytes), peer_(peer), tag_(tag), ticket_(ticket), receive_(std::move(receive)) {}
    // A receive lets go of what it was lent, or is withdrawn. A send whose receiver may still
    // read its data in place waits, unless an exception is unwinding the body: the job then
    // ends (run_mpi) before the buffer could be reused.
    ~SharedRequest() override {
      if (receive_) {
        comm_.messages_->release(*receive_);
      } else if (std::uncaught_exceptions() == 0) {
        try {
          wait();
        } catch (const std::exception& e) {
          abort_job(static_cast<int>(comm_.rank_), e.what());
        }
      }
    }
    void wait() override {
      const std::string call = p2p_call(!receive_, bytes_, peer_, tag_);
      comm_.wait_shared([&] { return test(); }, [&] { return comm_.p2p_timeout(!receive_, call); });
      if (receive_ && receive_->mismatched) throw comm_.p2p_mismatch(call, peer_);
    }
    bool test() override {
      comm_.messages_->progress();
      return receive_ ? receive_->arrived : !ticket_ || comm_.messages_->acknowledged(*ticket_);
    }
    const void* received() const override { return receive_ ? receive_->at : nullptr; }

   private:
    MpiCommunicator& comm_;
    std::int64_t bytes_, peer_;
    int tag_;
    std::optional<SharedMessages::Ticket> ticket_;
    std::shared_ptr<SharedMessages::Receive> receive_;
  };

  Request shared_send(const void* data, std::int64_t bytes, std::int64_t peer, int tag, bool lend) {
    std::int64_t passes = 0;
    const Clock::time_point deadline = Clock::now() + watchdog_;
    const std::string call = p2p_call(true, bytes, peer, tag);
    const auto ticket = messages_->send(data, static_cast<std::uint64_t>(bytes), static_cast<int>(peer), tag, lend,
                                        [&] { idle_pass(passes, deadline, [&] { return p2p_timeout(true, call); }); });
    ++(ticket ? shared_lent_sends : shared_copied_sends);
    return std::make_unique<SharedRequest>(*this, bytes, peer, tag, ticket, nullptr);
  }
  Request shared_receive(void* data, std::int64_t bytes, std::int64_t peer, int tag, bool lent) {
    return std::make_unique<SharedRequest>(
        *this, bytes, peer, tag, std::nullopt,
        messages_->receive(data, static_cast<std::uint64_t>(bytes), static_cast<int>(peer), tag, lent));
  }

  // Spins until `done()`, a pass of idle_pass whenever it is not.
  template <class Done, class Timeout>
  void wait_shared(Done&& done, Timeout&& timeout) {
    std::int64_t passes = 0;
    const Clock::time_point deadline = Clock::now() + watchdog_;
    while (!done()) idle_pass(passes, deadline, timeout);
  }

  // One idle pass of a wait on shared memory. Now and then only it enters MPI: that cost a pass
  // up to ~50 us at times, and shared memory moves without it. It is there for a peer that
  // waits in MPI for a buffered send of this rank's, which moves only when this rank enters
  // MPI, and in check mode for the notes and the watchdog.
  template <class Timeout>
  void idle_pass(std::int64_t& passes, Clock::time_point deadline, Timeout&& timeout) {
    if (++passes % kSharedProgressEvery == 0) {
      if (check_) {
        receive_checks();
        if (Clock::now() > deadline) abort_job(rank_, timeout().c_str());
      } else {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world_, &flag, MPI_STATUS_IGNORE);
      }
    }
    if (yield_) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }

  // Completes this rank's sends still in flight; run before the communicators go away. In
  // check mode it first tells every other rank that this one has returned (an empty message
  // on checks_) and waits until each has said the same: a peer waiting in a collective for
  // this rank learns that it never comes, and no fingerprint is left in flight.
  void finish() {
    if (check_) {
      std::vector<int> others;
      for (int r = 0; r < mesh_.device_count(); ++r) {
        if (r != rank_) others.push_back(r);
      }
      post({}, others);
      std::vector<char> returned(inbox_.size(), 0);
      returned[static_cast<std::size_t>(rank_)] = 1;
      std::vector<std::int64_t> running;
      poll_until(
          Clock::now() + watchdog_,
          [&] {
            running.clear();
            for (int r : others) {
              std::deque<Note>& notes = inbox_[static_cast<std::size_t>(r)];
              // Whatever comes before a peer's end is left over from a mismatch.
              for (; !notes.empty(); notes.pop_front()) returned[static_cast<std::size_t>(r)] |= notes.front().returned;
              if (!returned[static_cast<std::size_t>(r)]) running.push_back(r);
            }
            return running.empty();
          },
          [&] {
            return "collective timeout at the end of the run: rank " + std::to_string(rank_) + " returned and waited " +
                   watchdog_text_ + "; " + ranks(running) + " never returned" + watchdog_hint(watchdog_text_);
          });
    }
    for (Outgoing& o : outgoing_) {
      check(MPI_Waitall(static_cast<int>(o.requests.size()), o.requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
    outgoing_.clear();
    // A copied send's block goes when its receiver has read it, not with this communicator.
    if (messages_) {
      wait_shared([&] { return messages_->sends_read(); },
                  [&] {
                    return "p2p timeout at the end of the run: rank " + std::to_string(rank_) + " waited " +
                           watchdog_text_ + " for its peers to receive what it sent; a receive was never posted" +
                           watchdog_hint(watchdog_text_);
                  });
    }
  }

 private:
  struct Group {
    MPI_Comm comm = MPI_COMM_NULL;  // built by joined()
    std::int64_t size = 1;
    std::size_t me = 0;                // this rank's group rank
    std::vector<int> members;          // device ids, by group rank
    std::vector<std::int64_t> sorted;  // the same, ascending, as fingerprint.h takes them
    std::string label;                 // "over X of device 0", for messages
    // Where all members share a node (and shared memory is on): their window and its exchange.
    MPI_Win window = MPI_WIN_NULL;
    std::unique_ptr<SharedExchange> shared;
  };
  // A fingerprint from a peer, or its notice that it returned from the body.
  struct Note {
    bool returned = false;
    Fingerprint fp;
  };
  // One member's share of an exchange, in elements.
  struct Transfer {
    const char* send = nullptr;
    std::int64_t send_count = 0;
    char* recv = nullptr;
    std::int64_t recv_count = 0;
  };
  struct Outgoing {
    std::unique_ptr<char[]> data;
    std::vector<MPI_Request> requests;
  };

  // The group's members, from the mesh alone: no communication, so that in check mode the
  // members compare their calls before anything depends on them agreeing.
  Group& group(const AxisList& axes) {
    if (auto it = groups_.find(axes); it != groups_.end()) return it->second;
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] < 0 || axes[i] >= mesh_.rank() || std::count(axes.begin(), axes.begin() + i, axes[i]) > 0) {
        throw InputError("group axis " + std::to_string(axes[i]) + " is out of range or repeated for mesh " +
                         mesh_.to_string() + "; a group lists distinct axes numbered 0 to " +
                         std::to_string(mesh_.rank() - 1));
      }
    }
    Group g;
    g.members = as_ints(mesh_.group_members(rank_, axes));
    g.size = static_cast<std::int64_t>(g.members.size());
    g.me = static_cast<std::size_t>(mesh_.group_rank(rank_, axes));
    g.sorted.assign(g.members.begin(), g.members.end());
    std::sort(g.sorted.begin(), g.sorted.end());
    g.label = "over " + axes_label(mesh_, axes) + " of device " + std::to_string(g.sorted.front());
    return groups_.emplace(axes, std::move(g)).first->second;
  }

  // The group with its communicator, built on first use. MPI_Comm_create_group involves only
  // the group's members (MPI_Comm_split would need every rank of the world), so a collective
  // that only part of the mesh runs cannot hang on ranks that never reach it. Members are
  // listed in group-rank order, which makes the MPI rank the group rank.
  const Group& joined(Group& g) {
    if (g.comm != MPI_COMM_NULL) return g;
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group sub = MPI_GROUP_NULL;
    check(MPI_Comm_group(world_, &world_group), "MPI_Comm_group");
    int rc = MPI_Group_incl(world_group, static_cast<int>(g.members.size()), g.members.data(), &sub);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(world_, sub, kCreateGroupTag, &g.comm);
    MPI_Group_free(&world_group);
    if (sub != MPI_GROUP_NULL) MPI_Group_free(&sub);
    check(rc, "MPI_Comm_create_group");
    check(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    if (shared_memory_ && g.size > 1) share_window(g);
    return g;
  }

  // Gives the group a shared window when all its members are on this node: collective over
  // the group, like the communicator before it.
  void share_window(Group& g) {
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int on_node = 0;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    if (on_node != g.size) return;
    const auto n = static_cast<std::size_t>(g.size);
    const std::int64_t limit = shared_part_limit.load();
    std::int64_t wanted = limit > 0 ? limit : shared_bank_bytes() / (g.size - 1);
    wanted = std::max<std::int64_t>(SharedExchange::kLine, wanted / SharedExchange::kLine * SharedExchange::kLine);
    // The members must agree on the layout; a core's L2 may differ between cores of one node.
    check(MPI_Allreduce(MPI_IN_PLACE, &wanted, 1, MPI_INT64_T, MPI_MIN, g.comm), "MPI_Allreduce");
    const auto part = static_cast<std::size_t>(wanted);
    MPI_Info info = MPI_INFO_NULL;
    check(MPI_Info_create(&info), "MPI_Info_create");
    // Each segment on its owner's pages (its NUMA node), not one block where rank 0 put it.
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char* mine = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(SharedExchange::segment_bytes(n, part)), 1, info,
                                           g.comm, &mine, &g.window);
    MPI_Info_free(&info);
    // Where the window could not be had (no shared-memory support, /dev/shm full) on any
    // member, all keep to messages: the group must agree on its path.
    int had = rc == MPI_SUCCESS ? 1 : 0;
    check(MPI_Allreduce(MPI_IN_PLACE, &had, 1, MPI_INT, MPI_MIN, g.comm), "MPI_Allreduce");
    if (!had) {
      if (rc == MPI_SUCCESS) MPI_Win_free(&g.window);
      g.window = MPI_WIN_NULL;
      return;
    }
    SharedExchange::clear(mine, n);
    std::vector<char*> segments(n);
    for (std::size_t m = 0; m < n; ++m) {
      MPI_Aint bytes = 0;
      int unit = 0;
      check(MPI_Win_shared_query(g.window, static_cast<int>(m), &bytes, &unit, &segments[m]), "MPI_Win_shared_query");
    }
    check(MPI_Barrier(g.comm), "MPI_Barrier");  // every segment is cleared before anyone writes
    g.shared = std::make_unique<SharedExchange>(std::move(segments), g.me, part, exchange_copy_);
  }

  // Point-to-point through shared memory (shared_messages.h) when every rank is on this node:
  // each makes a mailbox, they swap where to find them, and each maps the others'. If any rank
  // cannot (no memfd, /proc closed to it, ranks in different pid namespaces), all keep to MPI
  // messages. From then on Buffers of this process are shareable, so
  // that the rings lend them. Collective over the world, from the constructor.
  void share_messages() {
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int on_node = 0;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    const auto n = static_cast<std::size_t>(mesh_.device_count());
    if (static_cast<std::size_t>(on_node) != n) return;  // the same answer on every rank
    const std::size_t bytes = SharedMessages::mailbox_bytes(n);
    char* mine = static_cast<char*>(allocate_shareable(bytes));
    // pid, mailbox fd and serial, and the pid namespace: a peer's pid means the same process
    // here only within one namespace.
    constexpr int kCard = 4;
    struct stat ns {};
    std::int64_t card[kCard] = {getpid(), -1, 0,
                                stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<std::int64_t>(ns.st_ino) : -1};
    if (mine) {
      std::memset(mine, 0, bytes);
      const BlockName name = find_shareable(mine, bytes)->block;
      card[1] = name.fd;
      card[2] = static_cast<std::int64_t>(name.serial);
    }
    std::vector<std::int64_t> cards(kCard * n);
    check(MPI_Allgather(card, kCard, MPI_INT64_T, cards.data(), kCard, MPI_INT64_T, world_), "MPI_Allgather");
    std::vector<MappedBlock> mapped(n);
    std::vector<char*> boxes(n);
    std::vector<pid_t> pids(n);
    int had = mine && card[3] >= 0 ? 1 : 0;
    for (std::size_t r = 0; r < n; ++r) {
      const std::int64_t* c = &cards[kCard * r];
      pids[r] = static_cast<pid_t>(c[0]);
      if (static_cast<int>(r) == rank_) {
        boxes[r] = mine;
      } else if (c[1] < 0 || c[3] != card[3] || !had) {
        had = 0;
      } else {
        try {
          mapped[r] = MappedBlock(pids[r], {static_cast<std::int32_t>(c[1]), static_cast<std::uint64_t>(c[2])}, true);
          boxes[r] = mapped[r].data();
        } catch (const std::runtime_error&) {  // no access to the peer's descriptors, say
          had = 0;
        }
      }
    }
    check(MPI_Allreduce(MPI_IN_PLACE, &had, 1, MPI_INT, MPI_MIN, world_), "MPI_Allreduce");
    if (!had) {
      if (mine) free_shareable(mine);
      return;
    }
    own_mailbox_ = mine;
    peer_mailboxes_ = std::move(mapped);
    messages_ = std::make_unique<SharedMessages>(rank_, std::move(boxes), std::move(pids));
    set_buffers_shareable(true);
  }

  // Check mode: before any data moves, the members of `g` tell each other what they are
  // calling, and all throw the same CollectiveMismatch when they disagree (worded as the
  // threads backend words it, fingerprint.h). Each member sends its fingerprint to every
  // other over checks_ and reads theirs in the order they were sent (MPI keeps a pair's
  // messages in order), so a member's next note to this rank is one of:
  //   - a fingerprint for this group: compared once every member's is in;
  //   - a fingerprint for another group that includes this rank: each of the two waits for
  //     the other, a certain deadlock, so a mismatch now;
  //   - its notice that it returned from the body (finish()): it will never come.
  // No note yet means not arrived; past the watchdog this rank ends the job naming those.
  void agree(const Group& g, const Fingerprint& fp) {
    if (!check_ || g.size == 1) return;
    std::vector<int> others;
    for (int m : g.sorted) {
      if (m != rank_) others.push_back(m);
    }
    post(encode(fp), others);
    const AxisList key = axis_set(fp.axes);
    std::vector<std::int64_t> absent, gone, elsewhere;
    poll_until(
        Clock::now() + watchdog_,
        [&] {
          absent.clear();
          gone.clear();
          elsewhere.clear();
          for (int m : others) {
            const std::deque<Note>& notes = inbox_[static_cast<std::size_t>(m)];
            if (notes.empty()) {
              absent.push_back(m);
            } else if (notes.front().returned) {
              gone.push_back(m);
            } else if (axis_set(notes.front().fp.axes) != key) {
              elsewhere.push_back(m);
            }
          }
          return absent.empty() || !gone.empty() || !elsewhere.empty();
        },
        [&] {
          return "collective timeout in group " + g.label + ": rank " + std::to_string(rank_) + " called " +
                 describe(mesh_, fp, false) + " and waited " + watchdog_text_ + "; " + ranks(absent) +
                 " never arrived" + watchdog_hint(watchdog_text_);
        });
    if (!gone.empty() || !elsewhere.empty()) {
      // Left in the inbox: these notes are not this collective's.
      std::string why = "collective mismatch in group " + g.label + ": rank " + std::to_string(rank_) + " called " +
                        describe(mesh_, fp, !elsewhere.empty());
      for (std::size_t k = 0; k < elsewhere.size(); ++k) {
        why += (k ? ", rank " : "; rank ") + std::to_string(elsewhere[k]) + " called " +
               describe(mesh_, inbox_[static_cast<std::size_t>(elsewhere[k])].front().fp, true);
      }
      if (!gone.empty()) why += "; " + ranks(gone) + " returned without calling it";
      throw CollectiveMismatch(why);
    }
    std::vector<Fingerprint> theirs;
    theirs.reserve(others.size());
    for (int m : others) {
      theirs.push_back(std::move(inbox_[static_cast<std::size_t>(m)].front().fp));
      inbox_[static_cast<std::size_t>(m)].pop_front();
    }
    std::vector<const Fingerprint*> fps;
    for (std::size_t i = 0, k = 0; i < g.sorted.size(); ++i) {
      fps.push_back(g.sorted[i] == rank_ ? &fp : &theirs[k++]);
    }
    if (std::string why = disagreement(mesh_, g.sorted, fps); !why.empty()) throw CollectiveMismatch(why);
  }

  // A fingerprint on the wire: op, dtype, reduction, the axes, the counts and the receive
  // counts, each list after its length. The notice that a rank returned is the empty message.
  static std::vector<std::int64_t> encode(const Fingerprint& fp) {
    std::vector<std::int64_t> wire{static_cast<std::int64_t>(fp.op), static_cast<std::int64_t>(fp.dtype),
                                   static_cast<std::int64_t>(fp.reduce)};
    wire.push_back(static_cast<std::int64_t>(fp.axes.size()));
    wire.insert(wire.end(), fp.axes.begin(), fp.axes.end());
    for (const Counts* c : {&fp.counts, &fp.recv_counts}) {
      wire.push_back(static_cast<std::int64_t>(c->size()));
      wire.insert(wire.end(), c->begin(), c->end());
    }
    return wire;
  }

  static Note decode(const std::vector<std::int64_t>& wire) {
    Note note;
    if (wire.empty()) {
      note.returned = true;
      return note;
    }
    auto at = wire.begin();
    note.fp.op = static_cast<CollectiveOp>(*at++);
    note.fp.dtype = static_cast<DType>(*at++);
    note.fp.reduce = static_cast<ReduceOp>(*at++);
    const auto naxes = *at++;
    note.fp.axes.assign(at, at + naxes);
    at += naxes;
    for (Counts* c : {&note.fp.counts, &note.fp.recv_counts}) {
      const auto n = *at++;
      c->assign(at, at + n);
      at += n;
    }
    return note;
  }

  // Members over the same set of axes form the same group whatever the order, so that XY
  // against YX is compared (and reported) rather than taken for two groups.
  static AxisList axis_set(AxisList axes) {
    // Sorted by insertion: std::sort's heap fallback draws a false -Warray-bounds from GCC 12
    // on the inline list here.
    for (auto it = axes.begin(); it != axes.end(); ++it)
      std::rotate(std::upper_bound(axes.begin(), it, *it), it, it + 1);
    return axes;
  }

  // Sends `wire` to each of `to` on checks_, in the background.
  void post(const std::vector<std::int64_t>& wire, const std::vector<int>& to) {
    reap_sends();
    Outgoing& o = outgoing_.emplace_back();
    const std::size_t bytes = wire.size() * sizeof(std::int64_t);
    o.data = std::make_unique_for_overwrite<char[]>(bytes);
    if (bytes > 0) std::memcpy(o.data.get(), wire.data(), bytes);
    for (int r : to) {
      check(MPI_Isend(o.data.get(), static_cast<int>(wire.size()), MPI_INT64_T, r, kCheckTag, checks_,
                      &o.requests.emplace_back()),
            "MPI_Isend");
    }
  }

  // Moves every note that has arrived on checks_ into its sender's inbox.
  void receive_checks() {
    for (;;) {
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      check(MPI_Improbe(MPI_ANY_SOURCE, kCheckTag, checks_, &flag, &message, &status), "MPI_Improbe");
      if (!flag) return;
      int n = 0;
      check(MPI_Get_count(&status, MPI_INT64_T, &n), "MPI_Get_count");
      std::vector<std::int64_t> wire(static_cast<std::size_t>(n));
      check(MPI_Mrecv(wire.data(), n, MPI_INT64_T, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
      inbox_[static_cast<std::size_t>(status.MPI_SOURCE)].push_back(decode(wire));
    }
  }

  // Takes in notes until `done` says so. Past `deadline` no exception could free a peer that
  // is blocked elsewhere, so this rank prints `timeout()` and ends the job.
  template <class Done, class Timeout>
  void poll_until(Clock::time_point deadline, Done&& done, Timeout&& timeout) {
    for (;;) {
      receive_checks();
      if (done()) return;
      if (Clock::now() > deadline) abort_job(rank_, timeout().c_str());
      if (yield_) std::this_thread::yield();
    }
  }

  // The data of all_gather, once the members agree.
  void gather(const Group& g, const void* send, void* recv, const Counts& counts, DType dtype) {
    const MPI_Datatype type = mpi_type(dtype);
    const std::vector<std::int64_t> displs = displacements(counts);
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    char* out = static_cast<char*>(recv);
    const char* mine = static_cast<const char*>(send);
    const bool in_place = mine == out + displs[g.me] * esz;
    if (!g.shared && fits_one_call(counts, displs)) {
      check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, static_cast<int>(counts[g.me]), type, recv,
                           as_ints(counts).data(), as_ints(displs).data(), type, g.comm),
            "MPI_Allgatherv");
      return;
    }
    std::vector<Transfer> transfers(counts.size());
    for (std::size_t m = 0; m < counts.size(); ++m) {
      transfers[m] = {mine, counts[g.me], out + displs[m] * esz, counts[m]};
    }
    exchange(g, transfers, type, esz, op_label("all_gather", dtype));
  }

  // The data of reduce_scatter, once the members agree (and the first half of all_reduce,
  // which also reduces with `op` = max).
  void scatter_reduce(const Group& g, const void* send, void* recv, const Counts& counts, DType dtype, ReduceOp op) {
    const MPI_Datatype type = mpi_type(dtype);
    // The other members' chunks [me] land side by side in the workspace (this rank's own
    // stays in `send`; a lent chunk stays where its sender keeps it), then all are summed in
    // member order. A library reduction
    // (MPI_Reduce_scatter) would pick its own order and lose bitwise agreement with the
    // threads backend. Point to point rather than MPI_Alltoallv: the same messages, and no
    // int limit on counts or offsets.
    const std::int64_t mine = counts[g.me];
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    const char* in = static_cast<const char*>(send);
    const std::vector<std::int64_t> send_displs = displacements(counts);
    Counts send_counts = counts, recv_counts(counts.size(), mine);
    std::vector<std::int64_t> recv_displs(counts.size(), 0);
    send_counts[g.me] = recv_counts[g.me] = 0;
    for (std::size_t m = 0; m < counts.size(); ++m) {
      if (m != g.me) recv_displs[m] = static_cast<std::int64_t>(m < g.me ? m : m - 1) * mine;
    }
    char* chunks = workspace(checked_mul(checked_mul(g.size - 1, mine, "reduce_scatter's buffer"),
                                         static_cast<long long>(esz), "reduce_scatter's buffer"));
    const std::vector<Transfer> transfers =
        chunk_transfers(in, send_counts, send_displs, chunks, recv_counts, recv_displs, esz);
    // Lent chunks are summed where their senders keep them.
    exchange(g, transfers, type, esz, op_label("reduce_scatter", dtype), true,
             [&](const std::vector<const void*>& at) { detail::reduce_in_order(op, dtype, at, mine, recv); });
  }

  // all_reduce once the members agree: a reduce-scatter of an even split (the first
  // count % n members take one extra element), then a gather of the sums back in place, in
  // segments. Every segment's messages are posted at once; this rank sums segment k of its
  // chunk as soon as the other members' copies of it are in, and sends the sum straight back
  // out, while the later segments are still arriving: the copies and the sum are summed and
  // sent while still in cache, where whole halves one after the other went through memory
  // twice more. Each element is reduced once (summed, or for ReduceOp::max its maximum taken),
  // in member order, as on the threads backend.
  void segmented_all_reduce(const Group& g, char* data, std::int64_t count, DType dtype, ReduceOp reduce) {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    const auto n = static_cast<std::size_t>(g.size);
    const Counts split = even_split(count, g.size);
    const std::vector<std::int64_t> chunk_at = displacements(split);
    const std::int64_t mine = split[g.me];
    const std::int64_t segment =
        std::clamp<std::int64_t>(kAllReduceSegmentBytes / static_cast<std::int64_t>(esz), 1, count_limit.load());
    // At least one (empty) segment, so that a member passing another count is a mismatch, not a hang.
    const std::int64_t segments = std::max<std::int64_t>(1, (split[0] + segment - 1) / segment);
    const auto begin = [&](std::size_t m, std::int64_t k) { return std::min(k * segment, split[m]); };
    const auto size = [&](std::size_t m, std::int64_t k) { return static_cast<int>(begin(m, k + 1) - begin(m, k)); };
    const auto at = [&](std::size_t m, std::int64_t k) { return data + (chunk_at[m] + begin(m, k)) * esz; };
    // Member m's copy of this rank's chunk (m != me), side by side in member order.
    char* copies = workspace(checked_mul(checked_mul(g.size - 1, mine, "all_reduce's buffer"),
                                         static_cast<long long>(esz), "all_reduce's buffer"));
    const auto copy_at = [&](std::size_t m, std::int64_t k) {
      return copies + (static_cast<std::int64_t>(m < g.me ? m : m - 1) * mine + begin(g.me, k)) * esz;
    };
    const std::size_t others = n - 1;
    const auto per_segment = static_cast<std::size_t>(segments) * others;
    // By segment, then member: the copies arriving, this rank's copies of the others' chunks
    // leaving, the sums arriving, this rank's sums leaving.
    std::vector<MPI_Request> copies_in(per_segment), copies_out(per_segment), sums_in(per_segment),
        sums_out(per_segment);
    std::vector<std::size_t> from(others);
    std::vector<int> expected_copy(others), expected_sum(others);
    for (std::size_t m = 0, i = 0; m < n; ++m) {
      if (m != g.me) from[i++] = m;
    }
    for (std::int64_t k = 0; k < segments; ++k) {
      for (std::size_t i = 0; i < others; ++i) {
        const std::size_t m = from[i];
        check(MPI_Irecv(copy_at(m, k), size(g.me, k), type, static_cast<int>(m), kPieceTag, g.comm,
                        &copies_in[k * others + i]),
              "MPI_Irecv");
      }
    }
    for (std::int64_t k = 0; k < segments; ++k) {
      for (std::size_t i = 0; i < others; ++i) {
        const std::size_t m = from[i];
        check(
            MPI_Isend(at(m, k), size(m, k), type, static_cast<int>(m), kPieceTag, g.comm, &copies_out[k * others + i]),
            "MPI_Isend");
      }
    }
    const std::string op = op_label("all_reduce", dtype);
    std::vector<const void*> sources(n);
    for (std::int64_t k = 0; k < segments; ++k) {
      const std::size_t first = static_cast<std::size_t>(k) * others;
      std::fill(expected_copy.begin(), expected_copy.end(), size(g.me, k));
      wait_checked(copies_in.data() + first, others, from, expected_copy, type, g, op);
      // The sums arriving overwrite what this rank sent of the same segment.
      check(MPI_Waitall(static_cast<int>(others), copies_out.data() + first, MPI_STATUSES_IGNORE), "MPI_Waitall");
      for (std::size_t i = 0; i < others; ++i) {
        const std::size_t m = from[i];
        check(MPI_Irecv(at(m, k), size(m, k), type, static_cast<int>(m), kGatherTag, g.comm, &sums_in[first + i]),
              "MPI_Irecv");
      }
      for (std::size_t m = 0; m < n; ++m) sources[m] = m == g.me ? at(g.me, k) : copy_at(m, k);
      detail::reduce_in_order(reduce, dtype, sources, size(g.me, k), at(g.me, k));
      for (std::size_t i = 0; i < others; ++i) {
        check(MPI_Isend(at(g.me, k), size(g.me, k), type, static_cast<int>(from[i]), kGatherTag, g.comm,
                        &sums_out[first + i]),
              "MPI_Isend");
      }
    }
    for (std::int64_t k = 0; k < segments; ++k) {
      for (std::size_t i = 0; i < others; ++i) expected_sum[i] = size(from[i], k);
      wait_checked(sums_in.data() + static_cast<std::size_t>(k) * others, others, from, expected_sum, type, g, op);
    }
    check(MPI_Waitall(static_cast<int>(per_segment), sums_out.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  // all_reduce through the group's shared window: a reduce_scatter of an even split (as
  // segmented_all_reduce splits it) into this rank's chunk, in place, then a gather of the sums
  // in place. The exchanges move pieces through cache-sized rounds already.
  void shared_all_reduce(const Group& g, char* data, std::int64_t count, DType dtype, ReduceOp op) {
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    const Counts split = even_split(count, g.size);
    char* mine = data + displacements(split)[g.me] * esz;
    scatter_reduce(g, data, mine, split, dtype, op);
    gather(g, mine, data, split, dtype);
  }

  // An exchange whose pieces all land in the receives.
  void exchange(const Group& g, const std::vector<Transfer>& transfers, MPI_Datatype type, std::size_t esz,
                const std::string& op) {
    exchange(g, transfers, type, esz, op, false, [](const std::vector<const void*>&) {});
  }

  // The data of an exchange: through the group's shared window where it has one, else as MPI
  // messages. Where every rank is on this node, a large piece whose bytes lie in shareable
  // memory is lent instead (shared_messages.h): the window carries only its size, and its
  // receiver reads it out of the sender's memory — one pass over the bytes, where the window
  // takes two (into the sender's segment, out of it) and Open MPI's transport two through its
  // fragments. The sender decides piece by piece; the receiver learns it from the window.
  //
  // `use(at)` is called once all has arrived, at[m] where member m's piece lies: in its
  // receive, or, with `read_in_place`, a lent piece where its sender keeps it (valid during
  // the call only), and this rank's own piece in its send. A member returns once every peer is
  // done with what it lent.
  template <class Use>
  void exchange(const Group& g, const std::vector<Transfer>& transfers, MPI_Datatype type, std::size_t esz,
                const std::string& op, bool read_in_place, Use&& use) {
    const Clock::time_point entered = Clock::now();
    const std::size_t n = transfers.size();
    std::vector<const void*> at(n);
    for (std::size_t m = 0; m < n; ++m) {
      at[m] = m == g.me && read_in_place ? static_cast<const void*>(transfers[m].send) : transfers[m].recv;
    }
    if (!g.shared) {
      exchange_point_to_point(g, transfers, type, esz, op);
      use(at);
      return;
    }
    const Clock::time_point deadline = entered + watchdog_;
    std::int64_t passes = 0;
    std::vector<std::optional<SharedMessages::Ticket>> lent(n);         // pieces this rank lends
    std::vector<std::shared_ptr<SharedMessages::Receive>> receives(n);  // pieces lent to it
    const auto idle = [&] {
      idle_pass(passes, deadline, [&] {
        // Who it waits for, through the window and for lent pieces: a member stopped or
        // starved of CPU stops sending and reading, and the others then stall behind it.
        SharedExchange::Waiting w = g.shared->waiting_for();
        for (std::size_t m = 0; m < n; ++m) {
          if (receives[m] && !receives[m]->arrived) w.not_sent.push_back(m);
          if (lent[m] && !messages_->acknowledged(*lent[m])) w.not_read.push_back(m);
        }
        const auto as_ranks = [&](std::vector<std::size_t> members) {
          std::sort(members.begin(), members.end());
          members.erase(std::unique(members.begin(), members.end()), members.end());
          std::vector<std::int64_t> out;
          for (std::size_t m : members) out.push_back(g.members[m]);
          return ranks(out);
        };
        std::string behind;
        if (!w.not_sent.empty()) behind += "; the data of " + as_ranks(w.not_sent) + " had not all arrived";
        if (!w.not_read.empty()) {
          behind += "; " + as_ranks(w.not_read) + " had not read what rank " + std::to_string(rank_) +
                    " sent (a process stopped or starved of CPU?)";
        }
        return "collective timeout in group " + g.label + ": rank " + std::to_string(rank_) + " waited " +
               watchdog_text_ + " for the data of " + op + " after every member had called it" + behind +
               watchdog_hint(watchdog_text_);
      });
    };
    std::vector<SharedExchange::Share> shares(n);
    std::vector<char> lendable(n, 0);
    std::int64_t lendable_bytes = 0;
    for (std::size_t m = 0; m < n; ++m) {
      const Transfer& t = transfers[m];
      const std::int64_t bytes = t.send_count * static_cast<std::int64_t>(esz);
      shares[m] = {t.send, bytes, t.recv, t.recv_count * static_cast<std::int64_t>(esz), m == g.me && read_in_place};
      if (m != g.me && messages_ && bytes >= kLentPieceBytes &&
          messages_->lendable(t.send, static_cast<std::uint64_t>(bytes))) {
        lendable[m] = 1;
        lendable_bytes += bytes;
      }
    }
    if (lendable_bytes > 0 && lend_choice_.lend(op + " " + g.label, lendable_bytes, entered)) {
      for (std::size_t m = 0; m < n; ++m) {
        if (!lendable[m]) continue;
        lent[m] = messages_->send(transfers[m].send, static_cast<std::uint64_t>(shares[m].send_bytes), g.members[m],
                                  kLentPieceTag, true, idle);
        shares[m].elsewhere = true;
      }
    }
    ++shared_exchanges;
    const auto mismatch = [&](std::size_t m) { throw count_mismatch(op, transfers[m].recv_count, g.members[m]); };
    g.shared->exchange(shares, idle, mismatch);
    if (!messages_) {  // nothing lent: all came through the window
      use(at);
      return;
    }
    // Lets go of the pieces read in place, also when a mismatch throws.
    struct Release {
      SharedMessages& messages;
      std::vector<std::shared_ptr<SharedMessages::Receive>>& receives;
      ~Release() {
        for (auto& r : receives) {
          if (r) messages.release(*r);
        }
      }
    } release{*messages_, receives};
    for (std::size_t m = 0; m < n; ++m) {
      if (m == g.me || !g.shared->arrives_elsewhere(m)) continue;
      ++lent_pieces;
      receives[m] = messages_->receive(transfers[m].recv, static_cast<std::uint64_t>(shares[m].recv_bytes),
                                       g.members[m], kLentPieceTag, read_in_place);
    }
    const auto arrived = [&] {
      messages_->progress();
      return std::all_of(receives.begin(), receives.end(), [](const auto& r) { return !r || r->arrived; });
    };
    while (!arrived()) idle();
    for (std::size_t m = 0; m < n; ++m) {
      if (!receives[m]) continue;
      if (receives[m]->mismatched) mismatch(m);
      at[m] = receives[m]->at;
    }
    use(at);
    for (auto& r : receives) {
      if (r) messages_->release(*r);
    }
    const auto read = [&] {
      messages_->progress();
      return std::all_of(lent.begin(), lent.end(), [&](const auto& t) { return !t || messages_->acknowledged(*t); });
    };
    while (!read()) idle();
  }

  // A member `from` (device id) sent another count than the `expected` elements this rank takes.
  CollectiveMismatch count_mismatch(const std::string& op, std::int64_t expected, int from) const {
    return CollectiveMismatch("collective mismatch in " + op + ": rank " + std::to_string(rank_) +
                              " expects a message of " + std::to_string(expected) + " elements from rank " +
                              std::to_string(from) + ", which sent another count");
  }

  // Waits for `count` receives, receive i from member from[i] of `expected[i]` elements. One
  // truncated, or short of that, means its sender passed another count than this rank.
  void wait_checked(MPI_Request* receives, std::size_t count, const std::vector<std::size_t>& from,
                    const std::vector<int>& expected, MPI_Datatype type, const Group& g, const std::string& op) {
    std::vector<MPI_Status> statuses(count);
    const int rc = MPI_Waitall(static_cast<int>(count), receives, statuses.data());
    const auto mismatch = [&](std::size_t i) { return count_mismatch(op, expected[i], g.members[from[i]]); };
    if (error_class(rc) == MPI_ERR_IN_STATUS) {
      for (std::size_t i = 0; i < count; ++i) {
        if (error_class(statuses[i].MPI_ERROR) == MPI_ERR_TRUNCATE) throw mismatch(i);
        if (statuses[i].MPI_ERROR != MPI_ERR_PENDING) check(statuses[i].MPI_ERROR, "MPI_Waitall");
      }
    }
    check(rc, "MPI_Waitall");
    for (std::size_t i = 0; i < count; ++i) {
      int got = 0;
      check(MPI_Get_count(&statuses[i], type, &got), "MPI_Get_count");
      if (got != expected[i]) throw mismatch(i);
    }
  }

  // One Transfer per member from concatenated chunks (counts and offsets in elements).
  static std::vector<Transfer> chunk_transfers(const char* send, const Counts& send_counts,
                                               const std::vector<std::int64_t>& sdispls, char* recv,
                                               const Counts& recv_counts, const std::vector<std::int64_t>& rdispls,
                                               std::size_t esz) {
    std::vector<Transfer> t(send_counts.size());
    for (std::size_t m = 0; m < t.size(); ++m) {
      t[m] = {send + sdispls[m] * esz, send_counts[m], recv + rdispls[m] * esz, recv_counts[m]};
    }
    return t;
  }

  // Nonblocking sends and receives, one per member and direction, or several of at most
  // count_limit elements each where a count overflows an int; addressed by pointer, so no offset
  // is ever an int. Pieces between a pair arrive in order (MPI messages do not overtake each
  // other). An empty transfer is still one empty message, so a member that expects elements
  // nobody sent gets a CollectiveMismatch instead of waiting forever.
  void exchange_point_to_point(const Group& g, const std::vector<Transfer>& transfers, MPI_Datatype type,
                               std::size_t esz, const std::string& op) {
    const Transfer& self = transfers[g.me];  // send_count == recv_count, checked by the callers
    std::vector<MPI_Request> receives, sends;
    std::vector<std::size_t> from;  // the member each receive is from
    std::vector<int> expected;      // and its count
    for (std::size_t m = 0; m < transfers.size(); ++m) {
      if (m == g.me) continue;
      for_each_piece(transfers[m].recv_count, [&](std::int64_t at, int size) {
        check(MPI_Irecv(transfers[m].recv + static_cast<std::size_t>(at) * esz, size, type, static_cast<int>(m),
                        kPieceTag, g.comm, &receives.emplace_back()),
              "MPI_Irecv");
        from.push_back(m);
        expected.push_back(size);
      });
    }
    for (std::size_t m = 0; m < transfers.size(); ++m) {
      if (m == g.me) continue;
      for_each_piece(transfers[m].send_count, [&](std::int64_t at, int size) {
        check(MPI_Isend(transfers[m].send + static_cast<std::size_t>(at) * esz, size, type, static_cast<int>(m),
                        kPieceTag, g.comm, &sends.emplace_back()),
              "MPI_Isend");
      });
    }
    if (self.send != self.recv && self.send_count > 0) {
      std::memcpy(self.recv, self.send, static_cast<std::size_t>(self.send_count) * esz);
    }
    wait_checked(receives.data(), receives.size(), from, expected, type, g, op);
    check(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  void check_message(std::int64_t bytes, std::int64_t peer, int tag, const char* op) const {
    if (peer < 0 || peer >= mesh_.device_count()) {
      throw InputError(std::string(op) + " device " + std::to_string(peer) + ": mesh " + mesh_.to_string() +
                       " has devices 0 to " + std::to_string(mesh_.device_count() - 1));
    }
    if (bytes < 0) {
      throw InputError(std::string(op) + " device " + std::to_string(peer) + " of " + std::to_string(bytes) +
                       " bytes; a message size is >= 0");
    }
    if (tag < 0 || tag > tag_ub_) {
      throw InputError(std::string(op) + " device " + std::to_string(peer) + " with tag " + std::to_string(tag) +
                       "; the mpi backend takes tags 0 to " + std::to_string(tag_ub_));
    }
  }

  // A message goes out as ceil(bytes / limit) pieces, and as one empty piece when it is empty,
  // so that sender and receiver agree on the number of MPI messages.
  template <class F>
  void for_each_piece(std::int64_t bytes, F&& piece) const {
    const std::int64_t limit = count_limit.load();
    std::int64_t at = 0;
    do {
      const std::int64_t size = std::min(limit, bytes - at);
      piece(at, static_cast<int>(size));
      at += size;
    } while (at < bytes);
  }

  // Scratch memory kept across calls: a fresh large allocation each call would cost its page
  // faults every time.
  char* workspace(std::int64_t bytes) {
    if (bytes > workspace_bytes_) {
      workspace_ = std::make_unique_for_overwrite<char[]>(static_cast<std::size_t>(bytes));
      workspace_bytes_ = bytes;
    }
    return workspace_.get();
  }

  // Frees the buffers of sends that have completed.
  void reap_sends() {
    std::erase_if(outgoing_, [](Outgoing& o) {
      int done = 0;
      check(MPI_Testall(static_cast<int>(o.requests.size()), o.requests.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall");
      return done != 0;
    });
  }

  Mesh mesh_;
  int rank_;
  MPI_Comm world_;
  MPI_Comm checks_;  // check mode's notes, apart from the data and the user's messages
  bool check_;
  Clock::duration watchdog_;
  std::string watchdog_text_;
  std::vector<std::deque<Note>> inbox_;  // notes received, by sender
  bool yield_;                           // when polling finds nothing
  bool progress_thread_;
  bool shared_memory_;
  ExchangeCopy exchange_copy_;
  LendChoice lend_choice_;
  int tag_ub_ = 32767;
  std::map<AxisList, Group> groups_;
  std::vector<Outgoing> outgoing_;
  std::unique_ptr<char[]> workspace_;
  std::int64_t workspace_bytes_ = 0;
  // Point-to-point through shared memory, where every rank is on this node (share_messages).
  char* own_mailbox_ = nullptr;
  std::vector<MappedBlock> peer_mailboxes_;
  std::unique_ptr<SharedMessages> messages_;
};

const char* env_value(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const char* v = std::getenv(name)) return v;
  }
  return nullptr;
}

}  // namespace

bool mpi_launched() {
  // Open MPI, PMIx launchers (srun --mpi=pmix, prterun), MPICH/Hydra and Intel MPI, MVAPICH.
  // Read once, before MPI_Init (ensure_initialized asks first): a singleton MPI_Init sets
  // these variables in the process itself.
  static const bool launched =
      env_value({"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) != nullptr;
  return launched;
}

int mpi_world_rank() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
  const char* v = env_value({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"});
  return v ? std::atoi(v) : 0;
}

std::int64_t set_mpi_count_limit(std::int64_t limit) {
  if (limit < 1 || limit > INT_MAX) {
    throw UsageError("the mpi count limit must be in [1, INT_MAX]; got " + std::to_string(limit));
  }
  return count_limit.exchange(limit);
}

std::int64_t set_mpi_shared_part(std::int64_t bytes) { return shared_part_limit.exchange(bytes); }

std::int64_t mpi_shared_exchanges() { return shared_exchanges.load(); }
std::int64_t mpi_lent_pieces() { return lent_pieces.load(); }
std::int64_t mpi_shared_sends(bool lent) { return (lent ? shared_lent_sends : shared_copied_sends).load(); }

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// The message every rank stops with, from every rank's (failed, failure or fingerprint).
std::string disagreement(const std::vector<std::pair<bool, std::string>>& ranks_said) {
  std::map<std::string, std::vector<std::int64_t>> failures;  // message -> ranks
  for (std::size_t r = 0; r < ranks_said.size(); ++r) {
    if (ranks_said[r].first) failures[ranks_said[r].second].push_back(static_cast<std::int64_t>(r));
  }
  if (failures.size() == 1 && failures.begin()->second.size() == ranks_said.size()) return failures.begin()->first;
  if (!failures.empty()) {
    std::string out;
    for (const auto& [message, who] : failures) out += (out.empty() ? "" : "; ") + ranks(who) + ": " + message;
    return out;
  }
  // Fingerprints: each rank's items against rank 0's, as multisets (the first that differs).
  const std::vector<std::string> first = lines_of(ranks_said[0].second);
  std::string out;
  for (std::size_t r = 1; r < ranks_said.size(); ++r) {
    if (ranks_said[r].second == ranks_said[0].second) continue;
    std::vector<std::string> only_here = lines_of(ranks_said[r].second), only_zero = first;
    for (auto it = only_here.begin(); it != only_here.end();) {
      const auto twin = std::find(only_zero.begin(), only_zero.end(), *it);
      if (twin == only_zero.end()) {
        ++it;
      } else {
        only_zero.erase(twin);
        it = only_here.erase(it);
      }
    }
    const std::string rank = "rank " + std::to_string(r);
    std::string what;
    if (!only_here.empty() && !only_zero.empty()) {
      what = rank + " has '" + only_here[0] + "' where rank 0 has '" + only_zero[0] + "'";
    } else if (!only_here.empty()) {
      what = rank + " has '" + only_here[0] + "', which rank 0 has not";
    } else if (!only_zero.empty()) {
      what = "rank 0 has '" + only_zero[0] + "', which " + rank + " has not";
    } else {
      what = rank + " has its arguments in another order";
    }
    out += (out.empty() ? "" : "; ") + what;
  }
  if (out.empty()) return "";
  return "the ranks were not started alike: " + out +
         " (every rank must run the same command, with the same SHARDMM_ environment)";
}

}  // namespace

std::optional<std::string> mpi_agree(bool at_launch, const std::string& failure, const std::string& fingerprint,
                                     double timeout_s) {
  if (!mpi_launched()) return std::string();
  static std::atomic<bool> launch_done{false}, run_done{false};
  if ((at_launch ? launch_done : run_done).exchange(true)) return std::string();
  ensure_initialized();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string& text = failure.empty() ? fingerprint : failure;
  // Each rank's (failed, bytes of its text), without blocking: a rank that never comes (it
  // runs no backend, or died) must not hang this one.
  int mine[2] = {failure.empty() ? 0 : 1, static_cast<int>(std::min<std::size_t>(text.size(), 1 << 20))};
  std::vector<int> all(static_cast<std::size_t>(2 * size));
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, MPI_COMM_WORLD, &request), "MPI_Iallgather");
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  for (int done = 0;;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    if (timeout_s >= 0 && Clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Everyone is here: the texts, blocking.
  std::vector<int> counts(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    counts[static_cast<std::size_t>(r)] = all[static_cast<std::size_t>(2 * r + 1)];
    offsets[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<char> texts(static_cast<std::size_t>(std::max(total, 1)));
  check(MPI_Allgatherv(text.data(), mine[1], MPI_CHAR, texts.data(), counts.data(), offsets.data(), MPI_CHAR,
                       MPI_COMM_WORLD),
        "MPI_Allgatherv");
  std::vector<std::pair<bool, std::string>> said;
  for (int r = 0; r < size; ++r) {
    const auto i = static_cast<std::size_t>(r);
    said.emplace_back(all[2 * i] != 0, std::string(texts.data() + offsets[i], static_cast<std::size_t>(counts[i])));
  }
  return disagreement(said);
}

void run_mpi(const Mesh& mesh, const std::function<void(Communicator&)>& body, const MpiOptions& options) {
  ensure_initialized();
  int size = 0;
  int rank = 0;
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  if (size != mesh.device_count()) {
    const std::string started = mpi_launched() ? "mpirun started " + count_of(size, "process", "processes")
                                               : std::string("this process was not started by mpirun");
    throw InputError("the mesh " + mesh.to_string() + " has " + count_of(mesh.device_count(), "device", "devices") +
                     " but " + started + "; run with mpirun -n " + std::to_string(mesh.device_count()));
  }
  // The first run: a rank that failed before it (its input, say) is waiting to say so.
  const std::optional<std::string> agreed = mpi_agree(false, "", "", options.watchdog_s);
  if (!agreed) {
    throw InputError("the ranks did not all reach the start of the run within the watchdog (" +
                     seconds(options.watchdog_s) + "): one exited or runs something else");
  }
  if (!agreed->empty()) throw InputError(*agreed);
  const bool progress_thread = progress_thread_wanted(options.blas_threads);
  const SharedMemorySettings shared_memory = shared_memory_wanted();
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm checks = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  check(MPI_Comm_dup(MPI_COMM_WORLD, &checks), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_set_errhandler(checks, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MpiCommunicator comm(mesh, rank, world, checks, options, progress_thread, shared_memory);
  // Errors found above (the world size) are raised by every rank alike, so they propagate and
  // the CLI exits 2 on each rank, cleanly. An exception from `body` is different: this rank
  // cannot know whether the others raised it too or are blocked in a collective waiting for
  // it, and asking them could hang. So it ends the job: the message goes to stderr with the
  // rank, and MPI_Abort's code 2 becomes mpirun's exit status (an InputError still exits 2).
  // Callers should therefore validate the user's input before run_backend.
  ++running_bodies;
  try {
    body(comm);
    comm.finish();
  } catch (const std::exception& e) {
    abort_job(rank, e.what());
  } catch (...) {
    abort_job(rank, "unknown exception");
  }
  --running_bodies;
}

}  // namespace shardmm::detail
