// The threads backend: one std::thread per device, each with its own buffers.
//
// A collective is three moves. Every member publishes a pointer to its buffers and a
// fingerprint of the call in its group's slot and waits until all members have arrived
// (the last arrival checks that the fingerprints agree). Then each member's part (what it
// needs copied or reduced straight out of its peers' buffers into its own) is done, and
// every member waits until all parts are, which keeps every buffer alive and unmodified until
// no part reads it any more. Each member does its own part. Where ranks share cores (more
// ranks than hardware threads) a member may not get a core again for a time slice while other
// ranks compute, so one that has done its own part goes on to the parts no member has claimed
// yet (the same copies and sums, in the same order, bit for bit) if they are small: beyond
// that, writing into a buffer that another core last wrote costs more than the wait.
//
// Only the first rendezvous can fail (abort, mismatch, watchdog): past it every member is
// committed to a bounded amount of copying, so the later ones always complete. That is
// what makes it safe for a rank to unwind and free its buffers after an error.
#include "runtime/threads_backend.h"

#include "runtime/cpu_relax.h"
#include "runtime/buffer_pool.h"
#include "runtime/fingerprint.h"
#include "runtime/ordered_sum.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shardmm/core/error.h"
#include "shardmm/core/geometry.h"
#include "shardmm/runtime/blas.h"
#include "shardmm/runtime/errors.h"

namespace shardmm {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// Thrown in ranks released because another rank failed. run_threads never rethrows it:
// the rank that failed records its own exception before anyone is released.
class Aborted : public std::runtime_error {
 public:
  Aborted() : std::runtime_error("aborted: another rank failed") {}
};

struct Entry {
  Fingerprint fp;
  const void* send = nullptr;
  void* recv = nullptr;
};

// The rendezvous of one group (a set of devices). Keyed by the group's axis set, not its
// axis order, so that members calling over XY and YX meet here and are told they differ.
struct Slot {
  explicit Slot(std::vector<std::int64_t> devices)
      : members(std::move(devices)), entries(members.size()), arrived(members.size(), 0) {}

  const std::vector<std::int64_t> members;  // ascending device ids; slot index = position
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Entry> entries;  // valid from arrival until the closing sync
  std::vector<char> arrived;   // in the current arrival round
  std::size_t arrivals = 0;
  // Completed arrival rounds (and below, closing rounds): changed under `mutex`, read without
  // it by a spinning waiter (acquire: it then sees the entries and verdict written before).
  std::atomic<std::uint64_t> generation{0};
  std::string verdict;  // the last completed round's mismatch message ("" when all agreed)
  bool broken = false;  // a member gave up waiting: this round can never complete
  // The current round's parts, by phase and group rank: claimed by whichever member takes
  // them first, and how many of each phase are done. Reset by the round's last arrival (every
  // member has left the previous round by then).
  static constexpr std::size_t kMaxPhases = 2;
  std::unique_ptr<std::atomic<bool>[]> claimed { new std::atomic<bool>[ kMaxPhases * members.size() ] };
  std::atomic<std::size_t> done[kMaxPhases];
};

// One point-to-point message addressed to one rank. The side that posts first creates it
// and queues it in the receiver's Inbox; the other side matches it. Guarded by the
// receiver's inbox mutex.
struct Transfer {
  // lent: the receiver reads the sender's buffer in place (irecv_lent met an isend); it sets
  // done when it drops its request, which completes the send.
  enum class State { posted, queued, copying, lent, done, cancelled };
  State state = State::posted;
  bool lend = false;  // the receive takes a lent buffer
  const std::byte* src = nullptr;
  std::int64_t src_bytes = -1;  // -1 until a send is posted
  std::byte* dst = nullptr;
  std::int64_t dst_bytes = -1;   // -1 until a receive is posted
  std::vector<std::byte> eager;  // a blocking send's copy of its message
  bool is_eager = false;
};
using TransferPtr = std::shared_ptr<Transfer>;

// The point-to-point traffic addressed to one rank, FIFO per (source, tag): sends that no
// receive has met yet, receives that no send has met yet, and matched nonblocking transfers
// waiting for this rank's progress thread. A progress thread copies, rather than the
// waiting rank, so that the copy runs while both ranks compute; it starts on first use.
struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<std::int64_t, int>, std::deque<TransferPtr>> sends, receives;
  std::deque<TransferPtr> copies;
  bool stop = false;
  std::thread progress;

  // Call with `mutex` held.
  void queue_copy(TransferPtr t) {
    t->state = Transfer::State::queued;
    copies.push_back(std::move(t));
    if (!progress.joinable()) progress = std::thread([this] { copy_loop(); });
    cv.notify_all();
  }

  ~Inbox() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    cv.notify_all();
    if (progress.joinable()) progress.join();
  }

 private:
  void copy_loop() {
    std::unique_lock lock(mutex);
    while (true) {
      cv.wait(lock, [&] { return stop || !copies.empty(); });
      if (copies.empty()) return;
      TransferPtr t = std::move(copies.front());
      copies.pop_front();
      if (t->state != Transfer::State::queued) continue;  // cancelled by a rank unwinding
      t->state = Transfer::State::copying;
      lock.unlock();
      if (t->src_bytes > 0 && t->src_bytes == t->dst_bytes) {
        std::memcpy(t->dst, t->src, static_cast<std::size_t>(t->src_bytes));
      }
      lock.lock();
      t->state = Transfer::State::done;
      cv.notify_all();
    }
  }
};

class World {
 public:
  World(const Mesh& mesh, const ThreadsOptions& options)
      : mesh_(mesh),
        // A far-future deadline would overflow the clock; a century is "never".
        watchdog_(std::chrono::duration_cast<Clock::duration>(
            std::min(options.watchdog, std::chrono::duration<double>(3.2e9)))),
        watchdog_text_(seconds(options.watchdog.count())),
        finished_(new std::atomic<bool>[static_cast<std::size_t>(mesh.device_count())]),
        shared_cores_(options.shared_cores.value_or(mesh.device_count() >
                                                    static_cast<std::int64_t>(std::thread::hardware_concurrency()))) {
    for (std::int64_t r = 0; r < mesh.device_count(); ++r) {
      finished_[static_cast<std::size_t>(r)] = false;
      inboxes_.push_back(std::make_unique<Inbox>());
    }
  }

  const Mesh& mesh() const { return mesh_; }
  bool shared_cores() const { return shared_cores_; }
  Clock::time_point deadline() const { return Clock::now() + watchdog_; }

  // Waits up to kSpin for `done()` (which must read atomics only) without sleeping; true if it
  // came. A rendezvous whose last member arrives a few microseconds later is then over that
  // much later, not after a futex wake-up (~20 us on the 2-vCPU VMs, where a sleeping vCPU must
  // be woken by the host). Only while every rank can have a core: time-sliced ranks would spin
  // away the time slice of the rank they wait for. Other programs may still take the cores,
  // so the spin yields every few pauses: a peer waiting for this core then gets it.
  template <class Done>
  bool spin_until(Done&& done) const {
    if (shared_cores_) return false;
    const Clock::time_point until = Clock::now() + kSpin;
    for (unsigned i = 1;; ++i) {
      if (done() || aborted_) return true;
      cpu_relax();
      if (i % 64 == 0) {
        if (Clock::now() > until) return false;
        std::this_thread::yield();
      }
    }
  }
  const std::string& watchdog_text() const { return watchdog_text_; }

  Slot& slot(AxisList axis_set, const std::vector<std::int64_t>& sorted_members) {
    std::sort(axis_set.begin(), axis_set.end());
    std::lock_guard lock(slots_mutex_);
    std::unique_ptr<Slot>& s = slots_[{std::move(axis_set), sorted_members.front()}];
    if (!s) s = std::make_unique<Slot>(sorted_members);
    return *s;
  }
  Inbox& inbox(std::int64_t rank) { return *inboxes_[static_cast<std::size_t>(rank)]; }

  // Records `error` unless an earlier one is recorded, then releases every waiting rank.
  // Must be called without holding a slot's or inbox's lock.
  void fail(std::exception_ptr error) {
    {
      std::lock_guard lock(error_mutex_);
      if (!first_error_) first_error_ = std::move(error);
    }
    aborted_ = true;
    wake_all();
  }
  bool aborted() const { return aborted_; }
  // `rank` unwinds past a send whose buffer a peer reads in place (Communicator::irecv_lent):
  // it must wait for the peer to let go, and the peer may be waiting for a message from it
  // that will not come. Releases everyone now, before the rank's error is recorded (when it
  // leaves its body); if it never is (the rank caught it), run_threads reports this.
  void abandon(std::int64_t rank) {
    abandoned_by_.store(rank);
    aborted_ = true;
    wake_all();
  }
  std::int64_t abandoned_by() const { return abandoned_by_.load(); }
  std::exception_ptr first_error() {
    std::lock_guard lock(error_mutex_);
    return first_error_;
  }

  // `rank`'s body has returned: peers still waiting for it will wait forever.
  void finish(std::int64_t rank) {
    finished_[static_cast<std::size_t>(rank)] = true;
    wake_all();
  }
  bool finished(std::int64_t rank) const { return finished_[static_cast<std::size_t>(rank)]; }

 private:
  // Waiters test the flags under their slot's or inbox's lock; taking each lock before
  // notifying means none can miss the change between its test and its wait.
  void wake_all() {
    std::lock_guard lock(slots_mutex_);
    for (auto& [key, s] : slots_) {
      { std::lock_guard l(s->mutex); }
      s->cv.notify_all();
    }
    for (auto& in : inboxes_) {
      { std::lock_guard l(in->mutex); }
      in->cv.notify_all();
    }
  }

  const Mesh mesh_;
  const Clock::duration watchdog_;
  const std::string watchdog_text_;
  std::unique_ptr<std::atomic<bool>[]> finished_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  std::mutex slots_mutex_;
  std::map<std::pair<AxisList, std::int64_t>, std::unique_ptr<Slot>> slots_;
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
  std::atomic<bool> aborted_{false};
  std::atomic<std::int64_t> abandoned_by_{-1};
  static constexpr std::chrono::microseconds kSpin{50};
  const bool shared_cores_;
};

void copy_bytes(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

std::int64_t element_bytes(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f64) {
    throw InputError(std::string("the threads backend computes in f32 and f64; got ") + to_string(dtype));
  }
  return dtype_bytes(dtype);
}

// Element offsets of consecutive chunks of `counts`, plus the total at the end; checked so
// that any byte offset derived from them fits too.
Counts offsets(const Counts& counts, std::int64_t element_size) {
  Counts out{0};
  for (std::int64_t c : counts) out.push_back(checked_add(out.back(), c, "the collective's element count"));
  checked_mul(out.back(), element_size, "the collective's byte count");
  return out;
}

const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

class ThreadsCommunicator;

// The oldest unmatched entry of `queues[key]`, removed; null when there is none.
TransferPtr take(std::map<std::pair<std::int64_t, int>, std::deque<TransferPtr>>& queues,
                 std::pair<std::int64_t, int> key) {
  const auto it = queues.find(key);
  if (it == queues.end() || it->second.empty()) return nullptr;
  TransferPtr t = std::move(it->second.front());
  it->second.pop_front();
  return t;
}

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(World& world, std::int64_t rank) : world_(world), rank_(rank) {}

  std::int64_t rank() const override { return rank_; }
  const Mesh& mesh() const override { return world_.mesh(); }
  std::string backend() const override { return "threads"; }
  BackendCapabilities capabilities() const override { return kThreadsCapabilities; }

  void all_gather(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& axes) override {
    const Group& g = group(axes);
    const std::int64_t eb = element_bytes(dtype);
    check_counts("all_gather", counts, g);
    const Counts off = offsets(counts, eb);
    if (g.size() == 1) return copy_bytes(bytes_of(recv), bytes_of(send), counts[0] * eb);
    collective(g, {{CollectiveOp::all_gather, axes, dtype, counts, {}}, send, recv}, {[&](std::size_t me) {
                 // Start with the next member, so that the ranks do not all read the same peer at once.
                 for (std::size_t i = 0; i < g.size(); ++i) {
                   const std::size_t m = (me + i) % g.size();
                   copy_bytes(bytes_of(g.entry(me).recv) + off[m] * eb, bytes_of(g.entry(m).send), counts[m] * eb);
                 }
               }},
               off.back() * eb);
  }

  void reduce_scatter(const void* send, void* recv, const Counts& counts, DType dtype, const AxisList& axes) override {
    const Group& g = group(axes);
    const std::int64_t eb = element_bytes(dtype);
    check_counts("reduce_scatter", counts, g);
    const Counts off = offsets(counts, eb);
    if (g.size() == 1) return copy_bytes(bytes_of(recv), bytes_of(send), counts[0] * eb);
    collective(g, {{CollectiveOp::reduce_scatter, axes, dtype, counts, {}}, send, recv}, {[&](std::size_t me) {
                 std::vector<const void*> sources;
                 for (std::size_t m = 0; m < g.size(); ++m) sources.push_back(bytes_of(g.entry(m).send) + off[me] * eb);
                 detail::sum_in_order(dtype, sources, counts[me], g.entry(me).recv);
               }},
               *std::max_element(counts.begin(), counts.end()) * eb);
  }

  // Reduce-scatter then all-gather within the members' own buffers: member k reduces chunk k
  // of everyone's data into its own, then copies the other chunks from their owners.
  void all_reduce(void* data, std::int64_t count, DType dtype, const AxisList& axes, ReduceOp op) override {
    const Group& g = group(axes);
    const std::int64_t eb = element_bytes(dtype);
    if (count < 0) {
      throw InputError("all_reduce of " + elements(count) + "; a count is a number of elements >= 0");
    }
    offsets({count}, eb);  // checks that the byte count fits
    if (g.size() == 1) return;
    const auto n = static_cast<std::int64_t>(g.size());
    // The buffer's own split, not a shard geometry (whatever the mesh's rule): array_split
    // balances the members' work, and the mpi backend splits the same way.
    auto chunk = [&](std::size_t m) {
      const Range part = split_range(count, n, static_cast<std::int64_t>(m), SplitRule::array);
      return std::pair{part.offset * eb, part.extent};
    };
    auto reduce_own_chunk = [&](std::size_t me) {
      const auto [mine, my_count] = chunk(me);
      std::vector<const void*> sources;
      for (std::size_t m = 0; m < g.size(); ++m) sources.push_back(bytes_of(g.entry(m).recv) + mine);
      detail::reduce_in_order(op, dtype, sources, my_count, bytes_of(g.entry(me).recv) + mine,
                              /*peers_read_out=*/true);
    };
    auto copy_other_chunks = [&](std::size_t me) {
      for (std::size_t i = 1; i < g.size(); ++i) {
        const std::size_t m = (me + i) % g.size();
        const auto [at, elements] = chunk(m);
        copy_bytes(bytes_of(g.entry(me).recv) + at, bytes_of(g.entry(m).recv) + at, elements * eb);
      }
    };
    collective(g, {{CollectiveOp::all_reduce, axes, dtype, {count}, {}, op}, data, data},
               {reduce_own_chunk, copy_other_chunks}, count * eb);
  }

  void all_to_all(const void* send, const Counts& send_counts, void* recv, const Counts& recv_counts, DType dtype,
                  const AxisList& axes) override {
    const Group& g = group(axes);
    const std::int64_t eb = element_bytes(dtype);
    check_counts("all_to_all (send counts)", send_counts, g);
    check_counts("all_to_all (recv counts)", recv_counts, g);
    offsets(send_counts, eb);  // checks that the byte count fits
    const Counts recv_off = offsets(recv_counts, eb);
    if (g.size() == 1) {
      if (send_counts[0] != recv_counts[0]) {
        throw CollectiveMismatch("collective mismatch in group over " + axes_label(mesh(), axes) + " of device " +
                                 std::to_string(rank_) + ": in all_to_all(" + to_string(dtype) + "), rank " +
                                 std::to_string(rank_) + " sends " + elements(send_counts[0]) +
                                 " to itself but expects " + std::to_string(recv_counts[0]));
      }
      return copy_bytes(bytes_of(recv), bytes_of(send), send_counts[0] * eb);
    }
    collective(g, {{CollectiveOp::all_to_all, axes, dtype, send_counts, recv_counts}, send, recv},
               {[&](std::size_t me) {
                 // Member me's own receive counts: the fingerprints agreed, so they are what its
                 // peers send it.
                 const Counts my_off = offsets(g.entry(me).fp.recv_counts, eb);
                 for (std::size_t i = 0; i < g.size(); ++i) {
                   const std::size_t m = (me + i) % g.size();
                   const Counts& theirs = g.entry(m).fp.counts;
                   std::int64_t at = 0;
                   for (std::size_t k = 0; k < me; ++k) at += theirs[k];
                   copy_bytes(bytes_of(g.entry(me).recv) + my_off[m] * eb, bytes_of(g.entry(m).send) + at * eb,
                              theirs[me] * eb);
                 }
               }},
               recv_off.back() * eb);
  }

  // A blocking send copies its message out (into the receive when one is posted, else into
  // the inbox), so a ring of sends followed by recvs cannot deadlock.
  void send(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_peer("send to", peer, bytes);
    if (world_.aborted()) throw Aborted();
    Inbox& in = world_.inbox(peer);
    std::unique_lock lock(in.mutex);
    if (TransferPtr t = take(in.receives, {rank_, tag})) {
      t->src = bytes_of(data);
      t->src_bytes = bytes;
      t->state = Transfer::State::copying;
      lock.unlock();
      if (bytes > 0 && bytes == t->dst_bytes) std::memcpy(t->dst, data, static_cast<std::size_t>(bytes));
      lock.lock();
      t->state = Transfer::State::done;
    } else {
      auto message = std::make_shared<Transfer>();
      message->eager.assign(bytes_of(data), bytes_of(data) + bytes);
      message->is_eager = true;
      message->src = message->eager.data();
      message->src_bytes = bytes;
      in.sends[{rank_, tag}].push_back(std::move(message));
    }
    in.cv.notify_all();
  }

  void recv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    irecv(data, bytes, peer, tag)->wait();
  }

  Request isend(const void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    check_peer("isend to", peer, bytes);
    if (world_.aborted()) throw Aborted();
    Inbox& in = world_.inbox(peer);
    std::lock_guard lock(in.mutex);
    TransferPtr t = take(in.receives, {rank_, tag});
    const bool matched = t != nullptr;
    if (!matched) t = std::make_shared<Transfer>();
    t->src = bytes_of(data);
    t->src_bytes = bytes;
    if (matched && t->lend) {
      lend(in, *t);
    } else if (matched) {
      in.queue_copy(t);
    } else {
      in.sends[{rank_, tag}].push_back(t);
    }
    return std::make_unique<ThreadsRequest>(*this, in, t, peer, tag, true);
  }

  Request irecv(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    return receive(data, bytes, peer, tag, false);
  }

  Request irecv_lent(void* data, std::int64_t bytes, std::int64_t peer, int tag) override {
    return receive(data, bytes, peer, tag, true);
  }

  bool clock_is_shared() const override { return true; }

  void barrier() override {
    const AxisList all = mesh().all_axes();
    const Group& g = group(all);
    if (g.size() > 1) arrive(g, {{CollectiveOp::barrier, all, DType::f32, {}, {}}, nullptr, nullptr});
  }

 private:
  Request receive(void* data, std::int64_t bytes, std::int64_t peer, int tag, bool lend_ok) {
    check_peer("recv from", peer, bytes);
    if (world_.aborted()) throw Aborted();
    Inbox& in = world_.inbox(rank_);
    std::unique_lock lock(in.mutex);
    TransferPtr t = take(in.sends, {peer, tag});
    const bool matched = t != nullptr;
    if (!matched) t = std::make_shared<Transfer>();
    t->dst = bytes_of(data);
    t->dst_bytes = bytes;
    t->lend = lend_ok;
    if (!matched) {
      in.receives[{peer, tag}].push_back(t);
    } else if (t->is_eager) {
      // Only this rank holds the message now: copy it here, without the lock.
      t->state = Transfer::State::copying;
      lock.unlock();
      if (bytes > 0 && bytes == t->src_bytes) std::memcpy(t->dst, t->src, static_cast<std::size_t>(bytes));
      lock.lock();
      t->state = Transfer::State::done;
    } else if (lend_ok) {
      lend(in, *t);
    } else {
      in.queue_copy(t);
    }
    return std::make_unique<ThreadsRequest>(*this, in, t, peer, tag, false);
  }

  // A nonblocking send has met a receive that takes a lent buffer: nothing to copy. Messages
  // of different sizes are done at once, for wait() to report. Call with the inbox's lock.
  static void lend(Inbox& in, Transfer& t) {
    t.state = t.src_bytes == t.dst_bytes ? Transfer::State::lent : Transfer::State::done;
    in.cv.notify_all();
  }

  class ThreadsRequest final : public P2PRequest {
   public:
    ThreadsRequest(ThreadsCommunicator& comm, Inbox& inbox, TransferPtr transfer, std::int64_t peer, int tag,
                   bool sending)
        : comm_(comm), inbox_(inbox), transfer_(std::move(transfer)), peer_(peer), tag_(tag), sending_(sending) {}
    ~ThreadsRequest() override {
      if (!waited_) {
        comm_.cancel(*this);
      } else if (!sending_) {
        comm_.give_back(*this);
      }
    }
    void wait() override {
      waited_ = true;  // whatever wait() raises, the transfer is settled or cancelled by then
      comm_.wait_for(*this);
    }
    bool test() override {
      std::lock_guard lock(inbox_.mutex);
      return comm_.arrived(*this);
    }
    const void* received() const override {
      std::lock_guard lock(inbox_.mutex);
      return transfer_->state == Transfer::State::lent ? transfer_->src : transfer_->dst;
    }

   private:
    friend class ThreadsCommunicator;
    ThreadsCommunicator& comm_;
    Inbox& inbox_;
    TransferPtr transfer_;
    std::int64_t peer_;
    int tag_;
    bool sending_;
    bool waited_ = false;
  };

  // "recv(8 bytes from rank 1, tag 3)" or "isend(8 bytes to rank 1, tag 3)".
  std::string p2p_call(const ThreadsRequest& r) const {
    const Transfer& t = *r.transfer_;
    return std::string(r.sending_ ? "isend(" : "recv(") + std::to_string(r.sending_ ? t.src_bytes : t.dst_bytes) +
           " bytes " + (r.sending_ ? "to" : "from") + " rank " + std::to_string(r.peer_) + ", tag " +
           std::to_string(r.tag_) + ")";
  }

  void wait_for(ThreadsRequest& r) {
    Inbox& in = r.inbox_;
    Transfer& t = *r.transfer_;
    const std::string me = "rank " + std::to_string(rank_);
    const std::string peer = "rank " + std::to_string(r.peer_);
    std::unique_lock lock(in.mutex);
    const auto deadline = world_.deadline();
    while (!arrived(r)) {
      if (world_.aborted()) {
        lock.unlock();
        cancel(r);
        throw Aborted();
      }
      if (t.state == Transfer::State::cancelled) {
        lock.unlock();
        raise<CollectiveMismatch>("p2p mismatch: " + me + " called " + p2p_call(r) + "; " + peer +
                                  " dropped its side without waiting for it");
      }
      if (t.state != Transfer::State::posted) {
        in.cv.wait(lock);  // matched: the progress thread's copy is bounded
        continue;
      }
      // A finished peer posted all its calls before it finished: an unmatched one stays so.
      if (world_.finished(r.peer_)) {
        const std::string call = p2p_call(r);
        t.state = Transfer::State::cancelled;
        lock.unlock();
        remove_unmatched(r);
        raise<CollectiveMismatch>("p2p mismatch: " + me + " called " + call + "; " + peer + " returned without " +
                                  (r.sending_ ? "receiving" : "sending") + " it");
      }
      if (in.cv.wait_until(lock, deadline) == std::cv_status::timeout && t.state == Transfer::State::posted) {
        const std::string call = p2p_call(r);
        lock.unlock();
        cancel(r);
        raise<CollectiveTimeout>("p2p timeout: " + me + " waited " + world_.watchdog_text() + " in " + call + "; " +
                                 (r.sending_ ? "no receive was posted" : "nothing arrived") + watchdog_hint());
      }
    }
    if (t.src_bytes != t.dst_bytes) {
      const std::string call = p2p_call(r);
      lock.unlock();
      raise<CollectiveMismatch>("p2p mismatch: " + me + " called " + call + " but " + peer +
                                (r.sending_ ? " posted a receive of " + std::to_string(t.dst_bytes)
                                            : " sent " + std::to_string(t.src_bytes)) +
                                " bytes");
    }
  }

  // Whether a request's transfer has finished for its side: a lent buffer is there for the
  // receiver; the send is done when the receiver gives it back. Call with the inbox's lock.
  static bool arrived(const ThreadsRequest& r) {
    const Transfer::State state = r.transfer_->state;
    return state == Transfer::State::done || (state == Transfer::State::lent && !r.sending_);
  }

  // A receive's request is dropped after wait(): a lent buffer goes back, completing the send.
  static void give_back(ThreadsRequest& r) noexcept {
    std::lock_guard lock(r.inbox_.mutex);
    if (r.transfer_->state != Transfer::State::lent) return;
    r.transfer_->state = Transfer::State::done;
    r.inbox_.cv.notify_all();
  }

  // Takes an unmatched transfer out of its queue. Call without the inbox's lock.
  void remove_unmatched(const ThreadsRequest& r) {
    Inbox& in = r.inbox_;
    std::lock_guard lock(in.mutex);
    auto& queue = r.sending_ ? in.sends[{rank_, r.tag_}] : in.receives[{r.peer_, r.tag_}];
    std::erase(queue, r.transfer_);
  }

  // A request dropped without wait(): what has not moved is withdrawn, a copy under way is
  // waited for. Call without the inbox's lock.
  void cancel(ThreadsRequest& r) noexcept {
    r.waited_ = true;
    Inbox& in = r.inbox_;
    Transfer& t = *r.transfer_;
    std::unique_lock lock(in.mutex);
    switch (t.state) {
      case Transfer::State::posted: {
        auto& queue = r.sending_ ? in.sends[{rank_, r.tag_}] : in.receives[{r.peer_, r.tag_}];
        std::erase(queue, r.transfer_);
        t.state = Transfer::State::cancelled;
        break;
      }
      case Transfer::State::queued:
        t.state = Transfer::State::cancelled;
        break;
      case Transfer::State::copying:
        in.cv.wait(lock, [&] { return t.state == Transfer::State::done; });
        break;
      // A receiver unwinding gives a lent buffer back; a sender unwinding waits until the
      // receiver has (as it would for a copy), so that nobody reads the buffer once it is gone.
      case Transfer::State::lent:
        if (r.sending_) {
          if (std::uncaught_exceptions() > 0) {
            lock.unlock();
            world_.abandon(rank_);
            lock.lock();
          }
          in.cv.wait(lock, [&] { return t.state == Transfer::State::done; });
        } else {
          t.state = Transfer::State::done;
        }
        break;
      case Transfer::State::done:
      case Transfer::State::cancelled:
        break;
    }
    in.cv.notify_all();
  }

  struct Group {
    Slot* slot = nullptr;
    std::vector<std::size_t> slot_index;  // by group rank
    std::size_t me = 0;                   // this rank's group rank
    std::string label;                    // "over X of device 0", for messages

    std::size_t size() const { return slot_index.size(); }
    const Entry& entry(std::size_t member) const { return slot->entries[slot_index[member]]; }
  };

  const Group& group(const AxisList& axes) {
    auto found = groups_.find(axes);
    if (found != groups_.end()) return found->second;
    const Mesh& m = mesh();
    for (std::size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] < 0 || axes[i] >= m.rank()) {
        throw InputError("group axis " + std::to_string(axes[i]) + " is not an axis of mesh " + m.to_string() +
                         "; axes are numbered 0 to " + std::to_string(m.rank() - 1));
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (axes[j] == axes[i]) {
          throw InputError("group " + m.axis_names(axes) + " names axis " + m.axis(axes[i]).name +
                           " twice; a group lists distinct mesh axes");
        }
      }
    }
    const std::vector<std::int64_t> members = m.group_members(rank_, axes);
    std::vector<std::int64_t> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    Group g;
    g.slot = &world_.slot(axes, sorted);
    for (std::int64_t d : members) {
      g.slot_index.push_back(
          static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), d) - sorted.begin()));
    }
    g.me = static_cast<std::size_t>(m.group_rank(rank_, axes));
    g.label = "over " + axes_label(m, axes) + " of device " + std::to_string(sorted.front());
    return groups_.emplace(axes, std::move(g)).first->second;
  }

  void check_counts(const char* what, const Counts& counts, const Group& g) const {
    if (counts.size() != g.size()) {
      throw InputError(std::string(what) + " in the group " + g.label + ": got " + std::to_string(counts.size()) +
                       " counts for " + std::to_string(g.size()) + " members; pass one count per member");
    }
    for (std::size_t m = 0; m < counts.size(); ++m) {
      if (counts[m] < 0) {
        throw InputError(std::string(what) + " in the group " + g.label + ": count " + std::to_string(counts[m]) +
                         " for member " + std::to_string(m) + "; a count is a number of elements >= 0");
      }
    }
  }

  void check_peer(const char* what, std::int64_t peer, std::int64_t bytes) const {
    if (peer < 0 || peer >= mesh().device_count()) {
      throw InputError(std::string(what) + " device " + std::to_string(peer) + ": mesh " + mesh().to_string() +
                       " has devices 0 to " + std::to_string(mesh().device_count() - 1));
    }
    if (bytes < 0) {
      throw InputError(std::string(what) + " device " + std::to_string(peer) + " of " + std::to_string(bytes) +
                       " bytes; a message size is >= 0");
    }
  }

  std::string watchdog_hint() const { return detail::watchdog_hint(world_.watchdog_text()); }

  // Fails the whole run with this rank's error before throwing it, so that it, not the
  // Aborted of a rank it releases, is what run_threads rethrows. Call without locks held.
  template <typename E>
  [[noreturn]] void raise(const std::string& message) {
    E error(message);
    world_.fail(std::make_exception_ptr(error));
    throw error;
  }

  // One member's share (by group rank) of one phase of a collective: each phase reads only
  // what every member's earlier phases wrote.
  using Part = std::function<void(std::size_t member)>;

  // Runs the collective's phases (at most Slot::kMaxPhases) once every member has arrived: in
  // each, this member does its own part, then, where ranks share cores and a part writes at
  // most kStealBytes (`part_bytes`), every part still unclaimed, and waits until all are done.
  void collective(const Group& g, Entry entry, std::initializer_list<Part> phases, std::int64_t part_bytes) {
    assert(phases.size() <= Slot::kMaxPhases);
    Slot& s = *g.slot;
    const std::size_t n = g.size();
    const std::size_t parts_to_try = world_.shared_cores() && part_bytes <= kStealBytes ? n : 1;
    arrive(g, std::move(entry), phases.size());
    std::size_t phase_index = 0;
    for (const Part& phase : phases) {
      std::atomic<bool>* claimed = &s.claimed[phase_index * n];
      std::atomic<std::size_t>& done = s.done[phase_index++];
      for (std::size_t i = 0; i < parts_to_try; ++i) {
        const std::size_t m = (g.me + i) % n;
        if (claimed[m].exchange(true, std::memory_order_relaxed)) continue;
        phase(m);
        if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
          { std::lock_guard lock(s.mutex); }  // a waiter between its test and its wait sees it
          s.cv.notify_all();
        }
      }
      const auto over = [&] { return done.load(std::memory_order_acquire) == n; };
      if (world_.spin_until(over) && over()) continue;
      std::unique_lock lock(s.mutex);
      s.cv.wait(lock, over);
    }
  }

  // Publishes `entry` and waits until every member has published its own; the last to arrive
  // readies the round's `phases` of parts.
  void arrive(const Group& g, Entry entry, std::size_t phases = 0) {
    Slot& s = *g.slot;
    std::unique_lock lock(s.mutex);
    if (s.broken || world_.aborted()) throw Aborted();
    const std::size_t mine = g.slot_index[g.me];
    s.entries[mine] = std::move(entry);
    s.arrived[mine] = 1;
    const std::uint64_t round = s.generation;
    if (++s.arrivals == s.members.size()) {
      std::vector<const Fingerprint*> fps;
      for (const Entry& e : s.entries) fps.push_back(&e.fp);
      s.verdict = disagreement(mesh(), s.members, fps);
      for (std::size_t i = 0; i < phases * s.members.size(); ++i) s.claimed[i].store(false, std::memory_order_relaxed);
      for (std::size_t p = 0; p < phases; ++p) s.done[p].store(0, std::memory_order_relaxed);
      s.arrivals = 0;
      std::fill(s.arrived.begin(), s.arrived.end(), 0);
      s.generation.fetch_add(1, std::memory_order_release);
      s.cv.notify_all();
    } else {
      lock.unlock();
      world_.spin_until([&] { return s.generation.load(std::memory_order_acquire) != round; });
      lock.lock();
    }
    const auto deadline = world_.deadline();
    while (s.generation == round) {
      if (s.broken || world_.aborted()) {
        s.broken = true;
        throw Aborted();
      }
      auto absent = [&](bool only_finished) {
        std::vector<std::int64_t> out;
        for (std::size_t i = 0; i < s.members.size(); ++i) {
          if (!s.arrived[i] && (!only_finished || world_.finished(s.members[i]))) out.push_back(s.members[i]);
        }
        return out;
      };
      auto called = [&] {
        return "rank " + std::to_string(rank_) + " called " + describe(mesh(), s.entries[mine].fp, false);
      };
      if (const std::vector<std::int64_t> gone = absent(true); !gone.empty()) {
        s.broken = true;
        const std::string message = "collective mismatch in group " + g.label + ": " + called() + "; " + ranks(gone) +
                                    " returned without calling it";
        lock.unlock();
        raise<CollectiveMismatch>(message);
      }
      if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout && s.generation == round) {
        s.broken = true;
        const std::string message = "collective timeout in group " + g.label + ": " + called() + " and waited " +
                                    world_.watchdog_text() + "; " + ranks(absent(false)) + " never arrived" +
                                    watchdog_hint();
        lock.unlock();
        raise<CollectiveTimeout>(message);
      }
    }
    if (!s.verdict.empty()) {
      const std::string verdict = s.verdict;
      lock.unlock();
      raise<CollectiveMismatch>(verdict);
    }
  }

  // Measured on 4 ranks over 2 cores (`bench collectives --mesh X=4`, a 2-vCPU AMD EPYC VM,
  // 2026-12-01): taking the parts of members without a core, 4 KiB collectives ran in 26-50 us
  // instead of 58-97, 1 MiB ones within -25%..+15%, and 4 MiB all_gather and all_to_all 1.3-1.5x
  // slower.
  static constexpr std::int64_t kStealBytes = 1 << 20;

  World& world_;
  const std::int64_t rank_;
  std::map<AxisList, Group> groups_;
};

}  // namespace

ThreadsOptions threads_options_from_env() {
  ThreadsOptions options;
  if (const char* text = std::getenv("SHARDMM_WATCHDOG_S")) {
    char* end = nullptr;
    const double s = std::strtod(text, &end);
    if (end == text || *end != '\0' || !std::isfinite(s) || s <= 0) {
      throw InputError(std::string("SHARDMM_WATCHDOG_S='") + text + "' is not a positive number of seconds");
    }
    options.watchdog = std::chrono::duration<double>(s);
  }
  return options;
}

void run_threads(const Mesh& mesh, const std::function<void(Communicator&)>& body, const ThreadsOptions& options) {
  // Every rank is a thread already: each rank's GEMM runs single-threaded on its own
  // thread (blas.h). OpenBLAS's count is process-wide, so restore it afterwards.
  struct BlasThreads {
    int saved = blas::threads();
    BlasThreads() { blas::set_threads(1); }
    ~BlasThreads() { blas::set_threads(saved); }
  } single_threaded_blas;
  World world(mesh, options);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(mesh.device_count()));
  try {
    for (std::int64_t r = 0; r < mesh.device_count(); ++r) {
      threads.emplace_back([&world, &body, r] {
        try {
          ThreadsCommunicator comm(world, r);
          body(comm);
        } catch (const Aborted&) {
          // The rank that failed has recorded why.
        } catch (...) {
          world.fail(std::current_exception());
        }
        world.finish(r);
      });
    }
  } catch (...) {
    world.fail(std::current_exception());  // no thread for a rank: release the others
  }
  for (std::thread& t : threads) t.join();
  if (std::exception_ptr error = world.first_error()) std::rethrow_exception(error);
  if (const std::int64_t rank = world.abandoned_by(); rank >= 0) {
    throw CollectiveMismatch("p2p mismatch: rank " + std::to_string(rank) +
                             " dropped a send a peer was reading in place while an exception unwound it, and "
                             "caught the exception; its peers were stopped");
  }
}

}  // namespace detail

void run_threads(const Mesh& mesh, const std::function<void(Communicator&)>& body) {
  const detail::ReleasePoolAtEnd release_pool;
  detail::run_threads(mesh, body, detail::threads_options_from_env());
}

}  // namespace shardmm
