// Point-to-point messages between the processes of one machine through memory they all map,
// with MPI's matching rules (per sender and tag, in order) and without copying where the
// sender's data lies in shareable memory (shareable_memory.h): the receiver reads it in place.
//
// Each rank has a mailbox that every rank maps: per sender, a ring of kSlots posts (what a
// message is and where its bytes lie) and a word per slot that the receiver sets once it is
// done with that post. A send
//   - lends its data when asked to and the data lies in a shareable block, this rank's or
//     one it was lent by a peer (a ring forwarding what it received): nothing is copied, and
//     the send completes once the receiver is done with it (its copy made, or its lent
//     receive let go);
//   - else copies its data into a bounce block of its own and completes at once (buffered,
//     like MPI's small messages), the block freed once the receiver is done.
// A receive is matched and, unless lent, copied in by progress(), which every wait calls: a
// rank waiting for one message still completes the others it has been sent, so two ranks
// that each wait for their own send to be received before receiving cannot deadlock.
//
// Free of MPI so that it can be tested with threads in one process.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/mpi/shareable_memory.h"

namespace shardmm::detail {

// A peer's block mapped here, with the lent receives that read it.
struct PeerMapping {
  MappedBlock block;
  int readers = 0;
  std::uint64_t last_use = 0;
};

class SharedMessages {
 public:
  static constexpr std::size_t kSlots = 256;  // posts a sender may have unacknowledged per receiver

  static std::size_t mailbox_bytes(std::size_t ranks);

  // A send that lent its data: complete once acknowledged.
  struct Ticket {
    int peer = 0;
    std::uint64_t seq = 0;
  };

  // A receive, matched by progress().
  struct Receive {
    int peer = 0;
    int tag = 0;
    char* into = nullptr;
    std::uint64_t bytes = 0;
    bool lent = false;
    bool arrived = false;      // matched, and (unless lent) copied in
    bool mismatched = false;   // the matched message had another size (it is consumed)
    const char* at = nullptr;  // where the bytes are once arrived
   private:
    friend class SharedMessages;
    std::uint64_t seq = 0;  // the matched post's
    bool released = false;
    PeerMapping* mapping = nullptr;  // the peer's block a lent receive reads, held until released
  };

  // Peers' blocks that no lent receive reads stay mapped (the next message from one needs no
  // new mapping) up to this many bytes; beyond it the least recently used are unmapped, so
  // that blocks their owners have freed do not stay alive here.
  static constexpr std::uint64_t kKeptMappingBytes = std::uint64_t{256} << 20;

  // `mailboxes[r]`: rank r's mailbox as this process maps it (this rank's own included), each
  // zeroed by its owner before any rank posts; `pids[r]`: rank r's process.
  SharedMessages(int me, std::vector<char*> mailboxes, std::vector<pid_t> pids,
                 std::uint64_t kept_mapping_bytes = kKeptMappingBytes);
  ~SharedMessages();
  SharedMessages(const SharedMessages&) = delete;
  SharedMessages& operator=(const SharedMessages&) = delete;

  // Posts `bytes` of `data` to `peer` (see above). Returns the ticket to wait on where the data
  // was lent, nothing where the send is already complete. Calls `idle` while the peer's ring
  // of posts from this rank is full.
  std::optional<Ticket> send(const void* data, std::uint64_t bytes, int peer, int tag, bool lend,
                             const std::function<void()>& idle);
  bool acknowledged(const Ticket& t) const;
  // Whether a send of these bytes would lend them: they lie in a shareable block, this rank's
  // or one mapped from a peer.
  bool lendable(const void* data, std::uint64_t bytes) const { return place_of(data, bytes).has_value(); }
  // Whether every copied send has been read by its receiver (its bounce block freed): this
  // rank may go only then. Moves progress() on.
  bool sends_read();

  std::shared_ptr<Receive> receive(void* into, std::uint64_t bytes, int peer, int tag, bool lent);
  // The receiver is done with `r`: a lent receive's sender is told; one not yet matched is
  // withdrawn. Idempotent.
  void release(Receive& r);

  // Takes in new posts, matches them to receives, copies and acknowledges. True if anything
  // moved.
  bool progress();

  // Bytes of peers' blocks mapped here, read by a lent receive or kept.
  std::uint64_t mapped_bytes() const { return mapped_bytes_; }
  std::int64_t lent_sends() const { return lent_sends_; }
  std::int64_t copied_sends() const { return copied_sends_; }

 private:
  struct Post {
    std::uint64_t seq;
    int tag;
    int owner;  // whose block holds the bytes; -1 for an empty message
    BlockName block;
    std::uint64_t offset;
    std::uint64_t bytes;
  };

  char* queue(int receiver, int sender) const;
  std::uint64_t* slot(int receiver, int sender, std::uint64_t seq) const;
  std::uint64_t* ack(int receiver, int sender, std::uint64_t seq) const;
  std::optional<std::pair<int, BlockPlace>> place_of(const void* data, std::uint64_t bytes) const;
  const char* locate(const Post& p, PeerMapping*& mapping);
  void trim_mappings();
  char* bounce(std::uint64_t bytes);
  void acknowledge(int sender, std::uint64_t seq);
  bool reap_bounces();

  int me_;
  std::vector<char*> mailboxes_;
  std::vector<pid_t> pids_;
  std::vector<std::uint64_t> sent_;                            // by receiver: the last seq posted to it
  std::vector<std::uint64_t> seen_;                            // by sender: the last of its seqs read here
  std::vector<std::deque<Post>> posts_;                        // by sender: read, not yet matched
  std::vector<std::deque<std::shared_ptr<Receive>>> waiting_;  // by sender: receives not yet matched
  std::map<std::pair<int, int>, PeerMapping> mapped_;          // peers' blocks, by (owner, fd)
  std::uint64_t kept_mapping_bytes_;
  std::uint64_t mapped_bytes_ = 0;
  std::uint64_t uses_ = 0;                         // a clock for least recently used
  std::vector<std::pair<Ticket, char*>> bounced_;  // copies the receivers still read
  std::int64_t lent_sends_ = 0, copied_sends_ = 0;
};

}  // namespace shardmm::detail
