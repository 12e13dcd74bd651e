#include "runtime/mpi/mpi_backend.h"

#include "runtime/ordered_sum.h"

// The C API only: Open MPI's and MPICH's deprecated C++ bindings stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/runtime/errors.h"

namespace shardmm::detail {

namespace {

std::atomic<std::int64_t> count_limit{INT_MAX};

// Tags on the backend's private communicators, which user send/recv never see.
constexpr int kCreateGroupTag = 1;
constexpr int kPieceTag = 2;

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

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
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
    if (finalized) throw std::logic_error("the mpi backend was used after MPI_Finalize");
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
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: break;
  }
  throw InputError(std::string("the mpi backend computes in f32 and f64; got ") + to_string(dtype));
}

// Offsets of the concatenated chunks, in elements.
std::vector<std::int64_t> displacements(const Counts& counts) {
  std::vector<std::int64_t> displs(counts.size());
  std::int64_t at = 0;
  for (std::size_t m = 0; m < counts.size(); ++m) {
    displs[m] = at;
    at = checked_add(at, counts[m], "a collective's element count");
  }
  return displs;
}

// Whether counts and displacements can be handed to one MPI call as ints. Every member of a
// group must take the same path (one collective call, or pieces), so callers decide it from
// what all members know alike.
bool fits_one_call(const Counts& counts, const std::vector<std::int64_t>& displs) {
  const std::int64_t limit = count_limit.load();
  auto small = [limit](std::int64_t v) { return v <= limit; };
  return std::all_of(counts.begin(), counts.end(), small) && std::all_of(displs.begin(), displs.end(), small);
}

// reduce_scatter: member m receives the others' chunks of counts[m] side by side, at offsets below
// (n - 1) * counts[m].
bool chunks_fit_one_call(const Counts& counts) {
  const auto n = static_cast<std::int64_t>(counts.size());
  const std::int64_t largest = *std::max_element(counts.begin(), counts.end());
  return fits_one_call(counts, displacements(counts)) && (n == 1 || largest <= count_limit.load() / (n - 1));
}

std::vector<int> as_ints(const std::vector<std::int64_t>& values) {
  return {values.begin(), values.end()};
}

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

[[noreturn]] void abort_job(int rank, const char* what) {
  std::cerr << "shardmm: rank " << rank << ": " << what << std::endl;
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // MPI_Abort does not return; this keeps the compiler and a broken MPI honest
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `world`, this run's duplicate of MPI_COMM_WORLD.
  MpiCommunicator(const Mesh& mesh, int rank, MPI_Comm world) : mesh_(mesh), rank_(rank), world_(world) {
    int flag = 0;
    int* tag_ub = nullptr;
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr");
    tag_ub_ = flag ? *tag_ub : 32767;  // 32767 is the least the standard allows
  }
  ~MpiCommunicator() override {
    for (auto& [axes, g] : groups_) MPI_Comm_free(&g.comm);
    MPI_Comm_free(&world_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::int64_t rank() const override { return rank_; }
  const Mesh& mesh() const override { return mesh_; }
  std::string backend() const override { return "mpi"; }

  void all_gather(const void* send, void* recv, const Counts& counts, DType dtype,
                  const AxisList& axes) override {
    const MPI_Datatype type = mpi_type(dtype);
    const Group& g = group(axes);
    check_counts(counts, g.size, "all_gather");
    const std::vector<std::int64_t> displs = displacements(counts);
    const std::size_t esz = static_cast<std::size_t>(dtype_bytes(dtype));
    char* out = static_cast<char*>(recv);
    const char* mine = static_cast<const char*>(send);
    // all_reduce gathers in place: its own block already sits in `recv`.
    const bool in_place = mine == out + displs[g.me] * esz;
    if (fits_one_call(counts, displs)) {
      check(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, static_cast<int>(counts[g.me]), type, recv,
                           as_ints(counts).data(), as_ints(displs).data(), type, g.comm),
            "MPI_Allgatherv");
      return;
    }
    std::vector<Transfer> transfers(counts.size());
    for (std::size_t m = 0; m < counts.size(); ++m) {
      transfers[m] = {mine, counts[g.me], out + displs[m] * esz, counts[m]};
    }
    exchange_in_pieces(g, transfers, type, esz);
  }

  void reduce_scatter(const void* send, void* recv, const Counts& counts, DType dtype,
                      const AxisList& axes) override {
    const MPI_Datatype type = mpi_type(dtype);
    const Group& g = group(axes);
    check_counts(counts, g.size, "reduce_scatter");
    // The other members' chunks [me] land side by side in the workspace (this rank's own
    // stays in `send`), then all are summed in member order. A library reduction
    // (MPI_Reduce_scatter) would pick its own order and lose bitwise agreement with the
    // threads backend.
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
    exchange(g, in, send_counts, send_displs, chunks, recv_counts, recv_displs, type, esz, chunks_fit_one_call(counts));
    std::vector<const void*> sources(counts.size());
    for (std::size_t m = 0; m < counts.size(); ++m) {
      sources[m] = m == g.me ? in + send_displs[m] * esz : chunks + recv_displs[m] * esz;
    }
    detail::sum_in_order(dtype, sources, mine, recv);
  }

  void all_reduce(void* data, std::int64_t count, DType dtype, const AxisList& axes) override {
    mpi_type(dtype);  // rejects bf16 and f16 before any communication
    if (count < 0) {
      throw InputError("all_reduce of " + std::to_string(count) + " elements; a count is a number of elements >= 0");
    }
    const Group& g = group(axes);
    // Reduce-scatter an even split (the first count % n members take one extra element), then
    // gather the reduced pieces back in place: each element is summed once, in member order.
    Counts split(static_cast<std::size_t>(g.size), count / g.size);
    for (std::int64_t m = 0; m < count % g.size; ++m) ++split[static_cast<std::size_t>(m)];
    const std::int64_t offset = displacements(split)[static_cast<std::size_t>(g.me)];
    char* mine = static_cast<char*>(data) + offset * dtype_bytes(dtype);
    reduce_scatter(data, mine, split, dtype, axes);
    all_gather(mine, data, split, dtype, axes);
  }

  void all_to_all(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts,
                  DType dtype, const AxisList& axes) override {
    const MPI_Datatype type = mpi_type(dtype);
    const Group& g = group(axes);
    check_counts(send_counts, g.size, "all_to_all (send counts)");
    check_counts(recv_counts, g.size, "all_to_all (recv counts)");
    if (send_counts[g.me] != recv_counts[g.me]) {
      throw CollectiveMismatch("collective mismatch in all_to_all(" + std::string(to_string(dtype)) + "): rank " +
                               std::to_string(rank_) + " sends " + std::to_string(send_counts[g.me]) +
                               " elements to itself but expects " + std::to_string(recv_counts[g.me]));
    }
    // Only this rank knows its counts, so the members agree on the path first: a 4-byte
    // allreduce, next to which a transfer large enough to matter is long.
    int one_call = fits_one_call(send_counts, displacements(send_counts)) &&
                   fits_one_call(recv_counts, displacements(recv_counts));
    check(MPI_Allreduce(MPI_IN_PLACE, &one_call, 1, MPI_INT, MPI_LAND, g.comm), "MPI_Allreduce");
    exchange(g, static_cast<const char*>(send), send_counts, displacements(send_counts), static_cast<char*>(recv),
             recv_counts, displacements(recv_counts), type, static_cast<std::size_t>(dtype_bytes(dtype)),
             one_call != 0);
  }

  // Buffered, like the threads backend's mailboxes: the data is copied and sent in the
  // background, so a ring where every rank sends before it receives cannot deadlock.
  void send(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "send to");
    reap_sends();
    Outgoing& o = outgoing_.emplace_back();
    o.data = std::make_unique_for_overwrite<char[]>(static_cast<std::size_t>(bytes));
    std::memcpy(o.data.get(), data, static_cast<std::size_t>(bytes));
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      MPI_Request& r = o.requests.emplace_back();
      check(MPI_Isend(o.data.get() + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &r), "MPI_Isend");
    });
  }

  void recv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_message(bytes, peer, tag, "recv from");
    char* out = static_cast<char*>(data);
    auto mismatch = [&] {
      return CollectiveMismatch("p2p mismatch: rank " + std::to_string(rank_) + " called recv(" +
                                std::to_string(bytes) + " bytes from rank " + std::to_string(peer) + ", tag " +
                                std::to_string(tag) + ") but rank " + std::to_string(peer) +
                                " sent a message of another size");
    };
    for_each_piece(bytes, [&](std::int64_t offset, int size) {
      MPI_Status status;
      const int rc = MPI_Recv(out + offset, size, MPI_BYTE, static_cast<int>(peer), tag, world_, &status);
      int error_class = MPI_SUCCESS;
      MPI_Error_class(rc, &error_class);
      if (error_class == MPI_ERR_TRUNCATE) throw mismatch();
      check(rc, "MPI_Recv");
      int got = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
      if (got != size) throw mismatch();
    });
  }

  void barrier() override { check(MPI_Barrier(world_), "MPI_Barrier"); }

  // Completes this rank's sends still in flight; run before the communicators go away.
  void finish() {
    for (Outgoing& o : outgoing_) {
      check(MPI_Waitall(static_cast<int>(o.requests.size()), o.requests.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
    }
    outgoing_.clear();
  }

 private:
  struct Group {
    MPI_Comm comm = MPI_COMM_NULL;
    std::int64_t size = 1;
    std::size_t me = 0;  // this rank's group rank
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

  // The group's communicator, built on first use. MPI_Comm_create_group involves only the
  // group's members (MPI_Comm_split would need every rank of the world), so a collective that
  // only part of the mesh runs cannot hang on ranks that never reach it. Members are listed
  // in group-rank order, which makes the MPI rank the group rank.
  const Group& group(const AxisList& axes) {
    if (auto it = groups_.find(axes); it != groups_.end()) return it->second;
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] < 0 || axes[i] >= mesh_.rank() || std::count(axes.begin(), axes.begin() + i, axes[i]) > 0) {
        throw InputError("group axis " + std::to_string(axes[i]) + " is out of range or repeated for mesh " +
                         mesh_.to_string() + "; a group lists distinct axes numbered 0 to " +
                         std::to_string(mesh_.rank() - 1));
      }
    }
    const std::vector<int> members = as_ints(mesh_.group_members(rank_, axes));
    MPI_Group world_group = MPI_GROUP_NULL;
    MPI_Group sub = MPI_GROUP_NULL;
    check(MPI_Comm_group(world_, &world_group), "MPI_Comm_group");
    int rc = MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &sub);
    Group g;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(world_, sub, kCreateGroupTag, &g.comm);
    MPI_Group_free(&world_group);
    if (sub != MPI_GROUP_NULL) MPI_Group_free(&sub);
    check(rc, "MPI_Comm_create_group");
    check(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    g.size = static_cast<std::int64_t>(members.size());
    g.me = static_cast<std::size_t>(mesh_.group_rank(rank_, axes));
    return groups_.emplace(axes, g).first->second;
  }

  // The all-to-all shape shared by all_to_all and reduce_scatter; `one_call` is the group's
  // common choice between MPI_Alltoallv and pieces.
  void exchange(const Group& g, const char* send, const Counts& send_counts, const std::vector<std::int64_t>& sdispls,
                char* recv, const Counts& recv_counts, const std::vector<std::int64_t>& rdispls, MPI_Datatype type,
                std::size_t esz, bool one_call) {
    if (one_call) {
      check(MPI_Alltoallv(send, as_ints(send_counts).data(), as_ints(sdispls).data(), type, recv,
                          as_ints(recv_counts).data(), as_ints(rdispls).data(), type, g.comm),
            "MPI_Alltoallv");
      return;
    }
    std::vector<Transfer> transfers(send_counts.size());
    for (std::size_t m = 0; m < transfers.size(); ++m) {
      transfers[m] = {send + sdispls[m] * esz, send_counts[m], recv + rdispls[m] * esz, recv_counts[m]};
    }
    exchange_in_pieces(g, transfers, type, esz);
  }

  // For transfers whose counts or offsets overflow an int: point-to-point messages of at most
  // count_limit elements, addressed by pointer so no offset is ever an int. Pieces between a
  // pair arrive in order (MPI messages do not overtake each other).
  void exchange_in_pieces(const Group& g, const std::vector<Transfer>& transfers, MPI_Datatype type,
                          std::size_t esz) {
    const Transfer& self = transfers[g.me];  // send_count == recv_count, checked by the callers
    const std::int64_t limit = count_limit.load();
    std::vector<MPI_Request> requests;
    auto post = [&](auto call, const char* name, auto* base, std::int64_t count, int peer) {
      for (std::int64_t at = 0; at < count; at += limit) {
        MPI_Request& r = requests.emplace_back();
        check(call(base + static_cast<std::size_t>(at) * esz, static_cast<int>(std::min(limit, count - at)), type, peer,
                   kPieceTag, g.comm, &r),
              name);
      }
    };
    for (std::size_t m = 0; m < transfers.size(); ++m) {
      if (m != g.me) post(MPI_Irecv, "MPI_Irecv", transfers[m].recv, transfers[m].recv_count, static_cast<int>(m));
    }
    for (std::size_t m = 0; m < transfers.size(); ++m) {
      if (m != g.me) post(MPI_Isend, "MPI_Isend", transfers[m].send, transfers[m].send_count, static_cast<int>(m));
    }
    if (self.send != self.recv && self.send_count > 0) {
      std::memcpy(self.recv, self.send, static_cast<std::size_t>(self.send_count) * esz);
    }
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
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
  int tag_ub_ = 32767;
  std::map<AxisList, Group> groups_;
  std::vector<Outgoing> outgoing_;
  std::unique_ptr<char[]> workspace_;
  std::int64_t workspace_bytes_ = 0;
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
    throw std::invalid_argument("the mpi count limit must be in [1, INT_MAX]; got " + std::to_string(limit));
  }
  return count_limit.exchange(limit);
}

void run_mpi(const Mesh& mesh, const std::function<void(Communicator&)>& body) {
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
  MPI_Comm world = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MpiCommunicator comm(mesh, rank, world);
  // Errors found above (the world size) are raised by every rank alike, so they propagate and
  // the CLI exits 2 on each rank, cleanly. An exception from `body` is different: this rank
  // cannot know whether the others raised it too or are blocked in a collective waiting for
  // it, and asking them could hang. So it ends the job: the message goes to stderr with the
  // rank, and MPI_Abort's code 2 becomes mpirun's exit status (an InputError still exits 2).
  // Callers should therefore validate the user's input before run_backend.
  try {
    body(comm);
    comm.finish();
  } catch (const std::exception& e) {
    abort_job(rank, e.what());
  } catch (...) {
    abort_job(rank, "unknown exception");
  }
}

}  // namespace shardmm::detail
