// An exchange between the members of a group through memory they all map (an MPI-3 shared
// window when they share a node), without MPI messages: each member copies what it sends into
// its own segment, and each reads what it is sent straight out of the sender's segment. Point
// to point, a message between two ranks on one node goes through Open MPI's shared-memory
// transport in 4-32 KiB fragments, each matched, copied in and copied out; here a round moves
// up to a partition (hundreds of KiB) per pair with one flag each way.
//
// Free of MPI so that it can be tested with threads over plain memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace shardmm::detail {

// A copy with non-temporal stores: the bytes go to memory rather than into this core's cache,
// so a reader on a core that shares no cache with this one reads them from memory instead of
// pulling them out of this core's cache line by line. On the 2-vCPU VM of docs/benchmarks.md,
// whose vCPUs the host moves between sharing a last-level cache and not, a 512 KiB handover
// took 45-51 us this way in either state, against 63-83 us (shared cache) or ~300 us (not)
// with memcpy; with a cache shared closely, memcpy can be twice as fast. Hence learned.
inline void streaming_copy(char* to, const char* from, std::size_t bytes) {
#if defined(__SSE2__)
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(to) % 16) % 16);
  std::memcpy(to, from, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const auto* in = reinterpret_cast<const __m128i*>(from + i);
    auto* out = reinterpret_cast<__m128i*>(to + i);
    const __m128i a = _mm_loadu_si128(in), b = _mm_loadu_si128(in + 1), c = _mm_loadu_si128(in + 2),
                  d = _mm_loadu_si128(in + 3);
    _mm_stream_si128(out, a);
    _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c);
    _mm_stream_si128(out + 3, d);
  }
  std::memcpy(to + i, from + i, bytes - i);
  _mm_sfence();  // before the round is published: a release store does not order streaming stores
#else
  std::memcpy(to, from, bytes);
#endif
}

// How a writer copies into its segment: memcpy (cached), streaming_copy, or whichever of the
// two has made this member's recent large exchanges faster (learn).
enum class ExchangeCopy { learn, cached, streaming };

// One member's segment, 64-byte lines:
//   line 0            published: rounds this member has written, ever (1, 2, 3, ...)
//   lines 1..n        consumed[r]: the last of this member's rounds member r has read
//   bank 0, bank 1    round s is in bank s % 2: a header line per peer (bytes, flags), then a
//                     partition of `part` bytes per peer, in ring order from this member
// A writer reuses a bank once every reader has consumed the round before in it, so one bank
// is written while the other is read.
class SharedExchange {
 public:
  // One peer's share, in bytes: what this member sends it and what it expects from it. A
  // share sent `elsewhere` (the caller moves its bytes by other means) takes no room in the
  // window: only its size goes through, so that its reader checks it and learns where to look.
  struct Share {
    const char* send = nullptr;
    std::int64_t send_bytes = 0;
    char* recv = nullptr;
    std::int64_t recv_bytes = 0;
    bool elsewhere = false;
  };

  static constexpr std::size_t kLine = 64;

  static std::size_t segment_bytes(std::size_t members, std::size_t part) {
    return (1 + members) * kLine + 2 * bank_bytes(members, part);
  }

  // `segments[m]`: member m's segment as this process maps it; each member zeroes its own
  // (clear) and all have done so before the first exchange.
  SharedExchange(std::vector<char*> segments, std::size_t me, std::size_t part, ExchangeCopy copy = ExchangeCopy::learn)
      : segments_(std::move(segments)),
        n_(segments_.size()),
        me_(me),
        part_(part),
        copy_(copy),
        seen_(n_, 0),
        sent_(n_, 0),
        got_(n_, 0),
        piece_done_(n_, 0),
        reader_done_(n_, 0),
        elsewhere_(n_, 0) {}

  static void clear(char* segment, std::size_t members) { std::memset(segment, 0, (1 + members) * kLine); }

  // Moves shares[m] to and from every member m (shares[me] is copied locally, unless sent
  // elsewhere). `idle()` is called whenever a pass over the peers moved nothing; `mismatch(m)`
  // must throw: member m's total differs from shares[m].recv_bytes. After it, arrives_elsewhere(m)
  // says whether member m sent its share to this one elsewhere (its bytes are not in recv).
  template <class Idle, class Mismatch>
  void exchange(const std::vector<Share>& shares, Idle&& idle, Mismatch&& mismatch) {
    const Share& self = shares[me_];
    if (!self.elsewhere && self.send != self.recv && self.send_bytes > 0) {
      std::memcpy(self.recv, self.send, static_cast<std::size_t>(self.send_bytes));
    }
    std::int64_t bytes = 0;  // through the window
    for (std::size_t m = 0; m < n_; ++m) {
      if (m != me_ && !shares[m].elsewhere) bytes += shares[m].send_bytes + shares[m].recv_bytes;
    }
    std::fill(elsewhere_.begin(), elsewhere_.end(), 0);
    written_ = 0;
    streaming_ = choose_streaming(bytes);
    copy_seconds_ = 0;
    std::fill(sent_.begin(), sent_.end(), 0);
    std::fill(got_.begin(), got_.end(), 0);
    std::fill(piece_done_.begin(), piece_done_.end(), 0);
    std::fill(reader_done_.begin(), reader_done_.end(), 0);
    reader_done_[me_] = 1;
    std::size_t readers_left = n_ - 1;
    writer_done_ = n_ == 1;
    while (!writer_done_ || readers_left > 0) {
      bool moved = false;
      if (!writer_done_ && try_write(shares, writer_done_)) moved = true;
      for (std::size_t m = 0; m < n_; ++m) {
        while (!reader_done_[m] && try_read(m, shares[m], mismatch)) {
          moved = true;
          if (reader_done_[m]) --readers_left;
        }
      }
      if (!moved) idle();
    }
    if (copy_ == ExchangeCopy::learn && bytes >= kLearnBytes) {
      const double per_byte = copy_seconds_ / static_cast<double>(bytes);
      double& cost = cost_[streaming_ ? 1 : 0];
      cost = cost > 0 ? 0.75 * cost + 0.25 * per_byte : per_byte;
    }
  }

  // Who the exchange under way waits for, for a timeout's message: the members whose share
  // has not all arrived, and, while this member has rounds left to write, those that have not
  // read the round whose bank it needs (a member stopped or starved stops both; the others
  // then stall behind it).
  struct Waiting {
    std::vector<std::size_t> not_sent, not_read;
  };
  Waiting waiting_for() const {
    Waiting w;
    const std::int64_t round = published(me_).load(std::memory_order_relaxed) + 1;
    for (std::size_t m = 0; m < n_; ++m) {
      if (m == me_) continue;
      if (!reader_done_[m]) w.not_sent.push_back(m);
      if (!writer_done_ && consumed(me_, m).load(std::memory_order_acquire) < round - 2) w.not_read.push_back(m);
    }
    return w;
  }

  // Whether this member's exchanges use streaming_copy now (the last exchange's choice).
  bool streaming() const { return streaming_; }
  bool arrives_elsewhere(std::size_t m) const { return elsewhere_[m] != 0; }

 private:
  using Clock = std::chrono::steady_clock;
  // Exchanges that move fewer bytes (sent and received, this member) copy with memcpy: their
  // pieces stay in cache either way, and their times say little about a large copy's.
  static constexpr std::int64_t kLearnBytes = std::int64_t{256} << 10;
  // One large exchange in this many tries the copy that is not the faster, so that a change
  // of the machine's state (docs/benchmarks.md) is noticed.
  static constexpr std::uint64_t kExploreEvery = 8;

  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // The members of a group make the same exchanges, so they try the two copies in step, and
  // the time this member spends copying (its writes, and its reads of what the others wrote
  // the same way) is what the choice weighs; waits for a peer are not counted.
  bool choose_streaming(std::int64_t bytes) {
    if (copy_ != ExchangeCopy::learn) return copy_ == ExchangeCopy::streaming;
    if (bytes < kLearnBytes) return false;
    if (cost_[0] == 0 || cost_[1] == 0) return cost_[0] != 0;  // each tried once first
    const bool faster = cost_[1] < cost_[0];
    return ++large_exchanges_ % kExploreEvery == 0 ? !faster : faster;
  }

  // An entry's flags: this piece ends the writer's share for this reader; this round ends the
  // writer's part of the exchange; the share (all of its bytes, in the entry) is sent elsewhere.
  static constexpr std::int64_t kLastPiece = 1;
  static constexpr std::int64_t kLastRound = 2;
  static constexpr std::int64_t kElsewhere = 4;

  static std::size_t header_bytes(std::size_t members) {
    return ((members - 1) * 2 * sizeof(std::int64_t) + kLine - 1) / kLine * kLine;
  }
  static std::size_t bank_bytes(std::size_t members, std::size_t part) {
    return header_bytes(members) + (members - 1) * part;
  }
  static std::atomic_ref<std::int64_t> word(char* at) {
    return std::atomic_ref<std::int64_t>(*reinterpret_cast<std::int64_t*>(at));
  }
  std::atomic_ref<std::int64_t> published(std::size_t m) const { return word(segments_[m]); }
  std::atomic_ref<std::int64_t> consumed(std::size_t writer, std::size_t reader) const {
    return word(segments_[writer] + (1 + reader) * kLine);
  }
  char* bank(std::size_t m, std::int64_t round) const {
    return segments_[m] + (1 + n_) * kLine + static_cast<std::size_t>(round % 2) * bank_bytes(n_, part_);
  }
  // Where `writer` keeps its piece for `reader`: (bytes, flags) and the partition.
  std::int64_t* entry(char* bank, std::size_t writer, std::size_t reader) const {
    return reinterpret_cast<std::int64_t*>(bank) + 2 * slot(writer, reader);
  }
  char* partition(char* bank, std::size_t writer, std::size_t reader) const {
    return bank + header_bytes(n_) + slot(writer, reader) * part_;
  }
  std::size_t slot(std::size_t writer, std::size_t reader) const { return (reader + n_ - writer) % n_ - 1; }

  // Writes this member's next round if its bank is free: up to a partition of what is left
  // for each peer. The round that leaves nothing to send is marked the last.
  bool try_write(const std::vector<Share>& shares, bool& writer_done) {
    const std::int64_t round = published(me_).load(std::memory_order_relaxed) + 1;
    for (std::size_t r = 0; r < n_; ++r) {
      if (r != me_ && consumed(me_, r).load(std::memory_order_acquire) < round - 2) return false;
    }
    char* b = bank(me_, round);
    bool last = true;
    for (std::size_t r = 0; r < n_; ++r) {
      if (r == me_) continue;
      if (shares[r].elsewhere) {  // told in the first round, whole
        std::int64_t* e = entry(b, me_, r);
        e[0] = written_ == 0 ? shares[r].send_bytes : 0;
        e[1] = kLastPiece | (written_ == 0 ? kElsewhere : 0);
        continue;
      }
      const std::int64_t bytes =
          std::min<std::int64_t>(static_cast<std::int64_t>(part_), shares[r].send_bytes - sent_[r]);
      if (bytes > 0) {
        const Clock::time_point start = Clock::now();
        char* to = partition(b, me_, r);
        const char* from = shares[r].send + sent_[r];
        if (streaming_) {
          streaming_copy(to, from, static_cast<std::size_t>(bytes));
        } else {
          std::memcpy(to, from, static_cast<std::size_t>(bytes));
        }
        copy_seconds_ += seconds_since(start);
      }
      sent_[r] += bytes;
      std::int64_t* e = entry(b, me_, r);
      e[0] = bytes;
      e[1] = sent_[r] == shares[r].send_bytes ? kLastPiece : 0;
      last = last && e[1] == kLastPiece;
    }
    if (last) {
      for (std::size_t r = 0; r < n_; ++r) {
        if (r != me_) entry(b, me_, r)[1] |= kLastRound;
      }
    }
    published(me_).store(round, std::memory_order_release);
    ++written_;
    writer_done = last;
    return true;
  }

  // Reads writer m's next round if it is out; a round past this member's last piece is only
  // acknowledged, so that the next exchange starts at the writer's next round.
  template <class Mismatch>
  bool try_read(std::size_t m, const Share& share, Mismatch& mismatch) {
    const std::int64_t round = seen_[m] + 1;
    if (published(m).load(std::memory_order_acquire) < round) return false;
    char* b = bank(m, round);
    const std::int64_t* e = entry(b, m, me_);
    if (!piece_done_[m] && (e[1] & kElsewhere)) {
      if (got_[m] != 0 || e[0] != share.recv_bytes) mismatch(m);
      elsewhere_[m] = 1;
      got_[m] = e[0];
      piece_done_[m] = 1;
    } else if (!piece_done_[m]) {
      const std::int64_t bytes = e[0];
      if (got_[m] + bytes > share.recv_bytes) mismatch(m);
      if (bytes > 0) {
        const Clock::time_point start = Clock::now();
        std::memcpy(share.recv + got_[m], partition(b, m, me_), static_cast<std::size_t>(bytes));
        copy_seconds_ += seconds_since(start);
      }
      got_[m] += bytes;
      if (e[1] & kLastPiece) {
        if (got_[m] != share.recv_bytes) mismatch(m);
        piece_done_[m] = 1;
      }
    }
    if (e[1] & kLastRound) {
      if (!piece_done_[m]) mismatch(m);
      reader_done_[m] = 1;
    }
    seen_[m] = round;
    consumed(m, me_).store(round, std::memory_order_release);
    return true;
  }

  std::vector<char*> segments_;
  std::size_t n_, me_, part_;
  ExchangeCopy copy_;
  bool streaming_ = false;
  double copy_seconds_ = 0;  // this exchange's, so far
  double cost_[2] = {0, 0};  // copy seconds per byte of large exchanges, EWMA: cached, streaming
  std::uint64_t large_exchanges_ = 0;
  std::vector<std::int64_t> seen_;  // by writer: the last of its rounds this member has read
  // This exchange's progress, by peer.
  std::vector<std::int64_t> sent_, got_;
  std::vector<char> piece_done_, reader_done_;
  std::vector<char> elsewhere_;  // by writer: its share for this member came elsewhere
  std::int64_t written_ = 0;     // rounds this member has written in this exchange
  bool writer_done_ = true;      // this member has written its last round of this exchange
};

}  // namespace shardmm::detail
