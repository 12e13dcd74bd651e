#include "runtime/mpi/shared_messages.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

namespace shardmm::detail {

namespace {

constexpr std::size_t kLine = 64;
// A post's words in its slot (one line): seq, written last, then what the post says.
enum Word { kSeq, kTag, kOwner, kFd, kSerial, kOffset, kBytes };

constexpr std::size_t queue_bytes() { return SharedMessages::kSlots * (kLine + sizeof(std::uint64_t)); }

std::atomic_ref<std::uint64_t> word(std::uint64_t* at) { return std::atomic_ref<std::uint64_t>(*at); }

// Bounce blocks are at least this large, so that the many small messages of a run share one
// size class of the blocks kept for reuse (shareable_memory.h).
constexpr std::uint64_t kMinBounceBytes = kShareableMinBytes;

}  // namespace

std::size_t SharedMessages::mailbox_bytes(std::size_t ranks) { return ranks * queue_bytes(); }

SharedMessages::SharedMessages(int me, std::vector<char*> mailboxes, std::vector<pid_t> pids,
                               std::uint64_t kept_mapping_bytes)
    : me_(me),
      mailboxes_(std::move(mailboxes)),
      pids_(std::move(pids)),
      sent_(mailboxes_.size(), 0),
      seen_(mailboxes_.size(), 0),
      posts_(mailboxes_.size()),
      waiting_(mailboxes_.size()),
      kept_mapping_bytes_(kept_mapping_bytes) {}

// Copies not yet read are left only by a run that failed (a run that ends waits for
// sends_read()); a receiver that has mapped one keeps it alive.
SharedMessages::~SharedMessages() {
  for (const auto& [ticket, b] : bounced_) free_shareable(b);
}

char* SharedMessages::queue(int receiver, int sender) const {
  return mailboxes_[static_cast<std::size_t>(receiver)] + static_cast<std::size_t>(sender) * queue_bytes();
}

std::uint64_t* SharedMessages::slot(int receiver, int sender, std::uint64_t seq) const {
  return reinterpret_cast<std::uint64_t*>(queue(receiver, sender) + (seq - 1) % kSlots * kLine);
}

std::uint64_t* SharedMessages::ack(int receiver, int sender, std::uint64_t seq) const {
  return reinterpret_cast<std::uint64_t*>(queue(receiver, sender) + kSlots * kLine) + (seq - 1) % kSlots;
}

std::optional<SharedMessages::Ticket> SharedMessages::send(const void* data, std::uint64_t bytes, int peer, int tag,
                                                           bool lend, const std::function<void()>& idle) {
  const std::uint64_t seq = sent_[static_cast<std::size_t>(peer)] + 1;
  // The slot's previous post must have been acknowledged before it is written over.
  while (seq > kSlots && word(ack(peer, me_, seq)).load(std::memory_order_acquire) < seq - kSlots) {
    if (!progress()) idle();
  }
  reap_bounces();
  Post p{seq, tag, -1, {}, 0, bytes};
  std::optional<Ticket> ticket;
  if (bytes > 0) {
    if (auto place = lend ? place_of(data, bytes) : std::nullopt) {
      p.owner = place->first;
      p.block = place->second.block;
      p.offset = place->second.offset;
      ticket = Ticket{peer, seq};
      ++lent_sends_;
    } else {
      char* b = bounce(bytes);
      std::memcpy(b, data, bytes);
      const std::optional<BlockPlace> own = find_shareable(b, bytes);
      p.owner = me_;
      p.block = own->block;
      p.offset = own->offset;
      bounced_.push_back({Ticket{peer, seq}, b});
      ++copied_sends_;
    }
  } else {
    ++copied_sends_;
  }
  std::uint64_t* w = slot(peer, me_, seq);
  w[kTag] = static_cast<std::uint64_t>(static_cast<std::int64_t>(tag));
  w[kOwner] = static_cast<std::uint64_t>(static_cast<std::int64_t>(p.owner));
  w[kFd] = static_cast<std::uint64_t>(static_cast<std::int64_t>(p.block.fd));
  w[kSerial] = p.block.serial;
  w[kOffset] = p.offset;
  w[kBytes] = p.bytes;
  word(w + kSeq).store(seq, std::memory_order_release);
  sent_[static_cast<std::size_t>(peer)] = seq;
  return ticket;
}

bool SharedMessages::sends_read() {
  progress();
  return bounced_.empty();
}

bool SharedMessages::acknowledged(const Ticket& t) const {
  return word(ack(t.peer, me_, t.seq)).load(std::memory_order_acquire) >= t.seq;
}

std::shared_ptr<SharedMessages::Receive> SharedMessages::receive(void* into, std::uint64_t bytes, int peer, int tag,
                                                                 bool lent) {
  auto r = std::make_shared<Receive>();
  r->peer = peer;
  r->tag = tag;
  r->into = static_cast<char*>(into);
  r->bytes = bytes;
  r->lent = lent;
  waiting_[static_cast<std::size_t>(peer)].push_back(r);
  return r;
}

void SharedMessages::release(Receive& r) {
  if (r.released) return;
  r.released = true;
  if (r.arrived && !r.mismatched) acknowledge(r.peer, r.seq);
  if (r.mapping) {
    --r.mapping->readers;
    r.mapping = nullptr;
    trim_mappings();
  }
}

bool SharedMessages::progress() {
  bool moved = reap_bounces();
  for (std::size_t s = 0; s < mailboxes_.size(); ++s) {
    const int sender = static_cast<int>(s);
    for (;;) {
      const std::uint64_t seq = seen_[s] + 1;
      std::uint64_t* w = slot(me_, sender, seq);
      if (word(w + kSeq).load(std::memory_order_acquire) != seq) break;
      posts_[s].push_back(Post{seq, static_cast<int>(static_cast<std::int64_t>(w[kTag])),
                               static_cast<int>(static_cast<std::int64_t>(w[kOwner])),
                               BlockName{static_cast<std::int32_t>(static_cast<std::int64_t>(w[kFd])), w[kSerial]},
                               w[kOffset], w[kBytes]});
      seen_[s] = seq;
      moved = true;
    }
    // Receives in the order they were made, each taking the first post with its tag: a pair's
    // messages of one tag are matched in order.
    std::deque<std::shared_ptr<Receive>>& waiting = waiting_[s];
    for (auto it = waiting.begin(); it != waiting.end();) {
      Receive& r = **it;
      if (r.released) {  // withdrawn before it was matched
        it = waiting.erase(it);
        continue;
      }
      const auto post = std::find_if(posts_[s].begin(), posts_[s].end(), [&](const Post& p) { return p.tag == r.tag; });
      if (post == posts_[s].end()) {
        ++it;
        continue;
      }
      const Post p = *post;
      posts_[s].erase(post);
      r.seq = p.seq;
      r.arrived = true;
      moved = true;
      if (p.bytes != r.bytes) {
        r.mismatched = true;
        r.released = true;
        acknowledge(sender, p.seq);
      } else {
        PeerMapping* mapping = nullptr;
        r.at = p.bytes > 0 ? locate(p, mapping) : r.into;
        if (r.lent && mapping) {
          ++mapping->readers;
          r.mapping = mapping;
        }
        if (!r.lent) {
          if (p.bytes > 0) std::memcpy(r.into, r.at, p.bytes);
          r.at = r.into;
          r.released = true;
          acknowledge(sender, p.seq);
        }
      }
      it = waiting.erase(it);
    }
  }
  trim_mappings();
  return moved;
}

std::optional<std::pair<int, BlockPlace>> SharedMessages::place_of(const void* data, std::uint64_t bytes) const {
  if (auto own = find_shareable(data, bytes)) return std::make_pair(me_, *own);
  const char* p = static_cast<const char*>(data);
  for (const auto& [key, m] : mapped_) {
    const MappedBlock& block = m.block;
    if (p >= block.data() && p + bytes <= block.data() + block.bytes()) {
      return std::make_pair(key.first, BlockPlace{block.name(), static_cast<std::uint64_t>(p - block.data())});
    }
  }
  return std::nullopt;
}

const char* SharedMessages::locate(const Post& p, PeerMapping*& mapping) {
  const char* data = nullptr;
  std::uint64_t size = 0;
  if (p.owner == me_) {  // a message of this rank's own memory, forwarded back to it
    data = shareable_data(p.block);
    size = p.offset + p.bytes;  // the registry checked the block when it was lent
  } else if (p.owner >= 0 && static_cast<std::size_t>(p.owner) < pids_.size()) {
    PeerMapping& m = mapped_[{p.owner, p.block.fd}];
    // A descriptor the owner has since reused names another block: map the new one. (No lent
    // receive reads the old one: its sender, not yet acknowledged, would still hold it.)
    if (!m.block.data() || m.block.name().serial != p.block.serial) {
      mapped_bytes_ -= m.block.bytes();
      m.block = MappedBlock(pids_[static_cast<std::size_t>(p.owner)], p.block, false);
      mapped_bytes_ += m.block.bytes();
    }
    m.last_use = ++uses_;
    mapping = &m;
    data = m.block.data();
    size = m.block.bytes();
  }
  if (!data || p.offset + p.bytes > size) {
    throw std::runtime_error("rank " + std::to_string(me_) + " was sent a message from block " +
                             std::to_string(p.block.serial) + " of rank " + std::to_string(p.owner) +
                             " that it cannot find");
  }
  return data + p.offset;
}

void SharedMessages::trim_mappings() {
  while (mapped_bytes_ > kept_mapping_bytes_) {
    auto oldest = mapped_.end();
    for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
      if (it->second.readers == 0 && (oldest == mapped_.end() || it->second.last_use < oldest->second.last_use)) {
        oldest = it;
      }
    }
    if (oldest == mapped_.end()) return;  // all read by lent receives
    mapped_bytes_ -= oldest->second.block.bytes();
    mapped_.erase(oldest);
  }
}

char* SharedMessages::bounce(std::uint64_t bytes) {
  const std::uint64_t capacity = std::max(bytes, kMinBounceBytes);
  char* data = static_cast<char*>(allocate_shareable(capacity));
  if (!data) {
    throw std::runtime_error("rank " + std::to_string(me_) + " cannot allocate " + std::to_string(capacity) +
                             " bytes of shared memory for a message (out of memory or file descriptors)");
  }
  return data;
}

void SharedMessages::acknowledge(int sender, std::uint64_t seq) {
  word(ack(me_, sender, seq)).store(seq, std::memory_order_release);
}

bool SharedMessages::reap_bounces() {
  return std::erase_if(bounced_, [&](const std::pair<Ticket, char*>& sent) {
           return acknowledged(sent.first) && free_shareable(sent.second);
         }) > 0;
}

}  // namespace shardmm::detail
