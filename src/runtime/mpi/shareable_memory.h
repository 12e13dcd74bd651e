// Memory another process of this machine can map: each block is a memfd that a peer opens
// through /proc/<owner pid>/fd/<fd> while its owner keeps it open. The mpi backend lends such
// blocks to the receivers of its point-to-point messages (shared_messages.h), so that a rank on
// the same machine reads a neighbour's shard or running sum where it lies, as the threads
// backend does, instead of copying it through Open MPI's shared-memory transport.
//
// While switched on (the mpi backend, for the length of a run on one machine), Buffers of at
// least kShareableMinBytes come from here; their memory behaves as any other.
//
// Free of MPI: blocks are found by (owner pid, fd, serial), and the serial, written into the
// block's first line, tells a peer that the fd it opened is still the block it was told of.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace shardmm::detail {

// How a peer finds a block: the owner's fd for it, and the serial the owner gave it.
struct BlockName {
  std::int32_t fd = -1;
  std::uint64_t serial = 0;
};

// Where some bytes lie in a block: its name and their offset from the block's data.
struct BlockPlace {
  BlockName block;
  std::uint64_t offset = 0;
};

// Smaller buffers stay on the heap: each block costs a file descriptor and a mapping.
constexpr std::size_t kShareableMinBytes = std::size_t{64} << 10;

// Whether Buffers come from shareable blocks from now on (existing ones stay where they are).
// Switching off releases the freed blocks kept for reuse.
void set_buffers_shareable(bool on);
bool buffers_shareable();

// A fresh block of `bytes` data bytes (64-byte aligned), or nullptr where none can be had (no
// memfd, or blocks would hold half of this process's descriptor limit): the caller falls back
// to the heap.
void* allocate_shareable(std::size_t bytes);
// Frees `data` if it is a block from allocate_shareable; false (and nothing done) otherwise.
// While Buffers are shareable, every freed block is kept, under its name, for the next request
// of its size class (blocks are sized in quarter steps of powers of two): a peer that mapped one
// reads the same memory when it is lent again, and no new pages are faulted in. A class's blocks
// never outnumber the most of them live at once; the oldest go past 256 MiB kept, and switching
// off releases them all.
bool free_shareable(void* data);
// The block of this process that holds [data, data + bytes), if any.
std::optional<BlockPlace> find_shareable(const void* data, std::size_t bytes);
// The data of this process's block `name`, or nullptr when it is not (or no longer) one.
const char* shareable_data(const BlockName& name);

// A peer's block mapped into this process (read-only unless `writable`); unmapped when
// destroyed. Throws std::runtime_error naming what failed.
class MappedBlock {
 public:
  MappedBlock() = default;
  MappedBlock(pid_t owner, const BlockName& name, bool writable);
  ~MappedBlock();
  MappedBlock(MappedBlock&& other) noexcept;
  MappedBlock& operator=(MappedBlock&& other) noexcept;
  MappedBlock(const MappedBlock&) = delete;
  MappedBlock& operator=(const MappedBlock&) = delete;

  char* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }  // data bytes
  const BlockName& name() const { return name_; }

 private:
  void* base_ = nullptr;
  std::size_t mapped_ = 0;
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
  BlockName name_;
};

}  // namespace shardmm::detail
